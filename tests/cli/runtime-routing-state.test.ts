import { afterAll, describe, expect, test } from "bun:test";
import { buildRoutingState, buildRuntime } from "../../infra/cli/runtime.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { RedisRoutingState } from "../../shared/inference/redis-routing-state.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const hasRedis = await requireRedis();
const prefix = randomPrefix("runtime-routing");
afterAll(async () => {
  if (hasRedis) await deleteByPrefix(prefix);
});

describe("routing state wiring", () => {
  test("buildRoutingState: none for the memory store or gateway.shared_state false; Redis for a redis:// store", async () => {
    const closers: (() => Promise<void>)[] = [];
    expect(buildRoutingState(parseAppConfig({}, "t"), closers)).toBeNull();
    expect(buildRoutingState(parseAppConfig({ store: { url: REDIS_URL }, gateway: { shared_state: false } }, "t"), closers)).toBeNull();
    expect(closers.length).toBe(0);
    const s = buildRoutingState(parseAppConfig({ store: { url: REDIS_URL, prefix } }, "t"), closers);
    expect(s).toBeInstanceOf(RedisRoutingState);
    expect((s as RedisRoutingState).pinKey("k")).toBe(`${prefix}routing:pin:k`);
    for (const c of closers) await c();
  });

  test.skipIf(!hasRedis)("the embedded gateway (sim --replicas 2) pins sessions in the store's Redis", async () => {
    const rt = await buildRuntime({ replicas: 2, store: REDIS_URL, storePrefix: prefix });
    const raw = rawRedis();
    try {
      expect(rt.describe.some((l) => l.includes("routing state shared in the store"))).toBe(true);
      const out = await rt.client.generate({ request_id: "r1", routing_key: "wired_0_0", prompt_ids: [9707, 11, 1879], sampling_params: SamplingParams.parse({}), max_tokens: 4 });
      expect(out.token_ids.length).toBeGreaterThan(0);
      expect(await raw.get(`${prefix}routing:pin:wired_0_0`)).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    } finally {
      await raw.quit();
      await rt.close();
    }
  }, HANG_MS);
});
