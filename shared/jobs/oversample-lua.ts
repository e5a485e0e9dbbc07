/**
 * Lua scripts that make the over-sampling decisions of a queued batch
 * atomic in Redis (docs/queue-layout.md, "Over-sampled batches"). KEYS[1]
 * is always the batch hash `{p}jobs:batch:{id}`, whose fields they keep:
 * `os:target`, `os:mode` (`cancel`/`carry`), `os:delivered`,
 * `os:completing` (group-completing writes admitted, not yet stored),
 * `os:filtered`, `os:replacements`, `stopped` (the mode, once the target
 * was reached), and per group `c:{uid}` (holds a delivery slot), `d:{uid}`
 * (delivered), `f:{uid}` (filtered), `r:{uid}` (the reserve uid started in
 * its place). They run by EVAL, so Redis over TCP and Upstash's REST API
 * (which accepts EVAL) both work.
 * @see https://redis.io/docs/latest/develop/interact/programmability/eval-intro/
 * @see https://upstash.com/docs/redis/commands/scripting/eval (Upstash runs EVAL over its REST API, atomically)
 */

/**
 * Admits a finished session's write. KEYS: batch hash, the group's admitted
 * set `{p}jobs:batch:{id}:w:{uid}`; ARGV: session_id, group size n, TTL
 * seconds. Replies `cancelled` (the batch was cancelled), `surplus` (the
 * batch was stopped and this session was not admitted before), `write`
 * (admitted; not its group's last), or `last` (admitted, and the set now
 * holds all n sessions: this write completes the group, so it needs a
 * delivery slot or a filter verdict first). Idempotent per session: a
 * redelivered job of an admitted session is admitted again, even after
 * the stop, so a group whose sessions were all admitted always completes.
 */
export const ADMIT_LUA = `local f = redis.call('HMGET', KEYS[1], 'cancelled', 'stopped')
if f[1] then return 'cancelled' end
local member = redis.call('SISMEMBER', KEYS[2], ARGV[1])
if f[2] and member == 0 then return 'surplus' end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[3])
if redis.call('SCARD', KEYS[2]) < tonumber(ARGV[2]) then return 'write' end
return 'last'`;

/**
 * Reserves a delivery slot for the write that completes group ARGV[1]:
 * granted (1) while `delivered + completing < target` and the batch is not
 * stopped (the in-process rule of BatchRun, made atomic across workers),
 * else refused (0). A group that already holds a slot or was delivered
 * gets 1 again (a redelivered job).
 */
export const RESERVE_LUA = `local c, d = 'c:' .. ARGV[1], 'd:' .. ARGV[1]
if redis.call('HEXISTS', KEYS[1], c) == 1 or redis.call('HEXISTS', KEYS[1], d) == 1 then return 1 end
local g = redis.call('HMGET', KEYS[1], 'stopped', 'os:target', 'os:delivered', 'os:completing', 'cancelled')
if g[1] or g[5] then return 0 end
if tonumber(g[3] or '0') + tonumber(g[4] or '0') >= tonumber(g[2]) then return 0 end
redis.call('HSET', KEYS[1], c, '1')
redis.call('HINCRBY', KEYS[1], 'os:completing', 1)
return 1`;

/**
 * The group-completing write of ARGV[1] is stored: its slot becomes a
 * delivery (counted once per group). Replies 2 when this delivery reached
 * the target and set `stopped` (the caller then stops the surplus), else 1.
 */
export const COMMIT_LUA = `if redis.call('HDEL', KEYS[1], 'c:' .. ARGV[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'os:completing', -1) end
local d
if redis.call('HSETNX', KEYS[1], 'd:' .. ARGV[1], '1') == 1 then
  d = redis.call('HINCRBY', KEYS[1], 'os:delivered', 1)
else
  d = tonumber(redis.call('HGET', KEYS[1], 'os:delivered') or '0')
end
local g = redis.call('HMGET', KEYS[1], 'os:target', 'os:mode', 'cancelled')
if d >= tonumber(g[1]) and not g[3] and redis.call('HSETNX', KEYS[1], 'stopped', g[2]) == 1 then return 2 end
return 1`;

/** The group-completing write of ARGV[1] failed: its delivery slot is freed. */
export const RELEASE_LUA = `if redis.call('HDEL', KEYS[1], 'c:' .. ARGV[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'os:completing', -1) end
return 1`;

/**
 * Group ARGV[1] was filtered (dynamic sampling): counts it once and starts
 * the next reserve row in its place unless the batch is stopped or
 * cancelled. KEYS: batch hash, reserve list, launched list, reserve-jobs
 * hash, the job stream; ARGV: uid, batch id, TTL seconds. Starting a row
 * moves its uid from the reserve to the launched list and XADDs its jobs
 * (entries as `JobQueue.prepare` builds them, plus `x`: the group to
 * register) — pop and enqueue in one script, so a crash never loses a
 * popped row. Replies the started row's reserve entry (JSON: `uid`, `n`,
 * `x`, `jobs`), the same one again for a repeated call, or '' when none
 * was started.
 */
export const FILTERED_LUA = `if redis.call('HSETNX', KEYS[1], 'f:' .. ARGV[1], '1') == 0 then
  local prev = redis.call('HGET', KEYS[1], 'r:' .. ARGV[1])
  if prev then return redis.call('HGET', KEYS[4], prev) or '' end
  return ''
end
redis.call('HINCRBY', KEYS[1], 'os:filtered', 1)
local g = redis.call('HMGET', KEYS[1], 'stopped', 'cancelled')
if g[1] or g[2] then return '' end
local r = redis.call('LPOP', KEYS[2])
if not r then return '' end
redis.call('RPUSH', KEYS[3], r)
redis.call('EXPIRE', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], r)
redis.call('HINCRBY', KEYS[1], 'os:replacements', 1)
local e = redis.call('HGET', KEYS[4], r)
if not e then return '' end
local row = cjson.decode(e)
for _, j in ipairs(row.jobs) do
  if j.rb then
    redis.call('XADD', KEYS[5], '*', 'batch', ARGV[2], 'key', j.key, 'r', '1', 'rb', j.rb, 'x', row.x, 't', j.t)
  else
    redis.call('XADD', KEYS[5], '*', 'batch', ARGV[2], 'key', j.key, 'x', row.x, 't', j.t)
  end
end
return e`;
