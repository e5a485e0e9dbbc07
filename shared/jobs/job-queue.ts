import { StoreError } from "../errors.ts";
import type { PlannedTrajectory } from "../rollout/batch.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../store/redis-commander.ts";
import { parseEntries, parseRead, StreamConsumer } from "../store/stream-consumer.ts";
import { JobKeys } from "./job-keys.ts";
import { JobRedis } from "./job-redis.ts";
import { StoreRunningCap } from "./running-cap.ts";
import { attachRows, toJob } from "./claimed-jobs.ts";
import type { BatchSpec, Job, JobQueueOptions, OversampleSettlement, PreparedBatch, QueuedOversampleState, QueueStats, StartedReserveRow } from "./job-types.ts";
import { OversampleJobs } from "./oversample-jobs.ts";
import { prepareBatch } from "./prepare-batch.ts";
import { queueStats } from "./queue-stats.ts";
export type { BatchSpec, ExpectedGroup, Job, JobQueueOptions, OversampleSettlement, PreparedBatch, QueuedOversampleState, QueueStats, StartedReserveRow } from "./job-types.ts";
export { batchIndexMember } from "./job-keys.ts";
export { storeError } from "./job-redis.ts";

const DEFAULT_LEASE_MS = 30_000;

/**
 * Jobs (one per trajectory key) in a Redis stream read by a consumer group
 * (DESIGN §4.6; layout in docs/queue-layout.md):
 * - `{p}jobs` STREAM — entries `batch`, `key`, `r` (`1`: the row is in the batch's rows hash), `rb` (its size) and
 *   `t` (the planned trajectory, JSON, its `row` null when `r`); consumer group `workers`. A job is
 *   XACKed and XDELed once its record is stored.
 * - `{p}jobs:batch:{id}` HASH — `spec` (a {@link BatchSpec}, JSON), `kn` and `k:{i}` (the keys, JSON
 *   arrays in `kn` chunks; batches written before chunking hold one `keys` field), `cancelled` (epoch ms,
 *   once the batch was cancelled: {@link JobQueue.cancelBatch}).
 * - `{p}jobs:batch:{id}:rows` HASH — field `{row_index}`: the row (JSON), once per batch, not per job.
 * - `{p}jobs:batch:{id}:done` STREAM — one entry `key` per stored record
 *   (at least once; readers dedupe), from which any API process derives progress.
 * - `{p}jobs:wake` STREAM — one entry `key` per tool result an API process
 *   committed to a waiting session; read by every worker ({@link wake}).
 *
 * Claiming is `XAUTOCLAIM` of jobs idle longer than the lease (a dead
 * worker's), then `XREADGROUP >`. A running job's idle time is reset by
 * {@link heartbeat} (`XCLAIM … JUSTID` with min-idle lease/2, so a job another
 * worker has reclaimed and is heart-beating is never taken back).
 * Runtime-free: any {@link RedisCommander} (TCP or Upstash REST). The key
 * layout is {@link JobKeys} (job-keys.ts), the over-sampling state
 * {@link OversampleJobs} (oversample-jobs.ts), the types job-types.ts.
 * @throws StoreError (503, retryable) for Redis failures, "queue full" and Redis OOM.
 * @see https://redis.io/docs/latest/commands/xautoclaim/
 */
export class JobQueue {
  readonly prefix: string;
  readonly group: string;
  readonly leaseMs: number;
  /**
   * Sorted set of the workers that claimed or heart-beat lately (`{prefix}jobs:workers`, member =
   * consumer name, score = the worker's clock in epoch ms at its last claim or heartbeat): how
   * {@link stats} tells live workers from dead ones (XINFO's idle time is not reset by an empty read on Redis 7.0).
   */
  readonly workersKey: string;
  /**
   * The lease (milliseconds) the workers claim with (`{prefix}jobs:lease`, a string set by every
   * claim; the last claimer's): how {@link stats} tells a stranded job from a running one in a
   * process (`serve`) that does not know the workers' `--lease`.
   */
  readonly leaseKey: string;
  readonly stream: string;
  /** The wake stream (`{p}jobs:wake`): one entry `key` per tool result delivered to a waiting session. */
  readonly wakeStream: string;
  private readonly opts: JobQueueOptions;
  /** The key layout under {@link prefix}. */
  private readonly keys: JobKeys;
  private readonly r: JobRedis;
  private readonly os: OversampleJobs;
  /** Seconds the per-batch keys are kept (`batchTtlSeconds`), as a Redis argument. */
  private readonly ttl: string;
  /** The `workers` group on {@link stream}: created again whenever Redis lost it (E2). */
  readonly consumers: StreamConsumer;

