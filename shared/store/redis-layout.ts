import { ConfigError } from "../errors.ts";
import { keyPart } from "./key-encoding.ts";
import { shardOf, shardTags } from "./key-slot.ts";
import type { Partition } from "./types.ts";

/** How a {@link RedisLayout} names its keys. */
export interface RedisLayoutOptions {
  /**
   * Stream shards per partition (default 1). A group belongs to shard
   * {@link shardOf}`(uid, shards)`; each shard has its own stream and
   * filtered list. Writers and readers of one prefix must agree on it.
   */
  shards?: number;
  /**
   * Put a hash tag in every key (default: `shards > 1`). Required on Redis
   * Cluster, where a script may only touch keys of one slot.
   */
  tagged?: boolean;
}

/**
 * Redis key names of the transfer queue (docs/queue-layout.md), all under one
 * prefix:
 * - `{p}traj:{key}` HASH — one record (`meta`, `prompt_ids`, `response_ids`, `response_mask`, `rollout_log_probs`, and `routed_experts` + `routed_experts_shape` + `routed_experts_dtype` when recorded).
 * - `{p}group:{uid}` HASH — `expected`, `partition`, `fingerprint`, `finished` (sessions), `records`, `failed`,
 *   `enqueued`, `delivery_id`, `cancelled` (`1`: withdrawn by a cancelled batch, never enqueued, writes refused),
 *   `filtered` (the reason: dynamic sampling keeps the group from the stream once complete), and per session `s:{sid}` (outputs stored) and `t:{sid}` (outputs in all, once known).
 * - `{p}group:{uid}:keys` SET — keys written for the group.
 * - `{p}groups:{partition}` STREAM — one entry per complete group, read with a consumer group.
 * - `{p}groups:filtered:{partition}` LIST — uids of groups filtered by dynamic sampling, in filter order.
 * - `{p}stage:{key}:{nonce}` HASH — a put's record before PUT_LUA renames it to `{p}traj:{key}` (expires after 60 s if orphaned).
 *
 * Tagged (Redis Cluster, or more than one shard): every name gets the hash
 * tag of its shard right after the prefix — `{p}{<tag>}:traj:{key}`, where
 * `<tag>` is {@link shardTags}`(shards)[k]` and `k` is the shard of the key's
 * uid — so a group's hash, key set, records, staging hashes and its shard's
 * stream and filtered list share one slot, and every script is single-slot.
 * Untagged (the default with one shard), the names are exactly the ones
 * above.
 *
 * Every `{uid}` and `{key}` goes through {@link keyPart} (the identity on the
 * uids and keys the API accepts; anything else percent-encoded), so no input
 * can name another namespace's key or a hash tag. Values stored inside keys
 * (stream entries, key sets) hold the raw uid and key.
 * @throws ConfigError (`store.shards`, `store.prefix`) for a shard count outside 1…1024, or a tagged layout whose prefix holds `{` or `}` (it would form another hash tag).
 */
export class RedisLayout {
  readonly shards: number;
  readonly tagged: boolean;
  private readonly tags: readonly string[];

