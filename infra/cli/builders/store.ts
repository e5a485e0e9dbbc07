import type { AppConfig } from "../../../shared/config/app-config.ts";
import { ConfigError, StoreError } from "../../../shared/errors.ts";
import { MemoryEngineGate, RedisEngineGate, type EngineGate } from "../../../shared/inference/engine-control.ts";
import { RedisRoutingState } from "../../../shared/inference/redis-routing-state.ts";
import type { RoutingState } from "../../../shared/inference/routing-state.ts";
import { MemoryPolicyVersions, RedisPolicyVersions, type PolicyVersions } from "../../../shared/rollout/policy-version.ts";
import { RedisSessionStorage } from "../../../shared/session/redis-session-storage.ts";
import { MemoryTransferQueue } from "../../../shared/store/memory-transfer-queue.ts";
import type { RedisCommander } from "../../../shared/store/redis-commander.ts";
import type { TransferQueue } from "../../../shared/store/types.ts";
import { checkUpstash, createUpstashTransferQueue, UpstashCommander } from "../../../shared/store/upstash-transfer-queue.ts";
import { IoRedisCommander, isClusterUrl } from "../../redis/ioredis-commander.ts";
import { MemoryLeaseStore, type LeaseStore } from "../../../shared/tools/lease-store.ts";
import { RedisLeaseStore } from "../../../shared/tools/redis-lease-store.ts";
import { checkRedis, maskRedisUrl } from "../../redis/redis-check.ts";
import { createRedisTransferQueue } from "../../redis/redis-transfer-queue.ts";
import { withBlobs } from "../../blobs/open-blob-store.ts";

// Builders of what lives in the store's Redis: the transfer queue, session storage, policy versions, the
// pause gate and the gateway's routing state, each over its own connection; and the start-up store checks.

/**
 * The transfer queue of `store.url`: in-process for `memory`, Upstash REST
 * for `upstash` (credentials from the environment), else Redis over TCP;
 * behind the blob layer when `store.blobs.url` is set (docs/queue-layout.md, "Blobs").
 * @throws ConfigError when Upstash credentials are missing or the blob store URL is not one.
 */
export function buildStore(config: AppConfig, storeTimeoutS?: number): TransferQueue {
  return withBlobs(config, buildInnerStore(config, storeTimeoutS));
}

function buildInnerStore(config: AppConfig, storeTimeoutS?: number): TransferQueue {
  const url = config.store.url;
  const prefix = config.store.prefix;
  if (url === "memory") return new MemoryTransferQueue();
  if (url === "upstash") {
    const restUrl = process.env.UPSTASH_REDIS_REST_URL;
    const token = process.env.UPSTASH_REDIS_REST_TOKEN;
    if (!restUrl || !token) throw new ConfigError("store.url", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
    return createUpstashTransferQueue({ url: restUrl, token, prefix, ...sizeLimit(config) });
  }
  return createRedisTransferQueue({ url, prefix, shards: config.store.shards, ...sizeLimit(config), ...durabilityOf(config), storeTimeoutS });
}

/** `store.durability: replicated` as the TCP commander's option (nothing for `primary`). */
function durabilityOf(config: AppConfig): { durability?: { replicas: number; timeoutMs: number } } {
  return config.store.durability === "replicated" ? { durability: { replicas: config.store.wait_replicas ?? 1, timeoutMs: config.store.wait_timeout_ms ?? 1000 } } : {};
}

/**
 * A new connection to the store's Redis (Upstash REST or TCP; `storeTimeoutS` bounds a TCP outage). Not for the memory store.
 * `soft`: state a failover may lose without harm (the gateway's routing pins, leases, ejections): its writes never wait for replicas.
 */
function storeCommander(config: AppConfig, storeTimeoutS?: number, soft = false): UpstashCommander | IoRedisCommander {
  const url = config.store.url;
  // Sessions, jobs, batch state, the pause gate, routing state and leases still run multi-key scripts across
  // slots (issue 31 item 1, not done yet): refuse here rather than fail later with CROSSSLOT.
  if (isClusterUrl(url)) {
    throw new ConfigError("store.url", "a redis+cluster:// store holds the transfer queue only for now (createRedisTransferQueue, the Python Reader); sessions, jobs, the pause gate, routing state and leases need a single Redis server or Upstash");
  }
  return url === "upstash"
    ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN!, ...sizeLimit(config) })
    : new IoRedisCommander(url, { ...sizeLimit(config), ...(soft ? {} : durabilityOf(config)), storeTimeoutS });
}

