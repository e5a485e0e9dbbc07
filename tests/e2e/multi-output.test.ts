import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { formatSummary } from "../../infra/cli/summary.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { RolloutRequest } from "../../shared/rollout/batch.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { validateTrajectory } from "../../shared/tokens/validate.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { delegatingQueue } from "../helpers/delegating-queue.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Edge case E1 (../shared/fixtures/edge-cases.md): a custom loop registered through
// agent_loop_config_path runs the single-turn loop twice and returns both outputs; n = 2,
// Redis store, concurrency 1. A group counts sessions, not records.
const redis = await requireRedis();
const ROOT = join(import.meta.dir, "..", "..");
const E1_ROW = { uid: "multi0", data_source: "edge", prompt: [{ role: "user", content: "Say hi." }], reward_model: { style: "rule", ground_truth: "1" } };

const dir = mkdtempSync(join(tmpdir(), "edgeloop-multi-"));
const CONFIG = join(dir, "config.json");
writeFileSync(
  CONFIG,
  JSON.stringify({ rollout: { agent: { agent_loop_config_path: join(ROOT, "tests", "agent-loop", "fixtures", "multi-output-loops.yaml"), default_agent_loop: "multi_output_agent" } } }),
);
const prefixes: string[] = [];
const runtimes: Runtime[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close();
  for (const p of prefixes) await deleteByPrefix(p);
  rmSync(dir, { recursive: true, force: true });
});

/** Logs every write with the group's sessions finished / records stored right after it. */
function watching(q: TransferQueue, log: string[]): TransferQueue {
  const note = async (key: string, what: string) => {
    const st = await q.groupStatus(key.split("_")[0]!);
    log.push(`${key} ${what} ${st.finished}/${st.records}${st.complete ? " complete" : ""}`);
  };
  return delegatingQueue(q, {
    put: async (r, o) => {
      const res = await q.put(r, o);
      await note(r.key, o?.last === false ? "more" : "last");
      return res;
    },
    markFailed: async (k, reason, f) => {
      const res = await q.markFailed(k, reason, f);
      await note(k, "failed");
      return res;
    },
    finishSession: async (u, s, n) => {
      const res = await q.finishSession(u, s, n);
      await note(`${u}_${s}`, `finish(${n})`);
      return res;
    },
  });
}

function summaryLines(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of text.split("\n")) {
    const m = /^\s*([a-z/ ()]+?)\s{2,}(\S+)$/.exec(line);
    if (m) out[m[1]!.trim()] = m[2]!;
  }
  return out;
}

async function runtime(prefix: string, log: string[] | null, jobs: "inline" | "queue" = "inline"): Promise<Runtime> {
  const rt = await buildRuntime(
    { config: CONFIG, store: REDIS_URL, storePrefix: prefix, n: 2, seed: 7, concurrency: 1, maxModelLen: 4096 },
    { ...(log ? { wrapStore: (q: TransferQueue) => watching(q, log) } : {}), jobs },
  );
  runtimes.push(rt);
  return rt;
}

