import type { RedisArg, RedisReply } from "./redis-commander.ts";

/** One stream entry: its id and fields (null for an entry deleted while pending). */
export interface StreamEntry {
  id: string;
  fields: Record<string, string> | null;
}

/** How a {@link StreamConsumer} sends commands: its owner's own wrappers (they decide how errors are wrapped). */
export interface StreamCommands {
  call(cmd: RedisArg[], blocking?: boolean): Promise<RedisReply>;
  pipe(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]>;
}

/** `HGETALL`-style reply (RESP2 flat array or RESP3 map) → object of strings. */
export function fieldsOf(reply: RedisReply): Record<string, string> {
  const out: Record<string, string> = {};
  if (reply === null) return out;
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) out[String(reply[i])] = String(reply[i + 1]);
  } else if (typeof reply === "object") {
    for (const [k, v] of Object.entries(reply)) out[k] = String(v);
  }
  return out;
}

/** XRANGE / XAUTOCLAIM entry list → entries. */
export function parseEntries(reply: RedisReply): StreamEntry[] {
  if (!Array.isArray(reply)) return [];
  return reply
    .filter((e) => Array.isArray(e))
    .map((e) => {
      const [id, fields] = e as [string, RedisReply];
      return { id: String(id), fields: fields === null ? null : fieldsOf(fields) };
    });
}

/**
 * XREAD / XREADGROUP reply → entries. Accepts RESP2 `[[stream, entries], …]`,
 * a RESP3 map as an object `{stream: entries}` (Bun) or flattened
 * `[stream, entries, …]` (ioredis 6).
 */
export function parseRead(reply: RedisReply): StreamEntry[] {
  if (reply === null) return [];
  if (Array.isArray(reply)) {
    if (typeof reply[0] === "string") {
      const out: StreamEntry[] = [];
      for (let i = 1; i < reply.length; i += 2) out.push(...parseEntries(reply[i] ?? null));
      return out;
    }
    return reply.flatMap((s) => parseEntries((s as RedisReply[])[1] ?? null));
  }
  if (typeof reply === "object") return Object.values(reply).flatMap((v) => parseEntries(v));
  return [];
}

function textOf(e: unknown): string {
  const parts: string[] = [];
  for (let x: unknown = e, i = 0; x != null && i < 4; x = (x as { cause?: unknown }).cause, i++) {
    parts.push(x instanceof Error ? x.message : String(x));
    if (typeof x !== "object") break;
  }
  return parts.join(" | ");
}

/**
 * Whether a Redis error says the stream or its consumer group is gone:
 * `NOGROUP` (XREADGROUP/XAUTOCLAIM/XCLAIM/XPENDING on a missing key or
 * group), `UNBLOCKED` (a blocked XREADGROUP whose stream was deleted or
 * flushed) or `no such key` (XINFO on a missing stream). Decided on the
 * Redis error code the reply starts with, also through a wrapping error's
 * `cause`.
 * @see https://redis.io/docs/latest/commands/xreadgroup/
 */
export function isGroupGone(e: unknown): boolean {
  return /(^|[\s|:])(NOGROUP|UNBLOCKED)\b|ERR no such key/.test(textOf(e));
}

/**
 * The consumer-group side of one Redis stream, shared by the job queue
 * (`{p}jobs`, group `workers`) and the transfer queue (`{p}groups:{partition}`,
 * group `trainers`): creates the group (`XGROUP CREATE … 0 MKSTREAM`) once,
 * and creates it again whenever a command finds it gone — Redis restarted
 * without persistence, the key was evicted or `FLUSHALL`ed — instead of
 * remembering "created" for the life of the process. The group is created
 * at id `0`, so entries of a stream that survived its group are delivered
 * again (at least once, never lost).
 * Runtime-free: commands go through the owner's {@link StreamCommands}.
 * @see https://redis.io/docs/latest/commands/xgroup-create/
 */
export class StreamConsumer {
  private ensured: Promise<void> | undefined;
  /** Times the group was found gone and created again (for logs and tests). */
  recreated = 0;

  constructor(
    private readonly cmds: StreamCommands,
    readonly stream: string,
    readonly group: string,
  ) {}

  /** Creates the group (and the stream) unless it exists; concurrent callers share one attempt. */
  ensure(): Promise<void> {
    this.ensured ??= this.cmds.call(["XGROUP", "CREATE", this.stream, this.group, "0", "MKSTREAM"]).then(
      () => undefined,
      (e) => {
        if (/BUSYGROUP/.test(textOf(e))) return;
        this.ensured = undefined;
        throw e;
      },
    );
    return this.ensured;
  }

