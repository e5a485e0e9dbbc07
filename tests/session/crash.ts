import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { createToolsApp } from "../../infra/tools/app.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL } from "../helpers/redis.ts";
import { POLICY, ROOT } from "./fixtures.ts";

/** A tool server that also counts the requests it gets per call_id (re-sends after a kill show up here). */
export function countingToolServer() {
  const app = createToolsApp({});
  const requests = new Map<string, number>();
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      if (req.method === "POST") {
        const body = (await req.clone().json().catch(() => ({}))) as { call_id?: string };
        if (body.call_id) requests.set(body.call_id, (requests.get(body.call_id) ?? 0) + 1);
      }
      return app.fetch(req);
    },
  });
  const url = `http://127.0.0.1:${server.port}`;
  return {
    url,
    requests,
    stats: async () => (await (await fetch(`${url}/stats`)).json()) as { executions: number },
    stop: () => server.stop(true),
  };
}

/** Options of {@link crashRun}. */
export interface CrashRunOptions {
  rows: number;
  n: number;
  /** SIGKILLs before the final, uninterrupted start. */
  kills: number;
  /** Random source for kill points (seeded in tests). */
  random: () => number;
  decodeMsPerToken?: number;
}

/** Figures of one crash run (or a reference run with `kills: 0`). */
export interface CrashRunResult {
  records: Map<string, TrajectoryRecord>;
  /** Per key: write attempts that reached the transfer queue, and how many stored the record. */
  attempts: Map<string, number>;
  stored: Map<string, number>;
  /** Attempts the queue answered "already stored" (a kill hit between a write and its `done` commit). */
  deduped: number;
  executions: number;
  callIds: number;
  resent: number;
  kills: number;
  starts: number;
  killAfterWrites: number[];
  ms: number;
}

/**
 * Runs `rows × n` trajectories in a child `bun` process (tests/session/crash-child.ts)
 * with durable sessions in Redis, SIGKILLs it `kills` times at random points
 * (after a random number of new records, or a random delay when nothing is
 * written yet), restarts it each time, and lets the last start finish.
 */
export async function crashRun(o: CrashRunOptions): Promise<CrashRunResult> {
  const t0 = performance.now();
  const prefix = randomPrefix("crash");
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-crash-"));
  const tools = countingToolServer();
  let engine: RunningSimEngine | undefined;
  try {
    engine = await startSimEngine({ script: { ...POLICY, seed: 7 }, latency: { prefill_ms_per_token: 0, decode_ms_per_token: o.decodeMsPerToken ?? 0.3 } });
    const toolsFile = join(dir, "tools.json");
    writeFileSync(toolsFile, readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", new URL(tools.url).port));
    const log = join(dir, "writes.log");
    const lines = () => (existsSync(log) ? readFileSync(log, "utf8").split("\n").filter((l) => l.includes(" stored") || l.includes(" dup")) : []);
    const all = () => (existsSync(log) ? readFileSync(log, "utf8").split("\n").filter(Boolean) : []);
    const total = o.rows * o.n;
    const env = { ...process.env, CRASH_PREFIX: prefix, CRASH_ENGINE: engine.urls[0]!, CRASH_TOOLS: toolsFile, CRASH_ROWS: String(o.rows), CRASH_N: String(o.n), CRASH_LOG: log };
    const killAfterWrites: number[] = [];
    let starts = 0;
    for (let k = 0; k <= o.kills; k++) {
      starts++;
      const child = Bun.spawn([process.execPath, join(import.meta.dir, "crash-child.ts")], { env, stdout: "pipe", stderr: "pipe" });
      if (k < o.kills) {
        const base = lines().length;
        const remaining = total - base;
        const target = base + 1 + Math.floor(o.random() * Math.max(1, Math.floor(remaining / (o.kills - k + 1))));
        const deadline = performance.now() + 20_000;
        while (lines().length < target && performance.now() < deadline && child.exitCode === null) await Bun.sleep(5);
        // Let it run a little further into the next steps, then kill it mid-flight.
        await Bun.sleep(Math.floor(o.random() * 40));
        child.kill("SIGKILL");
        await child.exited;
        killAfterWrites.push(lines().length);
      } else {
        const code = await child.exited;
        if (code !== 0) throw new Error(`final child exited ${code}: ${await new Response(child.stderr).text()}`);
      }
    }
    const stored = new Map<string, number>();
    const attempts = new Map<string, number>();
    let deduped = 0;
    for (const l of all()) {
      const [key, s] = l.split(" ");
      if (s === "attempt") attempts.set(key!, (attempts.get(key!) ?? 0) + 1);
      else if (s === "stored") stored.set(key!, (stored.get(key!) ?? 0) + 1);
      else deduped++;
    }
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
    const records = new Map<string, TrajectoryRecord>();
    try {
      for (let i = 0; i < o.rows; i++) {
        for (let s = 0; s < o.n; s++) {
          const key = `crash${i}_${s}_0`;
          const r = await q.get(key);
          if (r) records.set(key, r);
        }
      }
    } finally {
      await q.close();
    }
    const executions = (await tools.stats()).executions;
    let resent = 0;
    for (const n of tools.requests.values()) resent += n - 1;
    return { records, attempts, stored, deduped, executions, callIds: tools.requests.size, resent, kills: o.kills, starts, killAfterWrites, ms: performance.now() - t0 };
  } finally {
    await engine?.stop();
    tools.stop();
    await deleteByPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  }
}

export { mulberry32 } from "../../infra/chaos/chaos-run.ts";

/** A record without wall-clock figures (metrics seconds). */
export function comparableRecord(r: TrajectoryRecord) {
  const { metrics, ...rest } = r;
  return { ...rest, num_preempted: metrics.num_preempted };
}
