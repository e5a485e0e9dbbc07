import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import type { SimRequestLog } from "../sim-engine/sim-types.ts";
import { PACKAGE_ROOT } from "../cli/runtime.ts";
import { createRedisTransferQueue } from "../redis/redis-transfer-queue.ts";
import { startSimEngine } from "../sim-engine/server.ts";
import { freePort } from "../cli/free-port.ts";
import { chaosToolServer, comparableRecord, deletePrefix, differingFields, runReference, toolsFileText } from "./chaos-run.ts";

/**
 * A Redis server the run may SIGKILL and start again from its append-only
 * file (tests/helpers/redis-server.ts `privateRedis({ persist: true })`):
 * `stop()` kills without a save, `start()` serves the same port and data again.
 */
export interface RestartableRedis {
  url: string;
  start(): Promise<void>;
  stop(): Promise<void>;
}

/** Options of {@link runWholeRestart}. */
export interface WholeRestartOptions {
  /** Redis with an append-only file (`appendfsync always` or `everysec`: a process kill loses no acknowledged write either way). */
  redis: RestartableRedis;
  /** Prompt rows (the example rows, cycled; uids `wr{i}`; default 24). */
  rows?: number;
  /** Samples per row (default 4). */
  n?: number;
  /** Extra `calc` tool turns before each row's scripted turns (default 6): longer trajectories, more turns to resume. */
  toolTurns?: number;
  /** `edgeloop worker` processes (default 2), each running `concurrency` jobs at once (default 6). */
  workers?: number;
  concurrency?: number;
  /** Simulated decode pace, ms per token (default 4): paces the run so the kill lands mid-turn. */
  decodeMsPerToken?: number;
  /** Kill once the store holds this share of the records (default 0.4) and the trainer acknowledged at least one group. */
  killAt?: number;
  /** Seed of the scripted policy and the rollout (default 3). */
  seed?: number;
  /** Job lease, seconds (default 2): the new workers reclaim the dead ones' jobs after it. */
  leaseSeconds?: number;
  /** Give up waiting for the batch after this long, ms (default 240,000). */
  deadlineMs?: number;
  log?: (line: string) => void;
}

/** What {@link runWholeRestart} observed, and the properties it checked. */
export interface WholeRestartReport {
  trajectories: number;
  /** Records in the store when everything was killed, and groups the trainer had acknowledged then. */
  atKill: { records: number; acked_groups: number; engine_inflight: number };
  /** Records after the restart; keys without one (must be empty); groups whose `records` counter is not `n` (must be empty). */
  records: number;
  missing: string[];
  miscounted: string[];
  /** Records the trainer received that differ from the uninterrupted run's (must be empty). */
  unequal: string[];
  /** Groups delivered again after the trainer's ack of them had been confirmed (must be empty). */
  redelivered_after_ack: string[];
  /** Groups delivered to the trainer in all, and deliveries of a group it had read but not yet acked (allowed: at-least-once). */
  delivered_groups: number;
  repeat_deliveries_unacked: number;
  /** The batch as the restarted serve reports it. */
  batch: { done: boolean; ok: number; failed: number; lost: unknown };
  tool_executions: { run: number; reference: number };
  /**
   * Engine tokens: decoded before the kill (answered replies plus in-flight
   * decodes), decoded in all (every reply plus decodes cut by a gone client),
   * the uninterrupted run's, and the share of the tokens decoded before the
   * kill that were not decoded again: `1 − (all − reference) / before`.
   * `regenerated_answered` counts tokens of replies that reached edgeloop and
   * were asked for again (a turn answered but not yet checkpointed at the kill).
   */
  tokens: { before_kill: number; all: number; reference: number; regenerated: number; regenerated_answered: number; work_kept: number };
  ms: { reference: number; before_kill: number; restart_to_done: number };
  violations: string[];
}


