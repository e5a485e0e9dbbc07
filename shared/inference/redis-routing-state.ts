import { keyPart } from "../store/key-encoding.ts";
import { z } from "zod";
import { StoreError } from "../errors.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../store/redis-commander.ts";
import { scriptSha } from "../store/redis-layout.ts";
import { DEFAULT_LEASE_TTL_MS, DEFAULT_PIN_TTL_MS, type RouteRequest, type RouteResult, type RoutingState, type RoutingStateOptions } from "./routing-state.ts";

/**
 * One routing decision (see `RoutingState`), atomically.
 * KEYS[1] = the key's pin (a string), KEYS[2] = the health hash, KEYS[2+i] = the
 * lease ZSET of the i-th replica of `order`.
 * ARGV = now (epoch ms), has_key (1/0: read and write the pin), ordered (1/0:
 * first of `order` under the cap, else least-loaded), ε, pin TTL ms, lease
 * TTL ms, lease id, the replica URLs in `order`, then the sticky ε and the
 * sticky minimum load, then `r` lease ids to release first, and `r` last;
 * KEYS[2+n+j] is the lease ZSET of the j-th of them (releases folded into
 * this call: see {@link RedisRoutingState.release}).
 * Replies {url, probe (1/0), previous pin or "", {url, until, ...} of ejected replicas}.
 */
export const ROUTE_LUA = `
local now = tonumber(ARGV[1])
local haskey = ARGV[2] == '1'
local ordered = ARGV[3] == '1'
local eps = tonumber(ARGV[4])
local leasettl = tonumber(ARGV[6])
local r = tonumber(ARGV[#ARGV])
local n = #ARGV - 10 - r
for j = 1, r do
  redis.call('ZREM', KEYS[2 + n + j], ARGV[9 + n + j])
end
local fields = {}
for i = 1, n do
  fields[2 * i - 1] = ARGV[7 + i]
  fields[2 * i] = ARGV[7 + i] .. '#probe'
end
local h = redis.call('HMGET', KEYS[2], unpack(fields))
local prev = false
if haskey then prev = redis.call('GET', KEYS[1]) end
local ej = {}
local chosen = nil
local probe = 0
for i = 1, n do
  local u = tonumber(h[2 * i - 1])
  if u then
    ej[#ej + 1] = ARGV[7 + i]
    ej[#ej + 1] = h[2 * i - 1]
    if not chosen and u <= now and (tonumber(h[2 * i]) or 0) <= now then
      chosen = i
      probe = 1
      redis.call('HSET', KEYS[2], ARGV[7 + i] .. '#probe', tostring(now + leasettl))
    end
  end
end
if not chosen then
  local open = {}
  for i = 1, n do
    if not tonumber(h[2 * i - 1]) then open[#open + 1] = i end
  end
  if #open == 0 then
    for i = 1, n do open[i] = i end
  end
  local loads = {}
  local total = 0
  for j, i in ipairs(open) do
    redis.call('ZREMRANGEBYSCORE', KEYS[2 + i], '-inf', now)
    loads[j] = redis.call('ZCARD', KEYS[2 + i])
    total = total + loads[j]
  end
  local t = total + 1
  local m = #open
  local cap = math.max(math.ceil(t / m), math.floor((1 + eps) * t / m))
  local stickycap = math.max(tonumber(ARGV[9 + n]), math.ceil(t / m), math.floor((1 + tonumber(ARGV[8 + n])) * t / m))
  if prev then
    for j, i in ipairs(open) do
      if ARGV[7 + i] == prev and loads[j] < stickycap then chosen = i end
    end
  end
  if not chosen then
    if ordered then
      for j, i in ipairs(open) do
        if loads[j] < cap then
          chosen = i
          break
        end
      end
      if not chosen then chosen = open[1] end
    else
      local best = 1
      for j = 2, #open do
        if loads[j] < loads[best] then best = j end
      end
      chosen = open[best]
    end
  end
end
if haskey then redis.call('SET', KEYS[1], ARGV[7 + chosen], 'PX', ARGV[5]) end
redis.call('ZADD', KEYS[2 + chosen], now + leasettl, ARGV[7])
redis.call('PEXPIRE', KEYS[2 + chosen], leasettl)
return {ARGV[7 + chosen], probe, prev or '', ej}
`;

