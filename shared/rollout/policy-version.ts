import { z } from "zod";
import type { RedisCommander } from "../store/redis-commander.ts";
import { InputError, StoreError } from "../errors.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";

// The port (what loops and admission read) is defined below the loops, in inference/; its Memory and Redis
// implementations live here.
import type { PolicyVersion, PolicyVersions } from "../inference/policy-versions.ts";
export type { PolicyVersion, PolicyVersions } from "../inference/policy-versions.ts";

/** How a trajectory was admitted ({@link waitForAdmission}): the versions it started under and how long it was held. */
export interface Admission {
  /** The current policy version when it started, and its seq. */
  version: string | number;
  seq: number;
  /** The seq of the trainer's consumed version then. */
  consumed_seq: number;
  /** `seq − consumed_seq`: at most `rollout.max_staleness`. */
  staleness: number;
  /** Milliseconds it was held before starting (0: started at once). */
  held_ms: number;
}

/**
 * Admission control (`rollout.max_staleness` with `staleness_policy:
 * admit`): resolves once `current.seq − consumed.seq ≤ maxStaleness`, i.e.
 * once the trainer has consumed groups of a version at most `maxStaleness`
 * versions older than the one the trajectory would start with; until then it
 * waits ({@link PolicyVersions.waitChange}: no CPU, no engine call) and
 * re-checks when a version changes. Returns how it was admitted, or null
 * when no bound applies (no limit, no current version, or the trainer never
 * reported a consumed version: a trainer that does not report is never held).
 *
 * Adapted from AReaL's `rollout.max_head_offpolicyness` (StalenessManager:
 * at most `(max_staleness + current_version + 1) × consumer_batch_size`
 * samples started, so that none is consumed more than `max_staleness`
 * versions after the one it was generated with): edgeloop does not know the
 * trainer's batch size, so it counts in versions what the trainer has
 * consumed instead of in samples.
 * @see https://inclusionai.github.io/AReaL/algorithms/async.html
 * @see AReaL `areal/core/staleness_manager.py` (`get_capacity`)
 * @throws the signal's reason when `signal` aborts while held
 */
export async function waitForAdmission(policy: PolicyVersions, maxStaleness: number | null, opts: { signal?: AbortSignal; pollMs?: number; nowMs?: () => number } = {}): Promise<Admission | null> {
  if (maxStaleness == null) return null;
  const now = opts.nowMs ?? Date.now;
  const t0 = now();
  for (;;) {
    if (opts.signal?.aborted) throw opts.signal.reason;
    const { current, consumed } = await policy.admissionState();
    if (!current || !consumed) return null;
    const staleness = current.seq - consumed.seq;
    if (staleness <= maxStaleness) return { version: current.version, seq: current.seq, consumed_seq: consumed.seq, staleness, held_ms: Math.max(0, now() - t0) };
    await policy.waitChange(opts.pollMs ?? 50, opts.signal);
  }
}

function sleepOrAbort(ms: number, signal: AbortSignal | undefined, wake?: (fn: () => void) => () => void): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    let off = () => {};
    const done = () => {
      clearTimeout(timer);
      off();
      signal?.removeEventListener("abort", onAbort);
      resolve();
    };
    const onAbort = () => {
      clearTimeout(timer);
      off();
      reject(signal!.reason);
    };
    const timer = setTimeout(done, ms);
    if (wake) off = wake(done);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * A policy version as the API and CLI accept it: a string of 1–200
 * characters, not blank, without leading/trailing whitespace or control
 * characters, or a finite number
 * (`POST /v1/model-version`, `/v1/consumed-version`, a batch's
 * `model_version`, `--model-version`).
 */
