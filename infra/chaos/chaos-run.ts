import { appendFileSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import IORedis from "ioredis";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { buildRuntime, PACKAGE_ROOT, type Runtime } from "../cli/runtime.ts";
import type { ConfigFlags } from "../cli/flags.ts";
import { startSimEngine, type RunningSimEngine } from "../sim-engine/server.ts";
import { createToolsApp, type ToolInjectedFault } from "../tools/app.ts";
import { globEscape } from "../../shared/store/gc.ts";
import type { LeaseStoreStats } from "../../shared/tools/lease-store.ts";
import { RedisLeaseStore } from "../../shared/tools/redis-lease-store.ts";
import { IoRedisCommander } from "../redis/ioredis-commander.ts";
import { startSandboxProvider } from "../sandbox/provider.ts";
import type { SandboxProviderStats } from "../sandbox/sandboxes.ts";

/** Options of {@link runChaos}. Defaults are the full run of issue 8 (`npm run chaos`). */
export interface ChaosOptions {
  /** Trajectories (rounded up to a multiple of `n`; default 1,000). */
  trajectories?: number;
  /** Samples per row (default 4). */
  n?: number;
  /** Workers running at once (default 3). */
  workers?: number;
  /** Jobs per worker at once (default 8). */
  concurrency?: number;
  /** Seed of the scripted policy, the fault draws and the kill schedule (default 7). */
  seed?: number;
  /** Share of engine requests answered with an HTTP 500/503 (default 0.05). */
  engineErrors?: number;
  /** Share of engine requests preempted (`abort` after 0–8 tokens; default 0.05). */
  engineAborts?: number;
  /** Share of tool-call attempts that time out (default 0.05). */
  toolTimeouts?: number;
  /** Per-attempt tool timeout of the tools file, ms (default 1,000); an injected timeout is held past it. */
  toolTimeoutMs?: number;
  /** Milliseconds between SIGKILLs (a random worker each time; default 3,000, jittered ±30 %). */
  killEveryMs?: number;
  /** Stop killing after this many (default: no limit). */
  maxKills?: number;
  /** Job lease, seconds: a killed worker's jobs are reclaimed after it (default 2). */
  leaseSeconds?: number;
  /** Simulated decode time per generated token in the chaos run, ms (default 10): paces the run so kills land mid-flight. */
  decodeMsPerToken?: number;
  /** Time every tool call takes in the chaos run, ms (default 100). The fault-free run has no latency (records do not depend on it). */
  toolDelayMs?: number;
  /** Give up waiting for the batch after this long, ms (default 240,000). */
  deadlineMs?: number;
  /** Redis URL (default `REDIS_URL` or `redis://127.0.0.1:6379`). */
  redisUrl?: string;
  /**
   * Sandbox leases (issue 29; `npm run chaos:leases`): every trajectory of the
   * chaos run holds a sandbox from the example provider (`create: start`),
   * whose creates make their sandbox and then hang past the create deadline
   * for a share `createTimeouts` of attempts. Checked at the end: no sandbox
   * live, none destroyed by its own lifetime (a leak the reaper missed), no
   * lease left unreleased in the store, creations never over the limiter's bound.
   */
  sandbox?: {
    createTimeouts: number;
    ttlS: number;
    maxCreatesPerS: number;
    createTimeoutMs: number;
    /**
     * Two more batches beside the main one, enqueued before it so workers take
     * them first: one of `cancelRows` rows (uids `chaosC{i}`) cancelled once
     * `cancelAfterCreated` sandboxes were made (a count that only grows: a slow machine cannot miss it), and one of `surplusRows` rows
     * (uids `chaosS{i}`) over-sampled with `target_groups: surplusTarget`
     * (its surplus stopped while running). Their sandboxes' release reasons
     * are in the report (provider `releases_by_reason`).
     */
    stops?: { cancelRows: number; cancelAfterCreated: number; surplusRows: number; surplusTarget: number };
  };
  /** Progress lines (default: none). */
  log?: (line: string) => void;
}

/** What a chaos run observed, and the properties checked. */
export interface ChaosReport {
  /** The run's Redis key prefix (deleted when the run ends). */
  prefix: string;
  trajectories: number;
  /** Records stored without an error. */
  completed: number;
  /** Records stored with an error, by reason (digits folded to `N`). */
  failed: number;
  failedByReason: Record<string, number>;
  /** Keys with no record at all (must be empty). */
  missing: string[];
  faults: {
    engine_errors: number;
    engine_aborts: number;
    tool_timeouts: number;
    /** Trajectories with at least one fault injected. */
    trajectories_faulted: number;
  };
  kills: number;
  workerStarts: number;
  /** Jobs claimed again after their worker was killed (XAUTOCLAIM after the lease; from the workers' logs). */
  reclaimed: number;
  writes: {
    /** Writes that stored a record, from the workers' write logs (a write whose worker was killed before it logged is missing here). */
    stored: number;
    /** Records counted by the groups' `records` counters in Redis (incremented only by a write that stored). */
    groupDone: number;
    /** Writes refused because the key was already stored (a re-run after a kill; not a duplicate). */
    refused: number;
    /** Keys stored more than once, by the write logs and by the groups' `records` counters (must be 0). */
    duplicates: number;
  };
  /** Trajectories with no fault injected, and how many of their records equal the fault-free run's. */
  comparable: number;
  equal: number;
  /** Comparable keys whose record differs (must be empty). */
  unequal: string[];
  /** Faulted trajectories whose record still equals the fault-free run's (e.g. only retried errors). */
  faultedEqual: number;
  /** Tool calls executed (deduplicated by call id): chaos run and fault-free run. */
  toolExecutions: { chaos: number; reference: number };
  ms: { reference: number; chaos: number };
  /** Sandbox leases (with {@link ChaosOptions.sandbox}): the provider's counts, the store's, the limit. */
  sandbox?: {
    provider: SandboxProviderStats;
    store: LeaseStoreStats;
    limit_per_s: number;
    bound_per_s: number;
    live_after_ms: number;
    /** With `stops`: the cancelled batch's and the over-sampled batch's outcome (trajectories, records stored, groups). */
    stops?: { cancelled: { trajectories: number; records: number }; surplus: { trajectories: number; records: number; target_groups: number; complete_groups: number } };
  };
  /** Violated properties (empty: the run passed). */
  violations: string[];
}

/** A seeded PRNG (mulberry32). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A record without wall-clock figures: what must be identical between two runs of one trajectory. */
export function comparableRecord(r: TrajectoryRecord): Omit<TrajectoryRecord, "metrics"> & { num_preempted: number } {
  const { metrics, ...rest } = r;
  // The sandbox a trajectory ran in is named by the provider: not part of what the policy and tools produced.
  const { sandbox: _sandbox, ...extra } = (rest.extra_fields ?? {}) as Record<string, unknown>;
  return { ...rest, extra_fields: extra, num_preempted: metrics.num_preempted };
}

/** The top-level fields (and `extra_fields` keys) in which two records differ, for a violation's message. */
export function differingFields(a: Record<string, unknown>, b: Record<string, unknown>): string[] {
  const out: string[] = [];
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    if (k === "extra_fields") {
      const x = (a[k] ?? {}) as Record<string, unknown>;
      const y = (b[k] ?? {}) as Record<string, unknown>;
      for (const e of new Set([...Object.keys(x), ...Object.keys(y)])) if (!Bun.deepEquals(x[e], y[e])) out.push(`extra_fields.${e}`);
    } else if (!Bun.deepEquals(a[k], b[k])) out.push(k === "model" ? `model (${JSON.stringify(a[k])} vs ${JSON.stringify(b[k])})` : k);
  }
  return out;
}

