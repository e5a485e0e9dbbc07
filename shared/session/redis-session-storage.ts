import { keyPart } from "../store/key-encoding.ts";
import { StoreError } from "../errors.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../store/redis-commander.ts";
import { scriptSha } from "../store/redis-layout.ts";
import { staleStep, type AppendOptions, type SessionStorage, type StoredSession } from "./session-storage.ts";
import { fromParts, toParts } from "./value-parts.ts";
import { commandBytes } from "../store/request-size.ts";

/** A storage key built from encoded parts: `{part}` or `agent:{part}` (see `keyPart`). */
const STORAGE_KEY = /^(?:agent:)?[A-Za-z0-9._~%-]+$/;

/**
 * Fenced append. KEYS[1] the session hash; ARGV: step, ttl, the number of
 * input parts, mode (`v`: the parts themselves follow; `s`: names of staged
 * fields holding them follow), then the input parts, then the delta's parts.
 * Refuses (returns the stored step, dropping staged fields) when the stored
 * step is ≥ the new one; otherwise appends the parts as `p:{n}…`, stores the
 * input once (`i:{j}`, count `in`), sets `step` and `n`, and sets or clears
 * the TTL — atomically.
 */
const APPEND_LUA = `local h = KEYS[1]
local staged = ARGV[4] == 's'
local nin = tonumber(ARGV[3])
local cur = redis.call('HGET', h, 'step')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then
  if staged then for i = 5, #ARGV do redis.call('HDEL', h, ARGV[i]) end end
  return tonumber(cur)
end
if staged then
  for i = 5, #ARGV do
    if redis.call('HEXISTS', h, ARGV[i]) == 0 then return redis.error_reply('ERR staged checkpoint part ' .. ARGV[i] .. ' is missing') end
  end
end
local function val(i)
  if not staged then return ARGV[i] end
  local v = redis.call('HGET', h, ARGV[i])
  redis.call('HDEL', h, ARGV[i])
  return v
end
if nin > 0 then
  if redis.call('HEXISTS', h, 'in') == 0 then
    for j = 1, nin do redis.call('HSET', h, 'i:' .. (j - 1), val(4 + j)) end
    redis.call('HSET', h, 'in', nin)
  elseif staged then
    for j = 1, nin do redis.call('HDEL', h, ARGV[4 + j]) end
  end
end
local n = tonumber(redis.call('HGET', h, 'n') or '0')
for i = 5 + nin, #ARGV do
  redis.call('HSET', h, 'p:' .. n, val(i))
  n = n + 1
end
redis.call('HSET', h, 'step', ARGV[1], 'n', n)
local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('EXPIRE', h, ttl) else redis.call('PERSIST', h) end
return -1`;

/** Default largest stored value (one part of a delta or input): 1 MiB. */
export const DEFAULT_SESSION_VALUE_BYTES = 1024 * 1024;
/** Default largest single command: 8 MiB (under Upstash's 10 MB request limit with room for JSON quoting). */
export const DEFAULT_SESSION_COMMAND_BYTES = 8 * 1024 * 1024;

/** Options of {@link RedisSessionStorage}. */
export interface RedisSessionStorageOptions {
  /** Key prefix (default `edgeloop:`); the hash of a session is `{prefix}session:{key}`. */
  prefix?: string;
  /** Largest stored value, bytes (default {@link DEFAULT_SESSION_VALUE_BYTES}); longer deltas/inputs are stored as several. */
  maxValueBytes?: number;
  /**
   * Largest single command, bytes (default {@link DEFAULT_SESSION_COMMAND_BYTES}, capped by the
   * commander's `maxRequestBytes`): a commit larger than this stages its parts one command each,
   * then commits them in one script.
   */
  maxCommandBytes?: number;
}

/**
 * {@link SessionStorage} over any {@link RedisCommander} (TCP or Upstash
 * REST): one hash per session, `{prefix}session:{key}`, fields `in` and
 * `i:{j}` (the input, written once, in parts), `p:{i}` (the checkpoint
 * deltas' parts, append-only; see value-parts.ts), `n` (parts committed)
 * and `step`. A commit is one Lua script (EVALSHA, EVAL on NOSCRIPT), so the
 * step fence and the append are atomic; a commit larger than one command
 * first stages its parts under fields named by a random id (`s:{id}:{j}`,
 * invisible to readers) and the script moves them in. Reads fetch the parts
 * in batches of at most one command's size. Runtime-free.
 * @throws StoreError (retryable) for transport failures; (not retryable, code `checkpoint_version`) for a
 *   hash written by an older layout; ConflictError from a fenced `append`.
 * @see https://redis.io/docs/latest/develop/interact/programmability/eval-intro/
 */
export class RedisSessionStorage implements SessionStorage {
  readonly prefix: string;
  readonly maxValueBytes: number;
  readonly maxCommandBytes: number;
  private sha: Promise<string> | undefined;