/** @throws RangeError naming the option when one is out of range (before anything starts). */
function checkOptions(o: WholeRestartOptions): void {
  const int = (v: number | undefined, name: string, min: number, max = 1_000_000) => {
    if (v !== undefined && (!Number.isInteger(v) || v < min || v > max)) throw new RangeError(`${name} must be an integer in ${min}..${max}, got ${v}`);
  };
  int(o.rows, "rows", 1);
  int(o.n, "n", 1, 1024);
  int(o.toolTurns, "toolTurns (--tool-turns)", 0, 64);
  int(o.workers, "workers", 1, 64);
  int(o.concurrency, "concurrency", 1, 1024);
  if (o.killAt !== undefined && !(o.killAt > 0 && o.killAt < 1)) throw new RangeError(`killAt (--kill-at) must be a share of the records strictly between 0 and 1, got ${o.killAt}`);
  if (o.decodeMsPerToken !== undefined && !(o.decodeMsPerToken >= 0)) throw new RangeError(`decodeMsPerToken must be >= 0, got ${o.decodeMsPerToken}`);
  if (o.leaseSeconds !== undefined && !(o.leaseSeconds >= 0.1)) throw new RangeError(`leaseSeconds must be >= 0.1, got ${o.leaseSeconds}`);
}

/** The example policy with `k` extra calc tool turns before each rule's own turns (each answered by the example calc tool). */
export function longerPolicy(k: number, seed: number): Record<string, unknown> {
  const policy = JSON.parse(readFileSync(join(PACKAGE_ROOT, "examples", "policy.json"), "utf8")) as { rules: { when: string; turns: unknown[] }[] };
  const extra = Array.from({ length: k }, (_, j) => `<think>\nStep ${j + 1}: let me check ${j + 1}+${j + 2} first.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "${j + 1}+${j + 2}"}}\n</tool_call>`);
  return { ...policy, seed, rules: policy.rules.map((r) => ({ ...r, turns: [...extra, ...r.turns] })) };
}

type Proc = ReturnType<typeof Bun.spawn>;

/**
 * Issue 31's whole-system restart: serve (queue mode), `workers` workers and
 * an inference gateway (`edgeloop gateway`, routing state in Redis) run as
 * real processes over two simulated engine replicas and the example tool
 * server (both in this process: they stay up, as GPUs and tool environments
 * would); a trainer in this process reads complete groups with a consumer
 * group and acks them. Once `killAt` of the records are stored, serve, every
 * worker, the gateway and Redis are SIGKILLed together; Redis starts again
 * from its append-only file, then the gateway, serve and fresh workers on the
 * same ports and flags. Checks: every trajectory has exactly one record, what
 * the trainer received equals an uninterrupted in-process run with the same
 * seed (token ids, masks, log-probs, rewards), no acknowledged group is
 * delivered again, the restarted serve reports the batch done with nothing
 * lost, tools ran once per call; and measures the work kept.
 * @throws Error when a component does not start, or the batch does not finish by the deadline.
 */