const RouteReply = z.tuple([z.string(), z.coerce.number(), z.string().nullable(), z.array(z.coerce.string())]);

/** Options of {@link RedisRoutingState}. */
export interface RedisRoutingStateOptions extends RoutingStateOptions {
  /** Key prefix (the store's `store.prefix`, default `edgeloop:`). */
  prefix?: string;
  /** This instance's name inside lease ids (default: random). */
  instance?: string;
  /**
   * Longest wait in ms before releases are sent on their own when no route
   * call carries them (default 10; 0 = each release is its own `ZREM` at once).
   */
  releaseFoldMs?: number;
}

/** A release waiting for the next route call (or the fold timer). */
interface PendingRelease {
  url: string;
  lease: string;
  resolve: () => void;
  reject: (e: unknown) => void;
}

/**
 * {@link RoutingState} in Redis, over a {@link RedisCommander} (ioredis TCP or
 * Upstash REST), so that every gateway instance of a deployment routes a
 * session to one replica and sees one load and one set of ejections.
 *
 * Keys (documented in docs/queue-layout.md): `{prefix}routing:pin:{routing key}`
 * (STRING: replica URL, PX pin TTL, refreshed by every call of the key);
 * `{prefix}routing:leases:{replica url}` (ZSET: lease id `{instance}:{n}` →
 * expiry epoch ms; the key's PEXPIRE follows its newest lease);
 * `{prefix}routing:health` (HASH: `{url}` → end of its ejection's cool-down,
 * epoch ms; `{url}#probe` → expiry of the half-open probe slot one instance holds).
 *
 * Why leases in a ZSET scored by expiry rather than per-instance counters with a
 * heartbeat key: the count of live leases on a replica is one `ZREMRANGEBYSCORE`
 * + `ZCARD` inside the routing script (no list of instances to walk, every key
 * the script touches is named in KEYS), a lease that outlives its instance
 * simply scores in the past, and a release is one `ZREM`. A lease is renewed
 * while its call runs (this instance re-scores its held leases every third of
 * the lease TTL, one pipeline for all), so a slow generation keeps its lease.
 *
 * Round trips per call: one `EVALSHA` to route (`EVAL` once on `NOSCRIPT`);
 * releases are folded into the next route (their `ZREM`s run first in its
 * script), or sent as one pipeline `releaseFoldMs` after the first of them
 * when no route comes sooner — so under load a call costs one round trip,
 * and a lease outlives its call by at most `releaseFoldMs` (default 10 ms);
 * an ejection or a recovery adds one.
 * Clock: the instances' wall clocks (passed to the script, which stays
 * deterministic as Upstash asks of scripts), so lease expiry is exact to the
 * instances' clock skew. Every key the script touches is passed in KEYS.
 * @see https://redis.io/docs/latest/commands/eval/ (a script runs atomically)
 * @see https://upstash.com/docs/redis/commands/scripting/eval (Upstash runs EVAL/EVALSHA atomically; keys in KEYS, values from ARGV, not from a clock)
 */
export class RedisRoutingState implements RoutingState {
  private readonly redis: RedisCommander;
  private readonly prefix: string;
  private readonly pinTtlMs: number;
  private readonly leaseTtlMs: number;
  private readonly now: () => number;
  private readonly instance: string;
  private readonly held = new Map<string, string>();
  private sha: Promise<string> | undefined;
  private seq = 0;
  private timer: ReturnType<typeof setInterval> | undefined;
  private readonly releaseFoldMs: number;
  private pending: PendingRelease[] = [];
  private foldTimer: ReturnType<typeof setTimeout> | undefined;
  /** Redis commands sent so far (one per round trip: a pipeline counts once), for benches. */
  roundTrips = 0;

