import { z } from "zod";
import { EdgeloopError, StoreError } from "../errors.ts";
import { keyPart } from "../store/key-encoding.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../store/redis-commander.ts";
import { scriptSha } from "../store/redis-layout.ts";
import {
  CAP_WAIT_MS,
  checkBaseUrl,
  checkClaimLimit,
  checkId,
  checkLimits,
  checkMs,
  checkReason,
  checkTombstoneS,
  DEFAULT_TOMBSTONE_S,
  parseLeaseRecord,
  type AcquireResult,
  type LeaseLimits,
  type LeaseReason,
  type LeaseRecord,
  type LeaseRef,
  type LeaseStore,
  type LeaseStoreStats,
} from "./lease-store.ts";

/**
 * Lua shared by the scripts. `now_ms()` is the store clock (`TIME`, epoch ms
 * with microsecond fractions; Redis >= 5 replicates scripts by effects, so a
 * script may write after reading it). `int()`/`num()` format numbers as
 * Redis strings. `gauge()` moves a status count of the stats hash
 * (`n:creating`, `n:live`, `n:releasing`; KEYS[stats] is passed as `s`).
 */
const PRELUDE = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end
local function int(x) return string.format('%d', math.floor(x)) end
local function num(x) return string.format('%.17g', x) end
local function move(s, from, to)
  if from then redis.call('HINCRBY', s, 'n:' .. from, -1) end
  if to then redis.call('HINCRBY', s, 'n:' .. to, 1) end
end
`;

/**
 * acquire. KEYS = record, due, bucket, stats; ARGV = key, rate_per_s, burst,
 * max_live, hold ms, renew (1/0). Replies `{'exists', HGETALL}`,
 * `{'granted', HGETALL}`, `{'wait', 'cap'|'rate', wait ms}`. The bucket
 * (`tokens`, `ts` in ms, and the limits of the last grant for stats) is
 * written only by a grant.
 */
export const ACQUIRE_LUA = `${PRELUDE}
local now = now_ms()
local t = math.floor(now)
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempt')
if cur[1] and (cur[1] ~= 'released' or ARGV[6] ~= '1') then
  return {'exists', redis.call('HGETALL', KEYS[1])}
end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return {'wait', 'cap', '${CAP_WAIT_MS}'} end
local rate, burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local b = redis.call('HMGET', KEYS[3], 'tokens', 'ts')
local tokens = burst
if b[1] and b[2] then
  tokens = math.min(burst, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * rate / 1000)
end
if tokens < 1 then return {'wait', 'rate', int(math.ceil((1 - tokens) * 1000 / rate))} end
redis.call('HSET', KEYS[3], 'tokens', num(tokens - 1), 'ts', num(now), 'rate', ARGV[2], 'burst', ARGV[3])
local attempt = 1
if cur[1] then attempt = tonumber(cur[2]) + 1 end
local exp = t + tonumber(ARGV[5])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'key', ARGV[1], 'lease_id', ARGV[1] .. '~' .. attempt, 'attempt', int(attempt), 'status', 'creating', 'created_ms', int(t), 'expires_ms', int(exp))
redis.call('ZADD', KEYS[2], int(exp), ARGV[1])
redis.call('HINCRBY', KEYS[4], 'granted', 1)
move(KEYS[4], nil, 'creating')
return {'granted', redis.call('HGETALL', KEYS[1])}
`;

/**
 * confirm. KEYS = record, due, stats; ARGV = lease id, sandbox id, ttl ms,
 * base url (`''`: none, the field is not written). Replies HGETALL, or nil
 * when not `creating` with that lease id.
 */
export const CONFIRM_LUA = `${PRELUDE}
local cur = redis.call('HMGET', KEYS[1], 'status', 'lease_id', 'key')
if cur[1] ~= 'creating' or cur[2] ~= ARGV[1] then return false end
local exp = math.floor(now_ms()) + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'status', 'live', 'sandbox_id', ARGV[2], 'expires_ms', int(exp))
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'base_url', ARGV[4]) end
redis.call('ZADD', KEYS[2], int(exp), cur[3])
redis.call('HINCRBY', KEYS[3], 'confirmed', 1)
move(KEYS[3], 'creating', 'live')
return redis.call('HGETALL', KEYS[1])
`;

/** heartbeat. KEYS = due, then one record per entry; ARGV = ttl ms, then the entries' lease ids (ARGV[i] goes with KEYS[i]). Replies 1/0 per entry. */
export const HEARTBEAT_LUA = `${PRELUDE}
local exp = math.floor(now_ms()) + tonumber(ARGV[1])
local out = {}
for i = 2, #KEYS do
  local cur = redis.call('HMGET', KEYS[i], 'status', 'lease_id', 'key')
  if cur[1] == 'live' and cur[2] == ARGV[i] then
    redis.call('HSET', KEYS[i], 'expires_ms', int(exp))
    redis.call('ZADD', KEYS[1], int(exp), cur[3])
    out[i - 1] = 1
  else
    out[i - 1] = 0
  end