  constructor(
    private readonly redis: RedisCommander,
    opts: RedisSessionStorageOptions = {},
  ) {
    this.prefix = opts.prefix ?? "edgeloop:";
    this.maxCommandBytes = Math.min(opts.maxCommandBytes ?? DEFAULT_SESSION_COMMAND_BYTES, redis.maxRequestBytes ? Math.floor(redis.maxRequestBytes * 0.8) : Infinity);
    this.maxValueBytes = Math.min(opts.maxValueBytes ?? DEFAULT_SESSION_VALUE_BYTES, this.maxCommandBytes - 1024);
  }

  /**
   * The Redis key of a session's hash: `{p}session:{key}`. `key` is a storage key whose parts the caller
   * encoded with `keyPart` (a trajectory key, or `agent:{key}`); anything else is encoded whole, so no
   * input can form a glob, a hash tag or another namespace's key.
   */
  hashKey(key: string): string {
    return `${this.prefix}session:${STORAGE_KEY.test(key) ? key : keyPart(key)}`;
  }

  async get(key: string): Promise<StoredSession | null> {
    const h = this.hashKey(key);
    const [step, n, nin, v1] = (await this.call(["HMGET", h, "step", "n", "in", "cp"])) as (string | null)[];
    if (v1 != null) {
      throw new StoreError(`session '${key}': stored checkpoint is version 1 (one whole snapshot); this edgeloop reads versions 2 and 3 only (finish or drop sessions before upgrading)`, {
        retryable: false,
        code: "checkpoint_version",
      });
    }
    if (step == null && nin == null) return null;
    const fields = [...Array.from({ length: Number(nin ?? 0) }, (_, j) => `i:${j}`), ...Array.from({ length: Number(n ?? 0) }, (_, i) => `p:${i}`)];
    const values: string[] = [];
    const per = Math.max(1, Math.floor(this.maxCommandBytes / this.maxValueBytes));
    for (let i = 0; i < fields.length; i += per) {
      const got = (await this.call(["HMGET", h, ...fields.slice(i, i + per)])) as (string | null)[];
      got.forEach((v, j) => {
        if (v == null) throw new StoreError(`session '${key}': stored part ${fields[i + j]} vanished while reading (expired or deleted)`, { retryable: true });
        values.push(v);
      });
    }
    const ni = Number(nin ?? 0);
    return { input: ni ? values.slice(0, ni).join("") : null, deltas: fromParts(values.slice(ni)), step: step == null ? -1 : Number(step) };
  }

  async stepOf(key: string): Promise<number | null> {
    const step = (await this.call(["HGET", this.hashKey(key), "step"])) as string | null;
    return step == null ? null : Number(step);
  }

  async append(key: string, step: number, delta: string, opts: AppendOptions = {}): Promise<void> {
    const h = this.hashKey(key);
    const input = opts.input !== undefined ? splitPlain(opts.input, this.maxValueBytes) : [];
    const parts = toParts(delta, this.maxValueBytes);
    // Measured as a JSON body (escapes included): at least the RESP size, so right for both transports.
    const size = commandBytes([...input, ...parts], "json");
    let args: string[];
    let staged: string[] = [];
    if (size + 256 <= this.maxCommandBytes) args = [String(step), String(opts.ttlSeconds ?? 0), String(input.length), "v", ...input, ...parts];
    else {
      const id = crypto.randomUUID();
      staged = [...input, ...parts].map((_, j) => `s:${id}:${j}`);
      // One value per command; the hash's TTL (if any) covers staged fields a crash leaves behind.
      for (let j = 0; j < staged.length; j++) await this.call(["HSET", h, staged[j]!, j < input.length ? input[j]! : parts[j - input.length]!]);
      args = [String(step), String(opts.ttlSeconds ?? 0), String(input.length), "s", ...staged];
    }
    const stored = Number(await this.script(h, args));
    if (stored >= 0) throw staleStep(key, step, stored);
  }

  async delete(key: string): Promise<void> {
    await this.call(["DEL", this.hashKey(key)]);
  }

  private async script(h: string, args: string[]): Promise<RedisReply> {
    this.sha ??= scriptSha(APPEND_LUA);
    try {
      return await this.redis.exec(["EVALSHA", await this.sha, "1", h, ...args]);
    } catch (e) {
      if (!String((e as Error)?.message ?? e).startsWith("NOSCRIPT")) throw wrap(e);
      return this.call(["EVAL", APPEND_LUA, "1", h, ...args]);
    }
  }

  private async call(cmd: RedisArg[]): Promise<RedisReply> {
    try {
      return await this.redis.exec(cmd);
    } catch (e) {
      throw wrap(e);
    }
  }
}

/** `s` in unmarked pieces of at most `max` UTF-8 bytes (the input is one value: its pieces are joined). */
function splitPlain(s: string, max: number): string[] {
  return toParts(s, max + 1).map((p) => p.slice(1));
}

function wrap(e: unknown): StoreError {
  if (e instanceof StoreError) return e;
  return new StoreError(`session storage: ${(e as Error)?.message ?? String(e)}`, { retryable: true, cause: e });
}
