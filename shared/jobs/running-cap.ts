import type { RedisCommander } from "../store/redis-commander.ts";
import { keyPart } from "../store/key-encoding.ts";
import { JobRedis } from "./job-redis.ts";

/**
 * The atomic step of {@link StoreRunningCap} (one key, so one hash slot on a
 * Redis Cluster). KEYS[1] the running hash (field = consumer, value =
 * `{held}:{expiry ms}:{cap}`); ARGV: now ms (empty: the store's own clock, `TIME`),
 * entry TTL ms, consumer, its held count, slots wanted, its cap. Drops expired
 * or malformed entries (a dead worker's), counts the others' held slots and
 * takes the smallest cap of all live entries and its own (workers given
 * different caps obey the smallest), grants
 * `min(want, smallest cap − others − held)` (at least 0), records `held + grant` for
 * this consumer, and replies `{grant, others, smallest cap}`. Expiries are written and read
 * on the store's one clock, so workers whose clocks disagree cannot drop each
 * other's live entries (Redis ≥ 5 replicates script effects, so `TIME` in a
 * writing script is allowed).
 */
const RESERVE_LUA = `
local now = tonumber(ARGV[1])
if now == nil then local t = redis.call('TIME'); now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) end
local ttl = tonumber(ARGV[2]); local me = ARGV[3]
local held = tonumber(ARGV[4]); local want = tonumber(ARGV[5]); local cap = tonumber(ARGV[6])
local all = redis.call('HGETALL', KEYS[1])
local others = 0
local low = cap
for i = 1, #all, 2 do
  local n, exp, c = string.match(all[i + 1], '^(%d+):(%d+):(%d+)$')
  n = tonumber(n); exp = tonumber(exp); c = tonumber(c)
  if n == nil or exp == nil or c == nil or c < 1 or exp <= now then redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= me then
    others = others + n
    if c < low then low = c end
  end
end
local grant = low - others - held
if grant > want then grant = want end
if grant < 0 then grant = 0 end
redis.call('HSET', KEYS[1], me, string.format('%d:%d:%d', held + grant, now + ttl, cap))
redis.call('PEXPIRE', KEYS[1], ttl * 2)
return {grant, others, low}
`;

/** Options of {@link StoreRunningCap}. */
export interface StoreRunningCapOptions {
  /** Key prefix (default `edgeloop:`); the hash is `{prefix}jobs:running`. */
  prefix?: string;
  /** Sessions running at once across every worker of the prefix (≥ 1). */
  cap: number;
  /** Lifetime of a worker's entry without a renewal, ms (the job lease: a dead worker's slots free with its jobs); rounded up to a whole ms, at least 1. */
  ttlMs: number;
  /** Clock, epoch ms, for tests only; default the store's own clock (Redis `TIME`), one clock for every worker whatever their skew. */
  now?: () => number;
}

/**
 * A store-wide cap on running sessions for queue mode (issue 32 item 4):
 * every worker of one store prefix records how many job slots it holds in
 * one Redis hash (`{prefix}jobs:running`, field = consumer, value =
 * `{held}:{expiry ms}:{cap}`), and takes new slots with one atomic script that
 * grants at most `cap − (all others' held) − (its own held)`, `cap` being
 * the smallest cap any live worker of the prefix was given. A worker claims
 * only as many jobs as it was granted, so the sum of running sessions never
 * passes the cap (each entry is an upper bound: a claim that got fewer jobs,
 * or a job that ended, is counted until the worker's next {@link reserve}).
 * A worker that dies stops renewing its entry; after `ttlMs` (its jobs'
 * lease) the entry is dropped and its slots go to the workers that reclaim
 * its jobs. One round trip per call; HGETALL is linear in the workers.
 * Every worker should be started with the same cap; when they differ, all
 * obey the smallest (and {@link reserve} says so). A worker's entry counts the
 * slots it took for a claim until the claim returns: hold them only for a
 * non-blocking claim (the job worker does), or idle workers keep each other
 * from claiming. Runtime-free (any {@link RedisCommander}: TCP, Cluster, Upstash REST).
 */
export class StoreRunningCap {
  readonly key: string;
  readonly cap: number;
  private readonly ttlMs: number;
  private readonly now: (() => number) | undefined;
  private readonly r: JobRedis;

  /** @throws RangeError for a cap below 1 or a TTL below 1 ms. */
  constructor(redis: RedisCommander, opts: StoreRunningCapOptions) {
    if (!Number.isInteger(opts.cap) || opts.cap < 1) throw new RangeError("cap must be an integer >= 1");
    if (!(opts.ttlMs > 0)) throw new RangeError("ttlMs must be > 0");
    this.key = `${opts.prefix ?? "edgeloop:"}jobs:running`;
    this.cap = opts.cap;
    this.ttlMs = Math.ceil(opts.ttlMs);
    this.now = opts.now;
    this.r = new JobRedis(redis);
  }

  /**
   * Records that `consumer` holds `held` slots and asks for `want` more.
   * Returns the slots granted (0..want), the slots the other live workers
   * hold, and the cap that held (`cap`: the smallest of this one's and the
   * other live workers'). `want` 0 only renews (and lowers) this worker's entry.
   * @throws StoreError when Redis fails (nothing is granted).
   */
  async reserve(consumer: string, held: number, want: number): Promise<{ granted: number; others: number; cap: number }> {
    const reply = await this.r.eval(RESERVE_LUA, [this.key], [this.now ? String(this.now()) : "", String(this.ttlMs), keyPart(consumer, "consumer"), String(Math.max(0, held)), String(Math.max(0, want)), String(this.cap)]);
    const [granted, others, low] = Array.isArray(reply) ? reply.map(Number) : [0, 0, this.cap];
    return { granted: granted ?? 0, others: others ?? 0, cap: low ?? this.cap };
  }

  /** Drops `consumer`'s entry (a worker leaving): its slots are free at once. @throws StoreError */
  async leave(consumer: string): Promise<void> {
    await this.r.call(["HDEL", this.key, keyPart(consumer, "consumer")]);
  }
}
