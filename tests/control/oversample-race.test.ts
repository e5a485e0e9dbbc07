import { expect, test } from "bun:test";
import { BatchRun, type TrajectoryExecutor } from "../../shared/rollout/batch-run.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { RolloutConfig, type AgentLoopOutput, type TrajectoryRecord } from "../../shared/schema/index.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import type { PutOptions } from "../../shared/store/types.ts";

// The sessions of a group that finish together must not all pass as "not the group's last": a group's last
// session takes a delivery slot (target_groups) before writing. With a store whose writes take a round trip
// (Redis), counting sessions only once their write returned let both sessions of a group write unadmitted,
// and over-sampled batches delivered more groups than their target.

/** A memory store whose writes take `ms` (a Redis round trip). */
class SlowStore extends MemoryTransferQueue {
  constructor(private readonly ms: number) {
    super();
  }
  override async put(record: TrajectoryRecord, opts?: PutOptions) {
    await new Promise((r) => setTimeout(r, this.ms));
    return super.put(record, opts);
  }
}

const output = (reward: number): AgentLoopOutput => ({
  prompt_ids: [1, 2],
  response_ids: [3, 151645],
  response_mask: [1, 1],
  response_logprobs: null,
  reward_score: reward,
  num_turns: 2,
  truncated: false,
  finish_reason: "stop",
  metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
  extra_fields: {},
});

/** Both sessions of group i finish at i × 2 ms (together); rewards per `reward(uid, session)`. */
function executor(reward: (uid: string, sid: number) => number): TrajectoryExecutor {
  return {
    agentNameFor: () => "stub",
    async run(t, _plan, signal) {
      const idx = Number(t.uid.slice(1));
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(resolve, idx * 2);
        signal?.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason)), { once: true });
      });
      return { agentName: "stub", outputs: [output(reward(t.uid, t.session_id))] };
    },
  };
}

const rows = (k: number) => Array.from({ length: k }, (_, i) => ({ uid: `g${i}`, prompt: [{ role: "user", content: "q" }] }));

test("target_groups 8 of 12, both sessions of each group finishing together, writes taking 15 ms: exactly 8 groups delivered", async () => {
  for (let round = 0; round < 5; round++) {
    const store = new SlowStore(15);
    const rollout = RolloutConfig.parse({ n: 2, calculate_log_probs: false });
    const plan = planBatch(RolloutRequest.parse({ rows: rows(12), target_groups: 8 }), rollout);
    for (const [uid, n] of plan.groups) await store.expectGroup(uid, n);
    const run = new BatchRun(plan, { executor: executor(() => 1), store, rollout, concurrency: 24 });
    await run.run();
    const o = run.stats().oversample!;
    const delivered = await store.readCompleteGroups({ consumer: "t", max: 100 });
    expect([o.delivered, delivered.length]).toEqual([8, 8]);
    expect(delivered.every((g) => g.records.length === 2)).toBe(true);
    expect(o.groups_withdrawn).toBe(4);
  }
});

test("DAPO with the same race: the filter sees every session of the group (records of writes still in flight)", async () => {
  const store = new SlowStore(15);
  const rollout = RolloutConfig.parse({ n: 2, calculate_log_probs: false, filter_groups: { metric: "reward", drop_if: "all_equal" } });
  const plan = planBatch(RolloutRequest.parse({ rows: rows(12), target_groups: 4 }), rollout);
  for (const [uid] of [...plan.groups].slice(0, 4)) await store.expectGroup(uid, 2);
  // Even groups: rewards 1 and 1 (filtered); odd groups: 1 and 0 (kept).
  const run = new BatchRun(plan, { executor: executor((uid, sid) => (Number(uid.slice(1)) % 2 === 0 ? 1 : sid === 0 ? 1 : 0)), store, rollout, concurrency: 24 });
  await run.run();
  const o = run.stats().oversample!;
  const delivered = await store.readCompleteGroups({ consumer: "t", max: 100 });
  expect(delivered.map((g) => g.uid).sort()).toEqual(["g1", "g3", "g5", "g7"]);
  expect(delivered.every((g) => g.records.map((r) => r.reward_score).sort().join() === "0,1")).toBe(true);
  expect((await store.filteredGroups({ max: 100 })).map((g) => g.uid).sort()).toEqual(["g0", "g2", "g4", "g6"]);
  expect([o.delivered, o.filtered, o.replacements]).toEqual([4, 4, 4]);
});