/** Session storage in the store's Redis (its own connection, shared with the job queue), or null for the memory store (no durable sessions). */
export function buildSessionStorage(config: AppConfig, closers: (() => Promise<void>)[], storeTimeoutS?: number): { storage: RedisSessionStorage; commander: RedisCommander } | null {
  const url = config.store.url;
  if (url === "memory") return null;
  const commander = storeCommander(config, storeTimeoutS);
  closers.push(() => commander.close());
  return { storage: new RedisSessionStorage(commander, { prefix: config.store.prefix }), commander };
}

/**
 * The deployment's pause gate: in the store's Redis (API and workers share
 * it; its admission also reads the policy version every engine call is
 * stamped with), or in-process for the memory store.
 */
export function buildGate(config: AppConfig, policy: PolicyVersions, closers: (() => Promise<void>)[], storeTimeoutS?: number): EngineGate {
  const url = config.store.url;
  if (url === "memory") return new MemoryEngineGate();
  const commander = storeCommander(config, storeTimeoutS);
  closers.push(() => commander.close());
  return new RedisEngineGate(commander, { prefix: config.store.prefix, ...(policy instanceof RedisPolicyVersions ? { policyKey: policy.key } : {}) });
}

/**
 * Whether the deployment's engines are paused on purpose (its pause gate in
 * the store's Redis is closed), for a standalone `edgeloop gateway --store`:
 * its health probes then count no failure against a replica. Null for the
 * memory store (the gateway cannot see another process's gate).
 */
export function buildPausedReader(config: AppConfig, closers: (() => Promise<void>)[]): (() => Promise<boolean>) | null {
  if (config.store.url === "memory") return null;
  const gate = buildGate(config, new MemoryPolicyVersions(), closers);
  return async () => (await gate.state()).paused;
}

/**
 * The gateway's shared routing state (pins, in-flight leases, ejections) in
 * the store's Redis, over its own connection: with a `redis://` or `upstash`
 * store and `gateway.shared_state` (default true); null for the memory store
 * or when switched off (each gateway process then routes on its own state).
 * @throws ConfigError when Upstash credentials are missing.
 */
