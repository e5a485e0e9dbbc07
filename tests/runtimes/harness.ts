import { HANG_MS } from "../helpers/bounds.ts";
import { afterAll, beforeAll } from "bun:test";
import { readFileSync, rmSync } from "node:fs";
import { basename, join } from "node:path";
import { Miniflare } from "miniflare";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { validateTrajectory } from "../../shared/tokens/validate.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL } from "../helpers/redis.ts";

export const ROOT = join(import.meta.dir, "..", "..");
const POLICY = JSON.parse(readFileSync(join(ROOT, "examples", "policy.json"), "utf8"));

/** The loopback services a runtime test runs against: simulated engine, example tools, Upstash bridge over the test Redis. */
export interface Services {
  engine: RunningSimEngine;
  tools: ToolServer;
  bridge: UpstashBridge;
  token: string;
  prefix: string;
  toolsJson: string;
  stop(): Promise<void>;
}

/** E4 (edge-cases.md): a calc call whose turn ends on <|endoftext|> (151643), then the answer. */
export const E4_TURN1 = [151657, 198, 4913, 606, 788, 330, 26586, 497, 330, 16370, 788, 5212, 28099, 788, 330, 17, 10, 17, 95642, 151658, 151643];
const E4_RULE = { when: "What is 2+2?", turns: [{ token_ids: E4_TURN1, finish_reason: "stop" }, "The answer is 4.\n#### 4"] };

/** The E4 row (tool_agent, ground truth 4) with uid `uid`. */
export function e4Row(uid: string): Record<string, unknown> {
  return { uid, data_source: "edge", agent_name: "tool_agent", prompt: [{ role: "user", content: "What is 2+2?" }], reward_model: { style: "rule", ground_truth: "4" } };
}

export async function startServices(name: string): Promise<Services> {
  const engine = await startSimEngine({ script: { ...POLICY, seed: 7, rules: [E4_RULE, ...POLICY.rules] }, maxModelLen: 4096 });
  const tools = startToolServer({ port: 0, secret: "runtime-secret" });
  const token = crypto.randomUUID();
  const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
  const prefix = randomPrefix(name);
  const toolsJson = readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", String(tools.port));
  return {
    engine,
    tools,
    bridge,
    token,
    prefix,
    toolsJson,
    async stop() {
      await engine.stop();
      await tools.stop();
      await bridge.stop();
      await deleteByPrefix(prefix);
    },
  };
}

/** The batch the runtime tests post: 4 example rows with fixed uids, n = 2. */
export function batchRows(tag: string): Record<string, unknown>[] {
  return readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8")
    .trim()
    .split("\n")
    .slice(0, 4)
    .map((l, i) => ({ ...JSON.parse(l), uid: `${tag}${i}` }));
}

export const RUNTIME_CONFIG = { rollout: { n: 2, prompt_length: 512, response_length: 512, max_model_len: 4096, seed: 7 } };

/** Polls the queue (Redis over TCP) until every group is complete, then returns every record by key. */
export async function awaitRecords(prefix: string, uids: string[], n: number, timeoutMs = 40_000): Promise<Map<string, TrajectoryRecord>> {
  const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
  try {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const st = await Promise.all(uids.map((u) => q.groupStatus(u)));
      if (st.every((s) => s.complete)) break;
      if (Date.now() > end) throw new Error(`groups incomplete after ${timeoutMs} ms: ${JSON.stringify(st.map((s) => [s.uid, s.finished, s.records]))}`);
      await Bun.sleep(100);
    }
    const out = new Map<string, TrajectoryRecord>();
    for (const u of uids) for (let s = 0; s < n; s++) out.set(`${u}_${s}_0`, (await q.get(`${u}_${s}_0`))!);
    return out;
  } finally {
    await q.close();
  }
}

