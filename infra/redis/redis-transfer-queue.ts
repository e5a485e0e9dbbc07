import { RedisTransferQueue, type RedisTransferQueueOptions } from "../../shared/store/redis-transfer-queue.ts";
import { IoRedisCommander, type IoRedisCommanderOptions } from "./ioredis-commander.ts";

/** Options of {@link createRedisTransferQueue}: a `redis://` URL plus the queue options. */
export interface TcpTransferQueueOptions extends RedisTransferQueueOptions {
  /** `redis://[user:pass@]host:port[/db]`, default `redis://127.0.0.1:6379`. */
  url?: string;
  /** Largest command / pipeline write, bytes (see {@link IoRedisCommander}). */
  maxRequestBytes?: number;
  /** `--store-timeout` in seconds, named in the outage line (see {@link IoRedisCommander}). */
  storeTimeoutS?: number;
  /** Blocking reads at once, waiters, idle close (see {@link IoRedisCommanderOptions.maxBlocking}). */
  maxBlocking?: number;
  maxBlockingQueue?: number;
  blockingIdleMs?: number;
  /** `store.durability: replicated` (see {@link IoRedisCommanderOptions.durability}). */
  durability?: { replicas: number; timeoutMs: number };
}

/**
 * The transfer queue over Redis TCP with ioredis (chosen over Bun's
 * `RedisClient` in bench/queue.ts: equal put throughput on this workload,
 * and it also runs on Node and Deno).
 */
export function createRedisTransferQueue(opts: TcpTransferQueueOptions = {}): RedisTransferQueue {
  const commanderOpts: IoRedisCommanderOptions = {
    ...(opts.maxRequestBytes ? { maxRequestBytes: opts.maxRequestBytes } : {}),
    ...(opts.storeTimeoutS !== undefined ? { storeTimeoutS: opts.storeTimeoutS } : {}),
    ...(opts.maxBlocking !== undefined ? { maxBlocking: opts.maxBlocking } : {}),
    ...(opts.maxBlockingQueue !== undefined ? { maxBlockingQueue: opts.maxBlockingQueue } : {}),
    ...(opts.blockingIdleMs !== undefined ? { blockingIdleMs: opts.blockingIdleMs } : {}),
    ...(opts.durability ? { durability: opts.durability } : {}),
  };
  return new RedisTransferQueue(new IoRedisCommander(opts.url ?? "redis://127.0.0.1:6379", commanderOpts), opts);
}

export { IoRedisCommander };