  constructor(
    readonly prefix: string,
    opts: RedisLayoutOptions = {},
  ) {
    const shards = opts.shards ?? 1;
    if (!Number.isInteger(shards) || shards < 1 || shards > 1024) throw new ConfigError("store.shards", `must be an integer in 1..1024, got ${String(shards)}`);
    this.shards = shards;
    this.tagged = opts.tagged ?? shards > 1;
    if (this.tagged && /[{}]/.test(prefix)) throw new ConfigError("store.prefix", "must not hold { or } with a sharded or cluster store (it would be the keys' hash tag)");
    this.tags = shardTags(shards);
  }
  /** The shard (0…shards−1) of a group. */
  shardOf(uid: string): number {
    return shardOf(uid, this.shards);
  }
  /** The prefix plus, when tagged, shard `k`'s hash tag and `:`. */
  base(shard: number): string {
    return this.tagged ? `${this.prefix}{${this.tags[shard]}}:` : this.prefix;
  }
  /** The hash tag text of shard `k` (inside the braces; also what untagged names would carry on a cluster). */
  tag(shard: number): string {
    return this.tags[shard]!;
  }
  private of(uid: string): string {
    return this.base(this.shardOf(uid));
  }
  traj(key: string): string {
    return `${this.of(uidOfKey(key))}traj:${keyPart(key, "key")}`;
  }
  group(uid: string): string {
    return `${this.of(uid)}group:${keyPart(uid, "uid")}`;
  }
  members(uid: string): string {
    return `${this.of(uid)}group:${keyPart(uid, "uid")}:keys`;
  }
  /** A put's staging hash (one per attempt, expiring): the record is written here, then renamed into place by PUT_LUA. */
  stage(key: string, nonce: string): string {
    return `${this.of(uidOfKey(key))}stage:${keyPart(key, "key")}:${nonce}`;
  }
  /** Shard `shard`'s stream of complete groups of a partition (shard 0 by default). */
  stream(partition: Partition, shard = 0): string {
    return `${this.base(shard)}groups:${partition}`;
  }
  /** uids of the partition's groups filtered by dynamic sampling (LIST), one per shard. */
  filtered(partition: Partition, shard = 0): string {
    return `${this.base(shard)}groups:filtered:${partition}`;
  }
  /** KEYS of every script, in order: group, members, train stream, val stream (of the group's shard). */
  groupKeys(uid: string): string[] {
    const s = this.shardOf(uid);
    return [this.group(uid), this.members(uid), this.stream("train", s), this.stream("val", s)];
  }
}

/** The uid part of a trajectory key `{uid}_{session_id}_{output_index}` (uids hold no `_`). */
export function uidOfKey(key: string): string {
  const i = key.indexOf("_");
  return i > 0 ? key.slice(0, i) : key;
}

/**
 * Lua shared by the scripts: `finish(uid)` counts one more finished session
 * and, when the group has `expected` set, every expected session finished
 * and is not yet enqueued, XADDs one entry to its partition's stream
 * (`uid`, `n`, `failed`, `keys` = JSON array ordered by session_id then
 * output_index) and flags it enqueued — inside the same script as the write
 * that finished the last session, so a group is enqueued exactly once.
 */
const COMPLETE_LUA = `
local function key_order(a, b)
  local sa, oa = string.match(a, '_(%d+)_(%d+)$')
  local sb, ob = string.match(b, '_(%d+)_(%d+)$')
  sa, sb = tonumber(sa), tonumber(sb)
  if sa ~= sb then return sa < sb end
  return tonumber(oa) < tonumber(ob)
end
local function maybe_complete(uid)
  local g = redis.call('HMGET', KEYS[1], 'expected', 'finished', 'enqueued', 'partition', 'failed', 'cancelled', 'filtered')
  if not g[1] or g[3] == '1' or g[6] == '1' or g[7] then return 0 end
  if tonumber(g[2] or '0') < tonumber(g[1]) then return 0 end
  local members = redis.call('SMEMBERS', KEYS[2])
  table.sort(members, key_order)
  local stream = KEYS[3]
  if g[4] == 'val' then stream = KEYS[4] end
  -- cjson encodes an empty table as {}: a group whose sessions emitted nothing holds keys [].
  local keys = '[]'
  if #members > 0 then keys = cjson.encode(members) end
  local id = redis.call('XADD', stream, '*', 'uid', uid, 'n', g[1], 'failed', g[5] or '0', 'keys', keys)
  redis.call('HSET', KEYS[1], 'enqueued', '1', 'delivery_id', id)
  return 1
end
local function finish(uid)
  redis.call('HINCRBY', KEYS[1], 'finished', 1)
  return maybe_complete(uid)
end
`;