export const PolicyVersionValue = z.union([
  z
    .string()
    .max(200, "a version is at most 200 characters")
    .superRefine((v, ctx) => {
      // One message per value: the first rule it breaks.
      const why = !/\S/.test(v)
        ? "a version must not be empty or blank"
        : v.trim() !== v
          ? 'a version must not start or end with whitespace ("3 " would be another version than 3)'
          : /[\u0000-\u001f\u007f]/.test(v)
            ? "a version must not hold control characters"
            : null;
      if (why) ctx.addIssue({ code: "custom", message: why });
    }),
  z.number().finite(),
]);

/**
 * The identity of a policy version: its text, so that a number and its
 * decimal string name one version (`3` and `"3"`: a trainer posting its step
 * as a number while SGLang reports `weight_version` as a string). Returned as
 * JSON of that text (the form of the Redis `v:` fields). A version keeps the
 * form it was first set with wherever it is reported.
 */
export function versionKey(version: string | number): string {
  return JSON.stringify(String(version));
}

/** In-process {@link PolicyVersions} (the memory store: one process). */
export class MemoryPolicyVersions implements PolicyVersions {
  private cur: PolicyVersion | null = null;
  private con: PolicyVersion | null = null;
  private readonly seqs = new Map<string, number>();
  private readonly listeners = new Set<() => void>();
  async current(): Promise<PolicyVersion | null> {
    return this.cur;
  }
  async set(version: string | number): Promise<PolicyVersion> {
    if (this.cur && versionKey(this.cur.version) === versionKey(version)) return this.cur;
    this.cur = { version, seq: (this.cur?.seq ?? 0) + 1 };
    if (!this.seqs.has(versionKey(version))) this.seqs.set(versionKey(version), this.cur.seq);
    this.changed();
    return this.cur;
  }
  async seqOf(version: unknown): Promise<number | null> {
    if (typeof version !== "string" && typeof version !== "number") return null;
    return this.seqs.get(versionKey(version)) ?? null;
  }
  async consumed(): Promise<PolicyVersion | null> {
    return this.con;
  }
  async setConsumed(version: string | number): Promise<PolicyVersion> {
    const seq = this.seqs.get(versionKey(version));
    if (seq === undefined) throw new InputError("version", `policy version ${JSON.stringify(version).slice(0, 200)} was never set (POST /v1/model-version first)`);
    if (!this.con || seq > this.con.seq) this.con = { version, seq };
    this.changed();
    return this.con;
  }
  async admissionState(): Promise<{ current: PolicyVersion | null; consumed: PolicyVersion | null }> {
    return { current: this.cur, consumed: this.con };
  }
  waitChange(ms: number, signal?: AbortSignal): Promise<void> {
    return sleepOrAbort(ms, signal, (fn) => {
      this.listeners.add(fn);
      return () => this.listeners.delete(fn);
    });
  }
  private changed(): void {
    for (const l of [...this.listeners]) l();
  }
}

/**
 * Set-if-changed: KEYS = the policy hash; ARGV = the version as JSON, its
 * {@link versionKey}. Bumps `seq`, sets `current` (and `current_key`) and
 * records `v:<key>` → seq (first time only), atomically; returns `[json, seq]`
 * of the current version (as first set, when the key is unchanged).
 */
const SET_LUA = `if redis.call('HGET', KEYS[1], 'current_key') == ARGV[2] then
  return {redis.call('HGET', KEYS[1], 'current'), tonumber(redis.call('HGET', KEYS[1], 'seq'))}
end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
redis.call('HSET', KEYS[1], 'current', ARGV[1], 'current_key', ARGV[2])
redis.call('HSETNX', KEYS[1], 'v:' .. ARGV[2], seq)
return {ARGV[1], seq}`;

/**
 * Consumed-if-newer: KEYS = the policy hash; ARGV = the version as JSON, its {@link versionKey}.
 * Replies `UNKNOWN` for a version never set; otherwise records `consumed` /
 * `consumed_seq` when its seq is newer than the recorded one; returns
 * `[json, seq]` of the recorded consumed version.
 */
