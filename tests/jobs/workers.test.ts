import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { comparableRecord, countingToolServer } from "../session/crash.ts";
import { POLICY, ROOT, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Several `edgeloop worker` processes drain a batch that `serve`'s service enqueued; one worker is
// SIGKILLed mid-run. Every trajectory completes exactly once, and the records equal an inline run's.
const redis = await requireRedis();
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const ROWS_N = 20;
const N = 4;

describe.skipIf(!redis)("edgeloop worker processes", () => {
  const prefix = randomPrefix("workers");
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-workers-"));
  let engine: RunningSimEngine;
  let tools: ReturnType<typeof countingToolServer>;
  let refTools: ReturnType<typeof countingToolServer>;
  let toolsFile: string;
  let refToolsFile: string;
  const procs: ReturnType<typeof Bun.spawn>[] = [];
  const rows = Array.from({ length: ROWS_N }, (_, i) => ({ ...ROWS[i % ROWS.length], uid: `job${i}` }));
  const flags = () => ({ engine: engine.urls[0]!, tools: toolsFile, n: N, seed: 7, maxModelLen: 4096 });

  beforeAll(async () => {
    engine = await startSimEngine({ script: { ...POLICY, seed: 7 }, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 1 } });
    tools = countingToolServer();
    refTools = countingToolServer();
    const example = readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8");
    toolsFile = join(dir, "tools.json");
    writeFileSync(toolsFile, example.replaceAll("{port}", new URL(tools.url).port));
    refToolsFile = join(dir, "tools-ref.json");
    writeFileSync(refToolsFile, example.replaceAll("{port}", new URL(refTools.url).port));
  });
  afterAll(async () => {
    for (const p of procs) p.kill("SIGKILL");
    await engine.stop();
    tools.stop();
    refTools.stop();
    await deleteByPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  });

  const spawnWorker = (name: string) => {
    const p = Bun.spawn(
      [process.execPath, MAIN, "worker", "--store", REDIS_URL, "--store-prefix", prefix, "--engine", engine.urls[0]!, "--tools", toolsFile, "--max-model-len", "4096", "--concurrency", "6", "--idle-exit", "3", "--lease", "1.5", "--consumer", name],
      { stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } },
    );
    procs.push(p);
    return p;
  };

  test(`${ROWS_N * N} trajectories, 3 workers, one SIGKILLed mid-run: all complete once, records equal the inline run's`, async () => {
    // Reference: the in-process path (memory store, no sessions, no queue).
    const inline = await buildRuntime({ ...flags(), tools: refToolsFile });
    const ref = inline.service.submit({ rows, global_steps: 2, model_version: "v1", validate: false });
    await ref.run.run();
    await inline.close();
    const reference = new Map(ref.run.records().map((r) => [r.key, r]));
    const refExecutions = (await refTools.stats()).executions;
    expect(reference.size).toBe(ROWS_N * N);

    let api: Runtime | undefined;
    try {
      api = await buildRuntime({ ...flags(), store: REDIS_URL, storePrefix: prefix }, { jobs: "queue", jobQueue: { leaseMs: 1500 } });
      const app = createRolloutsApp({ service: api.service });
      const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, global_steps: 2, model_version: "v1" }) });
      expect(res.status).toBe(202);
      const { batch_id, keys } = (await res.json()) as { batch_id: string; keys: string[] };
      expect(keys.length).toBe(ROWS_N * N);
      const queued = (await (await app.request("/v1/queue")).json()) as Record<string, number>;
      expect(queued).toMatchObject({ mode: "queue", depth: ROWS_N * N, in_flight: 0 });

      // The victim starts first and is killed while it holds claimed jobs (under load the
      // others could otherwise drain the queue before it even starts).
      const redis = rawRedis();
      const victimPending = async () => {
        const [, , , consumers] = (await redis.xpending(`${prefix}jobs`, "workers")) as [number, string, string, [string, string][] | null];
        return Number((consumers ?? []).find(([c]) => c === "victim")?.[1] ?? 0);
      };
      const victim = spawnWorker("victim");
      const deadline = Date.now() + 30_000;
      while ((await victimPending()) === 0 && Date.now() < deadline) await Bun.sleep(20);
      const workers = [spawnWorker("w1"), spawnWorker("w2"), victim];
      const stats = async () => (await (await app.request(`/v1/rollouts/${batch_id}`)).json()) as { done: boolean; counts: Record<string, number> };
      while (((await stats()).counts.ok < 15 || (await victimPending()) === 0) && Date.now() < deadline) await Bun.sleep(20);
      await redis.quit();
      const midway = await stats();
      expect(midway.done).toBe(false);
      const q = (await (await app.request("/v1/queue")).json()) as { in_flight: number };
      expect(q.in_flight).toBeGreaterThan(0);
      workers[2]!.kill("SIGKILL");
      await workers[2]!.exited;

      const run = await api.service.lookup(batch_id);
      await Promise.race([run.run(), Bun.sleep(40_000)]);
      const final = await stats();
      expect(final.counts).toEqual({ total: ROWS_N * N, pending: 0, running: 0, finished: ROWS_N * N, reused: 0, records: ROWS_N * N, ok: ROWS_N * N, failed: 0, truncated: 0 });

      // The survivors drain the queue, reclaim the victim's jobs, then scale to zero.
      const summaries = await Promise.all(
        workers.slice(0, 2).map(async (w) => {
          const code = await w.exited;
          const out = await new Response(w.stdout).text();
          if (code !== 0) throw new Error(`worker exited ${code}: ${await new Response(w.stderr).text()}`);
          return JSON.parse(out.trim().split("\n").pop()!) as { completed: number; reclaimed: number; exit: string };
        }),
      );
      console.log(`workers: killed 'victim' after ${midway.counts.ok} records; survivors ${JSON.stringify(summaries)}`);
      for (const s of summaries) expect(s.exit).toBe("idle");
      expect(summaries.reduce((n, s) => n + s.reclaimed, 0)).toBeGreaterThan(0);
      expect(await (await app.request("/v1/queue")).json()).toMatchObject({ depth: 0, in_flight: 0, oldest_age_ms: 0 });

      // Exactly once: each group counted n stored records (a second put of a key is refused, not counted).
      for (let i = 0; i < ROWS_N; i++) expect(await api.store.groupStatus(`job${i}`)).toMatchObject({ expected: N, finished: N, records: N, failed: 0, complete: true });
      const stored = new Map<string, TrajectoryRecord>();
      for (const k of keys) stored.set(k, (await api.store.get(k))!);
      for (const [key, r] of reference) expect(comparableRecord(stored.get(key)!)).toEqual(comparableRecord(r));
      // No tool call executed twice: as many executions as the inline run made (tools dedupe re-sent call ids).
      expect((await tools.stats()).executions).toBe(refExecutions);
      expect(tools.requests.size).toBe(refExecutions);
    } finally {
      await api?.close();
    }
  }, HANG_MS);
});
