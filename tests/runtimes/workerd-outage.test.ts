import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { outageAlarmDelayMs } from "../../infra/cloudflare/session-object.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { StoreError } from "../../shared/errors.ts";
import { StoreUnreachableError } from "../../shared/store/store-outage.ts";
import { requireRedis } from "../helpers/redis.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { startWorkerd, type Workerd } from "./harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// E7 on the Durable Object path: the store (Redis behind the Upstash REST bridge) goes away while a
// session runs in workerd. The object must wait the outage out — re-arming its own alarm with capped
// backoff instead of throwing into the runtime's 6 alarm retries — and write the record once, after.
const redis = await requireRedis();
let store: PrivateRedis;
let bridge: UpstashBridge;
let engine: RunningSimEngine;
let w: Workerd;
const token = crypto.randomUUID();
const prefix = "wdout:";

beforeAll(async () => {
  if (!redis) return;
  store = await privateRedis({ persist: true });
  await store.start();
  bridge = await startUpstashBridge({ port: 0, redisUrl: store.url, token });
  // About 1.5 s per answer: the outage starts while the turn is being generated.
  engine = await startSimEngine({ script: { seed: 5, rules: [], default: ["The answer is 4.\n#### 4"] }, maxModelLen: 4096, latency: { decode_ms_per_token: 150 } });
  w = await startWorkerd({
    EDGELOOP_ENGINE_URL: engine.urls[0]!,
    EDGELOOP_ENGINE_FORMAT: "vllm",
    EDGELOOP_CONFIG: JSON.stringify({ rollout: { n: 1, prompt_length: 512, response_length: 256, max_model_len: 4096 } }),
    EDGELOOP_STORE_PREFIX: prefix,
    UPSTASH_REDIS_REST_URL: bridge.url,
    UPSTASH_REDIS_REST_TOKEN: token,
    EDGELOOP_ALLOW_ANONYMOUS: "1",
  });
}, HANG_MS);

afterAll(async () => {
  await w?.stop();
  await engine?.stop();
  await bridge?.stop();
  await store?.dispose();
});

describe("outageAlarmDelayMs", () => {
  test("a store outage re-arms with 1 s doubling, capped at 30 s, without a count limit; anything else is the runtime's", () => {
    const outage = new StoreUnreachableError("store http://127.0.0.1:1 unreachable");
    expect([0, 1, 2, 3, 4, 5, 6, 50, 1000].map((n) => outageAlarmDelayMs(outage, n))).toEqual([1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 30000]);
    expect(outageAlarmDelayMs(new StoreError("wrapped", { cause: outage }), 3)).toBe(8000);
    expect(outageAlarmDelayMs(new StoreError("redis: WRONGTYPE", { retryable: true }), 0)).toBeNull();
    expect(outageAlarmDelayMs(new Error("engine down"), 0)).toBeNull();
  });
});

describe.skipIf(!redis)("E7 in workerd: a store outage while a Durable Object session runs", () => {
  test("Redis behind the bridge down for 8 s around the session's record write: the record lands once afterwards; the engine is called once", async () => {
    const row = { uid: "wdout0", data_source: "edge", prompt: [{ role: "user", content: "What is 2+2?" }], reward_model: { style: "rule", ground_truth: "4" } };
    const res = await w.mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [row] }) });
    expect(res.status).toBe(202);
    await store.stop();
    await Bun.sleep(8_000);
    await store.start();
    const q = createRedisTransferQueue({ url: store.url, prefix });
    try {
      let status = await q.groupStatus("wdout0");
      for (let i = 0; i < 200 && !status.complete; i++) {
        await Bun.sleep(100);
        status = await q.groupStatus("wdout0");
      }
      expect(status).toMatchObject({ expected: 1, finished: 1, records: 1, failed: 0, complete: true });
      const rec = (await q.get("wdout0_0_0"))!;
      expect([rec.error, rec.reward_score, rec.finish_reason]).toEqual([null, 1, "stop"]);
      expect(engine.replicas[0]!.engine.stats.requests).toBe(1);
    } finally {
      await q.close();
    }
  }, HANG_MS);
});