  /**
   * Runs `fn` with the group ensured; when it fails because the stream or
   * group is gone, creates the group again and runs `fn` once more.
   * @throws whatever `fn` throws otherwise (or on the second attempt).
   */
  async withGroup<T>(fn: () => Promise<T>): Promise<T> {
    await this.ensure();
    try {
      return await fn();
    } catch (e) {
      if (!isGroupGone(e)) throw e;
      this.ensured = undefined;
      this.recreated++;
      await this.ensure();
      return await fn();
    }
  }

  /**
   * Entries pending longer than `minIdleMs` (another consumer's, dead or
   * slow), now owned by `consumer`: XAUTOCLAIM from `0-0`, up to `rounds`
   * calls (it scans at most COUNT×10 PEL entries per call and may return a
   * non-zero cursor with nothing claimed).
   */
  autoclaim(consumer: string, minIdleMs: number, max: number, rounds = 1): Promise<StreamEntry[]> {
    return this.withGroup(async () => {
      const out: StreamEntry[] = [];
      let cursor = "0-0";
      for (let i = 0; i < rounds && out.length < max; i++) {
        const r = (await this.cmds.call(["XAUTOCLAIM", this.stream, this.group, consumer, String(minIdleMs), cursor, "COUNT", String(max - out.length)])) as RedisReply[];
        out.push(...parseEntries(r?.[1] ?? null));
        cursor = String(r?.[0] ?? "0-0");
        if (cursor === "0-0") break;
      }
      return out;
    });
  }

  /** New entries for `consumer` (XREADGROUP `>`), waiting up to `blockMs` when there are none (0: don't wait). */
  read(consumer: string, count: number, blockMs = 0): Promise<StreamEntry[]> {
    return this.withGroup(async () => {
      const cmd: RedisArg[] = ["XREADGROUP", "GROUP", this.group, consumer, "COUNT", String(count)];
      if (blockMs > 0) cmd.push("BLOCK", String(blockMs));
      cmd.push("STREAMS", this.stream, ">");
      return parseRead(await this.cmds.call(cmd, blockMs > 0));
    });
  }

  /** Delivery counts of pending entries (XPENDING per id; 2 when unknown, as for a reclaimed entry). */
  deliveries(ids: readonly string[]): Promise<number[]> {
    if (ids.length === 0) return Promise.resolve([]);
    return this.withGroup(async () => {
      const r = await this.cmds.pipe(ids.map((id) => ["XPENDING", this.stream, this.group, id, id, "1"]));
      const bad = r.find((x) => x instanceof Error);
      if (bad) throw bad;
      return r.map((x) => Number(((x as RedisReply[] | null)?.[0] as RedisReply[] | undefined)?.[3] ?? 2));
    });
  }

  /** Resets the idle time of `ids` for `consumer` (XCLAIM min-idle JUSTID): a lease heartbeat. */
  async touch(consumer: string, minIdleMs: number, ids: readonly string[]): Promise<void> {
    if (ids.length === 0) return;
    await this.withGroup(() => this.cmds.call(["XCLAIM", this.stream, this.group, consumer, String(minIdleMs), ...ids, "JUSTID"]));
  }

  /** XACK; returns how many were pending (0 for a stream or group that is gone: nothing is pending there). */
  async ack(ids: readonly string[]): Promise<number> {
    if (ids.length === 0) return 0;
    return Number(await this.cmds.call(["XACK", this.stream, this.group, ...ids]));
  }

  /** Pending count (XPENDING summary) and the consumers as XINFO CONSUMERS reports them. */
  info(): Promise<{ pending: number; consumers: Record<string, string>[] }> {
    return this.withGroup(async () => {
      const [pending, consumers] = await this.cmds.pipe([
        ["XPENDING", this.stream, this.group],
        ["XINFO", "CONSUMERS", this.stream, this.group],
      ]);
      if (pending instanceof Error) throw pending;
      if (consumers instanceof Error) throw consumers;
      return {
        pending: Number((pending as RedisReply[])?.[0] ?? 0),
        consumers: Array.isArray(consumers) ? consumers.map((c) => fieldsOf(c as RedisReply)) : [],
      };
    });
  }

  /** Removes `consumer` from the group when it holds no pending entries. */
  forget(consumer: string): Promise<void> {
    return this.withGroup(async () => {
      const pend = await this.cmds.call(["XPENDING", this.stream, this.group, "-", "+", "1", consumer]);
      if (Array.isArray(pend) && pend.length === 0) await this.cmds.call(["XGROUP", "DELCONSUMER", this.stream, this.group, consumer]);
    });
  }
}