export function buildRoutingState(config: AppConfig, closers: (() => Promise<void>)[], storeTimeoutS?: number): RoutingState | null {
  const url = config.store.url;
  if (url === "memory" || !config.gateway.shared_state) return null;
  if (url === "upstash" && (!process.env.UPSTASH_REDIS_REST_URL || !process.env.UPSTASH_REDIS_REST_TOKEN)) {
    throw new ConfigError("store.url", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
  }
  // Routing state is soft (a lost pin re-routes one call): its writes never wait for replicas.
  const commander = storeCommander(config, storeTimeoutS, true);
  const state = new RedisRoutingState(commander, { prefix: config.store.prefix, leaseTtlMs: config.gateway.lease_ttl_ms, pinTtlMs: config.gateway.pin_ttl_ms });
  closers.push(async () => {
    await state.close();
    await commander.close();
  });
  return state;
}

/** Policy versions shared through the store's Redis (API and workers see one), or in-process for the memory store. */
export function buildPolicy(config: AppConfig, closers: (() => Promise<void>)[], storeTimeoutS?: number): PolicyVersions {
  const url = config.store.url;
  if (url === "memory") return new MemoryPolicyVersions();
  const commander = storeCommander(config, storeTimeoutS);
  closers.push(() => commander.close());
  return new RedisPolicyVersions(commander, { prefix: config.store.prefix });
}

/** `store.max_request_bytes` as commander options (absent: the transport's default). */
function sizeLimit(config: AppConfig): { maxRequestBytes?: number } {
  return config.store.max_request_bytes ? { maxRequestBytes: config.store.max_request_bytes } : {};
}

/**
 * Checks, before anything is built, that the store answers: one PING over a
 * fresh connection (Redis) or over REST with no retries (Upstash), within
 * `timeoutMs`. The memory store needs nothing.
 * @throws StoreError naming the (masked) URL; AuthError for a refused Upstash token; ConfigError when Upstash credentials are missing.
 */
export async function checkStore(config: AppConfig, timeoutMs: number, opts: { noReplicaCheck?: boolean } = {}): Promise<void> {
  const url = config.store.url;
  if (url === "memory") return;
  if (url === "upstash") {
    const restUrl = process.env.UPSTASH_REDIS_REST_URL;
    const token = process.env.UPSTASH_REDIS_REST_TOKEN;
    if (!restUrl || !token) throw new ConfigError("store.url", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
    await checkUpstash({ url: restUrl, token, timeoutMs });
    return;
  }
  await checkRedis(url, { timeoutMs, what: "store.url / --store", ...(config.store.durability === "replicated" && !opts.noReplicaCheck ? { replicas: config.store.wait_replicas ?? 1 } : {}) });
}

/**
 * {@link checkStore} until the store answers: the first failure is reported
 * in one line naming the store and how to bound the wait, then checks repeat
 * with backoff (0.5 s doubling, capped at 5 s). After `timeoutS` seconds
 * (`--store-timeout`) `onTimeout` is called with one line (default: print it
 * and exit 1, as when the store stays unreachable mid-run).
 * @throws AuthError, ConfigError, and a StoreError that is a refusal (wrong password, ACL), at once.
 */
export async function waitForStore(config: AppConfig, checkTimeoutMs: number, timeoutS: number | undefined, onTimeout?: (line: string) => void): Promise<void> {
  const start = Date.now();
  let delay = 500;
  for (let said = false; ; ) {
    try {
      await checkStore(config, checkTimeoutMs);
      if (said) console.error(`edgeloop: store ${maskRedisUrl(config.store.url)} answers after ${((Date.now() - start) / 1000).toFixed(1)} s`);
      return;
    } catch (e) {
      if (!(e instanceof StoreError) || /WRONGPASS|NOAUTH|NOPERM|invalid (username|password)/i.test(e.message)) throw e;
      if (timeoutS !== undefined && Date.now() - start >= timeoutS * 1000) {
        const line = `edgeloop: ${e.message}; unreachable for ${Math.round((Date.now() - start) / 1000)} s at start (--store-timeout ${timeoutS}); exiting`;
        if (!onTimeout) {
          console.error(line);
          process.exit(1);
        }
        onTimeout(line);
        throw e;
      }
      if (!said) {
        console.error(`edgeloop: ${e.message}; waiting for it${timeoutS === undefined ? " (bound the wait with --store-timeout SECONDS)" : ` for up to ${timeoutS} s (--store-timeout)`}`);
        said = true;
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5_000);
    }
  }
}

/**
 * The lease store of the tools file's sandboxes: in the store's Redis (TCP or
 * Upstash; its own connection), so the create limiter, the live cap and the
 * reaper are shared by every process on the store; in-process for the memory store.
 */
export function buildLeaseStore(config: AppConfig, closers: (() => Promise<void>)[], storeTimeoutS?: number): LeaseStore {
  if (config.store.url === "memory") return new MemoryLeaseStore();
  const commander = storeCommander(config, storeTimeoutS);
  closers.push(() => commander.close());
  return new RedisLeaseStore(commander, { prefix: config.store.prefix });
}
