import { afterAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../../shared/store/redis-commander.ts";
import { RedisTransferQueue } from "../../shared/store/redis-transfer-queue.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { upstashBridgeFixture } from "../helpers/upstash-bridge.ts";
import { makeRecord } from "./contract.ts";

const hasRedis = await requireRedis();
const base = randomPrefix("put-round-trips");
const token = `tok-${crypto.randomUUID()}`;

/** Counts the round trips a queue makes through its commander: one per exec, one per pipeline (with the commands it held). */
class CountingCommander implements RedisCommander {
  trips: string[][] = [];
  constructor(private readonly inner: RedisCommander) {}
  exec(cmd: RedisArg[]): Promise<RedisReply> {
    this.trips.push([String(cmd[0])]);
    return this.inner.exec(cmd);
  }
  pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    this.trips.push(cmds.map((c) => String(c[0])));
    return this.inner.pipeline(cmds);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

/** Counts fetch requests to `url` while `fn` runs. */
async function countFetches(url: string, fn: () => Promise<unknown>): Promise<number> {
  const real = globalThis.fetch;
  let n = 0;
  globalThis.fetch = ((input: Parameters<typeof fetch>[0], init?: Parameters<typeof fetch>[1]) => {
    if (String(input instanceof Request ? input.url : input).startsWith(url)) n++;
    return real(input, init);
  }) as typeof fetch;
  try {
    await fn();
  } finally {
    globalThis.fetch = real;
  }
  return n;
}

describe.skipIf(!hasRedis)("one put is one round trip", () => {
  afterAll(() => deleteByPrefix(base));

  test("redis tcp: the first put of a queue (sends the script itself), the next, the one completing a group and a duplicate each take one pipeline", async () => {
    const prefix = `${base}tcp:`;
    const cmd = new CountingCommander(new IoRedisCommander(REDIS_URL));
    const q = new RedisTransferQueue(cmd, { prefix });
    const raw = rawRedis();
    try {
      await q.expectGroup("g1", 2);
      cmd.trips = [];
      expect(await q.put(makeRecord("g1", 0))).toEqual({ key: "g1_0_0", stored: true });
      expect(cmd.trips).toEqual([["HSET", "PEXPIRE", "EVAL"]]);
      cmd.trips = [];
      expect(await q.put(makeRecord("g1", 1))).toEqual({ key: "g1_1_0", stored: true });
      expect(cmd.trips).toEqual([["HSET", "PEXPIRE", "EVALSHA"]]);
      expect((await q.groupStatus("g1")).complete).toBe(true);
      expect(await raw.xlen(`${prefix}groups:train`)).toBe(1);
      cmd.trips = [];
      expect(await q.put(makeRecord("g1", 1))).toEqual({ key: "g1_1_0", stored: false });
      expect(cmd.trips).toEqual([["HSET", "PEXPIRE", "EVALSHA"]]);
      expect(await raw.xlen(`${prefix}groups:train`)).toBe(1);
      expect(await raw.keys(`${prefix}stage:*`)).toEqual([]);
    } finally {
      await q.close();
      await raw.quit();
    }
  });

  describe("upstash rest", () => {
    const bridge = upstashBridgeFixture({ token, prefix: base });
    test("a put is one HTTP request (first, next, completing, duplicate)", async () => {
      const prefix = `${base}up:`;
      const q = new RedisTransferQueue(new UpstashCommander({ url: bridge.url, token, retries: 0 }), { prefix });
      try {
        await q.expectGroup("u1", 2);
        expect(await countFetches(bridge.url, () => q.put(makeRecord("u1", 0)))).toBe(1);
        expect(await countFetches(bridge.url, () => q.put(makeRecord("u1", 1)))).toBe(1);
        expect(await bridge.raw.xlen(`${prefix}groups:train`)).toBe(1);
        expect(await countFetches(bridge.url, async () => expect((await q.put(makeRecord("u1", 1))).stored).toBe(false))).toBe(1);
        expect(await bridge.raw.xlen(`${prefix}groups:train`)).toBe(1);
      } finally {
        await q.close();
      }
    });
  });
});
