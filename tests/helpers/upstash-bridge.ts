import { afterAll, beforeAll } from "bun:test";
import type IORedis from "ioredis";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { deleteByPrefix, rawRedis, REDIS_URL } from "./redis.ts";

/** The bridge a describe block's tests talk to, and a raw connection for assertions on keys. */
export interface BridgeFixture {
  /** The running bridge's base URL (read it inside a test: the bridge starts in beforeAll). */
  readonly url: string;
  /** A plain ioredis connection to the same Redis. */
  raw: IORedis;
}

/**
 * Call inside a describe: beforeAll starts the local Upstash REST bridge over
 * the test Redis with `token` (and `maxBodyBytes`, bytes, when given);
 * afterAll stops it, quits the raw connection and deletes every key under
 * `prefix`.
 */
export function upstashBridgeFixture(opts: { token: string; prefix: string; maxBodyBytes?: number }): BridgeFixture {
  let bridge: UpstashBridge;
  const raw = rawRedis();
  beforeAll(async () => {
    bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: opts.token, ...(opts.maxBodyBytes === undefined ? {} : { maxBodyBytes: opts.maxBodyBytes }) });
  });
  afterAll(async () => {
    await bridge.stop();
    await raw.quit();
    await deleteByPrefix(opts.prefix);
  });
  return {
    get url() {
      return bridge.url;
    },
    raw,
  };
}
