import { ConflictError, EdgeloopError, InputError, StoreError } from "../errors.ts";
import type { TrajectoryRecord } from "../schema/index.ts";
import { decodeRecord, encodedFields, encodeRecord, failedRecord, validateRecord } from "./record-codec.ts";
import type { RedisArg, RedisCommander, RedisReply } from "./redis-commander.ts";
import { EXPECT_LUA, PUT_LUA, RedisLayout, scriptSha } from "./redis-layout.ts";
import { StreamConsumer, type StreamEntry } from "./stream-consumer.ts";
import {
  checkGroupSize,
  checkKey,
  checkPartition,
  checkReadOptions,
  checkUid,
  DEFAULT_GROUP,
  DEFAULT_PREFIX,
  DEFAULT_VISIBILITY_TIMEOUT_MS,
} from "./queue-args.ts";
import type {
  CompleteGroup,
  GroupStatus,
  Partition,
  PutResult,
  ReadGroupsOptions,
  TransferQueue,
  TransferQueueOptions,
} from "./types.ts";

/** Options of {@link RedisTransferQueue}. */
export interface RedisTransferQueueOptions extends TransferQueueOptions {
  /** Close the commander when the queue is closed (default true). */
  ownsCommander?: boolean;
}

/** `HGETALL`-style reply (RESP2 flat array or RESP3 map) → object of strings. */
export function replyToFields(reply: RedisReply): Record<string, string> {
  const out: Record<string, string> = {};
  if (reply === null) return out;
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) out[String(reply[i])] = String(reply[i + 1]);
    return out;
  }
  if (typeof reply === "object") {
    for (const [k, v] of Object.entries(reply)) out[k] = String(v);
    return out;
  }
  throw new StoreError(`unexpected hash reply ${JSON.stringify(reply).slice(0, 100)}`, { retryable: false });
}

function errorMessage(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}

/**
 * The transfer queue over Redis commands (DESIGN §4.5, layout in
 * docs/queue-layout.md), written against {@link RedisCommander} so that one
 * layout drives Redis over TCP and Upstash REST alike. Writes go through two
 * Lua scripts (EVALSHA, falling back to EVAL on NOSCRIPT); complete groups
 * are entries of a per-partition stream read with a consumer group:
 * `XAUTOCLAIM` re-delivers entries left unacked longer than the visibility
 * timeout, then `XREADGROUP >` delivers new ones.
 *
 * Errors: {@link InputError} for bad arguments/records, {@link ConflictError}
 * when a group is re-registered with another n/partition, {@link StoreError}
 * (retryable) for transport and Redis failures.
 * @see https://redis.io/docs/latest/develop/data-types/streams/
 */
export class RedisTransferQueue implements TransferQueue {
  readonly layout: RedisLayout;
  readonly group: string;
  private readonly visibilityMs: number;
  private readonly owns: boolean;
  private readonly shas = new Map<string, Promise<string>>();
  private readonly consumers = new Map<Partition, StreamConsumer>();

  constructor(
    private readonly redis: RedisCommander,
    opts: RedisTransferQueueOptions = {},
  ) {
    this.layout = new RedisLayout(opts.prefix ?? DEFAULT_PREFIX);
    this.group = opts.group ?? DEFAULT_GROUP;
    this.visibilityMs = opts.visibilityTimeoutMs ?? DEFAULT_VISIBILITY_TIMEOUT_MS;
    this.owns = opts.ownsCommander ?? true;
  }

  async expectGroup(uid: string, n: number, partition?: Partition): Promise<void> {
    checkUid(uid);
    checkGroupSize(n);
    const part = checkPartition(partition);
    try {
      await this.script(EXPECT_LUA, this.layout.groupKeys(uid), [uid, String(n), part]);
    } catch (e) {
      if (errorMessage(e).startsWith("CONFLICT")) {
        throw new ConflictError(`group ${uid} is already registered (${errorMessage(e).slice(9)}), not n=${n} in ${part}`);
      }
      throw e;
    }
  }

  async put(record: TrajectoryRecord): Promise<PutResult> {
    return this.store(validateRecord(record));
  }

  async markFailed(key: string, reason: string, fields?: Partial<TrajectoryRecord>): Promise<PutResult> {
    checkKey(key);
    return this.store(failedRecord(key, reason, fields));
  }

  async get(key: string): Promise<TrajectoryRecord | null> {
    checkKey(key);
    const fields = replyToFields(await this.call(["HGETALL", this.layout.traj(key)]));
    return fields.meta === undefined ? null : decodeRecord(fields);
  }

  async groupStatus(uid: string): Promise<GroupStatus> {
    checkUid(uid);
    const r = (await this.call(["HMGET", this.layout.group(uid), "expected", "partition", "done", "failed"])) as (string | null)[];
    const expected = r[0] == null ? null : Number(r[0]);
    const done = Number(r[2] ?? 0);
    return {
      uid,
      partition: r[1] === "val" ? "val" : "train",
      expected,
      done,
      failed: Number(r[3] ?? 0),
      complete: expected !== null && done >= expected,
    };
  }