/** Checks every record passes the validator and ran its tools; returns the decoded tool-call count. */
export function checkRecords(records: Map<string, TrajectoryRecord>): number {
  let calls = 0;
  for (const r of records.values()) {
    if (r.error !== null) throw new Error(`${r.key}: ${r.error}`);
    validateTrajectory({ ...r, logprobs: r.rollout_log_probs }, { responseLength: 512, promptLength: 512, trackLogProbs: true });
    calls += r.extra_fields.tool_calls as number;
  }
  return calls;
}

/**
 * Checks an E4 record: 151643 kept with mask 1, then the observation that
 * closes the turn (`[151645, 198, 151644, 872, 198, 151665, …]`, mask 0), reward 1.
 */
export function checkE4Record(r: TrajectoryRecord): void {
  const n = E4_TURN1.length;
  const ids = r.response_ids.slice(0, n + 6);
  const mask = r.response_mask.slice(0, n + 6);
  const want = { error: null, ids: [...E4_TURN1, 151645, 198, 151644, 872, 198, 151665], mask: [...E4_TURN1.map(() => 1), 0, 0, 0, 0, 0, 0], reward: 1 };
  const got = { error: r.error, ids, mask, reward: r.reward_score };
  if (JSON.stringify(got) !== JSON.stringify(want)) throw new Error(`E4 record ${r.key}: ${JSON.stringify(got)} != ${JSON.stringify(want)}`);
}

/** A record without wall-clock metrics. */
export function comparableRecord(r: TrajectoryRecord) {
  const { metrics, ...rest } = r;
  return { ...rest, num_preempted: metrics.num_preempted };
}

/** A wrangler bundle of a Worker entry, built as `wrangler deploy --dry-run` builds it, and the workerd instance running it. */
export interface Workerd {
  mf: Miniflare;
  /**
   * Milliseconds the bundle took, its size in bytes, milliseconds until Miniflare was ready, and the sizes
   * wrangler reports on its `Total Upload: X KiB / gzip: Y KiB` line (what the README's Worker size row quotes).
   */
  figures: { bundle_ms: number; bundle_bytes: number; start_ms: number; upload_kib: number; gzip_kib: number };
  /** Stops workerd and removes the bundle. */
  stop(): Promise<void>;
}

/** A loopback TCP port free now (bound once, then released): for a server whose URL must be known before it starts. */
export function freePort(): number {
  const srv = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  const port = srv.port!;
  srv.stop(true);
  return port;
}

/**
 * Bundles `entry` (default: wrangler.toml's main) with the real wrangler and runs it in workerd
 * (Miniflare) with the SESSIONS Durable Object on SQLite storage and the given bindings;
 * `opts.port`: workerd also listens on `http://127.0.0.1:{port}` (for callers outside this process's dispatchFetch);
 * `opts.stdio`: receives workerd's stdout and stderr (the Worker's console output).
 * @throws Error with wrangler's output when the bundle fails.
 */
export async function startWorkerd(
  bindings: Record<string, string>,
  entry?: string,
  opts: { port?: number; stdio?: (stdout: NodeJS.ReadableStream, stderr: NodeJS.ReadableStream) => void } = {},
): Promise<Workerd> {
  const outdir = join(ROOT, ".wrangler", `test-${crypto.randomUUID().slice(0, 8)}`);
  const t0 = performance.now();
  const build = Bun.spawnSync(["node", join(ROOT, "node_modules", "wrangler", "bin", "wrangler.js"), "deploy", "--dry-run", "--outdir", outdir, ...(entry ? [entry] : [])], {
    cwd: ROOT,
    env: { ...process.env, WRANGLER_SEND_METRICS: "false", CI: "true" },
    stdout: "pipe",
    stderr: "pipe",
  });
  if (build.exitCode !== 0) throw new Error(`wrangler build failed: ${build.stderr.toString()}${build.stdout.toString()}`);
  const upload = /Total Upload: ([\d.]+) KiB \/ gzip: ([\d.]+) KiB/.exec(build.stdout.toString());
  if (!upload) throw new Error(`wrangler printed no "Total Upload" line: ${build.stdout.toString()}`);
  const module = join(outdir, entry ? basename(entry).replace(/\.ts$/, ".js") : "worker.js");
  const bundle_ms = performance.now() - t0;
  const t1 = performance.now();
  const mf = new Miniflare({
    modules: [{ type: "ESModule", path: module }],
    compatibilityDate: "2026-04-07",
    compatibilityFlags: ["nodejs_compat"],
    durableObjects: { SESSIONS: { className: "TrajectorySessionObject", useSQLite: true } },
    bindings,
    ...(opts.port ? { host: "127.0.0.1", port: opts.port } : {}),
    ...(opts.stdio ? { handleRuntimeStdio: opts.stdio } : {}),
  });
  await mf.ready;
  return {
    mf,
    figures: { bundle_ms, bundle_bytes: Bun.file(module).size, start_ms: performance.now() - t1, upload_kib: Number(upload[1]), gzip_kib: Number(upload[2]) },
    stop: async () => {
      await mf.dispose();
      rmSync(outdir, { recursive: true, force: true });
    },
  };
}

