import { describe, expect, test } from "bun:test";
import { Redis } from "@upstash/redis";
import { randomPrefix, requireRedis } from "../helpers/redis.ts";
import { upstashBridgeFixture } from "../helpers/upstash-bridge.ts";

const hasRedis = await requireRedis();
const p = randomPrefix("upstash-bridge");
const token = "bridge-test-token";

describe.skipIf(!hasRedis)("upstash bridge", () => {
  const bridge = upstashBridgeFixture({ token, prefix: p });
  const raw = bridge.raw;

  const post = async (path: string, body: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${bridge.url}${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token}`, ...headers },
      body: JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() };
  };

  test("a wrong or missing bearer token is 401", async () => {
    expect(await post("/", ["PING"], { authorization: "Bearer nope" })).toEqual({ status: 401, body: { error: "Unauthorized" } });
    const res = await fetch(bridge.url, { method: "POST", headers: { "content-type": "application/json" }, body: '["PING"]' });
    expect(res.status).toBe(401);
    expect(await res.json()).toEqual({ error: "Unauthorized" });
  });

  test("single commands: results as JSON, Redis errors as 400 {error}", async () => {
    expect(await post("/", ["SET", `${p}a`, "héllo ✓"])).toEqual({ status: 200, body: { result: "OK" } });
    expect(await post("/", ["GET", `${p}a`])).toEqual({ status: 200, body: { result: "héllo ✓" } });
    expect(await post("/", ["INCRBY", `${p}n`, 5])).toEqual({ status: 200, body: { result: 5 } });
    expect(await post("/", ["GET", `${p}missing`])).toEqual({ status: 200, body: { result: null } });
    expect(await post("/", ["INCR", `${p}a`])).toEqual({ status: 400, body: { error: "ERR value is not an integer or out of range" } });
    expect((await post("/", ["NOSUCHCMD"])).status).toBe(400);
    expect(await post("/", [])).toEqual({ status: 400, body: { error: "ERR a command must be a non-empty JSON array" } });
    expect(await post("/", ["SUBSCRIBE", "x"])).toEqual({ status: 400, body: { error: "ERR command SUBSCRIBE is not supported over REST" } });
    const get = await fetch(bridge.url, { headers: { authorization: `Bearer ${token}` } });
    expect(get.status).toBe(405);
  });

  test("Upstash-Encoding: base64 encodes every string except OK, recursively; bytes survive", async () => {
    await raw.set(`${p}bin`, Buffer.from([0xff, 0x00, 0x80, 0x41]));
    const h = { "upstash-encoding": "base64" };
    expect(await post("/", ["GET", `${p}bin`], h)).toEqual({ status: 200, body: { result: "/wCAQQ==" } });
    expect(await post("/", ["SET", `${p}b`, "x"], h)).toEqual({ status: 200, body: { result: "OK" } });
    expect(await post("/", ["PING"], h)).toEqual({ status: 200, body: { result: "UE9ORw==" } });
    await raw.rpush(`${p}list`, "a", "bc");
    expect(await post("/", ["LRANGE", `${p}list`, 0, -1], h)).toEqual({ status: 200, body: { result: ["YQ==", "YmM="] } });
    expect(await post("/", ["LLEN", `${p}list`], h)).toEqual({ status: 200, body: { result: 2 } });
  });

  test("/pipeline returns one {result}|{error} per command with HTTP 200", async () => {
    const r = await post("/pipeline", [["SET", `${p}p`, "1"], ["INCR", `${p}p`], ["HGET", `${p}p`, "f"], ["GET", `${p}p`]]);
    expect(r).toEqual({
      status: 200,
      body: [
        { result: "OK" },
        { result: 2 },
        { error: "WRONGTYPE Operation against a key holding the wrong kind of value" },
        { result: "2" },
      ],
    });
  });

  test("/multi-exec runs atomically; a discarded transaction is a single 400 {error}", async () => {
    const r = await post("/multi-exec", [["SET", `${p}m`, "a"], ["APPEND", `${p}m`, "b"], ["GET", `${p}m`]], { "upstash-encoding": "base64" });
    expect(r).toEqual({ status: 200, body: [{ result: "OK" }, { result: 2 }, { result: "YWI=" }] });
    const bad = await post("/multi-exec", [["SET", `${p}m`, "z"], ["SET", `${p}m`]]);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toStartWith("EXECABORT");
    expect(await raw.get(`${p}m`)).toBe("ab");
  });

  test("@upstash/redis talks to it: base64 responses, pipeline, multi-exec, errors", async () => {
    const redis = new Redis({ url: bridge.url, token, automaticDeserialization: false, enableTelemetry: false, retry: false });
    expect(await redis.set(`${p}sdk`, "{\"a\":1}")).toBe("OK");
    expect(await redis.get(`${p}sdk`)).toBe("{\"a\":1}");
    const pipe = redis.pipeline();
    pipe.incr(`${p}sdkn`);
    pipe.incr(`${p}sdkn`);
    expect(await pipe.exec()).toEqual([1, 2]);
    const tx = redis.multi();
    tx.hset(`${p}sdkh`, { f: "v" });
    tx.hget(`${p}sdkh`, "f");
    expect(await tx.exec()).toEqual([1, "v"]);
    await expect(redis.incr(`${p}sdk`)).rejects.toThrow("ERR value is not an integer or out of range");
    const wrong = new Redis({ url: bridge.url, token: "wrong", retry: false, enableTelemetry: false });
    await expect(wrong.get(`${p}sdk`)).rejects.toThrow("Unauthorized");
  });
});
