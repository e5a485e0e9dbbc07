import { afterAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { StoreError } from "../../shared/errors.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";

// Issue 26 / audit S10: blocking reads (GET /v1/groups?block_ms=, job waits) share a bounded pool of
// connections; waiters queue up to their own BLOCK time; idle connections are closed.

const hasRedis = await requireRedis();
const prefix = randomPrefix("s10");
afterAll(async () => {
  if (hasRedis) await deleteByPrefix(prefix);
});

/** Waits (bounded) until `f` holds, re-checking on every macrotask: an event count, not a sleep. */
async function until(f: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 5000 && !f(); i++) await new Promise((r) => setTimeout(r, 2));
  if (!f()) throw new Error(`timed out waiting for ${what}`);
}

describe.skipIf(!hasRedis)("S10: bounded blocking pool", () => {
  test("at most maxBlocking connections; waiters past the queue bound are a 503; idle connections close", async () => {
    const c = new IoRedisCommander(REDIS_URL, { maxBlocking: 2, maxBlockingQueue: 3, blockingIdleMs: 50 });
    try {
      const stream = `${prefix}st`;
      const read = (ms: number) => c.execBlocking!(["XREAD", "BLOCK", String(ms), "STREAMS", stream, "0-0"]);
      // Six reads at once: two run, three wait, the sixth is refused.
      const long = [read(5000), read(5000)];
      const waiting = [read(5000), read(5000), read(5000)];
      const refused = await read(5000).then(
        () => null,
        (e: unknown) => e,
      );
      expect(refused).toBeInstanceOf(StoreError);
      expect([(refused as StoreError).status, (refused as StoreError).code, (refused as StoreError).retryable]).toEqual([503, "blocking_reads_busy", true]);
      expect(c.blockingStats()).toEqual({ active: 2, idle: 0, open: 2, waiting: 3 });
      // One XADD (reads from 0-0: any entry answers, also for a read that reaches Redis after it) wakes the two
      // running reads; their connections pass to the waiters in order, who answer at once: never more than 2 open.
      let maxOpen = 0;
      const watch = setInterval(() => (maxOpen = Math.max(maxOpen, c.blockingStats().open)), 1);
      await c.exec(["XADD", stream, "*", "f", "1"]);
      const all = (await Promise.all([...long, ...waiting])) as unknown[];
      clearInterval(watch);
      expect(all.map((r) => Array.isArray(r))).toEqual([true, true, true, true, true]);
      expect(maxOpen).toBeLessThanOrEqual(2);
      // Released and idle for blockingIdleMs: closed.
      await until(() => c.blockingStats().open === 0, "idle blocking connections to close");
      expect(c.blockingStats()).toEqual({ active: 0, idle: 0, open: 0, waiting: 0 });
    } finally {
      await c.close();
    }
  });

  test("a waiter that gets no connection within its BLOCK time answers as a timed-out read (null)", async () => {
    const c = new IoRedisCommander(REDIS_URL, { maxBlocking: 1 });
    try {
      const stream = `${prefix}st2`;
      const busy = c.execBlocking!(["XREAD", "BLOCK", "5000", "STREAMS", stream, "0-0"]);
      expect(await c.execBlocking!(["XREAD", "BLOCK", "30", "STREAMS", stream, "0-0"])).toBeNull();
      expect(c.blockingStats()).toMatchObject({ active: 1, waiting: 0 });
      await c.exec(["XADD", stream, "*", "f", "1"]);
      expect(Array.isArray(await busy)).toBe(true);
    } finally {
      await c.close();
    }
  });

  test("the audit's repro through the store: 40 concurrent blocking group reads use at most maxBlocking connections", async () => {
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix: `${prefix}q:`, maxBlocking: 4, blockingIdleMs: 50 });
    try {
      const commander = (q as unknown as { redis: IoRedisCommander }).redis;
      const reads = Array.from({ length: 40 }, (_, i) => q.readCompleteGroups({ consumer: `c${i}`, max: 1, block_ms: 100 }));
      await until(() => commander.blockingStats().active === 4, "the pool to fill");
      expect(commander.blockingStats().open).toBe(4);
      expect((await Promise.all(reads)).every((g) => g.length === 0)).toBe(true);
      await until(() => commander.blockingStats().open === 0, "idle connections to close");
    } finally {
      await q.close();
    }
  });
});
