import IORedis from "ioredis";
import type { RedisArg, RedisCommander, RedisReply } from "../../shared/store/redis-commander.ts";
import { checkCommand, pipelineBySize, TCP_MAX_REQUEST_BYTES } from "../../shared/store/request-size.ts";
import { maskRedisUrl } from "./redis-check.ts";

/** Options of {@link IoRedisCommander}. */
export interface IoRedisCommanderOptions {
  /**
   * Reconnect attempts in a row (100 ms, 200 ms, … capped at 2 s apart)
   * before a lost connection is given up and commands fail with
   * "Connection is closed"; the count restarts once connected. Default 30
   * (about a minute).
   */
  maxReconnects?: number;
  /**
   * Called with connection errors: once when a connection starts failing
   * (not for every reconnect attempt) and once when it gives up. Default:
   * one line on stderr naming the masked URL.
   */
  onError?: (message: string, error: Error) => void;
  /**
   * Largest single command, and largest pipeline write, bytes (default
   * {@link TCP_MAX_REQUEST_BYTES}): pipelines are split to fit; a single
   * command over it is refused (413 `request_too_large`) without being sent.
   */
  maxRequestBytes?: number;
}

/**
 * A {@link RedisCommander} over ioredis (RESP2; runs on Bun, Node and Deno).
 * Concurrent commands share one connection (ioredis queues them, so they are
 * pipelined on the wire); `pipeline` sends a batch in one write. Blocking
 * commands get a duplicate connection from a small idle pool.
 * @see https://github.com/redis/ioredis
 */
export class IoRedisCommander implements RedisCommander {
  private readonly main: IORedis;
  private readonly idle: IORedis[] = [];
  private readonly all = new Set<IORedis>();

  private readonly onError: (message: string, error: Error) => void;
  private readonly url: string;
  private readonly maxReconnects: number;
  private closing = false;
  readonly maxRequestBytes: number;

  constructor(url: string, opts: IoRedisCommanderOptions = {}) {
    const maxReconnects = (this.maxReconnects = opts.maxReconnects ?? 30);
    this.maxRequestBytes = opts.maxRequestBytes ?? TCP_MAX_REQUEST_BYTES;
    this.url = maskRedisUrl(url);
    this.onError = opts.onError ?? ((message) => process.stderr.write(`edgeloop: ${message}\n`));
    this.main = new IORedis(url, {
      lazyConnect: false,
      maxRetriesPerRequest: 3,
      retryStrategy: (times) => (times > maxReconnects ? null : Math.min(times * 100, 2_000)),
    });
    this.track(this.main, maxReconnects);
  }

  /**
   * Handles a connection's `error` events (ioredis prints "Unhandled error
   * event" with a stack trace for every reconnect attempt otherwise): reports
   * the first error of an outage and the give-up, nothing in between.
   */
  private track(c: IORedis, maxReconnects: number): void {
    this.all.add(c);
    let failing = false;
    c.on("error", (e: Error) => {
      if (failing || this.closing) return;
      failing = true;
      this.onError(`Redis ${this.url}: ${e.message} (reconnecting, up to ${maxReconnects} attempts)`, e);
    });
    c.on("ready", () => (failing = false));
    c.on("end", () => {
      if (failing && !this.closing) this.onError(`Redis ${this.url}: gave up reconnecting; commands fail until restart`, new Error("connection closed"));
    });
  }

  async exec(cmd: RedisArg[]): Promise<RedisReply> {
    checkCommand(cmd, this.maxRequestBytes, "resp");
    const [name, ...args] = cmd;
    return (await this.main.call(String(name), ...args.map(toArg))) as RedisReply;
  }

  async pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    return pipelineBySize(cmds, this.maxRequestBytes, "resp", async (batch) => {
      const p = this.main.pipeline();
      for (const [name, ...args] of batch) p.call(String(name), ...args.map(toArg));
      const res = (await p.exec()) ?? [];
      return res.map(([err, v]) => (err ? err : (v as RedisReply)));
    });
  }

  async execBlocking(cmd: RedisArg[]): Promise<RedisReply> {
    let c = this.idle.pop();
    if (!c) {
      c = this.main.duplicate();
      this.track(c, this.maxReconnects);
    }
    try {
      const [name, ...args] = cmd;
      return (await c.call(String(name), ...args.map(toArg))) as RedisReply;
    } finally {
      this.idle.push(c);
    }
  }

  async close(): Promise<void> {
    this.closing = true;
    await Promise.all([...this.all].map((c) => c.quit().catch(() => c.disconnect())));
    this.all.clear();
    this.idle.length = 0;
  }
}

function toArg(a: RedisArg): string | Buffer {
  return typeof a === "string" ? a : Buffer.from(a.buffer, a.byteOffset, a.byteLength);
}
