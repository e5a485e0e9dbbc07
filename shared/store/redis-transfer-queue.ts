import { deliverGroups } from "./tree-delivery.ts";
import { ConflictError, EdgeloopError, GroupCancelledError, InputError, StoreError } from "../errors.ts";
import type { TrajectoryRecord } from "../schema/index.ts";
import { decodeRecord, encodedFields, encodeRecord, failedRecord, validateAndEncode, type EncodedRecord, type RecordHead } from "./record-codec.ts";
import type { RedisArg, RedisCommander, RedisReply } from "./redis-commander.ts";
import { CANCEL_LUA, EXPECT_LUA, FILTER_LUA, FINISH_LUA, PUT_LUA, RedisLayout, scriptSha } from "./redis-layout.ts";
import { StreamConsumer, type StreamEntry } from "./stream-consumer.ts";
import {
  checkFingerprint,
  checkGroupSize,
  checkKey,
  checkOutputs,
  checkSessionId,
  compareKeys,
  fingerprintConflict,
  sessionConflict,
  checkPartition,
  checkReadOptions,
  recordsOfRole,
  checkUid,
  DEFAULT_GROUP,
  DEFAULT_PREFIX,
  DEFAULT_VISIBILITY_TIMEOUT_MS,
} from "./queue-args.ts";
import type {
  CompleteGroup,
  FilteredGroup,
  GroupStatus,
  Partition,
  PutOptions,
  PutResult,
  ReadGroupsOptions,
  TransferQueue,
  TransferQueueOptions,
} from "./types.ts";

/** Options of {@link RedisTransferQueue}. */
export interface RedisTransferQueueOptions extends TransferQueueOptions {
  /** Close the commander when the queue is closed (default true). */
  ownsCommander?: boolean;
  /**
   * Stream shards per partition (default 1; `store.shards`): each group goes
   * to shard `CRC16(uid) mod shards`, readers read every shard. Every
   * writer and reader of a prefix must use the same count.
   * @see docs/queue-layout.md ("Shards and Redis Cluster")
   */
  shards?: number;
  /** Hash-tag every key (default: `shards > 1`, or when the commander says it is a cluster). */
  tagged?: boolean;
}

/**
 * A delivery id of a sharded queue: the stream entry id, then `@` and the
 * shard (`1796002889517-0@2`); one shard's ids are the bare entry id.
 */
export const SHARDED_DELIVERY_ID = /^(\d{1,20}-\d{1,20})@(\d{1,4})$/;

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

/** How long an orphaned staging hash (a client that died between staging and the script) lives: 60 s. */
const STAGE_TTL_MS = "60000";

/** A short random suffix: each put attempt stages under its own key, so concurrent duplicates never mix their bytes. */
function nonce(): string {
  return Math.random().toString(36).slice(2, 10);
}

