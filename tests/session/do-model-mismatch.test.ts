import { afterAll, describe, expect, test } from "bun:test";
import type { Env } from "../../infra/cloudflare/env.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { startUpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { builtinTokenizer, modelIdOf } from "../../shared/models/index.ts";
import { fakeDurableObjectStorage, sessionObject } from "../helpers/durable-object.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { rolloutConfig } from "./fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// N4 on the Durable Object path: a session input names the model its batch was submitted with; an object
// whose bundled model (Qwen3) has another fingerprint fails the trajectory naming both, without running it.

const redisUp = await requireRedis();
const prefix = randomPrefix("do-model");
afterAll(async () => {
  if (redisUp) await deleteByPrefix(prefix);
});

describe.skipIf(!redisUp)("N4: a Durable Object refuses a session of another model", () => {
  test("input.model llama3_1 on a Qwen3 object: the trajectory is stored failed naming both models, the engine never called", async () => {
    const token = "do-model-token";
    const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
    let engineCalls = 0;
    const engine = Bun.serve({ port: 0, fetch: () => (engineCalls++, new Response("{}", { status: 500 })) });
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
    try {
      const llama = await modelIdOf(await builtinTokenizer("llama3_1"));
      const qwen = await modelIdOf(await builtinTokenizer("qwen3"));
      const env = { UPSTASH_REDIS_REST_URL: bridge.url, UPSTASH_REDIS_REST_TOKEN: token, EDGELOOP_ENGINE_URL: `http://127.0.0.1:${engine.port}`, EDGELOOP_STORE_PREFIX: prefix } as unknown as Env;
      const obj = sessionObject(fakeDurableObjectStorage(), env);
      await q.expectGroup("dm-a", 1, "train");
      const input = {
        key: "dm-a_0_0",
        agent_name: "single_turn_agent",
        sampling_params: { temperature: 1 },
        kwargs: { uid: "dm-a", session_id: 0, data_source: "test", raw_prompt: [{ role: "user", content: "hi" }] },
        rollout: rolloutConfig(),
        model: llama,
      };
      const res = await obj.fetch(new Request("https://session/start", { method: "POST", body: JSON.stringify(input) }));
      expect(res.status).toBe(202);
      await obj.alarm();
      const rec = await q.get("dm-a_0_0");
      expect(rec).toMatchObject({
        error: `model mismatch: session dm-a_0_0 was submitted with model llama3_1 (fingerprint ${llama.fingerprint}), this Durable Object runs qwen3 (fingerprint ${qwen.fingerprint}); refused, not run`,
        finish_reason: "error",
        prompt_ids: [],
        model: llama,
        extra_fields: { model_mismatch: { batch: llama, worker: qwen } },
      });
      expect((await q.groupStatus("dm-a")).complete).toBe(true);
      expect(engineCalls).toBe(0);
    } finally {
      await q.close();
      engine.stop(true);
      await bridge.stop();
    }
  }, HANG_MS);
});