  constructor(
    private readonly redis: RedisCommander,
    opts: JobQueueOptions = {},
  ) {
    this.opts = opts;
    this.prefix = opts.prefix ?? "edgeloop:";
    this.group = opts.group ?? "workers";
    this.leaseMs = opts.leaseMs ?? DEFAULT_LEASE_MS;
    this.keys = new JobKeys(this.prefix);
    this.stream = this.keys.stream;
    this.wakeStream = this.keys.wakeStream;
    this.workersKey = this.keys.workersKey;
    this.leaseKey = this.keys.leaseKey;
    this.ttl = String(opts.batchTtlSeconds ?? 7 * 24 * 3600);
    this.r = new JobRedis(redis);
    this.consumers = new StreamConsumer({ call: (c, b) => this.call(c, b), pipe: (c) => this.pipe(c) }, this.stream, this.group);
    this.os = new OversampleJobs(this.r, this.keys, this.consumers, this.group, this.ttl);
  }

  /**
   * The store-wide running cap over this queue's store and prefix: `cap`
   * sessions at once across every worker, each worker's entry living as long
   * as a job lease ({@link StoreRunningCap}).
   * @throws RangeError for a cap below 1.
   */
  runningCap(cap: number): StoreRunningCap {
    return new StoreRunningCap(this.redis, { prefix: this.prefix, cap, ttlMs: this.leaseMs });
  }

  /** The hash of a batch's spec and keys ({@link JobKeys.batchKey}). */
  batchKey(batchId: string): string {
    return this.keys.batchKey(batchId);
  }

  /** The batch index (ZSET; {@link JobKeys.batchesKey}). */
  batchesKey(): string {
    return this.keys.batchesKey();
  }

  /** The stream of a batch's completion events ({@link JobKeys.doneKey}). */
  doneKey(batchId: string): string {
    return this.keys.doneKey(batchId);
  }

  /** The hash of a batch's rows ({@link JobKeys.rowsKey}). */
  rowsKey(batchId: string): string {
    return this.keys.rowsKey(batchId);
  }

  /** Over-sampled batches: the reserve rows' uids not started yet (LIST; {@link JobKeys.reserveKey}). */
  reserveKey(batchId: string): string {
    return this.keys.reserveKey(batchId);
  }

  /** Over-sampled batches: the reserve uids started, in launch order (LIST; {@link JobKeys.launchedKey}). */
  launchedKey(batchId: string): string {
    return this.keys.launchedKey(batchId);
  }

  /** Over-sampled batches: per reserve uid, its group and job entries (HASH; {@link JobKeys.reserveJobsKey}). */
  reserveJobsKey(batchId: string): string {
    return this.keys.reserveJobsKey(batchId);
  }

  /** Over-sampled batches: the session ids of `uid`'s group admitted to write (SET; {@link JobKeys.admittedKey}). */
  admittedKey(batchId: string, uid: string): string {
    return this.keys.admittedKey(batchId, uid);
  }

  /**
   * Builds every write of a batch and checks each against the store's
   * request limit (`RedisCommander.maxRequestBytes`) before anything is
   * written: each row once (`{p}jobs:batch:{id}:rows`, not copied into its
   * `n` jobs), the spec and the keys (in chunks), and one small job entry per
   * trajectory (the row by reference: entry field `r`).
   * @throws StoreError (413, code `request_too_large`, field `rows[i]` for a row) when one write alone is
   *   over the limit: the batch is refused and nothing has been written.
   */
  prepare(spec: BatchSpec, keys: readonly string[], jobs: readonly PlannedTrajectory[], opts: { reserve?: readonly PlannedTrajectory[]; fingerprints?: ReadonlyMap<string, string> } = {}): PreparedBatch {
    return prepareBatch(this.keys, { max: this.redis.maxRequestBytes ?? Infinity, ttl: this.ttl }, spec, keys, jobs, opts);
  }

