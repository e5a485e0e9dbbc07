import { describe, expect, test } from "bun:test";
import { DEFAULT_BRIDGE_MAX_BODY } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { randomPrefix, requireRedis } from "../helpers/redis.ts";
import { upstashBridgeFixture } from "../helpers/upstash-bridge.ts";

const hasRedis = await requireRedis();
const p = randomPrefix("bridge-limit");
const token = "bridge-limit-token";

describe.skipIf(!hasRedis)("upstash bridge body limit", () => {
  const bridge = upstashBridgeFixture({ token, prefix: p, maxBodyBytes: 1000 });
  const raw = bridge.raw;
  const headers = { "content-type": "application/json", authorization: `Bearer ${token}` };
  const tooLarge = { error: "ERR request body larger than 1000 bytes" };

  test("a body over maxBodyBytes is 413 {error} and writes nothing, declared or streamed", async () => {
    const big = JSON.stringify(["SET", `${p}big`, "x".repeat(1000)]);
    const declared = await fetch(bridge.url, { method: "POST", headers, body: big });
    expect(declared.status).toBe(413);
    expect(await declared.json()).toEqual(tooLarge);
    const pipeline = await fetch(`${bridge.url}/pipeline`, { method: "POST", headers, body: JSON.stringify([["SET", `${p}big`, "x".repeat(600)], ["SET", `${p}big2`, "x".repeat(600)]]) });
    expect(pipeline.status).toBe(413);
    expect(await pipeline.json()).toEqual(tooLarge);
    const streamed = await fetch(bridge.url, {
      method: "POST",
      headers,
      body: new ReadableStream({
        start(c) {
          for (let i = 0; i < 4; i++) c.enqueue(new TextEncoder().encode(i === 0 ? `["SET","${p}big","` : i === 3 ? `"]` : "y".repeat(600)));
          c.close();
        },
      }),
    });
    expect(streamed.status).toBe(413);
    expect(await streamed.json()).toEqual(tooLarge);
    expect(await raw.exists(`${p}big`, `${p}big2`)).toBe(0);
  });

  test("a body under the limit is served; auth is checked before the size", async () => {
    const ok = await fetch(bridge.url, { method: "POST", headers, body: JSON.stringify(["SET", `${p}small`, "v"]) });
    expect(ok.status).toBe(200);
    expect(await ok.json()).toEqual({ result: "OK" });
    const noAuth = await fetch(bridge.url, { method: "POST", headers: { "content-type": "application/json" }, body: "x".repeat(5000) });
    expect(noAuth.status).toBe(401);
    expect(DEFAULT_BRIDGE_MAX_BODY).toBe(16 * 1024 * 1024);
  });
});
