import type { RedisArg, RedisReply } from "../store/redis-commander.ts";
import { parseEntries, type StreamConsumer, type StreamEntry } from "../store/stream-consumer.ts";
import type { JobKeys } from "./job-keys.ts";
import type { JobRedis } from "./job-redis.ts";
import type { ExpectedGroup, OversampleSettlement, QueuedOversampleState, StartedReserveRow } from "./job-types.ts";
import { ADMIT_LUA, COMMIT_LUA, FILTERED_LUA, RELEASE_LUA, RESERVE_LUA } from "./oversample-lua.ts";

/**
 * The cross-process state of over-sampled batches in the job queue (what
 * `JobQueue`'s over-sampling methods do; scripts in oversample-lua.ts):
 * sessions admitted to write, delivery slots reserved and committed,
 * filtered groups and the reserve rows started in their place, the
 * batch's `stopped` flag, its queued surplus removed, and its settlement.
 * Keys under `{p}jobs:batch:{id}` ({@link JobKeys}).
 * @throws StoreError (503, retryable) for Redis failures.
 */
export class OversampleJobs {
  constructor(
    private readonly r: JobRedis,
    private readonly keys: JobKeys,
    private readonly consumers: StreamConsumer,
    /** The workers' consumer group. */
    private readonly group: string,
    /** Seconds the per-batch keys are kept, as a Redis argument. */
    private readonly ttl: string,
  ) {}

  /**
   * Records that `keys`' sessions were stopped as surplus of an over-sampled
   * batch (nothing stored for them): events `key`, `surplus` (`running`: it
   * was inside its loop; `queued`: never started) on the batch's done
   * stream, counted by followers as cancelled or carried.
   */
  async surplus(batchId: string, keys: readonly string[], running: boolean): Promise<void> {
    if (!keys.length) return;
    const cmds: RedisArg[][] = keys.map((k) => ["XADD", this.keys.doneKey(batchId), "*", "key", k, "surplus", running ? "running" : "queued"]);
    for (let i = 0; i < cmds.length; i += 500) await this.r.pipe([...cmds.slice(i, i + 500), ["EXPIRE", this.keys.doneKey(batchId), this.ttl]]);
  }

  /**
   * Over-sampled batches: admits a finished session's write ({@link ADMIT_LUA}):
   * `write`, `last` (it completes its group), `surplus` or `cancelled`.
   */
  async admitSession(batchId: string, uid: string, sessionId: number, n: number): Promise<"write" | "last" | "surplus" | "cancelled"> {
    return String(await this.r.eval(ADMIT_LUA, [this.keys.batchKey(batchId), this.keys.admittedKey(batchId, uid)], [String(sessionId), String(n), this.ttl])) as "write" | "last" | "surplus" | "cancelled";
  }

  /** Whether `uid`'s session `sessionId` was admitted to write ({@link admitSession}) and whether the batch is stopped. */
  async admission(batchId: string, uid: string, sessionId: number): Promise<{ admitted: boolean; stopped: "cancel" | "carry" | null }> {
    const [stopped, member] = await this.r.pipe([["HGET", this.keys.batchKey(batchId), "stopped"], ["SISMEMBER", this.keys.admittedKey(batchId, uid), String(sessionId)]]);
    return { admitted: Number(member) === 1, stopped: stopped == null ? null : (String(stopped) as "cancel" | "carry") };
  }

  /** Reserves a delivery slot for the write completing `uid`'s group ({@link RESERVE_LUA}); false: none free (surplus). */
  async reserveDelivery(batchId: string, uid: string): Promise<boolean> {
    return Number(await this.r.eval(RESERVE_LUA, [this.keys.batchKey(batchId)], [uid])) === 1;
  }

  /** The write completing `uid`'s group is stored ({@link COMMIT_LUA}); true when this delivery reached the target and stopped the batch. */
  async commitDelivery(batchId: string, uid: string): Promise<boolean> {
    return Number(await this.r.eval(COMMIT_LUA, [this.keys.batchKey(batchId)], [uid])) === 2;
  }

  /** The write completing `uid`'s group failed: its slot is freed ({@link RELEASE_LUA}). */
  async releaseDelivery(batchId: string, uid: string): Promise<void> {
    await this.r.eval(RELEASE_LUA, [this.keys.batchKey(batchId)], [uid]);
  }

  /**
   * `uid`'s group was filtered: counts it and starts the next reserve row,
   * its jobs enqueued atomically ({@link FILTERED_LUA}). Returns the row
   * started (the same one for a repeated call), or null.
   */
  async groupFiltered(batchId: string, uid: string): Promise<StartedReserveRow | null> {
    await this.consumers.ensure();
    const r = await this.r.eval(FILTERED_LUA, [this.keys.batchKey(batchId), this.keys.reserveKey(batchId), this.keys.launchedKey(batchId), this.keys.reserveJobsKey(batchId), this.keys.stream], [uid, batchId, this.ttl]);
    if (typeof r !== "string" || r === "") return null;
    const e = JSON.parse(r) as { uid: string; x: string };
    return { uid: e.uid, group: JSON.parse(e.x) as ExpectedGroup };
  }