  /**
   * Lists stored batches newest first (`GET /v1/rollouts` in queue mode): up
   * to `limit` ids after `cursor` (a member of {@link batchesKey}, as the
   * previous page's `next_cursor` gave it; absent: from the newest), their
   * index members, and the
   * cursor of the next page (null on the last). Index entries whose batch
   * hash is gone (expired, collected by `edgeloop gc`) are dropped on the way.
   * @see https://redis.io/docs/latest/commands/zrevrangebylex/
   */
  async listBatches(opts: { limit: number; cursor?: string | null }): Promise<{ batch_ids: string[]; members: string[]; next_cursor: string | null }> {
    const out: string[] = [];
    const kept: string[] = [];
    let from = opts.cursor ? `(${opts.cursor}` : "+";
    let last: string | null = null;
    for (;;) {
      const want = opts.limit - out.length;
      const members = (await this.call(["ZREVRANGEBYLEX", this.batchesKey(), from, "-", "LIMIT", "0", String(want)])) as string[];
      if (!members.length) return { batch_ids: out, members: kept, next_cursor: null };
      const ids = members.map((m) => m.slice(m.indexOf(":") + 1));
      const exists = await this.pipe(ids.map((id) => ["EXISTS", this.batchKey(id)]));
      const gone: string[] = [];
      members.forEach((m, i) => (Number(exists[i]) ? (out.push(ids[i]!), kept.push(m)) : gone.push(m)));
      if (gone.length) await this.call(["ZREM", this.batchesKey(), ...gone]);
      last = members.at(-1)!;
      from = `(${last}`;
      if (members.length < want) return { batch_ids: out, members: kept, next_cursor: null };
      if (out.length >= opts.limit) return { batch_ids: out, members: kept, next_cursor: last };
    }
  }

  /**
   * Whether each batch's stored hash (`{p}jobs:batch:{id}`) still exists: it
   * is gone once `edgeloop gc` collected the batch or its retention expired
   * (or Redis lost it). One pipelined EXISTS per id.
   */
  async batchesExist(ids: readonly string[]): Promise<boolean[]> {
    if (!ids.length) return [];
    const exists = await this.pipe(ids.map((id) => ["EXISTS", this.batchKey(id)]));
    return exists.map((x) => Number(x) === 1);
  }

  /**
   * Stores the batch's rows, spec and keys, then enqueues one job per
   * trajectory (XADD; pipelines split by bytes by the commander, and at most
   * 500 commands each).
   * @throws StoreError 413 (see {@link prepare}; nothing written); 503 when Redis refuses (e.g. OOM).
   */
  async submit(spec: BatchSpec, keys: readonly string[], jobs: readonly PlannedTrajectory[]): Promise<void> {
    await this.submitPrepared(this.prepare(spec, keys, jobs));
  }

  /** Writes a {@link prepare}d batch: rows (and the reserve) first, then spec and keys, then the jobs (a job never refers to a row not yet stored). */
  async submitPrepared(b: PreparedBatch): Promise<void> {
    await this.consumers.ensure();
    for (const cmds of [b.rows, b.reserve, b.batch, b.entries]) {
      for (let i = 0; i < cmds.length; i += 500) await this.pipe(cmds.slice(i, i + 500));
    }
  }

  /** A batch's spec and keys, or null when unknown (never submitted, or expired). */
  async batch(batchId: string): Promise<{ spec: BatchSpec; keys: string[] } | null> {
    const [spec, kn, old] = (await this.call(["HMGET", this.batchKey(batchId), "spec", "kn", "keys"])) as (string | null)[];
    if (spec == null) return null;
    if (kn == null) return { spec: JSON.parse(spec) as BatchSpec, keys: JSON.parse(old ?? "[]") as string[] };
    const n = Number(kn);
    const keys: string[] = [];
    for (let i = 0; i < n; i += 16) {
      const got = (await this.call(["HMGET", this.batchKey(batchId), ...Array.from({ length: Math.min(16, n - i) }, (_, j) => `k:${i + j}`)])) as (string | null)[];
      for (const c of got) keys.push(...(JSON.parse(c ?? "[]") as string[]));
    }
    return { spec: JSON.parse(spec) as BatchSpec, keys };
  }

