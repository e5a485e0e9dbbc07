import { afterAll, describe, expect, test } from "bun:test";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { StoreError } from "../../shared/errors.ts";
import { BatchRun } from "../../shared/rollout/batch-run.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { createSessionExecutor } from "../../shared/rollout/executor.ts";
import type { SessionInputArg } from "../../shared/session/checkpoint.ts";
import { foldCheckpoint } from "../../shared/session/checkpoint-delta.ts";
import { SessionHost } from "../../shared/session/session-host.ts";
import { sessionCompletingQueue } from "../../shared/session/session-queue.ts";
import { queueWriter } from "../../shared/rollout/session-records.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { MultiOutputAgentLoop } from "../agent-loop/fixtures/multi-output-loop.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { depsFor, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";
import { delegatingQueue } from "../helpers/delegating-queue.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The durable-session paths write every output of a multi-output loop (edge case E1):
// - sessions that write their own records (the workerd Durable Object and the session
//   writers call `queueWriter`), on memory, Redis over TCP and Upstash REST;
// - the Bun/Deno host path (`createSessionExecutor` + `sessionCompletingQueue`), across a
//   crash between two outputs of one session.
const redis = await requireRedis();
const ROW = { data_source: "edge", prompt: [{ role: "user", content: "Say hi." }], reward_model: { style: "rule", ground_truth: "1" } };
const rollout = rolloutConfig({ agent: { default_agent_loop: "multi_output_agent" } });
const prefixes: string[] = [];
let bridge: UpstashBridge | null = null;
const BRIDGE_TOKEN = crypto.randomUUID();
afterAll(async () => {
  await bridge?.stop();
  for (const p of prefixes) await deleteByPrefix(p);
});

async function loopDeps() {
  const { deps } = await depsFor("http://127.0.0.1:9");
  deps.registry.register("multi_output_agent", MultiOutputAgentLoop);
  return deps;
}

function inputFor(uid: string, s: number, outputs: number): SessionInputArg {
  const key = `${uid}_${s}_0`;
  return {
    key,
    agent_name: "multi_output_agent",
    sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true, seed: 100 + s },
    kwargs: { ...ROW, extra_info: { outputs }, uid, session_id: s, global_steps: 0, key },
    rollout,
    model_version: null,
  };
}

/** Fails the `n`-th put (1-based) once, as a process dying between two writes would. */
function failingPut(q: TransferQueue, n: number): TransferQueue {
  let puts = 0;
  return delegatingQueue(q, {
    put: async (r, o) => {
      if (++puts === n) throw new StoreError("connection lost (test)", { retryable: false });
      return q.put(r, o);
    },
  });
}

const stores: [string, () => Promise<TransferQueue>][] = [
  ["memory", async () => new MemoryTransferQueue()],
  [
    "redis tcp",
    async () => {
      const prefix = randomPrefix("multi-session");
      prefixes.push(prefix);
      return createRedisTransferQueue({ url: REDIS_URL, prefix });
    },
  ],
  [
    "upstash rest",
    async () => {
      bridge ??= await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: BRIDGE_TOKEN });
      const prefix = randomPrefix("multi-session-up");
      prefixes.push(prefix);
      return createUpstashTransferQueue({ url: bridge.url, token: BRIDGE_TOKEN, prefix, retries: 0 });
    },
  ],
];

