import type { OversamplePlan, PlannedTrajectory } from "../rollout/batch.ts";
import type { ModelId, RolloutConfig } from "../schema/index.ts";
import type { RedisArg } from "../store/redis-commander.ts";

// The types of the job queue (jobs/job-queue.ts re-exports all of them): what a batch stores, a claimed job, the queue's figures and options.

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