  constructor(redis: RedisCommander, opts: RedisRoutingStateOptions = {}) {
    this.redis = redis;
    this.prefix = opts.prefix ?? "edgeloop:";
    this.pinTtlMs = opts.pinTtlMs ?? DEFAULT_PIN_TTL_MS;
    this.leaseTtlMs = opts.leaseTtlMs ?? DEFAULT_LEASE_TTL_MS;
    if (!(this.pinTtlMs >= 1) || !(this.leaseTtlMs >= 3)) throw new RangeError("pinTtlMs must be >= 1 and leaseTtlMs >= 3");
    this.now = opts.now ?? (() => Date.now());
    this.instance = opts.instance ?? crypto.randomUUID().slice(0, 8);
    this.releaseFoldMs = opts.releaseFoldMs ?? 10;
    if (!(this.releaseFoldMs >= 0)) throw new RangeError("releaseFoldMs must be >= 0");
  }

  /** The Redis key of `key`'s pin (`key` encoded by {@link keyPart}: a client's `x-session-id` cannot name another key). */
  pinKey(key: string): string {
    return `${this.prefix}routing:pin:${keyPart(key, "x-session-id")}`;
  }

  /** The Redis key of `url`'s lease ZSET. */
  leaseKey(url: string): string {
    return `${this.prefix}routing:leases:${url}`;
  }

  /** The Redis key of the shared health hash. */
  get healthKey(): string {
    return `${this.prefix}routing:health`;
  }

  async route(req: RouteRequest): Promise<RouteResult> {
    if (req.order.length === 0) throw new RangeError("route: order must name at least one replica");
    const lease = `${this.instance}:${++this.seq}`;
    const hasKey = req.key !== undefined;
    const keys = [hasKey ? this.pinKey(req.key!) : `${this.prefix}routing:pin:`, this.healthKey, ...req.order.map((u) => this.leaseKey(u))];
    const ordered = req.ordered ?? hasKey;
    const args = [String(this.now()), hasKey ? "1" : "0", ordered ? "1" : "0", String(req.epsilon), String(this.pinTtlMs), String(this.leaseTtlMs), lease, ...req.order, String(req.stickyEpsilon ?? req.epsilon), String(req.stickyMinLoad ?? 0)];
    // Releases waiting to be sent go first in this call's script (their ZREMs before the loads are counted).
    const folded = this.takePending();
    for (const p of folded) {
      keys.push(this.leaseKey(p.url));
      args.push(p.lease);
    }
    args.push(String(folded.length));
    let raw: RedisReply;
    try {
      raw = await this.script(keys, args);
    } catch (e) {
      for (const p of folded) p.reject(e);
      throw e;
    }
    for (const p of folded) p.resolve();
    const parsed = RouteReply.safeParse(raw);
    if (!parsed.success) throw new StoreError(`routing script replied ${JSON.stringify(raw).slice(0, 200)}`);
    const [url, probe, prev, ej] = parsed.data;
    const ejected: Record<string, number> = {};
    for (let i = 0; i + 1 < ej.length; i += 2) ejected[ej[i]] = Number(ej[i + 1]);
    this.held.set(lease, url);
    this.heartbeat();
    return { url, lease, probe: probe === 1, previous: prev ? prev : null, ejected };
  }

  /**
   * Ends a lease: its `ZREM` rides on the next {@link route} call's script, or
   * is sent (with every other waiting release, one pipeline) `releaseFoldMs`
   * after the first waiting one. Resolves once the lease is gone from Redis.
   * @throws StoreError when the call that carried it failed (the lease then
   *   expires by its TTL: it is no longer renewed).
   */
  async release(url: string, lease: string): Promise<void> {
    this.held.delete(lease);
    if (this.held.size === 0) this.stopHeartbeat();
    if (this.releaseFoldMs === 0) {
      await this.call(["ZREM", this.leaseKey(url), lease]);
      return;
    }
    await new Promise<void>((resolve, reject) => {
      this.pending.push({ url, lease, resolve, reject });
      if (this.foldTimer === undefined) {
        this.foldTimer = setTimeout(() => void this.flushReleases(), this.releaseFoldMs);
        (this.foldTimer as { unref?: () => void }).unref?.();
      }
    });
  }

  /** The waiting releases, taken (the fold timer stopped). */
  private takePending(): PendingRelease[] {
    if (this.foldTimer !== undefined) clearTimeout(this.foldTimer);
    this.foldTimer = undefined;
    return this.pending.splice(0);
  }

