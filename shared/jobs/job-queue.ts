import { keyPart } from "../store/key-encoding.ts";
import { EdgeloopError, StoreError } from "../errors.ts";
import type { OversamplePlan, PlannedTrajectory } from "../rollout/batch.ts";
import type { ModelId, RolloutConfig } from "../schema/index.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../store/redis-commander.ts";
import { replyToFields } from "../store/redis-transfer-queue.ts";
import { parseEntries, parseRead, StreamConsumer, type StreamEntry } from "../store/stream-consumer.ts";
import { checkCommand, commandBytes } from "../store/request-size.ts";
import { ADMIT_LUA, COMMIT_LUA, FILTERED_LUA, RELEASE_LUA, RESERVE_LUA } from "./oversample-lua.ts";

/** What every job of a batch shares; stored once per batch (`{p}jobs:batch:{id}`, field `spec`). */
export interface BatchSpec {
  batch_id: string;
  validate: boolean;
  global_steps: number;
  model_version: string | number | null;
  /** The batch's effective rollout config (per-batch overrides applied). */
  rollout: RolloutConfig;
  /** Trajectories in the batch (jobs plus rows that failed validation). */
  total: number;
  /** Epoch milliseconds of the submit. */
  started_at: number;
  /** Over-sampling and dynamic sampling of the batch (absent or null: a plain batch). */
  oversample?: OversamplePlan | null;
  /**
   * The model of the submitting process (`modelIdOf` its tokenizer): a
   * worker whose model has another fingerprint fails the batch's jobs
   * instead of running them. Absent in batches of older versions (not checked).
   */
  model?: ModelId;
}

/** A group a worker registers (`TransferQueue.expectGroup`) before running a job of a reserve row (job entry field `x`). */
export interface ExpectedGroup {
  n: number;
  part: "train" | "val";
  /** The prompt group's fingerprint, when computed. */
  fp?: string;
}

/** A reserve row started in place of a filtered group ({@link JobQueue.groupFiltered}): its uid and group. */
export interface StartedReserveRow {
  uid: string;
  group: ExpectedGroup;
}

/** The cross-process state of an over-sampled batch, from its batch hash and launched list ({@link JobQueue.oversampleState}). */
export interface QueuedOversampleState {
  delivered: number;
  filtered: number;
  replacements: number;
  /** How the surplus was stopped once the target was reached; null while not reached. */
  stopped: "cancel" | "carry" | null;
  /** Reserve uids started so far, in launch order. */
  launched: string[];
  /** Reserve rows not started. */
  reserve: number;
}

/** What settling an over-sampled batch decided (stored once per batch: {@link JobQueue.settleOversample}). */
export interface OversampleSettlement {
  groups_withdrawn: number;
  groups_carried: number;
  unused_groups: number;
  unused_sessions: number;
}

/** One claimed job: the stream entry id (ack it), the trajectory to run and how often it was delivered. */
export interface Job {
  id: string;
  batch_id: string;
  trajectory: PlannedTrajectory;
  /** Deliveries so far (1 for a fresh job; more after reclaims). */
  deliveries: number;
  /** The row is in the batch's rows hash, not yet read (internal to {@link JobQueue.claim}). */
  rowRef?: boolean;
  /** That row's size in bytes (internal). */
  rowBytes?: number;
  /** The job's row was not found in the batch's rows hash when claimed (expired, or the store lost its data). */
  rowLost?: boolean;
  /** A reserve row's job (over-sampled batches): its group, registered by the worker before it runs (entry field `x`). */
  expect?: ExpectedGroup;
}

/** A batch's writes, built and size-checked by {@link JobQueue.prepare}; nothing is written yet. */
export interface PreparedBatch {
  spec: BatchSpec;
  /** Jobs to enqueue. */
  jobs: number;
  rows: RedisArg[][];
  batch: RedisArg[][];
  entries: RedisArg[][];
  /** Over-sampled batches: the reserve rows' job entries (a hash) and their uids in row order (a list). */
  reserve: RedisArg[][];
}

