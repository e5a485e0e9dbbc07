import type { RedisCommander } from "../store/redis-commander.ts";
import { replyToFields } from "../store/redis-transfer-queue.ts";
import { StoreError } from "../errors.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";

/** The policy version trajectories are generated with, and its sequence number (1 for the first version set, +1 per change). */
export interface PolicyVersion {
  version: string | number;
  seq: number;
}

/**
 * The current policy version, set by the trainer after each weight update
 * (`POST /v1/model-version {version}`), shared by every process of a
 * deployment (API and workers). Each turn records the version it was
 * generated under (`extra_fields.model_versions`), and
 * `rollout.max_staleness` fails a trajectory whose first turn is more than
 * that many versions behind.
 */
export interface PolicyVersions {
  /** The current version, or null when none was ever set. */
  current(): Promise<PolicyVersion | null>;
  /** Makes `version` current; setting the current version again changes nothing. Returns it with its seq. */
  set(version: string | number): Promise<PolicyVersion>;
  /** The seq `version` got when it was set, or null for a version never set here. */
  seqOf(version: unknown): Promise<number | null>;
}

/** In-process {@link PolicyVersions} (the memory store: one process). */
export class MemoryPolicyVersions implements PolicyVersions {
  private cur: PolicyVersion | null = null;
  private readonly seqs = new Map<string, number>();
  async current(): Promise<PolicyVersion | null> {
    return this.cur;
  }
  async set(version: string | number): Promise<PolicyVersion> {
    if (this.cur && this.cur.version === version) return this.cur;
    this.cur = { version, seq: (this.cur?.seq ?? 0) + 1 };
    if (!this.seqs.has(JSON.stringify(version))) this.seqs.set(JSON.stringify(version), this.cur.seq);
    return this.cur;
  }
  async seqOf(version: unknown): Promise<number | null> {
    return this.seqs.get(JSON.stringify(version)) ?? null;
  }
}

/**
 * Set-if-changed: KEYS = the policy hash; ARGV = the version as JSON. Bumps
 * `seq`, sets `current` and records `v:<json>` → seq (first time only),
 * atomically; returns `[json, seq]` of the current version.
 */
const SET_LUA = `local cur = redis.call('HGET', KEYS[1], 'current')
if cur == ARGV[1] then return {cur, tonumber(redis.call('HGET', KEYS[1], 'seq'))} end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'current', ARGV[1])
redis.call('HSETNX', KEYS[1], 'v:' .. ARGV[1], seq)
return {ARGV[1], seq}`;

/**
 * {@link PolicyVersions} in Redis (`{p}policy` HASH: `current` = version
 * JSON, `seq`, `v:<version JSON>` = its seq), shared by the API and its
 * workers. Reads are cached for `cacheMs` (default 250) so a turn costs no
 * round trip in steady state. Runtime-free.
 * @throws StoreError (retryable) on Redis failures; reads wait a store outage out ({@link holdWhileStoreDown}).
 */
export class RedisPolicyVersions implements PolicyVersions {
  readonly key: string;
  private cache: { at: number; v: PolicyVersion | null } | null = null;
  private readonly seqCache = new Map<string, number>();

  constructor(
    private readonly redis: RedisCommander,
    opts: { prefix?: string; cacheMs?: number } = {},
  ) {
    this.key = `${opts.prefix ?? "edgeloop:"}policy`;
    this.cacheMs = opts.cacheMs ?? 250;
  }
  private readonly cacheMs: number;

  async current(): Promise<PolicyVersion | null> {
    if (this.cache && Date.now() - this.cache.at < this.cacheMs) return this.cache.v;
    const f = replyToFields(await this.call(["HGETALL", this.key]));
    const v = f.current === undefined ? null : { version: JSON.parse(f.current) as string | number, seq: Number(f.seq) };
    this.cache = { at: Date.now(), v };
    return v;
  }

  /** Drops the cached current version: the next read goes to Redis (called when a pause ended: the version may have changed). */
  invalidate(): void {
    this.cache = null;
  }

  async set(version: string | number): Promise<PolicyVersion> {
    const r = (await this.call(["EVAL", SET_LUA, "1", this.key, JSON.stringify(version)], false)) as [string, number];
    const v = { version: JSON.parse(String(r[0])) as string | number, seq: Number(r[1]) };
    this.cache = { at: Date.now(), v };
    return v;
  }

  async seqOf(version: unknown): Promise<number | null> {
    if (typeof version !== "string" && typeof version !== "number") return null;
    const k = JSON.stringify(version);
    const hit = this.seqCache.get(k);
    if (hit !== undefined) return hit;
    const r = await this.call(["HGET", this.key, `v:${k}`]);
    if (r === null) return null;
    this.seqCache.set(k, Number(r));
    return Number(r);
  }

  /**
   * One command. Reads (`hold`) are made on the trajectory path, after a
   * turn's generation: they wait a store outage out (the turn stays in
   * memory) instead of failing the trajectory; `set` (an API call) fails fast.
   */
  private async call(cmd: string[], hold = true) {
    const once = async () => {
      try {
        return await this.redis.exec(cmd);
      } catch (e) {
        throw new StoreError(`policy version: ${(e as Error)?.message ?? String(e)}`, { cause: e });
      }
    };
    return hold ? holdWhileStoreDown(once) : once();
  }
}