  /** Sends the waiting releases as one pipeline of `ZREM`s. */
  private async flushReleases(): Promise<void> {
    const batch = this.takePending();
    if (batch.length === 0) return;
    this.roundTrips++;
    try {
      const out = await this.redis.pipeline(batch.map((p) => ["ZREM", this.leaseKey(p.url), p.lease]));
      batch.forEach((p, i) => (out[i] instanceof Error ? p.reject(wrap(out[i])) : p.resolve()));
    } catch (e) {
      for (const p of batch) p.reject(wrap(e));
    }
  }

  async eject(url: string, untilMs: number): Promise<void> {
    this.roundTrips++;
    const out = await this.redis.pipeline([
      ["HSET", this.healthKey, url, String(untilMs)],
      ["HDEL", this.healthKey, `${url}#probe`],
    ]);
    const err = out.find((r) => r instanceof Error);
    if (err) throw new StoreError(`routing health: ${(err as Error).message}`);
  }

  async restore(url: string): Promise<void> {
    await this.call(["HDEL", this.healthKey, url, `${url}#probe`]);
  }

  async endProbe(url: string): Promise<void> {
    await this.call(["HDEL", this.healthKey, `${url}#probe`]);
  }

  async inflight(urls: readonly string[]): Promise<Record<string, number>> {
    const now = String(this.now());
    this.roundTrips++;
    const out = await this.redis.pipeline(urls.map((u) => ["ZCOUNT", this.leaseKey(u), `(${now}`, "+inf"]));
    return Object.fromEntries(urls.map((u, i) => [u, out[i] instanceof Error ? 0 : Number(out[i])]));
  }

  async pinned(key: string): Promise<string | null> {
    const v = await this.call(["GET", this.pinKey(key)]);
    return typeof v === "string" ? v : null;
  }

  /** Stops renewing leases and sends the releases still waiting. */
  async close(): Promise<void> {
    this.stopHeartbeat();
    await this.flushReleases();
  }

  /** Re-scores every held lease to now + lease TTL (one pipeline), while any is held. */
  private heartbeat(): void {
    if (this.timer !== undefined) return;
    this.timer = setInterval(() => {
      if (this.held.size === 0) return this.stopHeartbeat();
      const until = String(this.now() + this.leaseTtlMs);
      const byUrl = new Map<string, string[]>();
      for (const [lease, url] of this.held) {
        const l = byUrl.get(url);
        if (l) l.push(until, lease);
        else byUrl.set(url, [until, lease]);
      }
      const cmds: RedisArg[][] = [];
      for (const [url, members] of byUrl) {
        const k = this.leaseKey(url);
        cmds.push(["ZADD", k, "XX", ...members], ["PEXPIRE", k, String(this.leaseTtlMs)]);
      }
      this.roundTrips++;
      // A missed renewal is retried at the next tick; the lease has two more ticks before it expires.
      this.redis.pipeline(cmds).catch(() => undefined);
    }, Math.max(1, Math.floor(this.leaseTtlMs / 3)));
    (this.timer as { unref?: () => void }).unref?.();
  }

  private stopHeartbeat(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
  }

  private async script(keys: string[], args: string[]): Promise<RedisReply> {
    this.sha ??= scriptSha(ROUTE_LUA);
    try {
      this.roundTrips++;
      return await this.redis.exec(["EVALSHA", await this.sha, String(keys.length), ...keys, ...args]);
    } catch (e) {
      if (!String((e as Error)?.message ?? e).startsWith("NOSCRIPT")) throw wrap(e);
      return this.call(["EVAL", ROUTE_LUA, String(keys.length), ...keys, ...args]);
    }
  }

  private async call(cmd: RedisArg[]): Promise<RedisReply> {
    this.roundTrips++;
    try {
      return await this.redis.exec(cmd);
    } catch (e) {
      throw wrap(e);
    }
  }
}

function wrap(e: unknown): StoreError {
  return e instanceof StoreError ? e : new StoreError(`routing state: ${(e as Error)?.message ?? String(e)}`, { cause: e });
}
