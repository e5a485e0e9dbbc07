import type { SessionAdmission } from "./session-admission.ts";
import type { AgentLoopOutput, ModelId, RolloutConfig, TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import type { BatchMetrics } from "../telemetry/batch-metrics.ts";
import type { BatchPlan, PlannedTrajectory } from "./batch.ts";

// The contract of a batch run (what executors implement, what progress reports, the errors a run throws):
// what BatchRun (batch-run.ts), workers and the service share. batch-run.ts re-exports all of it.

/** Runs one planned trajectory through its agent loop. */
export interface TrajectoryExecutor {
  /**
   * Resolves the row's loop and runs it; returns the loop's outputs (usually
   * one) and the resolved `agent_name`. Throws for a failure of this
   * trajectory only (unknown agent, engine down after retries, broken
   * invariant); the batch goes on. `toolLatenciesMs`: each tool call's
   * latency in milliseconds, for the batch's latency percentiles.
   * `signal` aborts the trajectory (the batch was cancelled): its engine and
   * tool calls, and its admission hold.
   */
  run(t: PlannedTrajectory, plan: BatchPlan, signal?: AbortSignal): Promise<{ agentName: string; outputs: AgentLoopOutput[]; toolLatenciesMs?: number[] }>;
  /** The agent name a row routes to, for failure records (`default_agent_loop` when absent/null). */
  agentNameFor(t: PlannedTrajectory): string;
  /**
   * Drops whatever durable state `t` left (its session checkpoint): called
   * once the batch stored nothing for it because it was cancelled (batch
   * cancel, or surplus with `partial_rollout: cancel`). Optional: executors
   * without durable state have nothing to drop.
   */
  discard?(t: PlannedTrajectory): Promise<void>;
  /**
   * Called when {@link run} threw the session fence's stale-step
   * ConflictError: another process runs `t`'s durable session (two inline
   * serves on one store prefix given the same batch — a client retry
   * through a load balancer). Waits for that owner's outcome: resolves with
   * the session's records (0…k, by output_index) once it finished, or null
   * once the session committed no step for the executor's stall time (its
   * owner died; the caller resumes the session). Rejects when `signal`
   * aborts. Optional: executors without durable sessions have no other owner.
   */
  awaitOwner?(t: PlannedTrajectory, signal?: AbortSignal): Promise<TrajectoryRecord[] | null>;
}

/** Builds the executor for a batch's effective rollout config (per-batch overrides applied). */
export type ExecutorFactory = (rollout: RolloutConfig, batch: { model_version: string | number | null; validate: boolean }) => TrajectoryExecutor;

/**
 * Progress and totals of a batch, as `GET /v1/rollouts/{batch_id}` reports
 * them, with the {@link BatchMetrics} (verl's `agent_loop/*` figures, finish
 * reasons, tool-call latency percentiles) computed over the records so far.
 */
export interface BatchStats extends BatchMetrics {
  batch_id: string;
  validate: boolean;
  done: boolean;
  /**
   * Sessions (trajectories: one per prompt and `session_id`) and records (the
   * outputs they emitted, 0…k each) counted apart: `total`, `pending`,
   * `running`, `finished` and `reused` count sessions; `records`, `ok`,
   * `failed` and `truncated` count records. `reused`: sessions that had
   * finished before this batch (a re-posted uid): their stored records are
   * handed back, not run or counted again.
   */
  counts: BatchCounts;
  /** Token counts over finished trajectories: prompt, sampled (mask 1) and observation (mask 0). */
  tokens: { prompt: number; sampled: number; observation: number };
  turns: number;
  tool_calls: number;
  tool_errors: number;
  /** Finished trajectories whose initial prompt was left-truncated to `prompt_length`. */
  prompts_truncated: number;
  reward: { count: number; mean: number | null; min: number | null; max: number | null; /** rewards that could not be computed (`extra_fields.reward_error`) */ errors: number };
  /** The first errors (at most 50): key and reason. */
  errors: { key: string; error: string }[];
  /**
   * Trajectories the store lost (queue mode: Redis lost their job, session
   * and record — a restart without persistence, eviction, FLUSHALL): they
   * will never finish, so the batch is done without them. `keys` names them
   * (at most 1000), `missing` the Redis keys found gone (the batch hash, and
   * the hash of every group that will never be delivered: gone, or holding a
   * lost session), `reason` says how it was decided. Null when none.
   */
  lost: { count: number; keys: string[]; missing: string[]; reason: string } | null;
  /**
   * What {@link BatchRun.repairStore} put back after the store lost data
   * while the batch ran: groups completed again and records written again.
   * Null when nothing had to be repaired.
   */
  repaired: { groups: number; records: number } | null;
  /**
   * Set once the batch was cancelled (`DELETE /v1/rollouts/{id}`): when,
   * how many sessions it stopped (never started, or aborted while running:
   * nothing stored for them), and what became of its groups — `withdrawn`:
   * incomplete at the cancel, never delivered (records stored before stay
   * readable by key; later writes are refused); `complete`: already
   * delivered to the trainers' stream, left as they are. Null otherwise.
   */
  cancelled: BatchCancellation | null;
  /** Over-sampling and dynamic sampling figures (see {@link OversampleStats}); null for a plain batch. */
  oversample: OversampleStats | null;
  started_at: number;
  finished_at: number | null;
}

/** What a cancel did (see {@link BatchStats.cancelled}). */
export interface BatchCancellation {
  /** Epoch milliseconds of the cancel. */
  at: number;
  /** Sessions stopped: not run, or aborted while running (no record stored for them). */
  sessions: number;
  /** Groups incomplete at the cancel: never delivered. */
  groups_withdrawn: number;
  /** Groups complete before the cancel (already in the trainers' stream). */
  groups_complete: number;
}

/**
 * What over-sampling and dynamic sampling did in a batch (`target_groups`,
 * `rollout.oversample`, `partial_rollout`, `filter_groups`). Groups and
 * sessions are counted apart: at the end `counts.finished + cancelled +
 * carried + unused_sessions = counts.total`.
 */
export interface OversampleStats {
  target_groups: number;
  /** Which setting gave `target_groups`: the request's `target_groups` (wins over `rollout.oversample`), `rollout.oversample`, or `filter_groups` alone; null for a plan stored without it. */
  target_from: "target_groups" | "rollout.oversample" | "filter_groups" | null;
  /** Rows started at once (the rest are the reserve). */
  eager_rows: number;
  partial_rollout: "cancel" | "carry";
  /** Groups delivered to trainers (complete, not filtered), at most `target_groups`. */
  delivered: number;
  /** Complete groups kept from trainers by `filter_groups` (all rewards equal). */
  filtered: number;
  /** Reserve rows started to replace filtered groups. */
  replacements: number;
  /** Whether `target_groups` was reached (then the rest was stopped). */
  reached: boolean;
  /** `partial_rollout: cancel`: sessions stopped once the target was reached (aborted while running, or never started); nothing stored for them. */
  cancelled: number;
  /** `partial_rollout: carry`: sessions left for the next batch naming their uids (suspended at their last checkpoint, or not started). */
  carried: number;
  /** Of `cancelled` + `carried`: sessions that were running when stopped (their engine calls aborted). */
  interrupted: number;
  /** Groups left incomplete: withdrawn (`cancel`; never delivered) or open (`carry`; resumed by the next batch). */
  groups_withdrawn: number;
  groups_carried: number;
  /** Reserve rows never started (their groups never registered) and their sessions. */
  unused_groups: number;
  unused_sessions: number;
}

/** The reason a trajectory is aborted with when its batch reached `target_groups` (`partial_rollout: cancel`). */
export class SurplusCancelledError extends Error {
  override name = "SurplusCancelledError";
}

/** The reason a trajectory is suspended with when its batch reached `target_groups` (`partial_rollout: carry`): its session keeps its last checkpoint. */
export class TrajectoryCarriedError extends Error {
  override name = "TrajectoryCarriedError";
}

/** The reason a cancelled batch's trajectories are aborted with. */
export class BatchCancelledError extends Error {
  override name = "BatchCancelledError";
}

/** Progress counts of a batch: sessions and records apart (see {@link BatchStats.counts}). */
export interface BatchCounts {
  /** Sessions planned. */
  total: number;
  pending: number;
  running: number;
  /** Sessions finished (with 0…k records each), handed-back ones included. */
  finished: number;
  /** Sessions handed back from an earlier batch (not run; their records not counted in `records`/`ok`/`failed`). */
  reused: number;
  /** Records stored by this batch (ok + failed). */
  records: number;
  ok: number;
  failed: number;
  truncated: number;
}

/**
 * Thrown by an executor when the trajectory is no longer this run's to
 * finish (another worker took its session over: the session's step fence
 * refused a commit). The batch stores nothing for it and counts it in
 * {@link BatchRun.abandoned}; the new owner writes the record.
 */
export class TrajectoryAbandonedError extends Error {
  override name = "TrajectoryAbandonedError";
}

/**
 * Decides, across processes, the writes of an over-sampled batch whose
 * trajectories run in job-queue workers (the worker's one-trajectory
 * {@link BatchRun} asks it instead of its own in-process rule): whether a
 * finished session is written (its group's last one only within
 * `target_groups`, or when dynamic sampling filtered the group), and — once
 * written or not — settles what it reserved. Implemented over Redis by
 * `QueuedGroupGate` (shared/jobs/queued-oversample.ts).
 */
export interface GroupWriteGate {
  /**
   * Whether `t`'s finished session, with `records` (its outputs, 0…k), is
   * stored; false: it is surplus (the batch reached its target, or no
   * delivery slot was free) and nothing is stored for it.
   */
  admit(t: PlannedTrajectory, records: readonly TrajectoryRecord[]): Promise<boolean>;
  /** After an admitted session's writes: `stored` false when a write failed (a reserved delivery slot is released). */
  settled(t: PlannedTrajectory, stored: boolean): Promise<void>;
}

/** Options of a {@link BatchRun}. */
export interface BatchRunOptions {
  executor: TrajectoryExecutor;
  store: TransferQueue;
  rollout: RolloutConfig;
  /** Trajectories run at once. */
  concurrency: number;
  /**
   * The process's admission ({@link SessionAdmission}): each session takes a
   * slot before it starts, shared with every other batch of the process;
   * absent: only `concurrency` bounds this batch.
   */
  admission?: SessionAdmission;
  /** Called with every record once it is stored. */
  onRecord?: (r: TrajectoryRecord) => void;
  /** Clock in milliseconds (tests). */
  now?: () => number;
  /**
   * The trajectories run elsewhere (job-queue workers): `run()` executes
   * nothing and resolves once {@link BatchRun.observeSession} has counted
   * every session.
   */
  external?: boolean;
  /**
   * uids whose group existed before this batch: each of their sessions is
   * first looked up in the store, and one that already finished is handed
   * back (its records streamed, not run, not counted again).
   */
  reusedUids?: ReadonlySet<string>;
  /** Start time (epoch ms) to report instead of now (a batch rebuilt from the store). */
  startedAt?: number;
  /**
   * Cross-process write decisions of an over-sampled batch (job-queue
   * workers): replaces the in-process rule ({@link GroupWriteGate}).
   */
  groupGate?: GroupWriteGate;
  /** The model of this process's tokenizer, recorded as every record's `model` (absent: records name no model). */
  model?: ModelId;
}