/** A failure reason with digits folded, so reasons group (`delivered 6 times` → `delivered N times`). */
export function reasonClass(error: string): string {
  return error.replace(/\d+/g, "N").slice(0, 100);
}

const WORKER = join(import.meta.dir, "chaos-worker.ts");

/** The example tools file with every tool at `port`, `timeoutMs` per attempt and 3 retries (and a sandbox block). */
export function toolsFileText(port: number, timeoutMs: number, sandbox?: Record<string, unknown>): string {
  // The whole file's {port}: its tools and its simulated user (interactions) live on the same server.
  const example = JSON.parse(readFileSync(join(PACKAGE_ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", String(port))) as { tools: { url: string; timeout_ms: number; max_retries: number }[] };
  for (const t of example.tools) {
    t.timeout_ms = timeoutMs;
    t.max_retries = 3;
  }
  return JSON.stringify(sandbox ? { ...example, sandbox } : example);
}

/** The example tool server on loopback with probabilistic timeouts, logging each injected one. */
export function chaosToolServer(opts: { timeouts: number; seed: number; delayMs?: number }) {
  const faults: ToolInjectedFault[] = [];
  const app = createToolsApp({ faultRate: { timeouts: opts.timeouts, seed: opts.seed, holdMs: 10_000 }, onFault: (f) => faults.push(f), delayMs: opts.delayMs });
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch, idleTimeout: 30 });
  const url = `http://127.0.0.1:${server.port}`;
  return {
    port: server.port as number,
    faults,
    executions: async () => ((await (await fetch(`${url}/stats`)).json()) as { executions: number }).executions,
    stop: () => server.stop(true),
  };
}

/**
 * The fault-free, kill-free reference of a chaos run: `batch` run inline in
 * this process on the memory store, against its own simulated engine playing
 * `script` and its own example tool server (in `dir`, `toolTimeoutMs` per
 * attempt), with the rollout `flags`. The engine and tools stop through
 * `cleanups`; the engine is returned for its request log and token counts.
 */
export async function runReference(o: {
  script: unknown;
  seed: number;
  dir: string;
  toolTimeoutMs: number;
  flags: ConfigFlags;
  batch: { rows: unknown[]; global_steps: number; model_version: string | number | null; validate: boolean };
  cleanups: (() => unknown)[];
}): Promise<{ records: Map<string, TrajectoryRecord>; engine: RunningSimEngine; executions: number; ms: number }> {
  const t0 = performance.now();
  const engine = await startSimEngine({ script: o.script });
  o.cleanups.push(() => engine.stop());
  const tools = chaosToolServer({ timeouts: 0, seed: o.seed });
  o.cleanups.push(() => tools.stop());
  const toolsFile = join(o.dir, "tools-ref.json");
  writeFileSync(toolsFile, toolsFileText(tools.port, o.toolTimeoutMs));
  const inline = await buildRuntime({ ...o.flags, engine: engine.urls[0]!, tools: toolsFile, concurrency: 64 });
  const ref = inline.service.submit(o.batch);
  await ref.run.run();
  await inline.close();
  return { records: new Map(ref.run.records().map((r) => [r.key, r])), engine, executions: await tools.executions(), ms: performance.now() - t0 };
}

/** Deletes every key under `prefix` (SCAN + UNLINK). */
export async function deletePrefix(redisUrl: string, prefix: string): Promise<void> {
  const c = new IORedis(redisUrl, { maxRetriesPerRequest: 1 });
  // Redis may be gone already (an interrupted run): the failed SCAN says so, not ioredis's unhandled-error lines.
  c.on("error", () => {});
  try {
    let cursor = "0";
    do {
      const [next, keys] = await c.scan(cursor, "MATCH", `${globEscape(prefix)}*`, "COUNT", 1000);
      cursor = next;
      if (keys.length) await c.unlink(...keys);
    } while (cursor !== "0");
  } finally {
    await c.quit();
  }
}

/**
 * The chaos run of issue 8: `workers` `edgeloop worker` processes
 * (infra/chaos/chaos-worker.ts) drain `trajectories` jobs from a Redis store
 * (random prefix, deleted afterwards) while the simulated engine injects
 * errors and aborts, the tool server injects timeouts, and a driver SIGKILLs
 * a random worker every `killEveryMs` and starts a new one. Then checks:
 * every trajectory has a record (completed, or failed with a reason), no key
 * was stored twice (write logs and group counters), and every trajectory
 * into which no fault was injected (per the engine's and tool server's fault
 * logs, by trajectory key) has a record equal to a fault-free, kill-free
 * inline run with the same seed.
 * @throws Error when a component cannot start (Redis down, tokenizer missing).
 */
export async function runChaos(o: ChaosOptions = {}): Promise<ChaosReport> {
  const n = o.n ?? 4;
  const rowsN = Math.ceil((o.trajectories ?? 1000) / n);
  const total = rowsN * n;
  const seed = o.seed ?? 7;
  const redisUrl = o.redisUrl ?? process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
  const log = o.log ?? (() => {});
  const random = mulberry32(seed ^ 0x5eed);
  const prefix = `chaos:${crypto.randomUUID().slice(0, 8)}:`;
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-chaos-"));
  const examples = readFileSync(join(PACKAGE_ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n");
  const rows = Array.from({ length: rowsN }, (_, i) => ({ ...JSON.parse(examples[i % examples.length]!), uid: `chaos${i}` }));
  const script = { ...JSON.parse(readFileSync(join(PACKAGE_ROOT, "examples", "policy.json"), "utf8")), seed };
  const latency = { prefill_ms_per_token: 0, decode_ms_per_token: o.decodeMsPerToken ?? 10 };
  const batchReq = { rows, global_steps: 1, model_version: "v1", validate: false };
  const toolTimeoutMs = o.toolTimeoutMs ?? 1000;
  const cleanups: (() => Promise<unknown> | unknown)[] = [];
  const procs: ReturnType<typeof Bun.spawn>[] = [];
  try {
    // 1. The fault-free, kill-free reference: in-process, memory store.
    const { records: reference, executions: refExecutions, ms: refMs } = await runReference({ script, seed, dir, toolTimeoutMs, flags: { n, seed, maxModelLen: 4096 }, batch: batchReq, cleanups });
    log(`reference: ${reference.size} records in ${(refMs / 1000).toFixed(1)} s`);

    // 2. The chaos run.
    const t1 = performance.now();
    const engine: RunningSimEngine = await startSimEngine({ script, latency, faultRate: { errors: o.engineErrors ?? 0.05, aborts: o.engineAborts ?? 0.05, seed } });
    cleanups.push(() => engine.stop());
    const tools = chaosToolServer({ timeouts: o.toolTimeouts ?? 0.05, seed, delayMs: o.toolDelayMs ?? 100 });
    cleanups.push(() => tools.stop());
    const toolsFile = join(dir, "tools.json");
    const sb = o.sandbox;
    const provider = sb ? startSandboxProvider({ faults: { create_timeout_fraction: sb.createTimeouts, hang_ms: sb.createTimeoutMs * 4, seed } }) : null;
    if (provider) cleanups.push(() => provider.stop());
    const sandboxBlock = provider && sb
      ? { create_url: `${provider.url}/sandboxes/create`, release_url: `${provider.url}/sandboxes/release`, create: "start", ttl_s: sb.ttlS, create_timeout_ms: sb.createTimeoutMs, create_retries: 6, release_timeout_ms: 2_000, release_retries: 2, max_creates_per_s: sb.maxCreatesPerS, max_live: 10_000 }
      : undefined;
    writeFileSync(toolsFile, toolsFileText(tools.port, toolTimeoutMs, sandboxBlock));
    const lease = o.leaseSeconds ?? 2;
    let api: Runtime | undefined = await buildRuntime({ store: redisUrl, storePrefix: prefix, engine: engine.urls[0]!, tools: toolsFile, n, seed, maxModelLen: 4096 }, { jobs: "queue", jobQueue: { leaseMs: lease * 1000 } });
    cleanups.push(() => api?.close());
    cleanups.push(() => deletePrefix(redisUrl, prefix));
    // Stop batches (sandbox.stops) first: the job stream is read in order, so their jobs run while the main batch waits.
    const st = sb?.stops;
    const stopRows = (tag: string, count: number) => Array.from({ length: count }, (_, i) => ({ ...JSON.parse(examples[i % examples.length]!), uid: `chaos${tag}${i}` }));
    const toCancel = st ? await api.service.accept({ ...batchReq, rows: stopRows("C", st.cancelRows) }) : null;
    const oversampled = st ? await api.service.accept({ ...batchReq, rows: stopRows("S", st.surplusRows), target_groups: st.surplusTarget }) : null;
    let cancelSent = !toCancel;
    const accepted = await api.service.accept(batchReq);
    log(`chaos: ${accepted.keys.length} jobs enqueued under ${prefix}${st ? ` (after ${toCancel!.keys.length} to cancel and ${oversampled!.keys.length} over-sampled)` : ""}`);

    let starts = 0;
    const live: { name: string; proc: ReturnType<typeof Bun.spawn> }[] = [];
    const spawn = () => {
      const name = `w${++starts}`;
      const proc = Bun.spawn(
        [process.execPath, WORKER, "--store", redisUrl, "--prefix", prefix, "--engine", engine.urls[0]!, "--tools", toolsFile, "--consumer", name, "--log", join(dir, `${name}.writes`),
          "--concurrency", String(o.concurrency ?? 8), "--lease", String(lease), "--idle-exit", "2"],
        { stdout: Bun.file(join(dir, `${name}.out`)), stderr: Bun.file(join(dir, `${name}.err`)), env: { ...process.env, NO_COLOR: "1" } },
      );
      procs.push(proc);
      live.push({ name, proc });
    };
    for (let i = 0; i < (o.workers ?? 3); i++) spawn();

    const deadline = Date.now() + (o.deadlineMs ?? 240_000);
    const every = o.killEveryMs ?? 3000;
    const maxKills = o.maxKills ?? Infinity;
    let kills = 0;
    let nextKill = Date.now() + every * (0.7 + 0.6 * random());
    let lastReport = 0;
    for (;;) {
      const s = accepted.run.stats();
      if ((s.done && (!oversampled || oversampled.run.stats().done)) || Date.now() > deadline) break;
      if (!cancelSent && provider && provider.stats().created >= st!.cancelAfterCreated) {
        cancelSent = true;
        await api.service.cancel(toCancel!.batch_id, { waitMs: 0 });
        log(`cancelled batch ${toCancel!.batch_id} with ${provider.stats().live} sandboxes live`);
      }
      if (Date.now() >= nextKill && kills < maxKills && live.length > 0) {
        const i = Math.floor(random() * live.length);
        const victim = live.splice(i, 1)[0]!;
        victim.proc.kill("SIGKILL");
        await victim.proc.exited;
        kills++;
        spawn();
        log(`kill ${kills}: ${victim.name} after ${s.counts.ok + s.counts.failed}/${total} records; started w${starts}`);
        nextKill = Date.now() + every * (0.7 + 0.6 * random());
      }
      for (let i = live.length - 1; i >= 0; i--) if (live[i]!.proc.exitCode !== null) live.splice(i, 1);
      if (Date.now() - lastReport > 5000) {
        lastReport = Date.now();
        log(`progress: ${s.counts.ok + s.counts.failed}/${total} records, ${kills} kills, faults: engine ${engine.replicas[0]!.engine.faultRate!.injected.length}, tools ${tools.faults.length}`);
      }
      await Bun.sleep(100);
    }
    // Survivors drain what is left (nothing, when the batch is done) and exit idle.
    const exitBy = Date.now() + 20_000;
    while (live.some((w) => w.proc.exitCode === null) && Date.now() < exitBy) await Bun.sleep(100);
    for (const w of live) if (w.proc.exitCode === null) w.proc.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
    const chaosMs = performance.now() - t1;

    // 3. Checks.
    const violations: string[] = [];
    let sandbox: ChaosReport["sandbox"];
    if (provider && sb) {
      // Leases of killed workers that no one resumed are reaped once their TTL passed (by the API process's reaper).
      const t2 = performance.now();
      // The longest a lease can wait for the reaper: a release claimed by a worker that was then killed is held
      // release_timeout_ms × (release_retries + 1) + ttl_s (6 s + ttl here) before it is claimed again; plus passes.
      const waitS = 2 * sb.ttlS + 6 + 15;
      const liveBy = Date.now() + waitS * 1000;
      while (provider.stats().live > 0 && Date.now() < liveBy) await Bun.sleep(100);
      const leaseCommander = new IoRedisCommander(redisUrl);
      cleanups.push(() => leaseCommander.close());
      const store = await new RedisLeaseStore(leaseCommander, { prefix }).stats();
      const ps = provider.stats();
      const bound = sb.maxCreatesPerS; // create_burst 1: at most max_creates_per_s + 1 - 1 in any second
      sandbox = { provider: ps, store, limit_per_s: sb.maxCreatesPerS, bound_per_s: bound, live_after_ms: performance.now() - t2 };
      if (ps.live !== 0) violations.push(`${ps.live} sandboxes still live at the provider ${waitS} s after the run`);
      if (ps.destroyed_expired !== 0) violations.push(`${ps.destroyed_expired} sandboxes were destroyed by their own lifetime (leaked past the reaper)`);
      if (ps.created !== ps.destroyed_released + ps.destroyed_expired + ps.live) violations.push(`provider counts do not add up: ${JSON.stringify(ps)}`);
      if (store.live + store.creating + store.releasing !== 0) violations.push(`leases left in the store: live ${store.live}, creating ${store.creating}, releasing ${store.releasing}`);
      if (ps.peak_creates_1s > bound) violations.push(`${ps.peak_creates_1s} sandboxes created within one second, over the limit ${bound}`);
      if (ps.created < total) violations.push(`only ${ps.created} sandboxes created for ${total} trajectories`);
      if (toCancel && oversampled && st) {
        let cancelledRecords = 0;
        for (const k of toCancel.keys) if (await api.store.get(k)) cancelledRecords++;
        let surplusRecords = 0;
        for (const k of oversampled.keys) if (await api.store.get(k)) surplusRecords++;
        let complete = 0;
        for (let i = 0; i < st.surplusRows; i++) if ((await api.store.groupStatus(`chaosS${i}`)).records >= n) complete++;
        sandbox.stops = { cancelled: { trajectories: toCancel.keys.length, records: cancelledRecords }, surplus: { trajectories: oversampled.keys.length, records: surplusRecords, target_groups: st.surplusTarget, complete_groups: complete } };
        if (complete < st.surplusTarget) violations.push(`the over-sampled batch completed ${complete} of its ${st.surplusTarget} target groups`);
      }
    }
    const stored = new Map<string, number>();
    let refused = 0;
    let reclaimed = 0;
    for (const f of readdirSync(dir)) {
      if (f.endsWith(".writes")) {
        for (const line of readFileSync(join(dir, f), "utf8").split("\n")) {
          const [key, what] = line.split(" ");
          if (!key) continue;
          if (what === "stored") stored.set(key, (stored.get(key) ?? 0) + 1);
          else refused++;
        }
      } else if (f.endsWith(".err")) {
        reclaimed += readFileSync(join(dir, f), "utf8").split("\n").filter((l) => /\] reclaimed \S+ \(delivery \d+\)/.test(l)).length;
      }
    }
    let duplicates = 0;
    for (const c of stored.values()) duplicates += Math.max(0, c - 1);
    const records = new Map<string, TrajectoryRecord>();
    for (const key of accepted.keys) {
      const r = await api.store.get(key);
      if (r) records.set(key, r);
    }
    let groupDone = 0;
    for (let i = 0; i < rowsN; i++) {
      const g = await api.store.groupStatus(`chaos${i}`);
      groupDone += g.records;
      // Chaos loops emit one output per session: more records (or finished sessions) than n are duplicates.
      if (g.records > n) duplicates += g.records - n;
    }
    const missing = accepted.keys.filter((k) => !records.has(k));
    if (missing.length) violations.push(`${missing.length} trajectories have no record (e.g. ${missing.slice(0, 3).join(", ")})`);
    if (duplicates) violations.push(`${duplicates} duplicate writes`);
    const failedByReason: Record<string, number> = {};
    let completed = 0;
    let failed = 0;
    let withoutSandbox = 0;
    for (const r of records.values()) {
      const named = (r.extra_fields?.sandbox ?? null) as { sandbox_id?: unknown } | null;
      if (provider && (r.error === null || r.error === undefined) && typeof named?.sandbox_id !== "string") withoutSandbox++;
      if (r.error === null || r.error === undefined) completed++;
      else {
        failed++;
        const c = reasonClass(r.error);
        failedByReason[c] = (failedByReason[c] ?? 0) + 1;
        if (!r.error.trim()) violations.push(`${r.key} failed without a reason`);
      }
    }

    if (withoutSandbox) violations.push(`${withoutSandbox} completed records do not name their sandbox (extra_fields.sandbox)`);
    const engineFaults = engine.replicas[0]!.engine.faultRate!.injected;
    const faulted = new Set<string>();
    for (const f of engineFaults) if (f.routing_key) faulted.add(f.routing_key);
    for (const f of tools.faults) faulted.add(f.key);
    let comparable = 0;
    let equal = 0;
    let faultedEqual = 0;
    const unequal: string[] = [];
    let firstDiff: string[] = [];
    for (const key of accepted.keys) {
      const r = records.get(key);
      const want = reference.get(key);
      if (!r || !want) continue;
      const same = Bun.deepEquals(comparableRecord(r), comparableRecord(want));
      if (faulted.has(key)) {
        if (same) faultedEqual++;
        continue;
      }
      comparable++;
      if (same) equal++;
      else {
        if (unequal.length === 0) firstDiff = differingFields(comparableRecord(r), comparableRecord(want));
        unequal.push(key);
      }
    }
    if (unequal.length) violations.push(`${unequal.length} records without injected faults differ from the fault-free run (e.g. ${unequal.slice(0, 3).join(", ")}; the first differs in ${firstDiff.join(", ")})`);
    if (reference.size !== total) violations.push(`the fault-free run stored ${reference.size} of ${total} records`);

    const report: ChaosReport = {
      prefix,
      trajectories: total,
      completed,
      failed,
      failedByReason,
      missing,
      faults: {
        engine_errors: engineFaults.filter((f) => f.kind !== "abort").length,
        engine_aborts: engineFaults.filter((f) => f.kind === "abort").length,
        tool_timeouts: tools.faults.length,
        trajectories_faulted: faulted.size,
      },
      kills,
      workerStarts: starts,
      reclaimed,
      writes: { stored: [...stored.values()].reduce((a, b) => a + b, 0), groupDone, refused, duplicates },
      comparable,
      equal,
      unequal,
      faultedEqual,
      toolExecutions: { chaos: await tools.executions(), reference: refExecutions },
      ms: { reference: refMs, chaos: chaosMs },
      ...(sandbox ? { sandbox } : {}),
      violations,
    };
    // EDGELOOP_CHAOS_KEEP=1 keeps the worker logs and the report for inspection.
    if (process.env.EDGELOOP_CHAOS_KEEP) appendFileSync(join(dir, "report.json"), JSON.stringify(report));
    return report;
  } finally {
    for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => {});
    if (process.env.EDGELOOP_CHAOS_KEEP) console.error(`chaos: logs kept in ${dir}`);
    else if (existsSync(dir)) rmSync(dir, { recursive: true, force: true });
  }
}

/** The report as a table (one row per figure) plus the verdict. */
export function formatChaosReport(r: ChaosReport): string {
  const rows: [string, string][] = [
    ["trajectories", String(r.trajectories)],
    ["completed", String(r.completed)],
    ["failed", String(r.failed)],
    ...Object.entries(r.failedByReason).map(([k, v]): [string, string] => [`  failed: ${k}`, String(v)]),
    ["no record", String(r.missing.length)],
    ["faults: engine errors (500/503)", String(r.faults.engine_errors)],
    ["faults: engine aborts", String(r.faults.engine_aborts)],
    ["faults: tool timeouts", String(r.faults.tool_timeouts)],
    ["trajectories with a fault", String(r.faults.trajectories_faulted)],
    ["workers SIGKILLed", String(r.kills)],
    ["workers started", String(r.workerStarts)],
    ["jobs reclaimed from killed workers", String(r.reclaimed)],
    ["records stored (group counters)", String(r.writes.groupDone)],
    ["stored writes logged by workers", String(r.writes.stored)],
    ["writes refused (already stored)", String(r.writes.refused)],
    ["duplicate writes", String(r.writes.duplicates)],
    ["equal to fault-free run / comparable", `${r.equal} / ${r.comparable}`],
    ["faulted, still equal", `${r.faultedEqual} / ${r.faults.trajectories_faulted}`],
    ["tool executions (chaos / fault-free)", `${r.toolExecutions.chaos} / ${r.toolExecutions.reference}`],
    ["seconds (fault-free / chaos)", `${(r.ms.reference / 1000).toFixed(1)} / ${(r.ms.chaos / 1000).toFixed(1)}`],
  ];
  if (r.sandbox) {
    const p = r.sandbox.provider;
    const c = r.sandbox.store.counters;
    rows.push(
      ["sandboxes created (provider)", String(p.created)],
      ["  create timeouts injected", String(p.create_timeouts)],
      ["  destroyed by release", String(p.destroyed_released)],
      ["  destroyed by lifetime (leaks)", String(p.destroyed_expired)],
      ["  live at the end", String(p.live)],
      ["  releases answered 404 (repeats)", String(p.release_not_found)],
      ...Object.entries(p.releases_by_reason)
        .sort()
        .map(([k, v]): [string, string] => [`  released by the provider: ${k}`, String(v)]),
      ...(r.sandbox.stops
        ? ([
            ["cancelled batch: trajectories / records", `${r.sandbox.stops.cancelled.trajectories} / ${r.sandbox.stops.cancelled.records}`],
            ["over-sampled batch: complete groups / target", `${r.sandbox.stops.surplus.complete_groups} / ${r.sandbox.stops.surplus.target_groups}`],
            ["over-sampled batch: trajectories / records", `${r.sandbox.stops.surplus.trajectories} / ${r.sandbox.stops.surplus.records}`],
          ] as [string, string][])
        : []),
      ["  peak creates in 1 s / limit", `${p.peak_creates_1s} / ${r.sandbox.limit_per_s}`],
      ...Object.entries(c)
        .filter(([k]) => k.startsWith("released:") || k.startsWith("reaped:") || k === "granted" || k === "confirmed" || k === "create_failed")
        .sort()
        .map(([k, v]): [string, string] => [`  leases ${k}`, String(v)]),
      ["  seconds until none live", (r.sandbox.live_after_ms / 1000).toFixed(1)],
    );
  }
  const w = Math.max(...rows.map(([k]) => k.length));
  const lines = rows.map(([k, v]) => `${k.padEnd(w)}  ${v.padStart(12)}`);
  lines.push(r.violations.length ? `FAIL: ${r.violations.join("; ")}` : "PASS: every trajectory recorded, no duplicate write, fault-free trajectories equal the fault-free run");
  return lines.join("\n");
}
