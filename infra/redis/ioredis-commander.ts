import IORedis from "ioredis";
import type { RedisArg, RedisCommander, RedisReply } from "../../shared/store/redis-commander.ts";

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

  constructor(url: string) {
    this.main = new IORedis(url, { lazyConnect: false, maxRetriesPerRequest: 3 });
    this.all.add(this.main);
  }

  async exec(cmd: RedisArg[]): Promise<RedisReply> {
    const [name, ...args] = cmd;
    return (await this.main.call(String(name), ...args.map(toArg))) as RedisReply;
  }

  async pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    const p = this.main.pipeline();
    for (const [name, ...args] of cmds) p.call(String(name), ...args.map(toArg));
    const res = (await p.exec()) ?? [];
    return res.map(([err, v]) => (err ? err : (v as RedisReply)));
  }

  async execBlocking(cmd: RedisArg[]): Promise<RedisReply> {
    let c = this.idle.pop();
    if (!c) {
      c = this.main.duplicate();
      this.all.add(c);
    }
    try {
      const [name, ...args] = cmd;
      return (await c.call(String(name), ...args.map(toArg))) as RedisReply;
    } finally {
      this.idle.push(c);
    }
  }

  async close(): Promise<void> {
    await Promise.all([...this.all].map((c) => c.quit().catch(() => c.disconnect())));
    this.all.clear();
    this.idle.length = 0;
  }
}

function toArg(a: RedisArg): string | Buffer {
  return typeof a === "string" ? a : Buffer.from(a.buffer, a.byteOffset, a.byteLength);
}
