import { afterAll } from "bun:test";
import { globEscape } from "../../shared/store/gc.ts";
import IORedis from "ioredis";

/** The Redis the tests use (`REDIS_URL`, default `redis://127.0.0.1:6379`). */
export const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";

/** A random key prefix for one test file, e.g. `test:store-redis:k3j9x2:`. */
export function randomPrefix(name: string): string {
  return `test:${name}:${crypto.randomUUID().slice(0, 8)}:`;
}

/** A plain ioredis connection for assertions on raw keys; close it with `quit()`. */
export function rawRedis(): IORedis {
  return new IORedis(REDIS_URL, { maxRetriesPerRequest: 1 });
}

/**
 * Whether Redis answers PING within a second. When it does not and `CI` is
 * set, throws: in CI a missing Redis is a failure, not a skip.
 */
export async function requireRedis(): Promise<boolean> {
  const c = new IORedis(REDIS_URL, { lazyConnect: true, connectTimeout: 1000, maxRetriesPerRequest: 0, retryStrategy: () => null });
  c.on("error", () => {});
  try {
    await c.connect();
    await c.ping();
    return true;
  } catch (e) {
    if (process.env.CI) throw new Error(`Redis at ${REDIS_URL} is unreachable and CI is set: ${(e as Error).message}`);
    console.warn(`Redis at ${REDIS_URL} is unreachable: skipping Redis tests`);
    return false;
  } finally {
    c.disconnect();
  }
}

/** Deletes every key under `prefix` (SCAN + UNLINK); returns how many were deleted. */
export async function deleteByPrefix(prefix: string): Promise<number> {
  const c = rawRedis();
  let n = 0;
  try {
    let cursor = "0";
    do {
      const [next, keys] = await c.scan(cursor, "MATCH", `${globEscape(prefix)}*`, "COUNT", 1000);
      cursor = next;
      if (keys.length) n += await c.unlink(...keys);
    } while (cursor !== "0");
  } finally {
    await c.quit();
  }
  return n;
}

/** What one test file leaves for {@link redisCleanup}'s afterAll: key prefixes to delete, things to close. */
export interface RedisCleanup {
  /** Prefixes whose keys afterAll deletes (after closing). */
  prefixes: string[];
  /** Closers afterAll runs, last pushed first; a closer that fails is ignored. */
  closers: (() => Promise<unknown>)[];
}

/**
 * Registers an afterAll (call it at a file's top level) that runs the
 * returned closers, last pushed first, ignoring failures, then deletes every
 * key under each prefix pushed (see {@link deleteByPrefix}).
 */
export function redisCleanup(): RedisCleanup {
  const c: RedisCleanup = { prefixes: [], closers: [] };
  afterAll(async () => {
    for (const close of c.closers.reverse()) await close().catch(() => {});
    for (const p of c.prefixes) await deleteByPrefix(p);
  });
  return c;
}