end
return out
`;

/** claimRelease. KEYS = record, due, stats; ARGV = lease id, reason, hold ms. Replies HGETALL, or nil when not `creating`|`live` with that lease id. */
export const CLAIM_RELEASE_LUA = `${PRELUDE}
local cur = redis.call('HMGET', KEYS[1], 'status', 'lease_id', 'key')
if (cur[1] ~= 'creating' and cur[1] ~= 'live') or cur[2] ~= ARGV[1] then return false end
local exp = math.floor(now_ms()) + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'status', 'releasing', 'reason', ARGV[2], 'expires_ms', int(exp))
redis.call('ZADD', KEYS[2], int(exp), cur[3])
if ARGV[2] == 'create_failed' then redis.call('HINCRBY', KEYS[3], 'create_failed', 1) end
move(KEYS[3], cur[1], 'releasing')
return redis.call('HGETALL', KEYS[1])
`;

/**
 * finishRelease. KEYS = record, due, stats; ARGV = lease id, tombstone ms.
 * Replies 1 (released: out of due, the record PEXPIREs as a tombstone), 0
 * when not `releasing` with that lease id.
 */
export const FINISH_RELEASE_LUA = `${PRELUDE}
local cur = redis.call('HMGET', KEYS[1], 'status', 'lease_id', 'key', 'reason')
if cur[1] ~= 'releasing' or cur[2] ~= ARGV[1] then return 0 end
local tomb = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'status', 'released', 'expires_ms', int(math.floor(now_ms()) + tomb))
redis.call('PEXPIRE', KEYS[1], tomb)
redis.call('ZREM', KEYS[2], cur[3])
redis.call('HINCRBY', KEYS[3], 'released:' .. tostring(cur[4]), 1)
move(KEYS[3], 'releasing', nil)
return 1
`;

/**
 * claimDue. KEYS = due, stats; ARGV = the record key prefix
 * (`{prefix}sbx:l:`), limit, hold ms. Reads at most `limit` members of due
 * scored <= now (ZRANGEBYSCORE … LIMIT), and claims each: → `releasing`,
 * reason by status, expiring now + hold. Replies one HGETALL per claimed
 * lease. A member whose record is gone or released (the hash deleted by
 * hand or evicted under memory pressure: its lease id is unknown, so it cannot
 * be released) is dropped from due and counted as `orphaned`.
 *
 * The record keys are derived inside the script (`enc` is
 * {@link keyPart}: the identity on `[A-Za-z0-9._~-]`, else every other
 * UTF-8 byte as upper-case `%XX`), because which leases are due is only
 * known inside it; so this script, unlike the others, touches keys not in
 * KEYS (fine on one Redis and on Upstash's default global script lock, not
 * on Redis Cluster).
 */
export const CLAIM_DUE_LUA = `${PRELUDE}
local function enc(s)
  return (string.gsub(s, '[^A-Za-z0-9%._~%-]', function(c) return string.format('%%%02X', string.byte(c)) end))
