import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { JobQueue, type BatchSpec } from "../../shared/jobs/job-queue.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { RedisTransferQueue } from "../../shared/store/redis-transfer-queue.ts";
import { isGroupGone } from "../../shared/store/stream-consumer.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { StoreError } from "../../shared/errors.ts";
import { makeRecord } from "./contract.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";

// E2 at the queue level: Redis loses the job stream and the groups stream together with their
// consumer groups (FLUSHALL stands in for a restart without persistence). Both queues create the
// group again and go on, over TCP (ioredis) and over Upstash REST (the bridge). These tests flush,
// so they run against their own redis-server.
const cfg = parseAppConfig({ rollout: { n: 2 } });
const rec = (key: string, uid: string) => makeRecord(uid, Number(key.split("_").at(-2)));

function batch(uid: string) {
  const req = RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "Say hi." }], uid }] });
  const p = planBatch(req, cfg.rollout);
  const spec: BatchSpec = { batch_id: p.batch_id, validate: false, global_steps: -1, model_version: null, rollout: cfg.rollout, total: 2, started_at: Date.now() };
  return { p, spec };
}

test("isGroupGone decides by the Redis error code, through a StoreError's cause", () => {
  expect(isGroupGone(new Error("NOGROUP No such key 'x' or consumer group 'workers' in XREADGROUP with GROUP option"))).toBe(true);
  expect(isGroupGone(new StoreError("redis: NOGROUP No such key", { cause: new Error("NOGROUP No such key") }))).toBe(true);
  expect(isGroupGone(new Error("UNBLOCKED the stream key no longer exists"))).toBe(true);
  expect(isGroupGone(new Error("ERR no such key"))).toBe(true);
  expect(isGroupGone(new Error("BUSYGROUP Consumer Group name already exists"))).toBe(false);
  expect(isGroupGone(new Error("Connection is closed."))).toBe(false);
  expect(isGroupGone(new Error("WRONGTYPE mentions NOGROUPS"))).toBe(false);
});

describe("stream consumer groups heal after FLUSHALL", () => {
  let redis: PrivateRedis;
  let bridge: UpstashBridge;
  const token = `tok-${crypto.randomUUID()}`;
  const closers: (() => Promise<unknown>)[] = [];
  beforeAll(async () => {
    redis = await privateRedis();
    bridge = await startUpstashBridge({ port: 0, redisUrl: redis.url, token });
  });
  afterAll(async () => {
    for (const c of closers) await c().catch(() => {});
    await bridge.stop();
    await redis.dispose();
  });

  const transports: [string, () => RedisCommander][] = [
    ["redis tcp", () => new IoRedisCommander(redis.url)],
    ["upstash rest (bridge)", () => new UpstashCommander({ url: bridge.url, token, retries: 0 })],
  ];

  for (const [name, open] of transports) {
    test(`${name}: job queue and transfer queue recreate their groups on NOGROUP; work submitted after the flush runs`, async () => {
      const cmd = open();
      closers.push(() => cmd.close());
      const prefix = `heal:${crypto.randomUUID().slice(0, 6)}:`;
      const jobs = new JobQueue(cmd, { prefix, leaseMs: 60_000 });
      const store = new RedisTransferQueue(cmd, { prefix, ownsCommander: false });
      const raw = redis.client();
      closers.push(() => raw.quit());

      // Before: one batch, claimed and acked; one group, delivered and acked.
      const pre = batch("pre0");
      await jobs.submit(pre.spec, pre.p.trajectories.map((t) => t.key), pre.p.trajectories);
      expect((await jobs.claim("w1", 10)).map((j) => j.trajectory.key)).toEqual(["pre0_0_0", "pre0_1_0"]);
      await store.expectGroup("pre0", 2);
      for (const k of ["pre0_0_0", "pre0_1_0"]) await store.put(rec(k, "pre0"));
      const g0 = await store.readCompleteGroups({ max: 4, consumer: "t1" });
      expect(g0.map((g) => [g.uid, g.records.map((r) => r.key)])).toEqual([["pre0", ["pre0_0_0", "pre0_1_0"]]]);
      expect(await store.ack([g0[0]!.delivery_id])).toBe(1);

      expect(await raw.flushall()).toBe("OK");

      // Reading and stats right after the flush: empty, not NOGROUP.
      expect(await store.readCompleteGroups({ max: 4, consumer: "t1" })).toEqual([]);
      expect(await jobs.claim("w1", 10)).toEqual([]);
      expect(await jobs.stats()).toMatchObject({ mode: "queue", depth: 0, in_flight: 0, oldest_age_ms: 0, workers: { busy: 0 } });
      expect(await raw.exists(`${prefix}jobs`, `${prefix}groups:train`)).toBe(2);

      // A second flush between the reads: the group is created again every time it is found gone.
      await raw.flushall();
      const post = batch("post0");
      await jobs.submit(post.spec, post.p.trajectories.map((t) => t.key), post.p.trajectories);
      await raw.del(`${prefix}jobs`); // lost with its group after the submit: those jobs are gone (the API reports them lost)
      await jobs.submit(post.spec, post.p.trajectories.map((t) => t.key), post.p.trajectories);
      const claimed = await jobs.claim("w2", 10);
      expect(claimed.map((j) => [j.trajectory.key, j.deliveries])).toEqual([["post0_0_0", 1], ["post0_1_0", 1]]);
      await jobs.heartbeat("w2", claimed.map((j) => j.id));
      expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 2, workers: { known: 1, busy: 1 } });
      expect(await jobs.ack(claimed.map((j) => j.id))).toBe(2);
      await raw.del(`${prefix}groups:train`);
      await store.expectGroup("post0", 2);
      for (const k of ["post0_0_0", "post0_1_0"]) await store.put(rec(k, "post0"));
      const g1 = await store.readCompleteGroups({ max: 4, consumer: "t1" });
      expect(g1.map((g) => [g.uid, g.records.map((r) => r.key)])).toEqual([["post0", ["post0_0_0", "post0_1_0"]]]);
      expect(await store.ack([g1[0]!.delivery_id])).toBe(1);
      expect(jobs.consumers.recreated).toBeGreaterThanOrEqual(2);
      await jobs.forgetConsumer("w2");
    });
  }

  test("redis tcp: a trainer blocked in GET /v1/groups when Redis is flushed reads the next group", async () => {
    const cmd = new IoRedisCommander(redis.url);
    closers.push(() => cmd.close());
    const prefix = `heal:${crypto.randomUUID().slice(0, 6)}:`;
    const store = new RedisTransferQueue(cmd, { prefix, ownsCommander: false });
    const raw = redis.client();
    closers.push(() => raw.quit());
    expect(await store.readCompleteGroups({ max: 1, consumer: "t1" })).toEqual([]);
    const blocked = store.readCompleteGroups({ max: 1, consumer: "t1", block_ms: 1500 });
    await Bun.sleep(200);
    await raw.flushall();
    expect(await blocked).toEqual([]);
    await store.expectGroup("late0", 1);
    await store.put(rec("late0_0_0", "late0"));
    const g = await store.readCompleteGroups({ max: 1, consumer: "t1", block_ms: 500 });
    expect(g.map((x) => x.uid)).toEqual(["late0"]);
  });
});
