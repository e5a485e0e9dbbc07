import type { Partition } from "./types.ts";

/**
 * Redis key names of the transfer queue (docs/queue-layout.md), all under one
 * prefix:
 * - `{p}traj:{key}` HASH — one record (`meta`, `prompt_ids`, `response_ids`, `response_mask`, `rollout_log_probs`).
 * - `{p}group:{uid}` HASH — `expected`, `partition`, `done`, `failed`, `enqueued`, `delivery_id`.
 * - `{p}group:{uid}:keys` SET — keys written for the group.
 * - `{p}groups:{partition}` STREAM — one entry per complete group, read with a consumer group.
 */
export class RedisLayout {
  constructor(readonly prefix: string) {}
  traj(key: string): string {
    return `${this.prefix}traj:${key}`;
  }
  group(uid: string): string {
    return `${this.prefix}group:${uid}`;
  }
  members(uid: string): string {
    return `${this.prefix}group:${uid}:keys`;
  }
  stream(partition: Partition): string {
    return `${this.prefix}groups:${partition}`;
  }
  /** KEYS of both scripts, in order: group, members, train stream, val stream. */
  groupKeys(uid: string): string[] {
    return [this.group(uid), this.members(uid), this.stream("train"), this.stream("val")];
  }
}

/**
 * Lua shared by both scripts: when the group has `expected` set, at least
 * that many keys written and is not yet enqueued, XADD one entry to its
 * partition's stream (`uid`, `n`, `failed`, `keys` = JSON array ordered by
 * session_id then output_index) and flag it enqueued — inside the same
 * script as the write that completed it, so a group is enqueued exactly once.
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
  local g = redis.call('HMGET', KEYS[1], 'expected', 'done', 'enqueued', 'partition', 'failed')
  if not g[1] or g[3] == '1' then return 0 end
  if tonumber(g[2] or '0') < tonumber(g[1]) then return 0 end
  local members = redis.call('SMEMBERS', KEYS[2])
  table.sort(members, key_order)
  local stream = KEYS[3]
  if g[4] == 'val' then stream = KEYS[4] end
  local id = redis.call('XADD', stream, '*', 'uid', uid, 'n', g[1], 'failed', g[5] or '0', 'keys', cjson.encode(members))
  redis.call('HSET', KEYS[1], 'enqueued', '1', 'delivery_id', id)
  return 1
end
`;

/**
 * Put-once: KEYS = group, members, train stream, val stream, record hash;
 * ARGV = uid, key, failed ("0"/"1"), then HSET field/value pairs. Returns
 * 0 when the key already existed (nothing written), 1 when stored, 2 when
 * stored and the group became complete. The existence check, the record, the
 * counters and the enqueue happen in one atomic script: a crash leaves either
 * all of them or none.
 * @see https://redis.io/docs/latest/develop/interact/programmability/eval-intro/
 */
export const PUT_LUA = `${COMPLETE_LUA}
if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
redis.call('HSET', KEYS[5], unpack(ARGV, 4))
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'done', 1)
if ARGV[3] == '1' then redis.call('HINCRBY', KEYS[1], 'failed', 1) end
return 1 + maybe_complete(ARGV[1])
`;

/**
 * Group registration: KEYS = group, members, train stream, val stream;
 * ARGV = uid, n, partition. Idempotent for the same n and partition; a
 * different one replies `CONFLICT expected=<n> partition=<p>`. Completes the
 * group when its keys were already written.
 */
export const EXPECT_LUA = `${COMPLETE_LUA}
local cur = redis.call('HMGET', KEYS[1], 'expected', 'partition')
if cur[1] then
  if cur[1] ~= ARGV[2] or cur[2] ~= ARGV[3] then
    return redis.error_reply('CONFLICT expected=' .. cur[1] .. ' partition=' .. tostring(cur[2]))
  end
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