/** A script's `CONFLICT finished <t>` / `CONFLICT stored <s>` reply as the ConflictError the memory queue throws; anything else unchanged. */
function sessionError(e: unknown, uid: string, sid: number, n: number, op: "put" | "finish"): unknown {
  if (/CANCELLED group/.test(errorMessage(e))) return new GroupCancelledError(uid);
  const m = /^CONFLICT (finished|stored) (\d+)/.exec(errorMessage(e));
  if (!m) return e;
  const count = Number(m[2]);
  if (m[1] === "finished") return sessionConflict(uid, sid, op === "put" ? `finished with ${count} outputs; output_index ${n} is past its last` : `finished with ${count} outputs, not ${n}`);
  return sessionConflict(uid, sid, op === "put" ? `has ${count} outputs stored; output ${n} cannot be its last` : `has ${count} outputs stored, more than ${n}`);
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
  /** Whether a put of this queue has run PUT_LUA (then puts send EVALSHA, else EVAL with the source). */
  private putScriptLoaded = false;
  private readonly consumers = new Map<string, StreamConsumer>();
  /** Entries read from a shard beyond a call's `max` (parallel blocking reads), handed out first by the next read, per partition and consumer. */
  private readonly spill = new Map<string, { shard: number; entry: StreamEntry }[]>();
  /** The shard the next read starts at (rotates, so no shard waits behind another). */
  private nextShard = 0;

  constructor(
    private readonly redis: RedisCommander,
    opts: RedisTransferQueueOptions = {},
  ) {
    this.layout = new RedisLayout(opts.prefix ?? DEFAULT_PREFIX, { ...(opts.shards !== undefined ? { shards: opts.shards } : {}), tagged: opts.tagged ?? (redis.cluster === true || (opts.shards ?? 1) > 1) });
    this.group = opts.group ?? DEFAULT_GROUP;
    this.visibilityMs = opts.visibilityTimeoutMs ?? DEFAULT_VISIBILITY_TIMEOUT_MS;
    this.owns = opts.ownsCommander ?? true;
  }

  async expectGroup(uid: string, n: number, partition?: Partition, fingerprint?: string): Promise<void> {
    checkUid(uid);
    checkGroupSize(n);
    const part = checkPartition(partition);
    const fp = checkFingerprint(fingerprint);
    try {
      await this.script(EXPECT_LUA, this.layout.groupKeys(uid), [uid, String(n), part, fp ?? ""]);
    } catch (e) {
      if (errorMessage(e).startsWith("CONFLICT fingerprint")) throw fingerprintConflict(uid);
      if (errorMessage(e).startsWith("CONFLICT")) {
        // Upstash appends ", command was: [...]" to script errors: keep the script's own words only.
        const said = errorMessage(e).slice(9).split(", command was:")[0];
        throw new ConflictError(`group ${uid} is already registered (${said}), not n=${n} in ${part}`);
      }
      throw e;
    }
  }

  async put(record: TrajectoryRecord, opts: PutOptions = {}): Promise<PutResult> {
    const { head, encoded } = validateAndEncode(record);
    return this.store(head, encoded, opts.last === false ? "m" : "l");
  }

  async markFailed(key: string, reason: string, fields?: Partial<TrajectoryRecord>): Promise<PutResult> {
    checkKey(key);
    const rec = failedRecord(key, reason, fields);
    return this.store(rec, encodeRecord(rec), "f");
  }

  async finishSession(uid: string, session_id: number, outputs: number): Promise<boolean> {
    checkUid(uid);
    checkSessionId(session_id);
    checkOutputs(outputs);
    try {
      return Number(await this.script(FINISH_LUA, this.layout.groupKeys(uid), [uid, String(session_id), String(outputs)])) === 1;
    } catch (e) {
      throw sessionError(e, uid, session_id, outputs, "finish");
    }
  }

  async sessionRecords(uid: string, session_id: number): Promise<TrajectoryRecord[] | null> {
    checkUid(uid);
    checkSessionId(session_id);
    const [stored, total] = (await this.call(["HMGET", this.layout.group(uid), `s:${session_id}`, `t:${session_id}`])) as (string | null)[];
    if (total == null || Number(stored ?? 0) !== Number(total)) return null;
    if (Number(total) === 0) return [];
    const prefix = `${uid}_${session_id}_`;
    const members = (await this.call(["SMEMBERS", this.layout.members(uid)])) as string[];
    const keys = members.map(String).filter((k) => k.startsWith(prefix)).sort(compareKeys);
    const replies = await this.pipe(keys.map((k) => ["HGETALL", this.layout.traj(k)]));
    return replies.map((r, i) => {
      const fields = replyToFields(r as RedisReply);
      if (fields.meta === undefined) throw new StoreError(`record ${keys[i]} of a finished session is missing`, { key: keys[i], retryable: false });
      return decodeRecord(fields);
    });
  }

  async get(key: string): Promise<TrajectoryRecord | null> {
    checkKey(key);
    const fields = replyToFields(await this.call(["HGETALL", this.layout.traj(key)]));
    return fields.meta === undefined ? null : decodeRecord(fields);
  }

  async groupStatus(uid: string): Promise<GroupStatus> {
    checkUid(uid);
    const r = (await this.call(["HMGET", this.layout.group(uid), "expected", "partition", "finished", "records", "failed", "fingerprint", "cancelled", "filtered"])) as (string | null)[];
    const expected = r[0] == null ? null : Number(r[0]);
    const finished = Number(r[2] ?? 0);
    return {
      uid,
      partition: r[1] === "val" ? "val" : "train",
      expected,
      finished,
      records: Number(r[3] ?? 0),
      failed: Number(r[4] ?? 0),
      complete: expected !== null && finished >= expected,
      fingerprint: r[5] == null ? null : String(r[5]),
      ...(String(r[6]) === "1" ? { cancelled: true as const } : {}),
      ...(r[7] != null ? { filtered: true as const } : {}),
    };
  }

  async cancelGroups(uids: readonly string[]): Promise<{ withdrawn: string[]; complete: string[] }> {
    const withdrawn: string[] = [];
    const complete: string[] = [];
    for (const uid of new Set(uids)) {
      checkUid(uid);
      const r = String(await this.script(CANCEL_LUA, [this.layout.group(uid)], []));
      (r === "complete" ? complete : withdrawn).push(uid);
    }
    return { withdrawn, complete };
  }

  async filterGroup(uid: string, reason: string): Promise<boolean> {
    checkUid(uid);
    const s = this.layout.shardOf(uid);
    const r = await this.script(FILTER_LUA, [this.layout.group(uid), this.layout.filtered("train", s), this.layout.filtered("val", s)], [uid, reason.slice(0, 500)]);
    return Number(r) === 1;
  }

  async filteredGroups(opts: { partition?: Partition; max: number }): Promise<FilteredGroup[]> {
    const part = checkPartition(opts.partition);
    const lists = await Promise.all(Array.from({ length: this.layout.shards }, (_, k) => this.call(["LRANGE", this.layout.filtered(part, k), "0", "-1"])));
    const uids = lists.flatMap((l) => (l as string[]).map(String));
    const out: FilteredGroup[] = [];
    for (const uid of uids) {
      if (out.length >= opts.max) break;
      const st = await this.groupStatus(uid);
      if (!st.complete) continue;
      const reason = String(await this.call(["HGET", this.layout.group(uid), "filtered"]));
      const keys = ((await this.call(["SMEMBERS", this.layout.members(uid)])) as string[]).map(String).sort(compareKeys);
      const replies = keys.length ? await this.pipe(keys.map((k) => ["HGETALL", this.layout.traj(k)])) : [];
      const records = replies.map((x) => replyToFields(x as RedisReply)).filter((f) => f.meta !== undefined).map((f) => decodeRecord(f));
      out.push({ uid, partition: part, reason, failed: st.failed, records });
    }
    return out;
  }

  async readCompleteGroups(opts: ReadGroupsOptions): Promise<CompleteGroup[]> {
    const o = checkReadOptions(opts);
    if (this.layout.shards === 1) {
      const sc = this.consumer(o.partition, 0);
      const entries: StreamEntry[] = await sc.autoclaim(o.consumer, this.visibilityMs, o.max, 8);
      if (entries.length < o.max) {
        entries.push(...(await sc.read(o.consumer, o.max - entries.length, entries.length === 0 ? o.block_ms : 0)));
      }
      return deliverGroups(recordsOfRole(await this.materialise(o.partition, entries.map((entry) => ({ shard: 0, entry }))), o.agent_role), o.deliver);
    }
    return deliverGroups(recordsOfRole(await this.materialise(o.partition, await this.readShards(o.partition, o.consumer, o.max, o.block_ms)), o.agent_role), o.deliver);
  }

  /**
   * Entries of every shard for one read: what an earlier read left over,
   * then each shard's stale entries (XAUTOCLAIM), then new ones (XREADGROUP
   * without BLOCK), shard after shard from a rotating start, until `max`.
   * With nothing found and `blockMs` > 0, one blocking XREADGROUP per shard
   * runs at once (a cluster cannot read streams of several slots in one
   * command); entries beyond `max` from those are kept for this consumer's
   * next read (they are pending under its name meanwhile, so a consumer
   * that never reads again has them reclaimed after the visibility timeout).
   */
  private async readShards(part: Partition, consumer: string, max: number, blockMs: number): Promise<{ shard: number; entry: StreamEntry }[]> {
    const n = this.layout.shards;
    const spillKey = `${part}\u0000${consumer}`;
    const spilled = this.spill.get(spillKey) ?? [];
    const out = spilled.splice(0, max);
    if (spilled.length === 0) this.spill.delete(spillKey);
    const start = this.nextShard++ % n;
    const order = Array.from({ length: n }, (_, i) => (start + i) % n);
    for (const k of order) {
      if (out.length >= max) break;
      for (const entry of await this.consumer(part, k).autoclaim(consumer, this.visibilityMs, max - out.length, 8)) out.push({ shard: k, entry });
    }
    for (const k of order) {
      if (out.length >= max) break;
      for (const entry of await this.consumer(part, k).read(consumer, max - out.length, 0)) out.push({ shard: k, entry });
    }
    if (out.length > 0 || blockMs <= 0) return out;
    // The first shard that answers with entries ends the wait; what the still-blocked reads return later is kept for the next read.
    let done = false;
    const keep = (got: { shard: number; entry: StreamEntry }[]) => {
      if (got.length) this.spill.set(spillKey, [...(this.spill.get(spillKey) ?? []), ...got]);
    };
    const reads = order.map(async (k) => {
      const got = (await this.consumer(part, k).read(consumer, max, blockMs)).map((entry) => ({ shard: k, entry }));
      if (done) keep(got);
      return got;
    });
    const first = await new Promise<{ shard: number; entry: StreamEntry }[]>((resolve, reject) => {
      let left = reads.length;
      for (const r of reads) {
        r.then((got) => {
          left--;
          if (done) return;
          if (got.length > 0 || left === 0) {
            done = true;
            resolve(got);
          }
        }, (e) => {
          if (!done) {
            done = true;
            reject(e);
          }
        });
      }
    });
    return first;
  }

  async ack(deliveryIds: readonly string[], partition?: Partition): Promise<number> {
    const part = checkPartition(partition);
    if (deliveryIds.length === 0) return 0;
    try {
      if (this.layout.shards === 1) return await this.consumer(part, 0).ack(deliveryIds);
      const byShard = new Map<number, string[]>();
      for (const d of deliveryIds) {
        const m = SHARDED_DELIVERY_ID.exec(d);
        if (!m || Number(m[2]) >= this.layout.shards) throw new InputError("delivery_ids", `${JSON.stringify(d).slice(0, 60)} is not a delivery id of this ${this.layout.shards}-shard queue (expected <ms>-<seq>@<shard>, as readCompleteGroups returns)`);
        const k = Number(m[2]);
        byShard.set(k, [...(byShard.get(k) ?? []), m[1]!]);
      }
      const counts = await Promise.all([...byShard].map(([k, ids]) => this.consumer(part, k).ack(ids)));
      return counts.reduce((a, b) => a + b, 0);
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

  /**
   * One put-once write (PUT_LUA; `mode`: `l` last output, `m` more follow,
   * `f` markFailed). Puts stage the record and run the script in one
   * pipelined round trip (the record's bytes skip Lua: `bench/queue.ts`);
   * markFailed's small empty record goes through the script's arguments.
   */
  private async store(rec: RecordHead, encoded: EncodedRecord, mode: "l" | "m" | "f"): Promise<PutResult> {
    const fields = encodedFields(encoded);
    const keys = [...this.layout.groupKeys(rec.uid), this.layout.traj(rec.key)];
    const args = [rec.uid, rec.key, String(rec.session_id), String(rec.output_index), mode, rec.error === null ? "0" : "1"];
    try {
      const r = mode === "f" ? await this.script(PUT_LUA, keys, [...args, ...fields]) : await this.stagedPut(keys, args, this.layout.stage(rec.key, nonce()), fields);
      return { key: rec.key, stored: Number(r) > 0 };
    } catch (e) {
      throw sessionError(e, rec.uid, rec.session_id, rec.output_index, "put");
    }
  }

  /**
   * `HSET stage …`, `PEXPIRE stage 60000`, `EVALSHA PUT_LUA` in one pipeline.
   * Until one put of this queue has run the script, the pipeline carries
   * `EVAL PUT_LUA` instead (which also caches it in Redis), so the first put
   * is one round trip too; EVAL once more on NOSCRIPT (the script cache was
   * emptied under a running process; the stage is still there).
   */
  private async stagedPut(keys: string[], args: string[], stage: string, fields: string[]): Promise<RedisReply> {
    let sha = this.shas.get(PUT_LUA);
    if (!sha) this.shas.set(PUT_LUA, (sha = scriptSha(PUT_LUA)));
    const tail = [String(keys.length + 1), ...keys, stage, ...args];
    const run = this.putScriptLoaded ? ["EVALSHA", await sha, ...tail] : ["EVAL", PUT_LUA, ...tail];
    let out: (RedisReply | Error)[];
    try {
      out = await this.redis.pipeline([["HSET", stage, ...fields], ["PEXPIRE", stage, STAGE_TTL_MS], run]);
    } catch (e) {
      throw this.wrap(e, true);
    }
    const [hset, , evalReply] = out;
    if (hset instanceof Error) throw this.wrap(hset, true);
    // Any reply of the script itself (a CONFLICT too) means Redis holds it now.
    if (!(evalReply instanceof Error) || !errorMessage(evalReply).startsWith("NOSCRIPT")) this.putScriptLoaded = true;
    if (!(evalReply instanceof Error)) return evalReply ?? null;
    if (!errorMessage(evalReply).startsWith("NOSCRIPT")) throw this.wrap(evalReply, false);
    try {
      return await this.redis.exec(["EVAL", PUT_LUA, ...tail]);
    } catch (e) {
      throw this.wrap(e, false);
    }
  }

  private async materialise(part: Partition, read: { shard: number; entry: StreamEntry }[]): Promise<CompleteGroup[]> {
    const sharded = this.layout.shards > 1;
    const groups = read.map(({ shard, entry: e }) => {
      let keys: string[] = [];
      try {
        keys = e.fields?.keys ? (JSON.parse(e.fields.keys) as string[]) : [];
      } catch (cause) {
        throw new StoreError(`stream entry ${e.id} has a bad keys field`, { cause, retryable: false });
      }
      return { id: sharded ? `${e.id}@${shard}` : e.id, uid: e.fields?.uid ?? "", keys };
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

  /** The `trainers` group of a partition's stream shard (created again whenever Redis lost it). */
  private consumer(part: Partition, shard: number): StreamConsumer {
    const id = `${part}:${shard}`;
    let c = this.consumers.get(id);
    if (!c) {
      c = new StreamConsumer({ call: (cmd, b) => this.call(cmd, b), pipe: (cmds) => this.pipe(cmds) }, this.layout.stream(part, shard), this.group);
      this.consumers.set(id, c);
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