  /**
   * Claims up to `max` jobs for `consumer`: first jobs idle longer than the
   * lease (a dead worker's; their delivery counts come from XPENDING), then
   * new ones, blocking up to `blockMs` when there are none.
   */
  async claim(consumer: string, max: number, blockMs = 0): Promise<Job[]> {
    await this.pipe([["ZADD", this.workersKey, String(Date.now()), consumer], ["SET", this.leaseKey, String(this.leaseMs)]]);
    const out: Job[] = [];
    const reclaimed = await this.consumers.autoclaim(consumer, this.leaseMs, max);
    const counts = await this.consumers.deliveries(reclaimed.map((e) => e.id));
    reclaimed.forEach((e, i) => {
      const job = toJob(e, counts[i] ?? 2);
      if (job) out.push(job);
    });
    if (out.length < max) {
      const block = out.length === 0 && blockMs > 0 ? blockMs : 0;
      for (const e of await this.consumers.read(consumer, max - out.length, block)) {
        const job = toJob(e, 1);
        if (job) out.push(job);
      }
    }
    await attachRows(this.r, this.keys, this.redis.maxRequestBytes, out);
    return out;
  }

  /**
   * Resets the idle time of jobs `consumer` is running (XCLAIM min-idle
   * lease/2 JUSTID), so they are not reclaimed while it is alive; a job
   * another worker reclaimed (and heart-beats) is left alone.
   */
  async heartbeat(consumer: string, ids: readonly string[]): Promise<void> {
    await this.call(["ZADD", this.workersKey, String(Date.now()), consumer]);
    await this.consumers.touch(consumer, Math.floor(this.leaseMs / 2), ids);
  }

  /**
   * Records that `key`'s session finished and its records are stored (an
   * event on the batch's done stream); `reused`: another batch had stored
   * them first (field `reused 1`), so followers do not count them again.
   */
  async completed(batchId: string, key: string, reused = false): Promise<void> {
    await this.pipe([
      ["XADD", this.doneKey(batchId), "*", "key", key, ...(reused ? ["reused", "1"] : [])],
      ["EXPIRE", this.doneKey(batchId), this.ttl],
    ]);
  }

  /**
   * Announces that a tool result for `key`'s session was committed (the API
   * process, queue mode): the worker running that session continues it at
   * once instead of at the tool's deadline. An entry `key` on the wake
   * stream, capped at about 10 000 entries (`MAXLEN ~`); every worker reads
   * it ({@link wakes}) and acts only on keys it runs.
   */
  async wake(key: string): Promise<void> {
    await this.call(["XADD", this.wakeStream, "MAXLEN", "~", "10000", "*", "key", key]);
  }

  /** The id of the newest wake entry (`0-0` when none): where a worker starts reading. */
  async lastWake(): Promise<string> {
    const r = await this.call(["XREVRANGE", this.wakeStream, "+", "-", "COUNT", "1"]);
    return parseEntries(r)[0]?.id ?? "0-0";
  }

  /** Wake entries after stream id `after` (exclusive), waiting up to `blockMs` for one (XREAD BLOCK; 0 = don't wait). */
  async wakes(after: string, blockMs = 0, count = 500): Promise<{ id: string; key: string }[]> {
    const cmd: RedisArg[] = ["XREAD", "COUNT", String(count)];
    if (blockMs > 0) cmd.push("BLOCK", String(blockMs));
    cmd.push("STREAMS", this.wakeStream, after);
    return parseRead(await this.call(cmd, blockMs > 0)).map((e) => ({ id: e.id, key: e.fields?.key ?? "" }));
  }

  /** Acknowledges and deletes finished jobs; returns how many were pending. */
  async ack(ids: readonly string[]): Promise<number> {
    if (ids.length === 0) return 0;
    // One round trip; XACK on a stream or group that is gone answers 0 (nothing was pending), never NOGROUP.
    const [acked] = await this.pipe([
      ["XACK", this.stream, this.group, ...ids],
      ["XDEL", this.stream, ...ids],
    ]);
    return Number(acked);
  }