/**
 * Put-once with session accounting: KEYS = group, members, train stream, val
 * stream, record hash, and optionally a staging hash; ARGV = uid, key,
 * session_id, output_index, mode (`l` the session's last output, `m` more
 * follow, `f` markFailed), failed ("0"/"1"), then — without a staging key —
 * the record's HSET field/value pairs.
 *
 * With a staging key (the fast path: the client pipelines `HSET <stage>
 * <fields…>`, `PEXPIRE <stage> 60000` and this script in one round trip),
 * the record's bytes never pass through Lua: the script RENAMEs the staged
 * hash into place (O(1), the stored bytes are those HSET wrote) and PERSISTs
 * it, or DELetes it when nothing is to be written. A staging key that is
 * gone (expired, lost) replies `STAGE lost` before anything is written.
 *
 * The group hash keeps, per session, `s:{sid}` (outputs stored) and `t:{sid}`
 * (outputs in all, known once the last one or a finish arrived); the session
 * finishes when they are equal. Returns 0 when the key already existed
 * (nothing written; `f` on a stored key of an unfinished session still
 * finishes it with what it stored), 1 when stored, 2 when stored and the
 * group became complete; replies `CONFLICT finished <t>` for an output past a
 * finished session's last, `CONFLICT stored <s>` for a last output below
 * outputs already stored. The existence check, the record, the counters and
 * the enqueue happen in one atomic script: a crash leaves either all of them
 * or none (at most an unreferenced staging hash, which expires).
 * @see https://redis.io/docs/latest/develop/interact/programmability/eval-intro/
 * @see https://redis.io/docs/latest/commands/rename/
 */
export const PUT_LUA = `${COMPLETE_LUA}
local staged = KEYS[6]
local function drop()
  if staged then redis.call('DEL', staged) end
end
if redis.call('HGET', KEYS[1], 'cancelled') == '1' then
  drop()
  return redis.error_reply('CANCELLED group')
end
local sf, tf = 's:' .. ARGV[3], 't:' .. ARGV[3]
local idx, mode = tonumber(ARGV[4]), ARGV[5]
local g = redis.call('HMGET', KEYS[1], sf, tf, 'records', 'failed', 'finished', 'expected', 'enqueued', 'partition', 'filtered')
local stored = tonumber(g[1] or '0')
local total = false
if g[2] then total = tonumber(g[2]) end
if redis.call('EXISTS', KEYS[5]) == 1 then
  drop()
  if mode == 'f' and not total then
    redis.call('HSET', KEYS[1], tf, stored)
    finish(ARGV[1])
  end
  return 0
end
if total then
  if mode == 'f' then drop() return 0 end
  if idx >= total then drop() return redis.error_reply('CONFLICT finished ' .. total) end
end
if mode == 'l' and stored > idx then drop() return redis.error_reply('CONFLICT stored ' .. stored) end
if staged then
  -- RENAME is the first write: a staging hash that is gone stops the script before anything changed.
  local moved = redis.pcall('RENAME', staged, KEYS[5])
  if type(moved) == 'table' and moved.err then return redis.error_reply('STAGE lost') end
  redis.call('PERSIST', KEYS[5])
else
  redis.call('HSET', KEYS[5], unpack(ARGV, 7))
end
redis.call('SADD', KEYS[2], ARGV[2])
stored = stored + 1
if not total then
  if mode == 'l' then total = idx + 1 elseif mode == 'f' then total = stored end
end
local failed = tonumber(g[4] or '0')
if ARGV[6] == '1' then failed = failed + 1 end
local set = {sf, stored, 'records', tonumber(g[3] or '0') + 1, 'failed', failed}
if total then
  set[#set + 1] = tf
  set[#set + 1] = total
end
local out = 1
if stored == total then
  -- The session finished: count it, and enqueue the group if this was its last session (as finish() does, without re-reading).
  local finished = tonumber(g[5] or '0') + 1
  set[#set + 1] = 'finished'
  set[#set + 1] = finished
  if g[6] and g[7] ~= '1' and not g[9] and finished >= tonumber(g[6]) then
    local members = redis.call('SMEMBERS', KEYS[2])
    table.sort(members, key_order)
    local stream = KEYS[3]
    if g[8] == 'val' then stream = KEYS[4] end
    local id = redis.call('XADD', stream, '*', 'uid', ARGV[1], 'n', g[6], 'failed', failed, 'keys', cjson.encode(members))
    set[#set + 1] = 'enqueued'
    set[#set + 1] = '1'
    set[#set + 1] = 'delivery_id'
    set[#set + 1] = id
    out = 2
  end
end
redis.call('HSET', KEYS[1], unpack(set))
return out
`;