describe.skipIf(!redis)("E1: a loop with several outputs per session (Redis, durable sessions)", () => {
  test("the fixture's command: `edgeloop rollout` with the custom loop, n = 2, Redis, concurrency 1", async () => {
    const prefix = randomPrefix("e1-cli");
    prefixes.push(prefix);
    writeFileSync(join(dir, "e1.jsonl"), JSON.stringify(E1_ROW) + "\n");
    const p = Bun.spawnSync(
      ["node", join(ROOT, "bin", "edgeloop.mjs"), "rollout", "--data", "e1.jsonl", "--config", CONFIG, "--n", "2", "--store", REDIS_URL, "--store-prefix", prefix, "--concurrency", "1", "--out", "e1-out.jsonl", "--no-progress"],
      { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } },
    );
    const stdout = p.stdout.toString();
    if (p.exitCode !== 0) throw new Error(`rollout exited ${p.exitCode}: ${p.stderr.toString()}`);
    const s = summaryLines(stdout);
    // Main printed `trajectories 2 / ok 4`: sessions and records are now counted apart.
    expect([s["sessions (trajectories)"], s["finished"], s["records"], s["ok"], s["failed"]]).toEqual(["2", "2", "4", "4", "0"]);
    expect(p.stderr.toString()).toContain("wrote 4 records to e1-out.jsonl");
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
    try {
      expect(await q.groupStatus("multi0")).toMatchObject({ expected: 2, finished: 2, records: 4, failed: 0, complete: true });
      const groups = await q.readCompleteGroups({ consumer: "trainer", max: 10 });
      expect(groups.map((g) => [g.uid, g.records.map((r) => r.key)])).toEqual([["multi0", ["multi0_0_0", "multi0_0_1", "multi0_1_0", "multi0_1_1"]]]);
    } finally {
      await q.close();
    }
  }, HANG_MS);

  test("n = 2, two outputs each: one group multi0 with four records, delivered only after session 1 finished", async () => {
    const prefix = randomPrefix("e1");
    prefixes.push(prefix);
    const log: string[] = [];
    const rt = await runtime(prefix, log);
    const acc = await rt.service.accept(RolloutRequest.parse({ rows: [E1_ROW] }));
    expect(acc.keys).toEqual(["multi0_0_0", "multi0_1_0"]);
    await acc.run.run();
    // Session 0's two outputs finish session 0 only; session 1's first output leaves the group open (main: complete at 2 records).
    expect(log).toEqual(["multi0_0_0 more 0/1", "multi0_0_1 last 1/2", "multi0_1_0 more 1/3", "multi0_1_1 last 2/4 complete"]);
    const st = await rt.store.groupStatus("multi0");
    expect(st).toEqual({ uid: "multi0", partition: "train", expected: 2, finished: 2, records: 4, failed: 0, complete: true, fingerprint: st.fingerprint });
    expect(st.fingerprint).toMatch(/^[0-9a-f]{64}$/);
    const groups = await rt.store.readCompleteGroups({ consumer: "trainer", max: 10 });
    expect(groups.map((g) => [g.uid, g.failed, g.records.map((r) => r.key)])).toEqual([["multi0", 0, ["multi0_0_0", "multi0_0_1", "multi0_1_0", "multi0_1_1"]]]);
    for (const r of groups[0]!.records) {
      expect([r.error, r.agent_name, r.num_turns, r.response_mask.every((m) => m === 1)]).toEqual([null, "multi_output_agent", 2, true]);
      validateTrajectory({ ...r, logprobs: r.rollout_log_probs }, { responseLength: 512, promptLength: 512, trackLogProbs: true });
    }
    const streamed = [...acc.run.records()].sort((a, b) => a.key.localeCompare(b.key));
    expect(JSON.stringify(groups[0]!.records)).toBe(JSON.stringify(streamed));
    expect(await rt.store.readCompleteGroups({ consumer: "trainer", max: 10 })).toEqual([]);
    // The durable sessions are done (their records written), and the summary counts sessions and records apart.
    for (const k of acc.keys) expect(await rt.sessions!.status(k)).toMatchObject({ phase: "done" });
    const s = summaryLines(formatSummary(acc.run.stats(), 1));
    expect([s["sessions (trajectories)"], s["finished"], s["records"], s["ok"], s["failed"]]).toEqual(["2", "2", "4", "4", "0"]);
    expect(acc.run.stats().counts).toEqual({ total: 2, pending: 0, running: 0, finished: 2, reused: 0, records: 4, ok: 4, failed: 0, truncated: 0 });

    // Posted again (same prompt): the finished sessions are handed back whole, not run or counted again.
    const again = await rt.service.accept(RolloutRequest.parse({ rows: [E1_ROW] }));
    expect([again.reused_uids, again.complete_uids]).toEqual([["multi0"], ["multi0"]]);
    await again.run.run();
    expect(again.run.stats().counts).toEqual({ total: 2, pending: 0, running: 0, finished: 2, reused: 2, records: 0, ok: 0, failed: 0, truncated: 0 });
    expect(JSON.stringify([...again.run.records()].sort((a, b) => a.key.localeCompare(b.key)))).toBe(JSON.stringify(streamed));
    expect(log.length).toBe(4);
    expect(await rt.store.readCompleteGroups({ consumer: "trainer", max: 10 })).toEqual([]);
  }, HANG_MS);

  test("one batch mixing loops of 3, 1 and 0 outputs: each group completes once its sessions finished, with every output", async () => {
    const prefix = randomPrefix("e1-mix");
    prefixes.push(prefix);
    const log: string[] = [];
    const rt = await runtime(prefix, log);
    const rows = [3, 1, 0].map((k) => ({ ...E1_ROW, uid: `mix${k}`, extra_info: { outputs: k } }));
    const acc = await rt.service.accept(RolloutRequest.parse({ rows }));
    await acc.run.run();
    expect(log).toEqual([
      "mix3_0_0 more 0/1",
      "mix3_0_1 more 0/2",
      "mix3_0_2 last 1/3",
      "mix3_1_0 more 1/4",
      "mix3_1_1 more 1/5",
      "mix3_1_2 last 2/6 complete",
      "mix1_0_0 last 1/1",
      "mix1_1_0 last 2/2 complete",
      "mix0_0 finish(0) 1/0",
      "mix0_1 finish(0) 2/0 complete",
    ]);
    expect(acc.run.stats().counts).toEqual({ total: 6, pending: 0, running: 0, finished: 6, reused: 0, records: 8, ok: 8, failed: 0, truncated: 0 });
    const groups = await rt.store.readCompleteGroups({ consumer: "trainer", max: 10 });
    expect(groups.map((g) => [g.uid, g.records.map((r) => r.key)])).toEqual([
      ["mix3", ["mix3_0_0", "mix3_0_1", "mix3_0_2", "mix3_1_0", "mix3_1_1", "mix3_1_2"]],
      ["mix1", ["mix1_0_0", "mix1_1_0"]],
      ["mix0", []],
    ]);
    expect(await rt.store.sessionRecords("mix0", 1)).toEqual([]);
    expect((await rt.store.sessionRecords("mix3", 1))!.map((r) => r.output_index)).toEqual([0, 1, 2]);
  }, HANG_MS);

  test("queue mode: the worker writes every output, serve's progress counts sessions and records apart", async () => {
    const prefix = randomPrefix("e1-queue");
    prefixes.push(prefix);
    const api = await runtime(prefix, null, "queue");
    const w = await runtime(prefix, null);
    const rows = [{ ...E1_ROW, uid: "multiq" }, { ...E1_ROW, uid: "emptyq", extra_info: { outputs: 0 } }];
    const acc = await api.service.accept(RolloutRequest.parse({ rows }));
    const worker = new JobWorker({ model: null, jobs: w.jobs!, store: w.batchStore, executorFor: w.executorFor, consumer: "w1", concurrency: 1, idleExitMs: 1_500 });
    expect(await worker.run()).toMatchObject({ claimed: 4, completed: 4, failed: 0, exit: "idle" });
    await Promise.race([acc.run.run(), Bun.sleep(10_000)]);
    const run = await api.service.lookup(acc.batch_id);
    expect(run.stats()).toMatchObject({ done: true, counts: { total: 4, pending: 0, running: 0, finished: 4, reused: 0, records: 4, ok: 4, failed: 0, truncated: 0 } });
    expect(run.records().map((r) => r.key).sort()).toEqual(["multiq_0_0", "multiq_0_1", "multiq_1_0", "multiq_1_1"]);
    const groups = await api.store.readCompleteGroups({ consumer: "trainer", max: 10 });
    expect(groups.map((g) => [g.uid, g.records.map((r) => r.key)]).sort()).toEqual([
      ["emptyq", []],
      ["multiq", ["multiq_0_0", "multiq_0_1", "multiq_1_0", "multiq_1_1"]],
    ]);
  }, HANG_MS);
});