  /** Completion events of a batch after stream id `after` (exclusive; `0-0` for all), at most `count`; `reused` as {@link completed} wrote it. */
  async completions(batchId: string, after: string, count = 1000): Promise<{ id: string; key: string; reused: boolean; surplus?: { running: boolean } }[]> {
    const r = await this.call(["XRANGE", this.doneKey(batchId), after === "0-0" ? "-" : `(${after}`, "+", "COUNT", String(count)]);
    return parseEntries(r).map((e) => ({
      id: e.id,
      key: e.fields?.key ?? "",
      reused: e.fields?.reused === "1",
      ...(e.fields?.surplus !== undefined ? { surplus: { running: e.fields.surplus === "running" } } : {}),
    }));
  }

  /**
   * Records that `keys`' sessions were stopped as surplus of an over-sampled
   * batch (nothing stored for them): events `key`, `surplus` on the batch's
   * done stream ({@link OversampleJobs.surplus}).
   */
  surplus(batchId: string, keys: readonly string[], running: boolean): Promise<void> {
    return this.os.surplus(batchId, keys, running);
  }

  /** Over-sampled batches: admits a finished session's write: `write`, `last` (it completes its group), `surplus` or `cancelled` ({@link OversampleJobs.admitSession}). */
  admitSession(batchId: string, uid: string, sessionId: number, n: number): Promise<"write" | "last" | "surplus" | "cancelled"> {
    return this.os.admitSession(batchId, uid, sessionId, n);
  }

  /** Whether `uid`'s session `sessionId` was admitted to write ({@link admitSession}) and whether the batch is stopped. */
  admission(batchId: string, uid: string, sessionId: number): Promise<{ admitted: boolean; stopped: "cancel" | "carry" | null }> {
    return this.os.admission(batchId, uid, sessionId);
  }

  /** Reserves a delivery slot for the write completing `uid`'s group; false: none free (surplus) ({@link OversampleJobs.reserveDelivery}). */
  reserveDelivery(batchId: string, uid: string): Promise<boolean> {
    return this.os.reserveDelivery(batchId, uid);
  }

  /** The write completing `uid`'s group is stored; true when this delivery reached the target and stopped the batch ({@link OversampleJobs.commitDelivery}). */
  commitDelivery(batchId: string, uid: string): Promise<boolean> {
    return this.os.commitDelivery(batchId, uid);
  }

  /** The write completing `uid`'s group failed: its slot is freed ({@link OversampleJobs.releaseDelivery}). */
  releaseDelivery(batchId: string, uid: string): Promise<void> {
    return this.os.releaseDelivery(batchId, uid);
  }

  /** `uid`'s group was filtered: counts it and starts the next reserve row; returns the row started (the same one for a repeated call), or null ({@link OversampleJobs.groupFiltered}). */
  groupFiltered(batchId: string, uid: string): Promise<StartedReserveRow | null> {
    return this.os.groupFiltered(batchId, uid);
  }

  /** The over-sampling figures of a batch as workers keep them, the reserve rows started (from index `from` of the launched list) and left. */
  oversampleState(batchId: string, from = 0): Promise<QueuedOversampleState> {
    return this.os.oversampleState(batchId, from);
  }

  /** Seeds an over-sampled batch's state before its jobs run (handed-back sessions, complete groups, `stopped`; {@link OversampleJobs.seedOversample}). */
  seedOversample(batchId: string, seed: { admitted: { uid: string; session_id: number }[]; delivered: string[]; filtered: string[]; mode: "cancel" | "carry"; target: number }): Promise<void> {
    return this.os.seedOversample(batchId, seed);
  }

  /** Removes the jobs of a stopped over-sampled batch that no worker holds and records them as surplus; returns the keys removed ({@link OversampleJobs.stopQueued}). */
  stopQueued(batchId: string): Promise<string[]> {
    return this.os.stopQueued(batchId);
  }

  /** Stores the settlement of an over-sampled batch once and returns the one stored ({@link OversampleJobs.settleOversample}). */
  settleOversample(batchId: string, s: OversampleSettlement): Promise<OversampleSettlement> {
    return this.os.settleOversample(batchId, s);
  }