/** `GET /v1/queue`: the autoscaler's signal. */
export interface QueueStats {
  mode: "queue" | "inline";
  /**
   * Jobs a worker can claim now: never claimed, plus {@link stranded} ones (queue mode:
   * `depth + in_flight` = XLEN, every job still to do).
   */
  depth: number;
  /** Jobs held by a worker that heart-beats them (running), not yet acknowledged. */
  in_flight: number;
  /**
   * Queue mode: of {@link depth}, jobs a worker claimed and stopped heart-beating (SIGKILLed, hung,
   * its host gone) for longer than the lease: the next claim of any worker reclaims them.
   */
  stranded?: number;
  /** Age in milliseconds of the oldest job not yet acknowledged (0 when none). */
  oldest_age_ms: number;
  /** Workers (consumers) seen by the consumer group, and how many hold jobs. */
  workers?: { known: number; busy: number };
}

/** Options of {@link JobQueue}. */
export interface JobQueueOptions {
  /** Key prefix (default `edgeloop:`), shared with the transfer queue and the session hashes. */
  prefix?: string;
  /** Consumer group of the workers (default `workers`). */
  group?: string;
  /**
   * Milliseconds a claimed job may go without a heartbeat before another
   * worker reclaims it (XAUTOCLAIM min-idle; default 30 000). Workers
   * heartbeat every lease/3.
   */
  leaseMs?: number;
  /** Refuse a batch (503) when the jobs not yet acknowledged would exceed this (default: no limit). */
  maxPending?: number;
  /** Seconds the per-batch hashes and done streams are kept (default 7 days). */
  batchTtlSeconds?: number;
}

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
 * Runtime-free: any {@link RedisCommander} (TCP or Upstash REST).
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
    this.stream = `${this.prefix}jobs`;
    this.wakeStream = `${this.prefix}jobs:wake`;
    this.workersKey = `${this.prefix}jobs:workers`;
    this.leaseKey = `${this.prefix}jobs:lease`;
    this.consumers = new StreamConsumer({ call: (c, b) => this.call(c, b), pipe: (c) => this.pipe(c) }, this.stream, this.group);
  }

  /** The hash of a batch's spec and keys. */
  batchKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}`;
  }

  /**
   * The batch index (ZSET, every score 0): one member `{started_at, 15 digits}:{batch_id}` per
   * submitted batch, so `ZREVRANGEBYLEX` lists batches newest first with a stable cursor (the last
   * member seen). Members of batches whose hash expired or was collected are skipped and removed.
   */
  batchesKey(): string {
    return `${this.prefix}jobs:batches`;
  }

  /** The stream of a batch's completion events. */
  doneKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:done`;
  }

  /** The hash of a batch's rows: field = the row's index in the request, value = the row (JSON); stored once per batch. */
  rowsKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:rows`;
  }

  /** Over-sampled batches: the reserve rows' uids not started yet, in row order (LIST). */
  reserveKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:reserve`;
  }

  /** Over-sampled batches: the reserve uids started in place of filtered groups, in launch order (LIST). */
  launchedKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:launched`;
  }

  /** Over-sampled batches: per reserve uid, its group and job entries (HASH, JSON values). */
  reserveJobsKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:reserve-jobs`;
  }

  /** Over-sampled batches: the session ids of `uid`'s group admitted to write (SET). */
  admittedKey(batchId: string, uid: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:w:${keyPart(uid, "uid")}`;
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
    const max = this.redis.maxRequestBytes ?? Infinity;
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    const rowsKey = this.rowsKey(spec.batch_id);
    const rows: RedisArg[][] = [];
    const rowBytes = new Map<number, number>();
    const reserveJobs = opts.reserve ?? [];
    for (const t of [...jobs, ...reserveJobs]) {
      if (!t.row || rowBytes.has(t.row_index)) continue;
      const json = JSON.stringify(t.row);
      rowBytes.set(t.row_index, json.length);
      const cmd = ["HSET", rowsKey, String(t.row_index), json];
      if (commandBytes(cmd, "json") > max * 0.95) {
        throw new StoreError(`rows[${t.row_index}] is ${commandBytes(cmd, "json")} bytes as stored; the store accepts requests of at most ${max} bytes (store.max_request_bytes): nothing was written`, {
          retryable: false,
          status: 413,
          code: "request_too_large",
          field: `rows[${t.row_index}]`,
        });
      }
      rows.push(cmd);
    }
    if (rows.length) rows.push(["EXPIRE", rowsKey, ttl]);
    // Keys in chunks, so a 100k-key batch is several values of bounded size, not one.
    const chunkKeys = Math.max(1, Math.min(10_000, Math.floor(max / 4 / (keys.reduce((m, k) => Math.max(m, k.length), 1) + 8))));
    const chunks: string[] = [];
    for (let i = 0; i < keys.length; i += chunkKeys) chunks.push(JSON.stringify(keys.slice(i, i + chunkKeys)));
    const os = spec.oversample ? ["os:target", String(spec.oversample.target_groups), "os:mode", spec.oversample.partial_rollout] : [];
    const batch: RedisArg[][] = [["HSET", this.batchKey(spec.batch_id), "spec", JSON.stringify(spec), "kn", String(chunks.length), ...os]];
    chunks.forEach((c, i) => batch.push(["HSET", this.batchKey(spec.batch_id), `k:${i}`, c]));
    batch.push(["EXPIRE", this.batchKey(spec.batch_id), ttl], ["ZADD", this.batchesKey(), "0", batchIndexMember(spec.started_at, spec.batch_id)]);
    const entries = jobs.map((t) => {
      const ref = t.row !== null;
      // `rb`: the row's size, so a worker reads rows in requests of bounded size.
      return ["XADD", this.stream, "*", "batch", spec.batch_id, "key", t.key, ...(ref ? ["r", "1", "rb", String(rowBytes.get(t.row_index))] : []), "t", JSON.stringify(ref ? { ...t, row: null } : t)];
    });
    // Reserve rows (over-sampled batches): their job entries wait in a hash until a filtered group starts them (FILTERED_LUA).
    const reserve: RedisArg[][] = [];
    const byUid = new Map<string, PlannedTrajectory[]>();
    for (const t of reserveJobs) byUid.set(t.uid, [...(byUid.get(t.uid) ?? []), t]);
    const part = spec.validate ? "val" : "train";
    for (const [uid, ts] of byUid) {
      const fp = opts.fingerprints?.get(uid);
      const x = JSON.stringify({ n: ts[0]!.group_size, part, ...(fp ? { fp } : {}) } satisfies ExpectedGroup);
      const entry = { uid, x, jobs: ts.map((t) => (t.row !== null ? { key: t.key, rb: String(rowBytes.get(t.row_index)), t: JSON.stringify({ ...t, row: null }) } : { key: t.key, t: JSON.stringify(t) })) };
      reserve.push(["HSET", this.reserveJobsKey(spec.batch_id), uid, JSON.stringify(entry)]);
    }
    if (byUid.size) {
      reserve.push(["RPUSH", this.reserveKey(spec.batch_id), ...byUid.keys()], ["EXPIRE", this.reserveKey(spec.batch_id), ttl], ["EXPIRE", this.reserveJobsKey(spec.batch_id), ttl]);
    }
    for (const c of [...batch, ...entries, ...reserve]) checkCommand(c, max, "json");
    return { spec, jobs: jobs.length, rows, batch, entries, reserve };
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
   * Fills in the rows of jobs whose entry refers to its batch's rows hash
   * (one HGET per distinct row, pipelined). A row that is gone (the batch
   * expired) makes the job's trajectory fail on its own (`row_error`).
   */
  private async attachRows(jobs: Job[]): Promise<void> {
    const need = new Map<string, { batch: string; index: number; bytes: number; jobs: Job[] }>();
    for (const j of jobs) {
      if (!j.rowRef) continue;
      const id = `${j.batch_id}\u0000${j.trajectory.row_index}`;
      const e = need.get(id) ?? { batch: j.batch_id, index: j.trajectory.row_index, bytes: j.rowBytes ?? 0, jobs: [] };
      e.jobs.push(j);
      need.set(id, e);
    }
    if (need.size === 0) return;
    const wanted = [...need.values()];
    // Replies bounded like requests: rows are read in pipelines of at most the store's request size.
    const max = (this.redis.maxRequestBytes ?? Infinity) * 0.8;
    const got: RedisReply[] = [];
    for (let i = 0; i < wanted.length; ) {
      let size = 0;
      let end = i;
      while (end < wanted.length && (end === i || size + wanted[end]!.bytes <= max)) size += wanted[end++]!.bytes;
      got.push(...(await this.pipe(wanted.slice(i, end).map((w) => ["HGET", this.rowsKey(w.batch), String(w.index)]))));
      i = end;
    }
    wanted.forEach((w, i) => {
      const raw = got[i];
      for (const j of w.jobs) {
        delete j.rowRef;
        delete j.rowBytes;
        if (typeof raw === "string") j.trajectory = { ...j.trajectory, row: JSON.parse(raw) as PlannedTrajectory["row"] };
        else {
          j.trajectory = { ...j.trajectory, row: null, row_error: `row ${w.index} of batch ${w.batch} is gone from ${this.rowsKey(w.batch)} (expired?)` };
          j.rowLost = true;
        }
      }
    });
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
    await this.attachRows(out);
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
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    await this.pipe([
      ["XADD", this.doneKey(batchId), "*", "key", key, ...(reused ? ["reused", "1"] : [])],
      ["EXPIRE", this.doneKey(batchId), ttl],
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
   * batch (nothing stored for them): events `key`, `surplus` (`running`: it
   * was inside its loop; `queued`: never started) on the batch's done
   * stream, counted by followers as cancelled or carried.
   */
  async surplus(batchId: string, keys: readonly string[], running: boolean): Promise<void> {
    if (!keys.length) return;
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    const cmds: RedisArg[][] = keys.map((k) => ["XADD", this.doneKey(batchId), "*", "key", k, "surplus", running ? "running" : "queued"]);
    for (let i = 0; i < cmds.length; i += 500) await this.pipe([...cmds.slice(i, i + 500), ["EXPIRE", this.doneKey(batchId), ttl]]);
  }

  /**
   * Over-sampled batches: admits a finished session's write ({@link ADMIT_LUA}):
   * `write`, `last` (it completes its group), `surplus` or `cancelled`.
   */
  async admitSession(batchId: string, uid: string, sessionId: number, n: number): Promise<"write" | "last" | "surplus" | "cancelled"> {
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    return String(await this.eval(ADMIT_LUA, [this.batchKey(batchId), this.admittedKey(batchId, uid)], [String(sessionId), String(n), ttl])) as "write" | "last" | "surplus" | "cancelled";
  }

  /** Whether `uid`'s session `sessionId` was admitted to write ({@link admitSession}) and whether the batch is stopped. */
  async admission(batchId: string, uid: string, sessionId: number): Promise<{ admitted: boolean; stopped: "cancel" | "carry" | null }> {
    const [stopped, member] = await this.pipe([["HGET", this.batchKey(batchId), "stopped"], ["SISMEMBER", this.admittedKey(batchId, uid), String(sessionId)]]);
    return { admitted: Number(member) === 1, stopped: stopped == null ? null : (String(stopped) as "cancel" | "carry") };
  }

  /** Reserves a delivery slot for the write completing `uid`'s group ({@link RESERVE_LUA}); false: none free (surplus). */
  async reserveDelivery(batchId: string, uid: string): Promise<boolean> {
    return Number(await this.eval(RESERVE_LUA, [this.batchKey(batchId)], [uid])) === 1;
  }

  /** The write completing `uid`'s group is stored ({@link COMMIT_LUA}); true when this delivery reached the target and stopped the batch. */
  async commitDelivery(batchId: string, uid: string): Promise<boolean> {
    return Number(await this.eval(COMMIT_LUA, [this.batchKey(batchId)], [uid])) === 2;
  }

  /** The write completing `uid`'s group failed: its slot is freed ({@link RELEASE_LUA}). */
  async releaseDelivery(batchId: string, uid: string): Promise<void> {
    await this.eval(RELEASE_LUA, [this.batchKey(batchId)], [uid]);
  }

  /**
   * `uid`'s group was filtered: counts it and starts the next reserve row,
   * its jobs enqueued atomically ({@link FILTERED_LUA}). Returns the row
   * started (the same one for a repeated call), or null.
   */
  async groupFiltered(batchId: string, uid: string): Promise<StartedReserveRow | null> {
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    await this.consumers.ensure();
    const r = await this.eval(FILTERED_LUA, [this.batchKey(batchId), this.reserveKey(batchId), this.launchedKey(batchId), this.reserveJobsKey(batchId), this.stream], [uid, batchId, ttl]);
    if (typeof r !== "string" || r === "") return null;
    const e = JSON.parse(r) as { uid: string; x: string };
    return { uid: e.uid, group: JSON.parse(e.x) as ExpectedGroup };
  }

  /** The over-sampling figures of a batch as workers keep them, the reserve rows started (from index `from` of the launched list) and left. */
  async oversampleState(batchId: string, from = 0): Promise<QueuedOversampleState> {
    const [h, launched, left] = await this.pipe([
      ["HMGET", this.batchKey(batchId), "os:delivered", "os:filtered", "os:replacements", "stopped"],
      ["LRANGE", this.launchedKey(batchId), String(from), "-1"],
      ["LLEN", this.reserveKey(batchId)],
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
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    const cmds: RedisArg[][] = seed.admitted.flatMap(({ uid, session_id }) => [["SADD", this.admittedKey(batchId, uid), String(session_id)], ["EXPIRE", this.admittedKey(batchId, uid), ttl]]);
    const fields = [...seed.delivered.map((u) => [`d:${u}`, "1"]), ...seed.filtered.map((u) => [`f:${u}`, "1"])].flat();
    if (fields.length) cmds.push(["HSET", this.batchKey(batchId), ...fields, "os:delivered", String(seed.delivered.length), "os:filtered", String(seed.filtered.length)]);
    if (seed.delivered.length >= seed.target) cmds.push(["HSET", this.batchKey(batchId), "stopped", seed.mode]);
    for (let i = 0; i < cmds.length; i += 500) await this.pipe(cmds.slice(i, i + 500));
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
      const entries = parseEntries(await this.call(["XRANGE", this.stream, start, "+", "COUNT", "500"]));
      for (const e of entries) if (e.fields?.batch === batchId) waiting.push(e);
      if (entries.length < 500) break;
      start = `(${entries[entries.length - 1]!.id}`;
    }
    if (!waiting.length) return [];
    const held = new Set<string>();
    start = "-";
    for (;;) {
      const r = (await this.consumers.withGroup(() => this.call(["XPENDING", this.stream, this.group, start, "+", "500"]))) as RedisReply[];
      for (const p of r) held.add(String((p as RedisReply[])[0]));
      if (r.length < 500) break;
      start = `(${String((r[r.length - 1] as RedisReply[])[0])}`;
    }
    const free = waiting.filter((e) => !held.has(e.id));
    // Only entries this call deleted are reported: one acknowledged meanwhile (its job finished) is not surplus.
    const keys: string[] = [];
    for (let i = 0; i < free.length; i += 500) {
      const chunk = free.slice(i, i + 500);
      const r = await this.pipe(chunk.map((e) => ["XDEL", this.stream, e.id]));
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
    const [, got] = await this.pipe([["HSETNX", this.batchKey(batchId), "os:settled", JSON.stringify(s)], ["HGET", this.batchKey(batchId), "os:settled"]]);
    return typeof got === "string" ? (JSON.parse(got) as OversampleSettlement) : s;
  }

  /** The stored settlement of an over-sampled batch, or null while it is not settled. */
  async oversampleSettlement(batchId: string): Promise<OversampleSettlement | null> {
    const got = await this.call(["HGET", this.batchKey(batchId), "os:settled"]);
    return typeof got === "string" ? (JSON.parse(got) as OversampleSettlement) : null;
  }

  /** Of `batchIds`, the stopped ones (over-sampled batches that reached their target) and how: one pipelined HGET each. */
  async stoppedBatches(batchIds: readonly string[]): Promise<Map<string, "cancel" | "carry">> {
    const ids = [...new Set(batchIds)];
    if (ids.length === 0) return new Map();
    const r = await this.pipe(ids.map((id) => ["HGET", this.batchKey(id), "stopped"]));
    const out = new Map<string, "cancel" | "carry">();
    ids.forEach((id, i) => r[i] != null && out.set(id, String(r[i]) as "cancel" | "carry"));
    return out;
  }

  /** EVAL of a script (Redis over TCP and Upstash REST alike; scripts here are small, so no EVALSHA cache). */
  private eval(script: string, keys: string[], args: string[]): Promise<RedisReply> {
    return this.call(["EVAL", script, String(keys.length), ...keys, ...args]);
  }

  /**
   * Depth (jobs a worker can claim now: never claimed, plus stranded ones),
   * in flight (held by a worker that heart-beats them), stranded (held by a
   * consumer with a job idle past the lease: it stopped heart-beating, so the
   * next claim reclaims them) and the oldest unacknowledged job's age (from
   * its stream id's milliseconds and the Redis clock); `depth + in_flight` is
   * XLEN, every job still to do. `workers.known` counts workers that claimed or
   * heart-beat within two leases (a worker blocked on an empty queue claims
   * every second; a busy one heart-beats), `busy` those of them holding
   * jobs that are not stranded. A worker silent for longer (SIGKILLed, its host gone) is pruned:
   * dropped from `{prefix}jobs:workers` and, once its jobs have been
   * reclaimed (no pending entries), from the consumer group (XGROUP
   * DELCONSUMER), so it is not counted forever.
   */
  async stats(): Promise<QueueStats> {
    const { pending, consumers: cs } = await this.consumers.info();
    const [len, first, time, seen, claimedWith] = await this.pipe([["XLEN", this.stream], ["XRANGE", this.stream, "-", "+", "COUNT", "1"], ["TIME"], ["ZRANGE", this.workersKey, "0", "-1", "WITHSCORES"], ["GET", this.leaseKey]]);
    const leaseMs = Number(claimedWith) > 0 ? Number(claimedWith) : this.leaseMs;
    // A consumer with a job idle past the lease has stopped heart-beating (a live worker's heartbeats keep
    // each of its jobs below ~5/6 of the lease): its jobs are stranded, reclaimable by the next claim. One XPENDING IDLE … COUNT 1 per holder.
    const holders = cs.filter((c) => Number(c.pending ?? 0) > 0);
    const idle = holders.length
      ? await this.consumers.withGroup(() => this.pipe(holders.map((c) => ["XPENDING", this.stream, this.group, "IDLE", String(leaseMs), "-", "+", "1", String(c.name)])))
      : [];
    const strandedBy = new Set(holders.filter((_, i) => Array.isArray(idle[i]) && (idle[i] as RedisReply[]).length > 0).map((c) => String(c.name)));
    const stranded = holders.reduce((n, c) => n + (strandedBy.has(String(c.name)) ? Number(c.pending) : 0), 0);
    const inFlight = Math.max(0, pending - stranded);
    const oldest = parseEntries(first)[0]?.id;
    const t = time as RedisReply[];
    const nowMs = Number(t[0]) * 1000 + Math.floor(Number(t[1]) / 1000);
    // Worker clocks may drift from Redis's by seconds; two leases (60 s by default) absorb that.
    const horizon = nowMs - 2 * leaseMs;
    const live = new Set<string>();
    // ZRANGE WITHSCORES: flat [member, score, …] (RESP2, Upstash) or [[member, score], …] (RESP3).
    const reply = (seen as RedisReply[] | null) ?? [];
    const pairs = reply.every(Array.isArray) ? (reply as RedisReply[][]) : reply.flatMap((v, i) => (i % 2 === 0 ? [[v, reply[i + 1]] as RedisReply[]] : []));
    for (const [member, score] of pairs) if (Number(score) >= horizon) live.add(String(member));
    const dead = cs.filter((c) => !live.has(String(c.name)) && Number(c.pending ?? 0) === 0);
    await Promise.all([
      this.call(["ZREMRANGEBYSCORE", this.workersKey, "-inf", `(${horizon}`]),
      ...dead.map((c) => this.call(["XGROUP", "DELCONSUMER", this.stream, this.group, String(c.name)])),
    ]).catch(() => {});
    return {
      mode: "queue",
      depth: Math.max(0, Number(len) - inFlight),
      in_flight: inFlight,
      stranded: Math.min(stranded, Math.max(0, Number(len) - inFlight)),
      oldest_age_ms: oldest ? Math.max(0, nowMs - Number(oldest.split("-")[0])) : 0,
      workers: { known: live.size, busy: cs.filter((c) => live.has(String(c.name)) && !strandedBy.has(String(c.name)) && Number(c.pending ?? 0) > 0).length },
    };
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
    if (keys.length) await this.call(["DEL", ...keys.map((k) => `${this.prefix}session:${keyPart(k)}`)]);
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
      const r = await this.pipe(chunk.map((k) => ["HMGET", `${this.prefix}session:${keyPart(k)}`, "step", "n"]));
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
      const r = await this.pipe(keys.slice(i, i + 1000).map((k) => ["EXISTS", `${this.prefix}session:${keyPart(k)}`]));
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

  private async call(cmd: RedisArg[], blocking = false): Promise<RedisReply> {
    try {
      return blocking && this.redis.execBlocking ? await this.redis.execBlocking(cmd) : await this.redis.exec(cmd);
    } catch (e) {
      throw storeError(e);
    }
  }

  private async pipe(cmds: RedisArg[][]): Promise<RedisReply[]> {
    let out: (RedisReply | Error)[];
    try {
      out = await this.redis.pipeline(cmds);
    } catch (e) {
      throw storeError(e);
    }
    const bad = out.find((r) => r instanceof Error);
    if (bad) throw storeError(bad);
    return out as RedisReply[];
  }
}

/** The batch index's member for a batch: its start (epoch ms, zero-padded to 15 digits, so members sort by time) and id. */
export function batchIndexMember(startedAt: number, batchId: string): string {
  return `${String(Math.max(0, Math.floor(startedAt))).padStart(15, "0")}:${batchId}`;
}

/** A Redis failure as a 503 StoreError; `OOM` (maxmemory reached) says the store is full. */
export function storeError(e: unknown): EdgeloopError {
  if (e instanceof EdgeloopError) return e;
  const msg = (e as Error)?.message ?? String(e);
  if (/^OOM\b/.test(msg)) return new StoreError("store full: Redis refused the write (maxmemory reached)", { cause: e, code: "store_full" });
  return new StoreError(`redis: ${msg.slice(0, 300)}`, { cause: e });
}

function toJob(e: StreamEntry, deliveries: number): Job | null {
  if (!e.fields?.t || !e.fields.batch) return null;
  try {
    return {
      id: e.id,
      batch_id: e.fields.batch,
      trajectory: JSON.parse(e.fields.t) as PlannedTrajectory,
      deliveries,
      ...(e.fields.r === "1" ? { rowRef: true, rowBytes: Number(e.fields.rb ?? 0) } : {}),
      ...(e.fields.x ? { expect: JSON.parse(e.fields.x) as ExpectedGroup } : {}),
    };
  } catch {
    return null;
  }
}