/** The bindings of the Worker entry against {@link startServices}' engine, tools and Upstash bridge. */
export function workerBindings(s: Services): Record<string, string> {
  return {
    EDGELOOP_ENGINE_URL: s.engine.urls[0]!,
    EDGELOOP_ENGINE_FORMAT: "vllm",
    EDGELOOP_TOOLS: s.toolsJson,
    EDGELOOP_TOOLS_SECRET: "runtime-secret",
    EDGELOOP_CONFIG: JSON.stringify(RUNTIME_CONFIG),
    EDGELOOP_STORE_PREFIX: s.prefix,
    UPSTASH_REDIS_REST_URL: s.bridge.url,
    UPSTASH_REDIS_REST_TOKEN: s.token,
    // These tests call the API without a bearer token: said explicitly (the Worker refuses otherwise).
    EDGELOOP_ALLOW_ANONYMOUS: "1",
  };
}

/**
 * Polls the groups of `uids` under `prefix` until every one is complete (or `timeoutMs` passes, then throws
 * with their statuses) and returns `[uid, expected, finished, records, failed]` for each, in order.
 */
export async function awaitGroups(prefix: string, uids: string[], timeoutMs = 40_000): Promise<(string | number | null)[][]> {
  const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
  try {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const st = await Promise.all(uids.map((u) => q.groupStatus(u)));
      if (st.every((x) => x.complete)) return st.map((x) => [x.uid, x.expected, x.finished, x.records, x.failed]);
      if (Date.now() > end) throw new Error(`groups incomplete: ${JSON.stringify(st)}`);
      await Bun.sleep(100);
    }
  } finally {
    await q.close();
  }
}

/** The services and the Worker a workerd test file runs against (see {@link workerdFixture}); read them inside a test or hook. */
export interface WorkerdFixture {
  readonly s: Services;
  readonly w: Workerd;
  /** `w.mf`: dispatchFetch reaches the Worker. */
  readonly mf: Miniflare;
}

/**
 * Registers beforeAll (only when `enabled`: {@link startServices}(`name`),
 * then {@link startWorkerd} of `entry` with {@link workerBindings}; timeout
 * `timeoutMs`, default 60 s) and afterAll (workerd, then the services,
 * stopped; whichever started). Call it at a file's top level.
 */
export function workerdFixture(name: string, opts: { enabled: boolean; entry?: string; timeoutMs?: number }): WorkerdFixture {
  let s: Services | undefined;
  let w: Workerd | undefined;
  beforeAll(async () => {
    if (!opts.enabled) return;
    s = await startServices(name);
    w = await startWorkerd(workerBindings(s), opts.entry);
  }, opts.timeoutMs ?? HANG_MS);
  afterAll(async () => {
    await w?.stop();
    await s?.stop();
  });
  return {
    get s() {
      return s!;
    },
    get w() {
      return w!;
    },
    get mf() {
      return w!.mf;
    },
  };
}