/**
 * Declares a session's output count: KEYS = group, members, train stream,
 * val stream; ARGV = uid, session_id, outputs (0 = none). Returns 1 when
 * this finished the session, 0 otherwise (already finished with that count,
 * or outputs still to come); `CONFLICT finished <t>` / `CONFLICT stored <s>`
 * when the count contradicts what is known.
 */
export const FINISH_LUA = `${COMPLETE_LUA}
if redis.call('HGET', KEYS[1], 'cancelled') == '1' then return redis.error_reply('CANCELLED group') end
local sf, tf = 's:' .. ARGV[2], 't:' .. ARGV[2]
local want = tonumber(ARGV[3])
local g = redis.call('HMGET', KEYS[1], sf, tf)
local stored = tonumber(g[1] or '0')
if g[2] then
  if tonumber(g[2]) ~= want then return redis.error_reply('CONFLICT finished ' .. g[2]) end
  return 0
end
if stored > want then return redis.error_reply('CONFLICT stored ' .. stored) end
redis.call('HSET', KEYS[1], tf, want)
if stored == want then
  finish(ARGV[1])
  return 1
end
return 0
`;

/**
 * Group registration: KEYS = group, members, train stream, val stream;
 * ARGV = uid, n, partition, fingerprint (`""` = none). Idempotent for the
 * same n and partition; a different one replies `CONFLICT expected=<n>
 * partition=<p>`, a different fingerprint `CONFLICT fingerprint` (a uid
 * names one prompt group). Completes the group when its sessions had
 * already finished.
 */
export const EXPECT_LUA = `${COMPLETE_LUA}
local cur = redis.call('HMGET', KEYS[1], 'expected', 'partition', 'fingerprint')
if cur[1] then
  if cur[1] ~= ARGV[2] or cur[2] ~= ARGV[3] then
    return redis.error_reply('CONFLICT expected=' .. cur[1] .. ' partition=' .. tostring(cur[2]))
  end
  if ARGV[4] ~= '' then
    if cur[3] and cur[3] ~= ARGV[4] then return redis.error_reply('CONFLICT fingerprint') end
    if not cur[3] then redis.call('HSET', KEYS[1], 'fingerprint', ARGV[4]) end
  end
elseif ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'expected', ARGV[2], 'partition', ARGV[3], 'fingerprint', ARGV[4])
else
  redis.call('HSET', KEYS[1], 'expected', ARGV[2], 'partition', ARGV[3])
end
return maybe_complete(ARGV[1])
`;

/** SHA-1 hex of a script (the EVALSHA handle), via Web Crypto. */
export async function scriptSha(script: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-1", new TextEncoder().encode(script));
  return Array.from(new Uint8Array(digest), (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Withdraws one group of a cancelled batch: KEYS = the group hash. Replies
 * `complete` when it was already enqueued or is a complete filtered group (left as it is), else flags it
 * `cancelled 1` (never enqueued; PUT_LUA and FINISH_LUA refuse writes to it
 * with `CANCELLED group`) and replies `withdrawn`.
 */
export const CANCEL_LUA = `local g = redis.call('HMGET', KEYS[1], 'enqueued', 'filtered', 'expected', 'finished')
if g[1] == '1' then return 'complete' end
if g[2] and g[3] and tonumber(g[4] or '0') >= tonumber(g[3]) then return 'complete' end
redis.call('HSET', KEYS[1], 'cancelled', '1')
return 'withdrawn'`;

/**
 * Filters one group (dynamic sampling): KEYS = the group hash, the train
 * and val filtered lists; ARGV = uid, reason. Replies 0 when the group was
 * already enqueued or withdrawn (nothing changed), else sets `filtered`
 * (COMPLETE_LUA and PUT_LUA then never enqueue it), RPUSHes the uid to its
 * partition's filtered list the first time, and replies 1.
 */
export const FILTER_LUA = `local g = redis.call('HMGET', KEYS[1], 'enqueued', 'cancelled', 'filtered', 'partition')
if g[1] == '1' or g[2] == '1' then return 0 end
if not g[3] then
  local list = KEYS[2]
  if g[4] == 'val' then list = KEYS[3] end
  redis.call('RPUSH', list, ARGV[1])
end
redis.call('HSET', KEYS[1], 'filtered', ARGV[2])
return 1`;
