import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { processStoreHealth } from "../../infra/cli/store-watch.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { StoreError } from "../../shared/errors.ts";
import { planBatch, RolloutRequest, type PlannedTrajectory } from "../../shared/rollout/batch.ts";
import { BatchRun } from "../../shared/rollout/batch-run.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { RedisTransferQueue } from "../../shared/store/redis-transfer-queue.ts";
import { holdWhileStoreDown, isStoreOutage, StoreUnreachableError } from "../../shared/store/store-outage.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { waitFor } from "../helpers/wait.ts";

// E7 below the CLI: while Redis is down (its own redis-server, SIGKILLed and restarted with its
// append-only file) a finished trajectory's record is held and written when it returns — over TCP
// (ioredis) and over Upstash REST (the bridge) — and /health answers 503 naming the store.
// On main BatchRun.store gave up after 5 attempts (~2 s) and recorded "transfer queue write failed".
const OUTAGE_MS = 4_000;
const cfg = parseAppConfig({ rollout: { n: 2 } });

function output(t: PlannedTrajectory): AgentLoopOutput {
  return {
    prompt_ids: [1, 2, t.session_id], response_ids: [5, 6], response_mask: [1, 1], response_logprobs: [-0.5, -0.25], reward_score: 1, num_turns: 1,
    truncated: false, finish_reason: "stop", metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: {},
  };
}

test("holdWhileStoreDown: retries an outage without limit, other retryable errors 4 times, non-retryable ones never", async () => {
  let n = 0;
  expect(await holdWhileStoreDown(async () => (++n < 12 ? Promise.reject(new StoreUnreachableError("down")) : "ok"), { minTimeoutMs: 1, maxTimeoutMs: 2 })).toBe("ok");
  expect(n).toBe(12);
  n = 0;
  const e = await holdWhileStoreDown(async () => (++n, Promise.reject(new StoreError("redis: BUSY"))), { minTimeoutMs: 1, maxTimeoutMs: 2 }).catch((x) => x);
  expect([n, e.message]).toEqual([5, "redis: BUSY"]);
  n = 0;
  await holdWhileStoreDown(async () => (++n, Promise.reject(new StoreError("bad", { retryable: false }))), { minTimeoutMs: 1 }).catch(() => {});
  expect(n).toBe(1);
  expect(isStoreOutage(new StoreError("session storage: x", { cause: new StoreUnreachableError("store down") }))).toBe(true);
  expect(isStoreOutage(new StoreError("redis: NOGROUP"))).toBe(false);
});

describe("a store outage holds records instead of failing them", () => {
  let redis: PrivateRedis;
  let bridge: UpstashBridge;
  const token = `tok-${crypto.randomUUID()}`;
  beforeAll(async () => {
    redis = await privateRedis({ persist: true });
    bridge = await startUpstashBridge({ port: 0, redisUrl: redis.url, token });
  });
  afterAll(async () => {
    await bridge?.stop();
    await redis?.dispose();
  });

  // The REST endpoint itself down (connection refused) rather than the Redis behind it.
  let restBridge: UpstashBridge | null = null;
  let restPort = 0;
  const restDown = async () => {
    await restBridge?.stop();
    restBridge = null;
  };
  const restUp = async () => {
    restBridge ??= await startUpstashBridge({ port: restPort, redisUrl: redis.url, token });
    restPort = restBridge.port;
  };
  afterAll(restDown);

  type Transport = { open: () => RedisCommander; down: () => Promise<void>; up: () => Promise<void>; name: () => string };
  const transports: [string, Transport][] = [
    ["redis tcp", { open: () => new IoRedisCommander(redis.url, { reconnectMaxDelayMs: 200, onError: () => {} }), down: () => redis.stop(), up: () => redis.start(), name: () => redis.url }],
    ["upstash rest (bridge), Redis behind it down", { open: () => new UpstashCommander({ url: bridge.url, token, retries: 0 }), down: () => redis.stop(), up: () => redis.start(), name: () => bridge.url }],
    ["upstash rest, the REST endpoint down", { open: () => new UpstashCommander({ url: `http://127.0.0.1:${restPort}`, token }), down: restDown, up: restUp, name: () => `http://127.0.0.1:${restPort}` }],
  ];
  for (const [name, tr] of transports) {
    test(`${name}: records finished during a ${OUTAGE_MS / 1000} s outage are written once it ends; /health is 503 meanwhile`, async () => {
      await restUp();
      const cmd = tr.open();
      const prefix = `hold:${crypto.randomUUID().slice(0, 6)}:`;
      const store = new RedisTransferQueue(cmd, { prefix, ownsCommander: false });
      const storeName = tr.name();
      const health = processStoreHealth(storeName, cmd, 500);
      const app = createRolloutsApp({ service: new RolloutService({ config: cfg, store, executorFor: () => ({ agentNameFor: () => "x", run: () => Promise.reject(new Error("unused")) }) }), health });
      const req = RolloutRequest.parse({ rows: [0, 1, 2].map((i) => ({ prompt: [{ role: "user", content: `q${i}` }], uid: `hold${i}` })) });
      const plan = planBatch(req, cfg.rollout);
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const run = new BatchRun(plan, {
        store,
        rollout: cfg.rollout,
        concurrency: 6,
        executor: { agentNameFor: () => "fake", run: async (t) => (await gate, { agentName: "fake", outputs: [output(t)] }) },
      });
      const done = run.run();
      try {
        // Groups registered; every trajectory finishes while Redis is down.
        // (The bridge's own connection may still be coming back from the previous test's outage.)
        await waitFor(async () => (await app.request("/health")).status === 200, "/health 200 again", HANG_MS, 100);
        expect((await app.request("/health")).status).toBe(200);
        await Bun.sleep(300);
        await tr.down();
        const t0 = Date.now();
        release();
        const h = await app.request("/health");
        const body = (await h.json()) as { ok: boolean; store: string; error: { code: string; message: string } };
        expect([h.status, body.ok, body.store, body.error.code]).toEqual([503, false, storeName, "store_unreachable"]);
        expect(body.error.message).toStartWith(`store ${storeName} is unreachable: `);
        await Bun.sleep(OUTAGE_MS);
        expect(run.stats().done).toBe(false);
        expect(run.records().length).toBe(0);
        await tr.up();
        await done;
        const took = Date.now() - t0;
        expect(took).toBeGreaterThanOrEqual(OUTAGE_MS);
        expect(run.stats().counts).toEqual({ total: 6, pending: 0, running: 0, finished: 6, reused: 0, records: 6, ok: 6, failed: 0, truncated: 0 });
        for (const t of plan.trajectories) expect((await store.get(t.key))?.response_ids).toEqual([5, 6]);
        for (const uid of ["hold0", "hold1", "hold2"]) expect(await store.groupStatus(uid)).toMatchObject({ expected: 2, finished: 2, records: 2, failed: 0, complete: true });
        expect((await app.request("/health")).status).toBe(200);
      } finally {
        release();
        await tr.up().catch(() => {});
        await cmd.close();
      }
    }, HANG_MS);
  }
});