export async function runWholeRestart(o: WholeRestartOptions): Promise<WholeRestartReport> {
  checkOptions(o);
  const n = o.n ?? 4;
  const rowsN = o.rows ?? 24;
  const total = rowsN * n;
  const seed = o.seed ?? 3;
  const log = o.log ?? (() => {});
  const lease = o.leaseSeconds ?? 2;
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-restart-"));
  const prefix = `wr:${crypto.randomUUID().slice(0, 8)}:`;
  const examples = readFileSync(join(PACKAGE_ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n");
  const rows = Array.from({ length: rowsN }, (_, i) => ({ ...JSON.parse(examples[i % examples.length]!), uid: `wr${i}` }));
  const script = longerPolicy(o.toolTurns ?? 6, seed);
  const rollout = { n, seed, responseLength: 2048, maxModelLen: 8192 };
  const rolloutFlags = ["--n", String(n), "--seed", String(seed), "--response-length", "2048", "--max-model-len", "8192"];
  const procs: Proc[] = [];
  const cleanups: (() => unknown)[] = [];
  const violations: string[] = [];
  // Ctrl-C or a SIGTERM to this process: the children die with it and every wait below ends (then the cleanups run).
  let interrupted: string | null = null;
  const onSignal = (sig: string) => {
    interrupted = sig;
    for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
  };
  const onInt = () => onSignal("SIGINT");
  const onTerm = () => onSignal("SIGTERM");
  process.on("SIGINT", onInt);
  process.on("SIGTERM", onTerm);
  const alive = () => {
    if (interrupted) throw new Error(`interrupted by ${interrupted}`);
  };
  try {
    // 1. The uninterrupted reference, in process on the memory store.
    const { records: reference, engine: refEngine, executions: refExecutions, ms: refMs } = await runReference({ script, seed, dir, toolTimeoutMs: 5_000, flags: rollout, batch: { rows, global_steps: 1, model_version: "v1", validate: false }, cleanups });
    const refTokens = refEngine.replicas.reduce((a, r) => a + r.engine.stats.completion_tokens, 0);
    if (reference.size !== total) violations.push(`the uninterrupted run stored ${reference.size} of ${total} records`);
    log(`reference: ${reference.size} records, ${refTokens} engine tokens in ${(refMs / 1000).toFixed(1)} s`);

    // 2. The system: engine replicas and tools stay up; Redis, gateway, serve and workers are processes.
    const engine = await startSimEngine({ script, replicas: 2, latency: { prefill_ms_per_token: 0, decode_ms_per_token: o.decodeMsPerToken ?? 4 } });
    cleanups.push(() => engine.stop());
    const tools = chaosToolServer({ timeouts: 0, seed });
    cleanups.push(() => tools.stop());
    const toolsFile = join(dir, "tools.json");
    writeFileSync(toolsFile, toolsFileText(tools.port, 5_000));
    cleanups.push(() => deletePrefix(o.redis.url, prefix));
    const [gatewayPort, servePort] = [await freePort(), await freePort()];
    const gatewayUrl = `http://127.0.0.1:${gatewayPort}`;
    const serveUrl = `http://127.0.0.1:${servePort}`;
    const env = { ...process.env, NO_COLOR: "1", EDGELOOP_STORE_RECONNECT_MAX_MS: "200" };
    const main = join(PACKAGE_ROOT, "infra", "cli", "main.ts");
    let life = 0;
    const spawn = (name: string, args: string[]): Proc => {
      const p = Bun.spawn([process.execPath, main, ...args], { stdout: Bun.file(join(dir, `${name}.${life}.out`)), stderr: Bun.file(join(dir, `${name}.${life}.err`)), env });
      procs.push(p);
      return p;
    };
    const answers = async (url: string, what: string, p: Proc): Promise<void> => {
      const by = Date.now() + 60_000; // a hang bound only: a start takes seconds
      for (;;) {
        alive();
        if (p.exitCode !== null) throw new Error(`${what} exited ${p.exitCode}: ${readFileSync(join(dir, `${what}.${life}.err`), "utf8").slice(-800)}`);
        const ok = await fetch(`${url}/health`, { signal: AbortSignal.timeout(5_000) }).then((r) => (r.body?.cancel(), r.status === 200), () => false);
        if (ok) return;
        if (Date.now() > by) throw new Error(`${what} did not answer /health at ${url}`);
        await Bun.sleep(50);
      }
    };
    const names = ["gateway", "serve", ...Array.from({ length: o.workers ?? 2 }, (_, i) => `worker${i}`)];
    const system = async (): Promise<Proc[]> => {
      const gw = spawn("gateway", ["gateway", "--replicas", engine.urls.join(","), "--port", String(gatewayPort), "--store", o.redis.url, "--store-prefix", prefix]);
      await answers(gatewayUrl, "gateway", gw);
      const common = ["--store", o.redis.url, "--store-prefix", prefix, "--engine", gatewayUrl, "--tools", toolsFile];
      const sv = spawn("serve", ["serve", "--port", String(servePort), "--jobs", "queue", ...common, ...rolloutFlags, "--lost-grace", "10"]);
      await answers(serveUrl, "serve", sv);
      const ws = Array.from({ length: o.workers ?? 2 }, (_, i) =>
        spawn(`worker${i}`, ["worker", ...common, "--max-model-len", "8192", "--concurrency", String(o.concurrency ?? 6), "--lease", String(lease), "--idle-exit", "3", "--consumer", `w${life}-${i}`]),
      );
      return [gw, sv, ...ws];
    };
    const t1 = performance.now();
    let live = await system();
    const posted = await fetch(`${serveUrl}/v1/rollouts`, { signal: AbortSignal.timeout(60_000), method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, global_steps: 1, model_version: "v1", validate: false }) });
    if (posted.status !== 202) throw new Error(`POST /v1/rollouts answered ${posted.status}: ${await posted.text()}`);
    const batch = (await posted.json()) as { batch_id: string; keys: string[] };

    // The trainer: reads complete groups and acks each; an ack is confirmed once Redis answered it.
    const q = createRedisTransferQueue({ url: o.redis.url, prefix });
    cleanups.push(() => q.close());
    const delivered = new Map<string, TrajectoryRecord[][]>();
    const ackedAt = new Set<string>(); // uids whose ack Redis answered
    const redelivered: string[] = [];
    let trainerDone = false;
    const trainer = (async () => {
      while (!trainerDone) {
        const groups = await q.readCompleteGroups({ consumer: "trainer-1", max: 16, block_ms: 200 }).catch(() => null);
        if (!groups) {
          await Bun.sleep(100);
          continue;
        }
        for (const g of groups) {
          if (ackedAt.has(g.uid)) redelivered.push(g.uid);
          delivered.set(g.uid, [...(delivered.get(g.uid) ?? []), g.records]);
        }
        if (!groups.length) continue;
        for (;;) {
          const ok = await q.ack(groups.map((g) => g.delivery_id)).then(() => true, () => false);
          if (ok) break;
          await Bun.sleep(100);
        }
        for (const g of groups) ackedAt.add(g.uid);
      }
    })();
    const storedRecords = async (): Promise<number> => {
      let c = 0;
      for (const r of rows) c += (await q.groupStatus(r.uid)).records;
      return c;
    };

    // 3. Wait for the kill point, then kill everything at once.
    const deadline = Date.now() + (o.deadlineMs ?? 240_000);
    const killAt = Math.ceil((o.killAt ?? 0.4) * total);
    let atKillRecords = 0;
    for (;;) {
      alive();
      // A process that exits before the kill (a bad flag, a crash) is named with its last lines, not waited on.
      for (const [i, p] of live.entries()) {
        if (p.exitCode !== null) throw new Error(`${names[i]} exited ${p.exitCode} before the kill: ${readFileSync(join(dir, `${names[i]}.${life}.err`), "utf8").slice(-800)}`);
      }
      atKillRecords = await storedRecords().catch(() => 0);
      if (atKillRecords >= killAt && ackedAt.size > 0) break;
      if (Date.now() > deadline) throw new Error(`the kill point (${killAt} records, a group acked) never came: ${atKillRecords} records`);
      await Bun.sleep(20);
    }
    const inflight = engine.replicas.flatMap((r) => r.engine.requests.filter((l) => l.started_ms !== undefined && l.ended_ms === undefined && l.fault === undefined));
    const answeredAtKill = engine.replicas.reduce((a, r) => a + r.engine.stats.completion_tokens, 0);
    const decodingAtKill = inflight.reduce((a, l) => a + (l.decoded ?? 0), 0);
    const ackedAtKill = ackedAt.size;
    for (const p of live) p.kill("SIGKILL");
    await o.redis.stop();
    await Promise.all(live.map((p) => p.exited));
    const beforeKillMs = performance.now() - t1;
    log(`killed serve, ${live.length - 2} workers, the gateway and Redis at ${atKillRecords}/${total} records, ${ackedAtKill} groups acked, ${inflight.length} engine requests decoding (${decodingAtKill} tokens in)`);

    // 4. Start everything again: Redis from its append-only file, then the processes with the same flags and ports.
    const t2 = performance.now();
    await o.redis.start();
    life++;
    live = await system();
    type BatchStatus = { done: boolean; counts: { ok: number; failed: number }; lost: unknown };
    let status = null as BatchStatus | null;
    for (;;) {
      alive();
      const res = await fetch(`${serveUrl}/v1/rollouts/${batch.batch_id}`, { signal: AbortSignal.timeout(5_000) }).catch(() => null);
      if (res?.status === 200) status = (await res.json()) as BatchStatus;
      else await res?.body?.cancel();
      if (status?.done && delivered.size === rowsN) break;
      if (Date.now() > deadline) throw new Error(`the batch did not finish after the restart: ${JSON.stringify(status)}; ${delivered.size}/${rowsN} groups delivered`);
      await Bun.sleep(100);
    }
    const restartMs = performance.now() - t2;
    // The trainer stops; one more read would show any group still due to it (an acked one delivered again).
    trainerDone = true;
    await trainer;
    const extra = await q.readCompleteGroups({ consumer: "trainer-1", max: 100, block_ms: 0 });
    for (const g of extra) if (ackedAt.has(g.uid)) redelivered.push(g.uid);

    // 5. Checks.
    let records = 0;
    const missing: string[] = [];
    for (const key of batch.keys) (await q.get(key)) ? records++ : missing.push(key);
    const miscounted: string[] = [];
    for (const r of rows) {
      const g = await q.groupStatus(r.uid);
      if (g.records !== n) miscounted.push(`${r.uid}: ${g.records}`);
    }
    const unequal: string[] = [];
    let firstDiff: string[] = [];
    let repeats = 0;
    for (const [uid, deliveries] of delivered) {
      repeats += deliveries.length - 1;
      for (const recs of deliveries) {
        if (recs.length !== n) unequal.push(`${uid}: ${recs.length} records`);
        for (const r of recs) {
          const want = reference.get(r.key);
          if (want && Bun.deepEquals(comparableRecord(r), comparableRecord(want))) continue;
          if (!unequal.length) firstDiff = want ? differingFields(comparableRecord(r), comparableRecord(want)) : ["(no reference record)"];
          unequal.push(r.key);
        }
      }
    }
    const all = engine.replicas.reduce((a, r) => a + r.engine.stats.completion_tokens, 0);
    const cut = engine.replicas.flatMap((r) => r.engine.requests).filter((l: SimRequestLog) => l.fault === "client_gone").reduce((a, l) => a + (l.decoded ?? 0), 0);
    const beforeKill = answeredAtKill + decodingAtKill;
    const regenerated = all + cut - refTokens;
    // At most each session running at the kill decodes its current turn again: a resume from the checkpoint, not from the start.
    let longestTurn = 0;
    for (const r of reference.values()) {
      let run = 0;
      for (const m of r.response_mask) longestTurn = Math.max(longestTurn, (run = m ? run + 1 : 0));
    }
    const running = (o.workers ?? 2) * (o.concurrency ?? 6);
    if (regenerated > running * longestTurn) violations.push(`${regenerated} tokens decoded again, more than a turn (≤ ${longestTurn} tokens) for each of the ${running} sessions that could be running at the kill`);
    const tokens = { before_kill: beforeKill, all: all + cut, reference: refTokens, regenerated, regenerated_answered: all - refTokens, work_kept: beforeKill ? 1 - regenerated / beforeKill : 1 };
    const toolRun = await tools.executions();
    // Every ack the trainer saw confirmed is in Redis: nothing is pending in its consumer group (an ack lost
    // in the restart would leave its group pending, to be delivered again after the visibility timeout).
    const raw = createRedisTransferQueue({ url: o.redis.url, prefix });
    cleanups.push(() => raw.close());
    const pendingReply = (await (raw as unknown as { redis: { exec(c: string[]): Promise<unknown> } }).redis.exec(["XPENDING", raw.layout.stream("train", 0), raw.group])) as [number, ...unknown[]];
    const pending = Number(pendingReply?.[0] ?? 0);
    if (pending !== 0) violations.push(`${pending} delivered groups are still pending in the trainer's consumer group: acks were lost`);
    // Resumed, not restarted: each trajectory asked the engine at most once more than the uninterrupted run
    // did (the turn cut at the kill); a restart from scratch asks again for every turn it had.
    const perKey = (logs: readonly SimRequestLog[]) => {
      const m = new Map<string, number>();
      for (const l of logs) if (l.routing_key) m.set(l.routing_key, (m.get(l.routing_key) ?? 0) + 1);
      return m;
    };
    const runLogs = engine.replicas.flatMap((r) => r.engine.requests);
    const refLogs = refEngine.replicas.flatMap((r) => r.engine.requests);
    const complete = engine.replicas.every((r) => r.engine.requests.length === r.engine.stats.requests) && refEngine.replicas.every((r) => r.engine.requests.length === r.engine.stats.requests);
    const extraCalls: string[] = [];
    if (complete) {
      const want = perKey(refLogs);
      for (const [key, got] of perKey(runLogs)) if (got > (want.get(key) ?? 0) + 1) extraCalls.push(`${key} (${got} engine calls, ${want.get(key) ?? 0} uninterrupted)`);
      if (extraCalls.length) violations.push(`${extraCalls.length} trajectories asked the engine more than once again: not resumed from their checkpoints (e.g. ${extraCalls.slice(0, 3).join(", ")})`);
    }
    if (inflight.length === 0) violations.push("no engine request was decoding at the kill: the kill landed between turns, nothing was cut (raise --rows or lower --kill-at)");
    if (atKillRecords >= total) violations.push("every record was stored before the kill: nothing was interrupted (lower --kill-at)");
    if (missing.length) violations.push(`${missing.length} trajectories have no record (e.g. ${missing.slice(0, 3).join(", ")})`);
    if (miscounted.length) violations.push(`groups whose record count is not ${n}: ${miscounted.slice(0, 5).join(", ")}`);
    if (unequal.length) violations.push(`${unequal.length} delivered records differ from the uninterrupted run (e.g. ${unequal.slice(0, 3).join(", ")}; the first differs in ${firstDiff.join(", ")})`);
    if (redelivered.length) violations.push(`acknowledged groups delivered again: ${redelivered.slice(0, 5).join(", ")}`);
    if (delivered.size !== rowsN) violations.push(`${delivered.size} of ${rowsN} groups reached the trainer`);
    if (!status?.done || status.counts.ok !== total || status.counts.failed !== 0 || status.lost) violations.push(`the restarted serve reports ${JSON.stringify(status)}`);
    if (toolRun !== refExecutions) violations.push(`tools executed ${toolRun} times, the uninterrupted run ${refExecutions}`);
    if (regenerated < 0) violations.push(`fewer engine tokens (${all + cut}) than the uninterrupted run (${refTokens})`);
    for (const p of live) p.kill("SIGTERM");
    await Promise.all(live.map((p) => p.exited));
    return {
      trajectories: total,
      atKill: { records: atKillRecords, acked_groups: ackedAtKill, engine_inflight: inflight.length },
      records,
      missing,
      miscounted,
      unequal,
      redelivered_after_ack: redelivered,
      delivered_groups: delivered.size,
      repeat_deliveries_unacked: repeats,
      batch: { done: status?.done ?? false, ok: status?.counts.ok ?? 0, failed: status?.counts.failed ?? 0, lost: status?.lost ?? null },
      tool_executions: { run: toolRun, reference: refExecutions },
      tokens,
      ms: { reference: refMs, before_kill: beforeKillMs, restart_to_done: restartMs },
      violations,
    };
  } finally {
    process.off("SIGINT", onInt);
    process.off("SIGTERM", onTerm);
    for (const p of procs) if (p.exitCode === null) p.kill("SIGKILL");
    await Promise.all(procs.map((p) => p.exited));
    for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => {});
    if (process.env.EDGELOOP_CHAOS_KEEP) console.error(`restart run: logs kept in ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

/** The report as lines: counts, the token figures and the verdict. */
export function formatRestartReport(r: WholeRestartReport): string {
  const t = r.tokens;
  const lines = [
    `trajectories                         ${r.trajectories}`,
    `records stored at the kill           ${r.atKill.records}`,
    `groups acked by the trainer then     ${r.atKill.acked_groups}`,
    `engine requests decoding then        ${r.atKill.engine_inflight}`,
    `records after the restart            ${r.records} (no record: ${r.missing.length})`,
    `groups delivered / again (unacked)   ${r.delivered_groups} / ${r.repeat_deliveries_unacked}`,
    `acked groups delivered again         ${r.redelivered_after_ack.length}`,
    `delivered records unlike reference   ${r.unequal.length}`,
    `tool executions (run / reference)    ${r.tool_executions.run} / ${r.tool_executions.reference}`,
    `engine tokens before the kill        ${t.before_kill}`,
    `engine tokens in all / reference     ${t.all} / ${t.reference}`,
    `tokens decoded again                 ${t.regenerated} (of answered replies: ${t.regenerated_answered})`,
    `work kept                            ${(100 * t.work_kept).toFixed(1)} % of the tokens decoded before the kill`,
    `seconds: reference / to kill / restart to done  ${(r.ms.reference / 1000).toFixed(1)} / ${(r.ms.before_kill / 1000).toFixed(1)} / ${(r.ms.restart_to_done / 1000).toFixed(1)}`,
  ];
  lines.push(r.violations.length ? `FAIL: ${r.violations.join("; ")}` : "PASS: every trajectory stored once, the trainer's groups equal the uninterrupted run, no acked group delivered again");
  return lines.join("\n");
}
