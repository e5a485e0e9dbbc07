import { EdgeloopError, StoreError } from "../errors.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../store/redis-commander.ts";

/**
 * The job queue's Redis calls: one command, a pipeline, or a script, each
 * failure mapped by {@link storeError} (a pipeline fails on its first error
 * reply). Runtime-free: any {@link RedisCommander} (TCP or Upstash REST).
 */
export class JobRedis {
  constructor(readonly redis: RedisCommander) {}

  /** One command; `blocking` (XREAD BLOCK …) goes through the commander's blocking connections when it has them. */
  async call(cmd: RedisArg[], blocking = false): Promise<RedisReply> {
    try {
      return blocking && this.redis.execBlocking ? await this.redis.execBlocking(cmd) : await this.redis.exec(cmd);
    } catch (e) {
      throw storeError(e);
    }
  }

  /** Commands in one pipeline; their replies in order. @throws StoreError when the pipeline or any command fails. */
  async pipe(cmds: RedisArg[][]): Promise<RedisReply[]> {
    let out: (RedisReply | Error)[];
    try {
      out = await this.redis.pipeline(cmds);
    } catch (e) {
      throw storeError(e);
    }
    const bad = out.find((r) => r instanceof Error);
    if (bad) throw storeError(bad);
    return out as RedisReply[];
  }

  /** EVAL of a script (Redis over TCP and Upstash REST alike; scripts here are small, so no EVALSHA cache). */
  eval(script: string, keys: string[], args: string[]): Promise<RedisReply> {
    return this.call(["EVAL", script, String(keys.length), ...keys, ...args]);
  }
}

/** A Redis failure as a 503 StoreError; `OOM` (maxmemory reached) says the store is full. */
export function storeError(e: unknown): EdgeloopError {
  if (e instanceof EdgeloopError) return e;
  const msg = (e as Error)?.message ?? String(e);
  if (/^OOM\b/.test(msg)) return new StoreError("store full: Redis refused the write (maxmemory reached)", { cause: e, code: "store_full" });
  return new StoreError(`redis: ${msg.slice(0, 300)}`, { cause: e });
}