  /** The stored settlement of an over-sampled batch, or null while it is not settled. */
  oversampleSettlement(batchId: string): Promise<OversampleSettlement | null> {
    return this.os.oversampleSettlement(batchId);
  }

  /** Of `batchIds`, the stopped ones (over-sampled batches that reached their target) and how: one pipelined HGET each. */
  stoppedBatches(batchIds: readonly string[]): Promise<Map<string, "cancel" | "carry">> {
    return this.os.stoppedBatches(batchIds);
  }

  /**
   * Depth, in flight, stranded, the oldest unacknowledged job's age and the
   * workers known and busy, pruning dead workers on the way: see
   * {@link queueStats} (queue-stats.ts).
   */
  stats(): Promise<QueueStats> {
    return queueStats(this.r, this.keys, this.consumers, this.group, this.leaseMs);
  }

  /**
   * Cancels a batch in the queue (`DELETE /v1/rollouts/{id}`): flags its
   * hash (`cancelled` = epoch ms; workers poll it, {@link cancelledBatches},
   * and abort the batch's running jobs) and removes every job of the batch
   * from the job stream (XACK + XDEL: waiting ones are never claimed; running
   * ones are no longer pending anywhere). O(stream length).
   * @returns whether the batch was stored, and how many jobs were removed (waiting or running)
   */
  async cancelBatch(batchId: string): Promise<{ found: boolean; removed: number }> {
    const [set] = await this.pipe([["HSET", this.batchKey(batchId), "cancelled", String(Date.now())]]);
    // HSET on a missing hash creates it with one field: a batch never stored is not one to cancel.
    if (Number(set) === 1 && !(await this.call(["HEXISTS", this.batchKey(batchId), "spec"]))) {
      await this.call(["DEL", this.batchKey(batchId)]);
      return { found: false, removed: 0 };
    }
    const ids: string[] = [];
    let start = "-";
    for (;;) {
      const entries = parseEntries(await this.call(["XRANGE", this.stream, start, "+", "COUNT", "500"]));
      for (const e of entries) if (e.fields?.batch === batchId) ids.push(e.id);
      if (entries.length < 500) break;
      start = `(${entries[entries.length - 1]!.id}`;
    }
    for (let i = 0; i < ids.length; i += 500) await this.ack(ids.slice(i, i + 500));
    return { found: true, removed: ids.length };
  }

  /** Of `batchIds`, those cancelled ({@link cancelBatch}); one pipelined HEXISTS each. */
  async cancelledBatches(batchIds: readonly string[]): Promise<Set<string>> {
    const ids = [...new Set(batchIds)];
    if (ids.length === 0) return new Set();
    const r = await this.pipe(ids.map((id) => ["HEXISTS", this.batchKey(id), "cancelled"]));
    return new Set(ids.filter((_, i) => Number(r[i]) === 1));
  }

  /** Deletes the durable-session hashes (`{p}session:{key}`) of `keys`: a cancelled job's session leaves nothing behind. */
  async dropSessions(keys: readonly string[]): Promise<void> {
    if (keys.length) await this.call(["DEL", ...keys.map((k) => this.keys.sessionKey(k))]);
  }

  /** Whether a batch's hash (`{p}jobs:batch:{id}`) is still stored. */
  async batchStored(batchId: string): Promise<boolean> {
    return Number(await this.call(["EXISTS", this.batchKey(batchId)])) === 1;
  }

  /**
   * Keys of `batchId` with a job still in the job stream (waiting, or
   * claimed and not yet acknowledged): XRANGE over the whole stream in
   * pages of `page` entries. O(stream length): for lost-work detection, not
   * for every poll.
   */
  async queuedKeys(batchId: string, page = 500): Promise<Set<string>> {
    const out = new Set<string>();
    let start = "-";
    for (;;) {
      const entries = parseEntries(await this.call(["XRANGE", this.stream, start, "+", "COUNT", String(page)]));
      for (const e of entries) if (e.fields?.batch === batchId && e.fields.key) out.add(e.fields.key);
      if (entries.length < page) return out;
      start = `(${entries[entries.length - 1]!.id}`;
    }
  }