  /** The over-sampling figures of a batch as workers keep them, the reserve rows started (from index `from` of the launched list) and left. */
  async oversampleState(batchId: string, from = 0): Promise<QueuedOversampleState> {
    const [h, launched, left] = await this.r.pipe([
      ["HMGET", this.keys.batchKey(batchId), "os:delivered", "os:filtered", "os:replacements", "stopped"],
      ["LRANGE", this.keys.launchedKey(batchId), String(from), "-1"],
      ["LLEN", this.keys.reserveKey(batchId)],
    ]);
    const f = h as (string | null)[];
    return {
      delivered: Number(f[0] ?? 0),
      filtered: Number(f[1] ?? 0),
      replacements: Number(f[2] ?? 0),
      stopped: f[3] == null ? null : (String(f[3]) as "cancel" | "carry"),
      launched: (launched as string[]).map(String),
      reserve: Number(left),
    };
  }

  /**
   * Seeds an over-sampled batch's state before its jobs run: sessions
   * already finished (a re-posted uid's, handed back) admitted, groups
   * already complete counted delivered or filtered (as BatchRun does
   * inline), and `stopped` set when they alone reach the target.
   */
  async seedOversample(batchId: string, seed: { admitted: { uid: string; session_id: number }[]; delivered: string[]; filtered: string[]; mode: "cancel" | "carry"; target: number }): Promise<void> {
    const cmds: RedisArg[][] = seed.admitted.flatMap(({ uid, session_id }) => [["SADD", this.keys.admittedKey(batchId, uid), String(session_id)], ["EXPIRE", this.keys.admittedKey(batchId, uid), this.ttl]]);
    const fields = [...seed.delivered.map((u) => [`d:${u}`, "1"]), ...seed.filtered.map((u) => [`f:${u}`, "1"])].flat();
    if (fields.length) cmds.push(["HSET", this.keys.batchKey(batchId), ...fields, "os:delivered", String(seed.delivered.length), "os:filtered", String(seed.filtered.length)]);
    if (seed.delivered.length >= seed.target) cmds.push(["HSET", this.keys.batchKey(batchId), "stopped", seed.mode]);
    for (let i = 0; i < cmds.length; i += 500) await this.r.pipe(cmds.slice(i, i + 500));
  }

  /**
   * Removes the jobs of a stopped over-sampled batch that no worker holds
   * (waiting in the stream, not in the consumer group's pending list: XDEL,
   * never claimed then) and records them as surplus (`queued`); running ones are stopped by their
   * workers, which poll the batch's `stopped` flag. Returns the keys removed.
   * A job claimed meanwhile is dropped by its worker (it sees the flag); a
   * key reported twice is counted once by followers.
   */
  async stopQueued(batchId: string): Promise<string[]> {
    const waiting: StreamEntry[] = [];
    let start = "-";
    for (;;) {
      const entries = parseEntries(await this.r.call(["XRANGE", this.keys.stream, start, "+", "COUNT", "500"]));
      for (const e of entries) if (e.fields?.batch === batchId) waiting.push(e);
      if (entries.length < 500) break;
      start = `(${entries[entries.length - 1]!.id}`;
    }
    if (!waiting.length) return [];
    const held = new Set<string>();
    start = "-";
    for (;;) {
      const r = (await this.consumers.withGroup(() => this.r.call(["XPENDING", this.keys.stream, this.group, start, "+", "500"]))) as RedisReply[];
      for (const p of r) held.add(String((p as RedisReply[])[0]));
      if (r.length < 500) break;
      start = `(${String((r[r.length - 1] as RedisReply[])[0])}`;
    }
    const free = waiting.filter((e) => !held.has(e.id));
    // Only entries this call deleted are reported: one acknowledged meanwhile (its job finished) is not surplus.
    const keys: string[] = [];
    for (let i = 0; i < free.length; i += 500) {
      const chunk = free.slice(i, i + 500);
      const r = await this.r.pipe(chunk.map((e) => ["XDEL", this.keys.stream, e.id]));
      chunk.forEach((e, j) => Number(r[j]) === 1 && e.fields?.key && keys.push(e.fields.key));
    }
    await this.surplus(batchId, keys, false);
    return keys;
  }

  /**
   * Stores the settlement of an over-sampled batch once (`os:settled`,
   * HSETNX) and returns the one stored: two API processes following the
   * batch report the same figures.
   */
  async settleOversample(batchId: string, s: OversampleSettlement): Promise<OversampleSettlement> {
    const [, got] = await this.r.pipe([["HSETNX", this.keys.batchKey(batchId), "os:settled", JSON.stringify(s)], ["HGET", this.keys.batchKey(batchId), "os:settled"]]);
    return typeof got === "string" ? (JSON.parse(got) as OversampleSettlement) : s;
  }

  /** The stored settlement of an over-sampled batch, or null while it is not settled. */
  async oversampleSettlement(batchId: string): Promise<OversampleSettlement | null> {
    const got = await this.r.call(["HGET", this.keys.batchKey(batchId), "os:settled"]);
    return typeof got === "string" ? (JSON.parse(got) as OversampleSettlement) : null;
  }

  /** Of `batchIds`, the stopped ones (over-sampled batches that reached their target) and how: one pipelined HGET each. */
  async stoppedBatches(batchIds: readonly string[]): Promise<Map<string, "cancel" | "carry">> {
    const ids = [...new Set(batchIds)];
    if (ids.length === 0) return new Map();
    const r = await this.r.pipe(ids.map((id) => ["HGET", this.keys.batchKey(id), "stopped"]));
    const out = new Map<string, "cancel" | "carry">();
    ids.forEach((id, i) => r[i] != null && out.set(id, String(r[i]) as "cancel" | "carry"));
    return out;
  }
}