  async readCompleteGroups(opts: ReadGroupsOptions): Promise<CompleteGroup[]> {
    const o = checkReadOptions(opts);
    const sc = this.consumer(o.partition);
    const entries: StreamEntry[] = await sc.autoclaim(o.consumer, this.visibilityMs, o.max, 8);
    if (entries.length < o.max) {
      entries.push(...(await sc.read(o.consumer, o.max - entries.length, entries.length === 0 ? o.block_ms : 0)));
    }
    return this.materialise(o.partition, entries);
  }

  async ack(deliveryIds: readonly string[], partition?: Partition): Promise<number> {
    const part = checkPartition(partition);
    if (deliveryIds.length === 0) return 0;
    try {
      return await this.consumer(part).ack(deliveryIds);
    } catch (e) {
      // A malformed id is the caller's mistake (400), not a store failure (503).
      if (e instanceof StoreError && errorMessage(e.cause).includes("Invalid stream ID")) {
        throw new InputError("delivery_ids", "not a stream entry id (expected <ms>-<seq>, as readCompleteGroups returns)");
      }
      throw e;
    }
  }

  async close(): Promise<void> {
    if (this.owns) await this.redis.close();
  }

  private async store(rec: TrajectoryRecord): Promise<PutResult> {
    const fields = encodedFields(encodeRecord(rec));
    const keys = [...this.layout.groupKeys(rec.uid), this.layout.traj(rec.key)];
    const r = await this.script(PUT_LUA, keys, [rec.uid, rec.key, rec.error === null ? "0" : "1", ...fields]);
    return { key: rec.key, stored: Number(r) > 0 };
  }

  private async materialise(part: Partition, entries: StreamEntry[]): Promise<CompleteGroup[]> {
    const groups = entries.map((e) => {
      let keys: string[] = [];
      try {
        keys = e.fields?.keys ? (JSON.parse(e.fields.keys) as string[]) : [];
      } catch (cause) {
        throw new StoreError(`stream entry ${e.id} has a bad keys field`, { cause, retryable: false });
      }
      return { id: e.id, uid: e.fields?.uid ?? "", keys };
    });
    const all = groups.flatMap((g) => g.keys);
    const replies = all.length ? await this.pipe(all.map((k) => ["HGETALL", this.layout.traj(k)])) : [];
    let i = 0;
    return groups.map((g) => {
      const records: TrajectoryRecord[] = [];
      for (const _ of g.keys) {
        const fields = replyToFields(replies[i++] as RedisReply);
        if (fields.meta !== undefined) records.push(decodeRecord(fields));
      }
      return { uid: g.uid, partition: part, delivery_id: g.id, failed: records.filter((r) => r.error !== null).length, records };
    });
  }

  /** The `trainers` group of a partition's stream (created again whenever Redis lost it). */
  private consumer(part: Partition): StreamConsumer {
    let c = this.consumers.get(part);
    if (!c) {
      c = new StreamConsumer({ call: (cmd, b) => this.call(cmd, b), pipe: (cmds) => this.pipe(cmds) }, this.layout.stream(part), this.group);
      this.consumers.set(part, c);
    }
    return c;
  }

  private async script(source: string, keys: string[], args: string[]): Promise<RedisReply> {
    let sha = this.shas.get(source);
    if (!sha) this.shas.set(source, (sha = scriptSha(source)));
    const tail = [String(keys.length), ...keys, ...args];
    try {
      return await this.redis.exec(["EVALSHA", await sha, ...tail]);
    } catch (e) {
      if (!errorMessage(e).startsWith("NOSCRIPT")) throw this.wrap(e, false);
      try {
        return await this.redis.exec(["EVAL", source, ...tail]);
      } catch (e2) {
        throw this.wrap(e2, false);
      }
    }
  }

  private async call(cmd: RedisArg[], blocking = false): Promise<RedisReply> {
    try {
      return blocking && this.redis.execBlocking ? await this.redis.execBlocking(cmd) : await this.redis.exec(cmd);
    } catch (e) {
      throw this.wrap(e, true);
    }
  }

  private async pipe(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    let out: (RedisReply | Error)[];
    try {
      out = await this.redis.pipeline(cmds);
    } catch (e) {
      throw this.wrap(e, true);
    }
    const bad = out.find((r) => r instanceof Error);
    if (bad) throw this.wrap(bad, true);
    return out;
  }

  /** Keeps script-level CONFLICT errors raw for the caller; everything else becomes a StoreError. */
  private wrap(e: unknown, always: boolean): Error {
    if (e instanceof EdgeloopError) return e;
    if (!always && errorMessage(e).startsWith("CONFLICT")) return e as Error;
    return new StoreError(`redis: ${errorMessage(e)}`, { cause: e });
  }
}
