import { EdgeloopError, StoreError } from "../errors.ts";
import type { PlannedTrajectory } from "../rollout/batch.ts";
import type { RolloutConfig } from "../schema/index.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../store/redis-commander.ts";
import { replyToFields } from "../store/redis-transfer-queue.ts";
import { parseEntries, parseRead, StreamConsumer, type StreamEntry } from "../store/stream-consumer.ts";

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
}

/** One claimed job: the stream entry id (ack it), the trajectory to run and how often it was delivered. */
export interface Job {
  id: string;
  batch_id: string;
  trajectory: PlannedTrajectory;
  /** Deliveries so far (1 for a fresh job; more after reclaims). */
  deliveries: number;
}

/** `GET /v1/queue`: the autoscaler's signal. */
export interface QueueStats {
  mode: "queue" | "inline";
  /** Jobs waiting to be claimed. */
  depth: number;
  /** Jobs claimed by a worker and not yet acknowledged (running, or held by a dead worker until reclaimed). */
  in_flight: number;
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
 * - `{p}jobs` STREAM — entries `batch`, `key`, `t` (the planned trajectory, JSON);
 *   consumer group `workers`. A job is XACKed and XDELed once its record is stored.
 * - `{p}jobs:batch:{id}` HASH — `spec` (a {@link BatchSpec}, JSON) and `keys` (JSON array).
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
    this.consumers = new StreamConsumer({ call: (c, b) => this.call(c, b), pipe: (c) => this.pipe(c) }, this.stream, this.group);
  }

  /** The hash of a batch's spec and keys. */
  batchKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${batchId}`;
  }

  /** The stream of a batch's completion events. */
  doneKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${batchId}:done`;
  }

  /**
   * Stores the batch spec and its keys, then enqueues one job per trajectory
   * (XADD, pipelined in chunks of 500).
   * @throws StoreError 503 when `maxPending` would be exceeded (nothing is written) or Redis refuses (e.g. OOM).
   */
  async submit(spec: BatchSpec, keys: readonly string[], jobs: readonly PlannedTrajectory[]): Promise<void> {
    await this.consumers.ensure();
    await this.reserve(jobs.length);
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    await this.pipe([
      ["HSET", this.batchKey(spec.batch_id), "spec", JSON.stringify(spec), "keys", JSON.stringify(keys)],
      ["EXPIRE", this.batchKey(spec.batch_id), ttl],
    ]);
    for (let i = 0; i < jobs.length; i += 500) {
      await this.pipe(jobs.slice(i, i + 500).map((t) => ["XADD", this.stream, "*", "batch", spec.batch_id, "key", t.key, "t", JSON.stringify(t)]));
    }
  }

  /** A batch's spec and keys, or null when unknown (never submitted, or expired). */
  async batch(batchId: string): Promise<{ spec: BatchSpec; keys: string[] } | null> {
    const f = replyToFields(await this.call(["HGETALL", this.batchKey(batchId)]));
    if (f.spec === undefined) return null;
    return { spec: JSON.parse(f.spec) as BatchSpec, keys: JSON.parse(f.keys ?? "[]") as string[] };
  }

  /**
   * Claims up to `max` jobs for `consumer`: first jobs idle longer than the
   * lease (a dead worker's; their delivery counts come from XPENDING), then
   * new ones, blocking up to `blockMs` when there are none.
   */
  async claim(consumer: string, max: number, blockMs = 0): Promise<Job[]> {
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
    return out;
  }

  /**
   * Resets the idle time of jobs `consumer` is running (XCLAIM min-idle
   * lease/2 JUSTID), so they are not reclaimed while it is alive; a job
   * another worker reclaimed (and heart-beats) is left alone.
   */
  async heartbeat(consumer: string, ids: readonly string[]): Promise<void> {
    await this.consumers.touch(consumer, Math.floor(this.leaseMs / 2), ids);
  }

  /** Records that `key`'s record is stored (an event on the batch's done stream). */
  async completed(batchId: string, key: string): Promise<void> {
    const ttl = String(this.opts.batchTtlSeconds ?? 7 * 24 * 3600);
    await this.pipe([
      ["XADD", this.doneKey(batchId), "*", "key", key],
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

  /** Completion events of a batch after stream id `after` (exclusive; `0-0` for all), at most `count`. */
  async completions(batchId: string, after: string, count = 1000): Promise<{ id: string; key: string }[]> {
    const r = await this.call(["XRANGE", this.doneKey(batchId), after === "0-0" ? "-" : `(${after}`, "+", "COUNT", String(count)]);
    return parseEntries(r).map((e) => ({ id: e.id, key: e.fields?.key ?? "" }));
  }

  /**
   * Depth (jobs not yet claimed), in flight (claimed, not acknowledged) and
   * the oldest unacknowledged job's age (from its stream id's milliseconds
   * and the Redis clock).
   */
  async stats(): Promise<QueueStats> {
    const { pending: inFlight, consumers: cs } = await this.consumers.info();
    const [len, first, time] = await this.pipe([["XLEN", this.stream], ["XRANGE", this.stream, "-", "+", "COUNT", "1"], ["TIME"]]);
    const oldest = parseEntries(first)[0]?.id;
    const t = time as RedisReply[];
    const nowMs = Number(t[0]) * 1000 + Math.floor(Number(t[1]) / 1000);
    return {
      mode: "queue",
      depth: Math.max(0, Number(len) - inFlight),
      in_flight: inFlight,
      oldest_age_ms: oldest ? Math.max(0, nowMs - Number(oldest.split("-")[0])) : 0,
      workers: { known: cs.length, busy: cs.filter((c) => Number(c.pending ?? 0) > 0).length },
    };
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

  /** Of `keys`, those with a durable-session hash (`{p}session:{key}`). */
  async sessionKeys(keys: readonly string[]): Promise<Set<string>> {
    const out = new Set<string>();
    for (let i = 0; i < keys.length; i += 1000) {
      const chunk = keys.slice(i, i + 1000);
      const r = await this.pipe(chunk.map((k) => ["EXISTS", `${this.prefix}session:${k}`]));
      r.forEach((x, j) => Number(x) > 0 && out.add(chunk[j]!));
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
      const r = await this.pipe(keys.slice(i, i + 1000).map((k) => ["EXISTS", `${this.prefix}session:${k}`]));
      for (const x of r) n += Number(x);
    }
    return n;
  }

  /**
   * Refuses (503) when `n` more jobs would exceed `maxPending`; nothing is
   * written. Called before a batch's other writes so a refused batch leaves
   * no trace.
   * @throws StoreError (503, code `queue_full`)
   */
  async reserve(n: number): Promise<void> {
    if (this.opts.maxPending === undefined) return;
    const len = Number(await this.call(["XLEN", this.stream]));
    if (len + n > this.opts.maxPending) {
      throw new StoreError(`job queue full: ${len} jobs pending, ${n} more would exceed max pending ${this.opts.maxPending}`, { code: "queue_full" });
    }
  }

  /** Removes a consumer that has exited (its pending jobs, if any, stay for reclaim). */
  async forgetConsumer(consumer: string): Promise<void> {
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
    return { id: e.id, batch_id: e.fields.batch, trajectory: JSON.parse(e.fields.t) as PlannedTrajectory, deliveries };
  } catch {
    return null;
  }
}