const CONSUMED_LUA = `local seq = redis.call('HGET', KEYS[1], 'v:' .. ARGV[2])
if not seq then return redis.error_reply('UNKNOWN version') end
local cur = tonumber(redis.call('HGET', KEYS[1], 'consumed_seq') or '0')
if tonumber(seq) > cur then
  redis.call('HSET', KEYS[1], 'consumed', ARGV[1], 'consumed_seq', seq)
  return {ARGV[1], tonumber(seq)}
end
return {redis.call('HGET', KEYS[1], 'consumed'), cur}`;

/**
 * {@link PolicyVersions} in Redis (`{p}policy` HASH: `current` = version
 * JSON, `current_key` = its {@link versionKey}, `seq`, `v:<versionKey>` = its seq, `consumed` / `consumed_seq` = the
 * trainer's consumed version), shared by the API and its
 * workers. `current` is one HMGET per read, never cached: no process may
 * stamp a call with a version another process has replaced. The engine
 * calls of `edgeloop serve`/`worker` do not read it: their gate's admission
 * script reads `{p}policy` too (`RedisEngineGate`'s `policyKey`), so a
 * stamp costs no round trip. `seqOf` is cached (a version's seq never changes). Runtime-free.
 * @throws StoreError (retryable) on Redis failures; reads wait a store outage out ({@link holdWhileStoreDown}).
 */
export class RedisPolicyVersions implements PolicyVersions {
  readonly key: string;
  private readonly seqCache = new Map<string, number>();

  constructor(
    private readonly redis: RedisCommander,
    opts: { prefix?: string } = {},
  ) {
    this.key = `${opts.prefix ?? "edgeloop:"}policy`;
  }

  async current(): Promise<PolicyVersion | null> {
    const [cur, seq] = (await this.call(["HMGET", this.key, "current", "seq"])) as (string | null)[];
    return cur == null ? null : { version: JSON.parse(cur) as string | number, seq: Number(seq) };
  }

  async set(version: string | number): Promise<PolicyVersion> {
    const r = (await this.call(["EVAL", SET_LUA, "1", this.key, JSON.stringify(version), versionKey(version)], false)) as [string, number];
    return { version: JSON.parse(String(r[0])) as string | number, seq: Number(r[1]) };
  }

  async seqOf(version: unknown): Promise<number | null> {
    if (typeof version !== "string" && typeof version !== "number") return null;
    const k = versionKey(version);
    const hit = this.seqCache.get(k);
    if (hit !== undefined) return hit;
    const r = await this.call(["HGET", this.key, `v:${k}`]);
    if (r === null) return null;
    this.seqCache.set(k, Number(r));
    return Number(r);
  }

  async consumed(): Promise<PolicyVersion | null> {
    return (await this.admissionState()).consumed;
  }

  async setConsumed(version: string | number): Promise<PolicyVersion> {
    let r: [string, number];
    try {
      r = (await this.call(["EVAL", CONSUMED_LUA, "1", this.key, JSON.stringify(version), versionKey(version)], false)) as [string, number];
    } catch (e) {
      if (/UNKNOWN version/.test((e as Error)?.message ?? "")) throw new InputError("version", `policy version ${JSON.stringify(version).slice(0, 200)} was never set (POST /v1/model-version first)`);
      throw e;
    }
    return { version: JSON.parse(String(r[0])) as string | number, seq: Number(r[1]) };
  }

  /** One HMGET. */
  async admissionState(): Promise<{ current: PolicyVersion | null; consumed: PolicyVersion | null }> {
    const [cur, seq, con, conSeq] = (await this.call(["HMGET", this.key, "current", "seq", "consumed", "consumed_seq"])) as (string | null)[];
    const current = cur == null ? null : { version: JSON.parse(cur) as string | number, seq: Number(seq) };
    return { current, consumed: con == null ? null : { version: JSON.parse(con) as string | number, seq: Number(conSeq) } };
  }

  /** Polls: resolves after `ms` (another process may have changed the versions). */
  waitChange(ms: number, signal?: AbortSignal): Promise<void> {
    return sleepOrAbort(ms, signal);
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