  /**
   * The committed step of each of `keys` that has a durable-session hash
   * (`{p}session:{key}` fields `step` and `n`, as `"{step}:{n}"`; keys
   * without a hash are absent from the map): lost-work detection compares
   * two reads to tell a session someone still runs from one left behind.
   */
  async sessionSteps(keys: readonly string[]): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    for (let i = 0; i < keys.length; i += 1000) {
      const chunk = keys.slice(i, i + 1000);
      const r = await this.pipe(chunk.map((k) => ["HMGET", this.keys.sessionKey(k), "step", "n"]));
      r.forEach((x, j) => {
        const [step, n] = (x as (string | null)[] | null) ?? [];
        if (step != null || n != null) out.set(chunk[j]!, `${step ?? ""}:${n ?? ""}`);
      });
    }
    return out;
  }

  /**
   * How many of `keys` have a durable-session hash (`{p}session:{key}`): the
   * trajectories a worker has started (or finished, until their hash expires).
   */
  async sessionsStarted(keys: readonly string[]): Promise<number> {
    let n = 0;
    for (let i = 0; i < keys.length; i += 1000) {
      const r = await this.pipe(keys.slice(i, i + 1000).map((k) => ["EXISTS", this.keys.sessionKey(k)]));
      for (const x of r) n += Number(x);
    }
    return n;
  }

  /**
   * Refuses when `n` more jobs would exceed `maxPending`; nothing is
   * written. Called before a batch's other writes so a refused batch leaves
   * no trace.
   * @throws StoreError 413 (code `batch_too_large`, field `rows`, not retryable) when `n` alone exceeds
   *   `maxPending` (it would never fit; the message states the limit); 503 (code `queue_full`, retry
   *   later) when the jobs already waiting leave too little room.
   */
  async reserve(n: number): Promise<void> {
    if (this.opts.maxPending === undefined) return;
    if (n > this.opts.maxPending) {
      // Could never fit, however long the client waits: not a 503 to retry.
      throw new StoreError(`batch too large for the job queue: it has ${n} trajectories to run and serve accepts at most ${this.opts.maxPending} pending jobs (--max-pending ${this.opts.maxPending}); split the batch or raise --max-pending`, {
        status: 413,
        retryable: false,
        code: "batch_too_large",
        field: "rows",
      });
    }
    const len = Number(await this.call(["XLEN", this.stream]));
    if (len + n > this.opts.maxPending) {
      throw new StoreError(`job queue full: ${len} jobs pending, ${n} more would exceed max pending ${this.opts.maxPending}`, { code: "queue_full" });
    }
  }

  /**
   * Jobs still to do that `consumer` does not hold: the stream's length (acknowledged and cancelled
   * jobs are deleted, so XLEN is every job waiting, running or held by a dead worker) minus the
   * entries pending for `consumer` itself. A worker with nothing running idle-exits only at 0
   * ({@link JobWorker}): a job held by another worker may be reclaimed by this one once that
   * worker stops heart-beating it (N1: the survivor of a SIGKILL waits for the lease, then reclaims).
   * @throws StoreError (503) when Redis fails.
   */
  async outstanding(consumer: string): Promise<number> {
    const [len, summary] = await this.consumers.withGroup(() => this.pipe([["XLEN", this.stream], ["XPENDING", this.stream, this.group]]));
    // XPENDING summary: [count, first id, last id, [[consumer, count], …] | null]. Own entries pending while
    // nothing runs here are abandoned jobs (their session taken over elsewhere): not work for this worker.
    const per = ((summary as RedisReply[] | null)?.[3] ?? []) as RedisReply[];
    const own = per.map((c) => c as RedisReply[]).find((c) => String(c[0]) === consumer)?.[1];
    return Math.max(0, Number(len) - Number(own ?? 0));
  }

  /** Removes a consumer that has exited (its pending jobs, if any, stay for reclaim). */
  async forgetConsumer(consumer: string): Promise<void> {
    await this.call(["ZREM", this.workersKey, consumer]);
    await this.consumers.forget(consumer);
  }

  private call(cmd: RedisArg[], blocking = false): Promise<RedisReply> {
    return this.r.call(cmd, blocking);
  }

  private pipe(cmds: RedisArg[][]): Promise<RedisReply[]> {
    return this.r.pipe(cmds);
  }
}