for (const [name, open] of stores) {
  describe.skipIf(name !== "memory" && !redis)(`sessions writing their own records (queueWriter, as the Durable Object): ${name}`, () => {
    test("2, 0 and 3 outputs: every output stored, each session finished, the group delivered once with all five", async () => {
      const q = await open();
      const deps = await loopDeps();
      const storage = new MemorySessionStorage();
      const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), writeOutputs: queueWriter(q) };
      await q.expectGroup("dur", 3);
      for (const [s, k] of [[0, 2], [1, 0], [2, 3]] as const) {
        const input = inputFor("dur", s, k);
        expect(await (await TrajectorySession.open(input.key, sd, input))!.run()).toEqual({ status: "done" });
      }
      expect(await q.groupStatus("dur")).toMatchObject({ expected: 3, finished: 3, records: 5, failed: 0, complete: true });
      expect((await q.sessionRecords("dur", 0))!.map((r) => [r.key, r.agent_name, r.error])).toEqual([
        ["dur_0_0", "multi_output_agent", null],
        ["dur_0_1", "multi_output_agent", null],
      ]);
      expect(await q.sessionRecords("dur", 1)).toEqual([]);
      const [g] = await q.readCompleteGroups({ consumer: "t", max: 5 });
      expect(g!.records.map((r) => r.key)).toEqual(["dur_0_0", "dur_0_1", "dur_2_0", "dur_2_1", "dur_2_2"]);
      await q.close();
    }, HANG_MS);

    test("a crash between two outputs: the re-run from the checkpoint writes the rest; nothing twice, the group completes", async () => {
      const inner = await open();
      const deps = await loopDeps();
      const storage = new MemorySessionStorage();
      await inner.expectGroup("crash", 1);
      const input = inputFor("crash", 0, 3);
      const dying: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), writeOutputs: queueWriter(failingPut(inner, 2)) };
      await expect((await TrajectorySession.open(input.key, dying, input))!.run()).rejects.toBeInstanceOf(StoreError);
      expect(await inner.groupStatus("crash")).toMatchObject({ finished: 0, records: 1, complete: false });
      expect(foldCheckpoint((await storage.get(input.key))!.deltas, input.key).cp.phase).toBe("finished");
      const revived: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), writeOutputs: queueWriter(inner) };
      expect(await (await TrajectorySession.open(input.key, revived))!.run()).toEqual({ status: "done" });
      expect(await inner.groupStatus("crash")).toMatchObject({ expected: 1, finished: 1, records: 3, complete: true });
      const [g] = await inner.readCompleteGroups({ consumer: "t", max: 5 });
      expect(g!.records.map((r) => r.key)).toEqual(["crash_0_0", "crash_0_1", "crash_0_2"]);
      await inner.close();
    }, HANG_MS);
  });
}

describe("the Bun/Deno session host path (createSessionExecutor + sessionCompletingQueue)", () => {
  test("a crash between two outputs of a session: the rerun writes the rest; a later rerun hands both back from the store", async () => {
    const deps = await loopDeps();
    const storage = new MemorySessionStorage();
    const host = new SessionHost({ storage, createLoop: sessionLoopFactory(deps) });
    const queue = new MemoryTransferQueue();
    const req = RolloutRequest.parse({ rows: [{ ...ROW, uid: "hosted" }] });
    const plan = () => planBatch(req, { ...rollout, n: 1 });
    const batch = (store: TransferQueue) =>
      new BatchRun(plan(), { executor: createSessionExecutor(deps, host, queue, { ...rollout, n: 1 }, { model_version: null, validate: false }), store: sessionCompletingQueue(store, storage, host), rollout: { ...rollout, n: 1 }, concurrency: 1 });

    const first = batch(failingPut(queue, 2));
    await first.run();
    expect(first.stats().counts).toMatchObject({ finished: 1, records: 2, ok: 1, failed: 1 });
    expect(first.records()[1]!.error).toStartWith("transfer queue write failed");
    // Output 1 is missing: the session is not done and its group not complete.
    expect(await queue.groupStatus("hosted")).toMatchObject({ finished: 0, records: 1, complete: false });
    expect(await host.status("hosted_0_0")).toMatchObject({ phase: "finished" });

    const second = batch(queue);
    await second.run();
    expect(second.stats().counts).toMatchObject({ finished: 1, records: 2, ok: 2, failed: 0 });
    expect(await queue.groupStatus("hosted")).toMatchObject({ expected: 1, finished: 1, records: 2, complete: true });
    expect(await host.status("hosted_0_0")).toMatchObject({ phase: "done" });
    const stored = (await queue.sessionRecords("hosted", 0))!;
    expect(stored.map((r) => r.key)).toEqual(["hosted_0_0", "hosted_0_1"]);

    // Done: the session is not run again; both outputs come back from the store (main handed back output 0 only).
    const third = batch(queue);
    await third.run();
    expect(third.records().map((r) => r.key)).toEqual(["hosted_0_0", "hosted_0_1"]);
    expect(JSON.stringify(third.records())).toBe(JSON.stringify(stored));
    expect(await queue.groupStatus("hosted")).toMatchObject({ finished: 1, records: 2 });
    host.close();
  }, HANG_MS);
});
