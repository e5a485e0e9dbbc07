import { StoreError } from "../errors.ts";
import type { RedisCommander, RedisReply } from "../store/redis-commander.ts";
import { scriptSha } from "../store/redis-layout.ts";
import { replyToFields } from "../store/redis-transfer-queue.ts";
import { staleStep, type PutOptions, type SessionStorage, type StoredSession } from "./session-storage.ts";

/**
 * Fenced commit: refuses (returns the stored step) when the stored step is
 * ≥ the new one; otherwise writes `step`, `cp` (and `input` once) and sets
 * or clears the TTL, atomically.
 */
const PUT_LUA = `local cur = redis.call('HGET', KEYS[1], 'step')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return tonumber(cur) end
if ARGV[3] ~= '' and redis.call('HEXISTS', KEYS[1], 'input') == 0 then redis.call('HSET', KEYS[1], 'input', ARGV[3]) end
redis.call('HSET', KEYS[1], 'step', ARGV[1], 'cp', ARGV[2])
local ttl = tonumber(ARGV[4])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) else redis.call('PERSIST', KEYS[1]) end
return -1`;

/** Options of {@link RedisSessionStorage}. */
export interface RedisSessionStorageOptions {
  /** Key prefix (default `edgeloop:`); the hash of a session is `{prefix}session:{key}`. */
  prefix?: string;
}

/**
 * {@link SessionStorage} over any {@link RedisCommander} (TCP or Upstash
 * REST): one hash per session, `{prefix}session:{key}` with fields `input`
 * (JSON, written once), `cp` (the last checkpoint, JSON) and `step`. Commits
 * are one Lua script (EVALSHA, EVAL on NOSCRIPT), so the step fence and the
 * write are atomic. Runtime-free.
 * @throws StoreError (retryable) for transport failures; ConflictError from a fenced `put`.
 * @see https://redis.io/docs/latest/develop/interact/programmability/eval-intro/
 */
export class RedisSessionStorage implements SessionStorage {
  readonly prefix: string;
  private sha: Promise<string> | undefined;

  constructor(
    private readonly redis: RedisCommander,
    opts: RedisSessionStorageOptions = {},
  ) {
    this.prefix = opts.prefix ?? "edgeloop:";
  }

  /** The Redis key of a session's hash. */
  hashKey(key: string): string {
    return `${this.prefix}session:${key}`;
  }

  async get(key: string): Promise<StoredSession | null> {
    const f = replyToFields(await this.call(["HGETALL", this.hashKey(key)]));
    if (f.step === undefined && f.input === undefined) return null;
    return { input: f.input ?? null, checkpoint: f.cp ?? null, step: f.step === undefined ? -1 : Number(f.step) };
  }

  async put(key: string, step: number, checkpoint: string, opts: PutOptions = {}): Promise<void> {
    const args = [String(step), checkpoint, opts.input ?? "", String(opts.ttlSeconds ?? 0)];
    this.sha ??= scriptSha(PUT_LUA);
    let r: RedisReply;
    try {
      r = await this.redis.exec(["EVALSHA", await this.sha, "1", this.hashKey(key), ...args]);
    } catch (e) {
      if (!String((e as Error)?.message ?? e).startsWith("NOSCRIPT")) throw wrap(e);
      r = await this.call(["EVAL", PUT_LUA, "1", this.hashKey(key), ...args]);
    }
    const stored = Number(r);
    if (stored >= 0) throw staleStep(key, step, stored);
  }

  async delete(key: string): Promise<void> {
    await this.call(["DEL", this.hashKey(key)]);
  }

  private async call(cmd: string[]): Promise<RedisReply> {
    try {
      return await this.redis.exec(cmd);
    } catch (e) {
      throw wrap(e);
    }
  }
}

function wrap(e: unknown): StoreError {
  return new StoreError(`session storage: ${(e as Error)?.message ?? String(e)}`, { retryable: true, cause: e });
}