end
local REAP = {creating = 'reaped_create', live = 'reaped_ttl', releasing = 'reaped_release'}
local t = math.floor(now_ms())
local exp = t + tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', int(t), 'LIMIT', 0, ARGV[2])
local out = {}
for _, key in ipairs(due) do
  local rk = ARGV[1] .. enc(key)
  local st = redis.call('HGET', rk, 'status')
  local reason = st and REAP[st]
  if reason then
    redis.call('HSET', rk, 'status', 'releasing', 'reason', reason, 'expires_ms', int(exp))
    redis.call('ZADD', KEYS[1], int(exp), key)
    redis.call('HINCRBY', KEYS[2], 'reaped:' .. reason, 1)
    move(KEYS[2], st, 'releasing')
    out[#out + 1] = redis.call('HGETALL', rk)
  else
    redis.call('ZREM', KEYS[1], key)
    redis.call('HINCRBY', KEYS[2], 'orphaned', 1)
  end
end
return out
`;

/** stats (reads only). KEYS = bucket, stats. Replies {tokens refilled to now or '', HGETALL stats}. */
export const STATS_LUA = `${PRELUDE}
local now = now_ms()
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts', 'rate', 'burst')
local tokens = ''
if b[1] and b[2] and b[3] and b[4] then
  tokens = num(math.min(tonumber(b[4]), tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * tonumber(b[3]) / 1000))
end
return {tokens, redis.call('HGETALL', KEYS[2])}
`;

const SCRIPTS = {
  acquire: ACQUIRE_LUA,
  confirm: CONFIRM_LUA,
  heartbeat: HEARTBEAT_LUA,
  claimRelease: CLAIM_RELEASE_LUA,
  finishRelease: FINISH_RELEASE_LUA,
  claimDue: CLAIM_DUE_LUA,
  stats: STATS_LUA,
} as const;
type ScriptName = keyof typeof SCRIPTS;

const FlatHash = z.array(z.string()).refine((a) => a.length % 2 === 0, "expected field/value pairs");
const IntReply = z.union([z.number().int(), z.string().regex(/^-?\d{1,16}$/).transform(Number)]);
const AcquireReply = z.union([
  z.tuple([z.enum(["granted", "exists"]), FlatHash]),
  z.tuple([z.literal("wait"), z.enum(["rate", "cap"]), IntReply.refine((n) => n >= 1, "expected wait ms >= 1")]),
]);
const Tokens = z
  .string()
  .regex(/^[0-9.eE+-]{1,32}$/, "expected a number")
  .transform(Number)
  .refine((n) => Number.isFinite(n) && n >= 0, "expected a number of tokens >= 0");
const StatsReply = z.tuple([z.union([z.literal(""), Tokens]), FlatHash]);
const TimeReply = z.tuple([z.string().regex(/^\d{1,12}$/), z.string().regex(/^\d{1,6}$/)]);

/** Options of {@link RedisLeaseStore}. */
export interface RedisLeaseStoreOptions {
  /** Key prefix (the store's `store.prefix`, default `edgeloop:`). */
  prefix?: string;
  /** Lifetime of a released record (its PEXPIRE), seconds (default {@link DEFAULT_TOMBSTONE_S}). */
  tombstoneS?: number;
}

/**
 * {@link LeaseStore} in Redis over a {@link RedisCommander} (ioredis TCP or
 * Upstash REST), shared by every process of a deployment.
 *
 * Keys (every trajectory key through {@link keyPart}):
 * `{prefix}sbx:l:{key}` HASH — the record (`key`, `lease_id`, `attempt`,
 * `status`, `created_ms`, `expires_ms`, and `sandbox_id`/`base_url`/`reason` once set;
 * numbers as decimal strings); no TTL until released, then PEXPIRE
 * `tombstoneS`. `{prefix}sbx:due` ZSET — member the raw key, score
 * `expires_ms`: every lease not released (its ZCARD is the live set).
 * `{prefix}sbx:bucket` HASH — `tokens`, `ts` (ms, fractional), and the
 * `rate`/`burst` of the last grant (for stats). `{prefix}sbx:stats` HASH —
 * the counters, and status gauges `n:creating`, `n:live`, `n:releasing`.
 *
 * Every mutation is one Lua script (EVALSHA; EVAL once on NOSCRIPT) that
 * reads the clock with `TIME`, so expiries and the bucket are on the store's
 * clock, immune to skew between processes. Round trips: one per call
 * (`get`: HGETALL, `now`: TIME; a heartbeat of no entries: none), plus one
 * the first time a script is not yet cached on the server.
 * @see https://redis.io/docs/latest/develop/interact/programmability/eval-intro/ (scripts run atomically; effects replication lets a script write after TIME)
 */
export class RedisLeaseStore implements LeaseStore {
  private readonly redis: RedisCommander;
  private readonly prefix: string;
  private readonly tombstoneMs: number;
  private readonly shas = new Map<ScriptName, Promise<string>>();
  /** Redis commands sent so far (one per round trip), for tests and benches. */
  roundTrips = 0;

  constructor(redis: RedisCommander, opts: RedisLeaseStoreOptions = {}) {
    this.redis = redis;
    this.prefix = opts.prefix ?? "edgeloop:";
    this.tombstoneMs = checkTombstoneS(opts.tombstoneS ?? DEFAULT_TOMBSTONE_S) * 1000;
  }

  /** The record hash of `key`. @throws InputError (field `key`) for a key {@link keyPart} refuses. */
  recordKey(key: string): string {
    return `${this.prefix}sbx:l:${keyPart(key, "key")}`;
  }
  /** The ZSET of non-released leases, scored by expiry. */
  get dueKey(): string {
    return `${this.prefix}sbx:due`;
  }
  /** The token-bucket hash. */
  get bucketKey(): string {
    return `${this.prefix}sbx:bucket`;
  }
  /** The counters hash. */
  get statsKey(): string {
    return `${this.prefix}sbx:stats`;
  }

  async acquire(key: string, limits: LeaseLimits, holdMs: number, opts: { renew: boolean }): Promise<AcquireResult> {
    const rk = this.recordKey(key);
    const l = checkLimits(limits);
    checkMs(holdMs, "holdMs");
    const raw = await this.script("acquire", [rk, this.dueKey, this.bucketKey, this.statsKey], [key, String(l.rate_per_s), String(l.burst), String(l.max_live), String(holdMs), opts.renew ? "1" : "0"]);
    const r = parse(AcquireReply, raw, "acquire");
    if (r[0] === "wait") return { outcome: "wait", cause: r[1], wait_ms: r[2] };
    return { outcome: r[0], lease: record(r[1], "acquire") };
  }

  async get(key: string): Promise<LeaseRecord | null> {
    const raw = await this.call(["HGETALL", this.recordKey(key)], "get");
    const h = hashOf(raw, "get");
    return Object.keys(h).length === 0 ? null : parseLeaseRecord(h, "get");
  }

  async confirm(key: string, leaseId: string, sandboxId: string, ttlMs: number, baseUrl: string | null = null): Promise<LeaseRecord | null> {
    const rk = this.recordKey(key);
    checkId(leaseId, "leaseId");
    checkId(sandboxId, "sandboxId");
    checkMs(ttlMs, "ttlMs");
    checkBaseUrl(baseUrl);
    const raw = await this.script("confirm", [rk, this.dueKey, this.statsKey], [leaseId, sandboxId, String(ttlMs), baseUrl ?? ""]);
    return raw === null ? null : record(parse(FlatHash, raw, "confirm"), "confirm");
  }

  async heartbeat(entries: readonly LeaseRef[], ttlMs: number): Promise<boolean[]> {
    const keys = entries.map((e) => this.recordKey(e.key));
    for (const e of entries) checkId(e.leaseId, "leaseId");
    checkMs(ttlMs, "ttlMs");
    if (entries.length === 0) return [];
    const raw = await this.script("heartbeat", [this.dueKey, ...keys], [String(ttlMs), ...entries.map((e) => e.leaseId)]);
    const out = parse(z.array(IntReply.refine((n) => n === 0 || n === 1, "expected 0 or 1")).length(entries.length), raw, "heartbeat");
    return out.map((n) => n === 1);
  }

  async claimRelease(key: string, leaseId: string, reason: LeaseReason, holdMs: number): Promise<LeaseRecord | null> {
    const rk = this.recordKey(key);
    checkId(leaseId, "leaseId");
    checkReason(reason);
    checkMs(holdMs, "holdMs");
    const raw = await this.script("claimRelease", [rk, this.dueKey, this.statsKey], [leaseId, reason, String(holdMs)]);
    return raw === null ? null : record(parse(FlatHash, raw, "claimRelease"), "claimRelease");
  }

  async finishRelease(key: string, leaseId: string): Promise<boolean> {
    const rk = this.recordKey(key);
    checkId(leaseId, "leaseId");
    const raw = await this.script("finishRelease", [rk, this.dueKey, this.statsKey], [leaseId, String(this.tombstoneMs)]);
    return parse(IntReply.refine((n) => n === 0 || n === 1, "expected 0 or 1"), raw, "finishRelease") === 1;
  }

  async claimDue(limit: number, holdMs: number): Promise<LeaseRecord[]> {
    checkClaimLimit(limit);
    checkMs(holdMs, "holdMs");
    const raw = await this.script("claimDue", [this.dueKey, this.statsKey], [`${this.prefix}sbx:l:`, String(limit), String(holdMs)]);
    const rows = parse(z.array(FlatHash).max(limit), raw, "claimDue");
    return rows.map((h) => record(h, "claimDue"));
  }

  async stats(): Promise<LeaseStoreStats> {
    const raw = await this.script("stats", [this.bucketKey, this.statsKey], []);
    const [tokens, flat] = parse(StatsReply, raw, "stats");
    const n = { creating: 0, live: 0, releasing: 0 };
    const counters: Record<string, number> = {};
    for (let i = 0; i < flat.length; i += 2) {
      const name = flat[i]!;
      const v = parse(IntReply, flat[i + 1], `stats field ${name}`);
      if (name === "n:creating" || name === "n:live" || name === "n:releasing") n[name.slice(2) as keyof typeof n] = v;
      else counters[name] = v;
    }
    return { ...n, tokens: tokens === "" ? null : tokens, counters };
  }

  async now(): Promise<number> {
    const [s, us] = parse(TimeReply, await this.call(["TIME"], "now"), "now");
    return Number(s) * 1000 + Math.floor(Number(us) / 1000);
  }

  /** EVALSHA of a script, EVAL once when the server does not hold it (NOSCRIPT). */
  private async script(name: ScriptName, keys: string[], args: string[]): Promise<RedisReply> {
    let sha = this.shas.get(name);
    if (!sha) this.shas.set(name, (sha = scriptSha(SCRIPTS[name])));
    const tail = [String(keys.length), ...keys, ...args];
    try {
      this.roundTrips++;
      return await this.redis.exec(["EVALSHA", await sha, ...tail]);
    } catch (e) {
      if (!String((e as Error)?.message ?? e).startsWith("NOSCRIPT")) throw wrap(e, name);
      return this.call(["EVAL", SCRIPTS[name], ...tail], name);
    }
  }

  private async call(cmd: RedisArg[], what: string): Promise<RedisReply> {
    this.roundTrips++;
    try {
      return await this.redis.exec(cmd);
    } catch (e) {
      throw wrap(e, what);
    }
  }
}

/** Parses a script's reply with `schema`. @throws StoreError naming the operation, the path in the reply and what was expected. */
function parse<T extends z.ZodType>(schema: T, raw: unknown, what: string): z.output<T> {
  const r = schema.safeParse(raw);
  if (r.success) return r.data;
  const i = r.error.issues[0]!;
  throw new StoreError(`lease store ${what}: malformed reply at ${i.path.length ? i.path.join(".") : "(root)"}: ${i.message} (got ${JSON.stringify(raw)?.slice(0, 200)})`);
}

/** A flat field/value list → a record. */
function record(flat: string[], what: string): LeaseRecord {
  const h: Record<string, string> = {};
  for (let i = 0; i < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
  return parseLeaseRecord(h, what);
}

/** An HGETALL reply in either shape (RESP2 flat array, RESP3 map) → field → value. */
function hashOf(raw: RedisReply, what: string): Record<string, unknown> {
  if (Array.isArray(raw)) {
    const flat = parse(FlatHash, raw, what);
    const h: Record<string, string> = {};
    for (let i = 0; i < flat.length; i += 2) h[flat[i]!] = flat[i + 1]!;
    return h;
  }
  if (raw !== null && typeof raw === "object") return raw;
  throw new StoreError(`lease store ${what}: malformed reply: expected a hash, got ${JSON.stringify(raw)?.slice(0, 200)}`);
}

/** A transport failure as a StoreError naming the operation; edgeloop's own errors (an unreachable store, a request over the size cap) pass as they are. */
function wrap(e: unknown, what: string): EdgeloopError {
  return e instanceof EdgeloopError ? e : new StoreError(`lease store ${what}: ${(e as Error)?.message ?? String(e)}`, { cause: e });
}
