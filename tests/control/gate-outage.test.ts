import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { RedisEngineGate } from "../../shared/inference/engine-control.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The engine gate is on every engine call's path: while the store is down it holds the call and lets it
// through when the store answers again — a trajectory is held, never failed, for a store outage (E7).
// Before this, a call made during an outage failed its trajectory with StoreUnreachableError (seen in CI's
// store-outage run).
let redis: PrivateRedis;
beforeAll(async () => {
  redis = await privateRedis({ persist: true });
});
afterAll(async () => {
  await redis?.dispose();
});

describe("RedisEngineGate during a store outage", () => {
  test("a call made while Redis is down waits it out and runs once when Redis is back", async () => {
    const c = new IoRedisCommander(redis.url, { reconnectMaxDelayMs: 200, onError: () => {} });
    try {
      const gate = new RedisEngineGate(c, { prefix: "gate-outage:", pollMs: 5 });
      expect(await gate.run(async () => "before")).toBe("before");
      await redis.stop();
      let runs = 0;
      const t0 = Date.now();
      const call = gate.run(async (sent) => {
        sent();
        runs++;
        return "after";
      });
      await new Promise((r) => setTimeout(r, 1_500));
      expect(runs).toBe(0);
      await redis.start();
      expect(await call).toBe("after");
      expect(runs).toBe(1);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(1_500);
    } finally {
      await c.close();
    }
  }, HANG_MS);
});
