import { describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { ConflictError, InputError } from "../../shared/errors.ts";
import { JobQueue } from "../../shared/jobs/job-queue.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { RolloutRequest } from "../../shared/rollout/batch.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { fakeExecutor } from "../helpers/fake-executor.ts";
import { randomPrefix, redisCleanup, REDIS_URL, requireRedis } from "../helpers/redis.ts";

// What POST /v1/rollouts does with uids that name existing groups (a refused batch writes nothing;
// a reused uid is reported), a malformed ack id (400, not 503), and the first progress answer of
// a batch rebuilt by a restarted API process.
const redis = await requireRedis();
const { prefixes, closers } = redisCleanup();
const executor = () => fakeExecutor();
const row = (uid: string) => ({ prompt: [{ role: "user", content: `q ${uid}` }], uid });
const req = (uids: string[], n: number) => RolloutRequest.parse({ rows: uids.map(row), config: { rollout: { n } } });

function queued() {
  const prefix = randomPrefix("accept");
  prefixes.push(prefix);
  const commander = new IoRedisCommander(REDIS_URL);
  const store = createRedisTransferQueue({ url: REDIS_URL, prefix });
  const jobs = new JobQueue(commander, { prefix, leaseMs: 5_000 });
  const service = new RolloutService({ config: parseAppConfig({}), store, executorFor: executor, jobs, followPollMs: 20 });
  closers.push(() => commander.close(), () => store.close(), async () => service.close());
  return { prefix, store, jobs, service, commander };
}

async function drain(jobs: JobQueue, store: ConstructorParameters<typeof JobWorker>[0]["store"]) {
  return new JobWorker({ model: null, jobs, store, executorFor: executor, consumer: `w-${crypto.randomUUID().slice(0, 4)}`, concurrency: 4, idleExitMs: 300, blockMs: 50 }).run();
}

describe.skipIf(!redis)("queue mode", () => {
  test("a batch refused because one uid's group has another n registers none of its groups and enqueues nothing", async () => {
    const { store, jobs, service } = queued();
    await service.accept(req(["u1"], 2));
    const depth = (await jobs.stats()).depth;
    const err = await service.accept(req(["fresh1", "u1"], 3)).catch((e) => e);
    expect(err).toBeInstanceOf(ConflictError);
    expect([err.status, err.message, err.field]).toEqual([409, "rows[1].uid: group u1 is registered with n=2 in train, not n=3 in train: a uid names one group; use a new uid for new samples", "rows[1].uid"]);
    expect((await store.groupStatus("fresh1")).expected).toBeNull();
    expect((await jobs.stats()).depth).toBe(depth);
    // The refused batch left no trace: fresh1 can now be posted with another n.
    const ok = await service.accept(req(["fresh1"], 2));
    expect([ok.keys, ok.reused_uids, ok.complete_uids]).toEqual([["fresh1_0_0", "fresh1_1_0"], [], []]);
    expect(await store.groupStatus("fresh1")).toMatchObject({ expected: 2, finished: 0, records: 0 });
  });

  test("re-posting uids reports them: reused_uids (group existed: resumed), complete_uids (already complete: its records come back, no new group)", async () => {
    const { store, jobs, service } = queued();
    const first = await service.accept(req(["r1", "r2"], 2));
    expect([first.reused_uids, first.complete_uids]).toEqual([[], []]);
    await drain(jobs, store);
    await first.run.run();
    // r3's group exists but is incomplete (e.g. its batch crashed before running): re-posting resumes it.
    await store.expectGroup("r3", 2, "train");
    const again = await service.accept(req(["r1", "r3", "new1"], 2));
    expect([again.reused_uids, again.complete_uids]).toEqual([["r1", "r3"], ["r1"]]);
    await drain(jobs, store);
    await again.run.run();
    // r1's sessions had finished: handed back as stored (not run, not counted again); r3 and new1 ran.
    expect(again.run.stats().counts).toMatchObject({ total: 6, finished: 6, reused: 2, records: 4, ok: 4, failed: 0 });
    expect(again.run.records().map((r) => r.key).sort()).toEqual(["new1_0_0", "new1_1_0", "r1_0_0", "r1_1_0", "r3_0_0", "r3_1_0"]);
    expect(await store.groupStatus("r3")).toMatchObject({ expected: 2, finished: 2, records: 2, complete: true });
    const groups = await store.readCompleteGroups({ consumer: "t", max: 10 });
    expect(groups.map((g) => g.uid).sort()).toEqual(["new1", "r1", "r2", "r3"]);
  });

  test("ack with a malformed delivery id is a 400 naming delivery_ids, not a store error", async () => {
    const { store } = queued();
    await store.expectGroup("a1", 1, "train");
    await store.markFailed("a1_0_0", "x");
    const [g] = await store.readCompleteGroups({ consumer: "t", max: 1 });
    const err = await store.ack(["abc"]).catch((e) => e);
    expect(err).toBeInstanceOf(InputError);
    expect([err.status, err.field, err.message]).toEqual([400, "delivery_ids", "delivery_ids: not a stream entry id (expected <ms>-<seq>, as readCompleteGroups returns)"]);
    expect(await store.ack([g!.delivery_id])).toBe(1);
  });

  test("a restarted API process answers the first GET of an old batch from what is stored", async () => {
    const { prefix, store, jobs, service } = queued();
    const { batch_id, run } = await service.accept(req(["old1", "old2", "old3"], 2));
    await drain(jobs, store);
    await run.run();
    expect(run.stats().counts).toMatchObject({ total: 6, ok: 6 });
    // A new process: nothing in memory; its first answer must already count the stored records.
    const commander = new IoRedisCommander(REDIS_URL);
    const restarted = new RolloutService({ config: parseAppConfig({}), store, executorFor: executor, jobs: new JobQueue(commander, { prefix }), followPollMs: 1_000 });
    closers.push(() => commander.close(), async () => restarted.close());
    const [a, b] = await Promise.all([restarted.lookup(batch_id), restarted.lookup(batch_id)]);
    expect(a).toBe(b);
    expect(a.stats()).toMatchObject({ done: true, counts: { total: 6, pending: 0, running: 0, ok: 6, failed: 0, truncated: 0 } });
  });
});

describe("inline mode", () => {
  test("a refused batch registers nothing; re-posting reports reused and complete uids", async () => {
    const store = new MemoryTransferQueue();
    const service = new RolloutService({ config: parseAppConfig({}), store, executorFor: executor });
    const first = await service.accept(req(["i1"], 2));
    await first.run.run();
    const err = await service.accept(req(["ifresh", "i1"], 3)).catch((e) => e);
    expect([err.status, err.message]).toEqual([409, "rows[1].uid: group i1 is registered with n=2 in train, not n=3 in train: a uid names one group; use a new uid for new samples"]);
    expect((await store.groupStatus("ifresh")).expected).toBeNull();
    expect(service.batchIds()).toEqual([first.batch_id]);
    const again = await service.accept(req(["ifresh", "i1"], 2));
    expect([again.reused_uids, again.complete_uids]).toEqual([["i1"], ["i1"]]);
    await again.run.run();
    expect(await store.groupStatus("ifresh")).toMatchObject({ expected: 2, finished: 2, records: 2, complete: true });
    await store.close();
  });
});
