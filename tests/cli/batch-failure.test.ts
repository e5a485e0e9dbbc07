import { describe, expect, test } from "bun:test";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { StoreError } from "../../shared/errors.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { BatchRun, type TrajectoryExecutor } from "../../shared/rollout/batch-run.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";

// A batch whose groups cannot be registered (the store refuses, e.g. Upstash answering 401) used to
// leave `done` false forever: `stream()` waited and `edgeloop rollout` hung silently.
class RefusingQueue extends MemoryTransferQueue {
  override async expectGroup(): Promise<void> {
    throw new StoreError("Unauthorized, command was: [\"HSET\"]", { retryable: false });
  }
}

const executor: TrajectoryExecutor = {
  run: async () => {
    throw new Error("must not run");
  },
  agentNameFor: () => "single_turn_agent",
};

function failingRun(): BatchRun {
  const rollout = parseAppConfig({}).rollout;
  const req = RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "q" }], __rollout_n__: 2 }] });
  return new BatchRun(planBatch(req, rollout), { executor, store: new RefusingQueue(), rollout, concurrency: 4 });
}

describe("a batch that fails before its trajectories run", () => {
  test("run() rejects with the store's error and the batch is done", async () => {
    const run = failingRun();
    const err = await run.run().catch((e) => e);
    expect(err).toBeInstanceOf(StoreError);
    expect(err.message).toBe('Unauthorized, command was: ["HSET"]');
    expect(run.failure).toBe(err);
    const s = run.stats();
    expect(s.done).toBe(true);
    expect(s.finished_at).not.toBeNull();
    expect(s.counts).toEqual({ total: 2, pending: 2, running: 0, finished: 0, reused: 0, records: 0, ok: 0, failed: 0, truncated: 0 });
    expect(s.errors).toEqual([{ key: "(batch)", error: 'batch failed: StoreError: Unauthorized, command was: ["HSET"]' }]);
  });

  test("stream() ends by throwing the error, for a reader waiting before it failed and one arriving after", async () => {
    const run = failingRun();
    const early = (async () => {
      const got = [];
      for await (const r of run.stream()) got.push(r);
      return got;
    })();
    void run.run().catch(() => {});
    expect(await early.catch((e) => e)).toBe(run.failure!);
    const late = await (async () => {
      for await (const _ of run.stream());
    })().catch((e) => e);
    expect(late).toBeInstanceOf(StoreError);
  });
});
