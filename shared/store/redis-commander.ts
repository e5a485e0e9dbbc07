/** One argument of a Redis command: strings are sent as UTF-8, bytes as-is. */
export type RedisArg = string | Uint8Array;

/**
 * A reply as the core understands it: bulk/simple strings as JS strings,
 * integers as numbers, nil as null, arrays as arrays. RESP3 maps (Bun's
 * client answers HGETALL with an object) are accepted too; the core
 * normalises both shapes.
 */
export type RedisReply = string | number | null | RedisReply[] | { [k: string]: RedisReply };

/**
 * The tiny command interface the Redis transfer-queue core is written
 * against (as Upstash's client needs only `request → {result, error}`). One
 * implementation per transport: TCP (`infra/redis/`), Upstash REST
 * (`shared/store/upstash-commander.ts`).
 */
export interface RedisCommander {
  /** Runs one command; rejects with an `Error` whose message is the Redis error (e.g. `NOSCRIPT …`). */
  exec(cmd: RedisArg[]): Promise<RedisReply>;
  /** Runs commands in one round trip, not atomically; failed commands yield an `Error` item. */
  pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]>;
  /**
   * Runs a command that may block (`XREADGROUP … BLOCK ms`) without stalling
   * other callers that share the connection. Defaults to {@link exec}.
   */
  execBlocking?(cmd: RedisArg[]): Promise<RedisReply>;
  close(): Promise<void>;
  /**
   * Largest request this transport sends, bytes (Upstash REST: the body of
   * one request; TCP: one command). Pipelines are split to fit; a single
   * command over it is refused. Absent: no limit known.
   */
  readonly maxRequestBytes?: number;
  /**
   * True when the server is a Redis Cluster: every script must then touch
   * keys of one hash slot, and adapters hash-tag their keys (absent: one
   * server, or Upstash's single endpoint).
   */
  readonly cluster?: boolean;
}
