import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { BatchRun } from "../../shared/rollout/batch-run.ts";
import { planBatch, RolloutRequest, type PlannedTrajectory } from "../../shared/rollout/batch.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { RedisTransferQueue } from "../../shared/store/redis-transfer-queue.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Redis loses its data (FLUSHALL here; a restart without persistence or eviction alike) while an
// in-process batch writes to it. On main the batch reported every record ok while the groups whose
// registration vanished could never be delivered. Now the batch puts back what it holds at its end.
const cfg = parseAppConfig({ rollout: { n: 2 } });

function outputs(t: PlannedTrajectory): AgentLoopOutput[] {
  const k = Number((t.row!.extra_info as { outputs?: number } | undefined)?.outputs ?? 1);
  return Array.from({ length: k }, (_, i) => ({
    prompt_ids: [1, 2, t.session_id], response_ids: [5, 6, i], response_mask: [1, 1, 0], response_logprobs: [-0.5, -0.25, 0], reward_score: 1, num_turns: 2,
    truncated: false, finish_reason: "stop", metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: {},
  }));
}

describe("a batch puts back what the store lost while it ran", () => {
  let redis: PrivateRedis;
  beforeAll(async () => {
    redis = await privateRedis();
    await redis.start();
  });
  afterAll(async () => {
    await redis?.dispose();
  });

  test("FLUSHALL after half the sessions: every group (1, 2 and 0 outputs per session) is registered and written again, then delivered once, whole", async () => {
    const cmd = new IoRedisCommander(redis.url);
    const q = new RedisTransferQueue(cmd, { prefix: "rep:", ownsCommander: false });
    const rows = Array.from({ length: 6 }, (_, i) => ({ prompt: [{ role: "user", content: `q${i}` }], uid: `rep${i}`, extra_info: { outputs: i % 3 } }));
    const plan = planBatch(RolloutRequest.parse({ rows }), cfg.rollout);
    let started = 0;
    let flushed!: () => void;
    const flush = new Promise<void>((r) => (flushed = r));
    const run = new BatchRun(plan, {
      store: q,
      rollout: cfg.rollout,
      concurrency: 1,
      executor: {
        agentNameFor: () => "fake",
        run: async (t) => {
          // The 7th session starts after the store lost what the first 6 wrote.
          if (++started === 7) {
            const c = redis.client();
            await c.flushall();
            await c.quit();
            flushed();
          }
          return { agentName: "fake", outputs: outputs(t) };
        },
      },
    });
    await run.run();
    await flush;
    const s = run.stats();
    // Sessions of rows 0 and 3 emit no output; rows 1, 4 one; rows 2, 5 two: 2·(0+1+2)·2 = 12 records.
    expect([s.counts.finished, s.counts.records, s.counts.ok, s.lost]).toEqual([12, 12, 12, null]);
    // Every group was registered before the flush, so all 6 lost their registration; the records of rep1 and rep2
    // (written before the flush: 2 + 4) are written again, those of rep3..rep5 (after it) were still there.
    expect(s.repaired).toEqual({ groups: 6, records: 6 });
    expect(s.errors).toEqual([{ key: "(store)", error: "the store lost data while the batch ran: 6 groups found incomplete, 6 records written again" }]);
    const got = new Map<string, string[]>();
    for (let i = 0; i < 3 && got.size < 6; i++) {
      for (const g of await q.readCompleteGroups({ consumer: "t", max: 10, block_ms: 100 })) got.set(g.uid, g.records.map((r) => r.key));
    }
    expect(Object.fromEntries([...got].sort())).toEqual({
      rep0: [],
      rep1: ["rep1_0_0", "rep1_1_0"],
      rep2: ["rep2_0_0", "rep2_0_1", "rep2_1_0", "rep2_1_1"],
      rep3: [],
      rep4: ["rep4_0_0", "rep4_1_0"],
      rep5: ["rep5_0_0", "rep5_0_1", "rep5_1_0", "rep5_1_1"],
    });
    for (const uid of ["rep0", "rep2", "rep5"]) expect(await q.groupStatus(uid)).toMatchObject({ expected: 2, finished: 2, complete: true });
    expect((await q.get("rep2_0_1"))!.response_ids).toEqual([5, 6, 1]);
    await cmd.close();
  }, HANG_MS);

  test("nothing lost: the end-of-batch check writes nothing", async () => {
    const cmd = new IoRedisCommander(redis.url);
    const q = new RedisTransferQueue(cmd, { prefix: "norep:", ownsCommander: false });
    const plan = planBatch(RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "q" }], uid: "norep0" }] }), cfg.rollout);
    const run = new BatchRun(plan, { store: q, rollout: cfg.rollout, concurrency: 2, executor: { agentNameFor: () => "fake", run: async (t) => ({ agentName: "fake", outputs: outputs(t) }) } });
    await run.run();
    expect([run.stats().repaired, run.stats().lost, run.stats().errors]).toEqual([null, null, []]);
    await cmd.close();
  });
});
