import { InputError } from "../errors.ts";
import type { TrajectoryRecord } from "../schema/index.ts";
import { BatchMetricsAccumulator, type BatchMetrics } from "../telemetry/batch-metrics.ts";
import type { BatchPlan } from "./batch.ts";
import type { BatchStats } from "./batch-types.ts";

/** A batch's progress figures without its metrics (those are computed from the records: {@link BatchProgress.snapshot}). */
export type BatchFigures = Omit<BatchStats, keyof BatchMetrics>;

/**
 * The accounting of a {@link BatchRun} (batch-run.ts): its progress figures
 * (`s`, mutated in place by the run), the metrics over its records, and the
 * records counted so far. Counting a record adds its tokens, turns, tool
 * calls and reward; the first 50 errors are kept.
 */
export class BatchProgress {
  /** The figures `stats()` reports (counts, tokens, rewards, errors, lost/repaired/cancelled, over-sampling). */
  readonly s: BatchFigures;
  readonly metrics = new BatchMetricsAccumulator();
  /** Records counted so far (stored here or observed from other processes), in completion order. */
  readonly finished: TrajectoryRecord[] = [];
  private rewardSum = 0;

  /** `startedAt`: epoch ms reported as `started_at`. */
  constructor(plan: BatchPlan, startedAt: number) {
    const total = plan.trajectories.length;
    this.s = {
      batch_id: plan.batch_id,
      validate: plan.validate,
      done: false,
      counts: { total, pending: total, running: 0, finished: 0, reused: 0, records: 0, ok: 0, failed: 0, truncated: 0 },
      tokens: { prompt: 0, sampled: 0, observation: 0 },
      turns: 0,
      tool_calls: 0,
      tool_errors: 0,
      prompts_truncated: 0,
      reward: { count: 0, mean: null, min: null, max: null, errors: 0 },
      errors: [],
      lost: null,
      repaired: null,
      cancelled: null,
      oversample: plan.oversample
        ? {
            target_groups: plan.oversample.target_groups,
            target_from: plan.oversample.target_from ?? null,
            eager_rows: plan.oversample.eager_rows,
            partial_rollout: plan.oversample.partial_rollout,
            delivered: 0,
            filtered: 0,
            replacements: 0,
            reached: false,
            cancelled: 0,
            carried: 0,
            interrupted: 0,
            groups_withdrawn: 0,
            groups_carried: 0,
            unused_groups: 0,
            unused_sessions: 0,
          }
        : null,
      started_at: startedAt,
      finished_at: null,
    };
  }

  /** Keeps an error of the batch (`key`: a trajectory key, or `(batch)`/`(store)`); only the first 50 are kept. */
  error(key: string, error: string): void {
    if (this.s.errors.length < 50) this.s.errors.push({ key, error });
  }

  /**
   * Counts a finished session and its records (`handedBack`: streamed, not
   * counted again), and publishes each record to `onRecord`.
   */
  sessionDone(records: readonly TrajectoryRecord[], handedBack: boolean, onRecord?: (r: TrajectoryRecord) => void): void {
    this.s.counts.finished++;
    if (handedBack) this.s.counts.reused++;
    for (const r of records) {
      if (!handedBack) this.count(r);
      this.finished.push(r);
      onRecord?.(r);
    }
  }

  /** A snapshot of the figures and metrics (a deep copy). */
  snapshot(): BatchStats {
    return { ...structuredClone(this.s), ...this.metrics.snapshot() };
  }

  private count(r: TrajectoryRecord): void {
    this.metrics.addRecord(r);
    const c = this.s.counts;
    c.records++;
    if (r.error !== null) {
      c.failed++;
      this.error(r.key, r.error);
      return;
    }
    c.ok++;
    if (r.truncated) c.truncated++;
    const sampled = r.response_mask.reduce<number>((n, m) => n + m, 0);
    this.s.tokens.prompt += r.prompt_ids.length;
    this.s.tokens.sampled += sampled;
    this.s.tokens.observation += r.response_ids.length - sampled;
    this.s.turns += r.num_turns;
    const ef = r.extra_fields as { tool_calls?: unknown; tool_errors?: unknown; prompt_truncated?: unknown; reward_error?: unknown };
    if (typeof ef.tool_calls === "number") this.s.tool_calls += ef.tool_calls;
    if (typeof ef.tool_errors === "number") this.s.tool_errors += ef.tool_errors;
    if (ef.prompt_truncated === true) this.s.prompts_truncated++;
    if (ef.reward_error != null) this.s.reward.errors++;
    if (r.reward_score !== null) {
      this.rewardSum += r.reward_score;
      this.s.reward.count++;
      this.s.reward.mean = this.rewardSum / this.s.reward.count;
      this.s.reward.min = Math.min(this.s.reward.min ?? Infinity, r.reward_score);
      this.s.reward.max = Math.max(this.s.reward.max ?? -Infinity, r.reward_score);
    }
  }
}

/**
 * The reason stored for a failed trajectory. An input error (a bad field of
 * the row, an unknown `agent_name`, a multimodal prompt) names the row, as
 * schema errors do: `rows[3].agent_name: unknown agent loop …`.
 */
export function rowErrorText(e: unknown, rowIndex: number): string {
  if (e instanceof InputError && e.field && !e.field.startsWith("rows[")) {
    // Config and loop-output errors are not the row's: they keep their own field.
    return e.field.startsWith("rollout.") || e.field.startsWith("config") || e.field.startsWith("agent_loop ") ? e.message : `rows[${rowIndex}].${e.message}`;
  }
  return errorText(e);
}

/** An error as one line of text: `Name: message` for a named error, the message for a plain `Error`, else `String(e)`. */
export function errorText(e: unknown): string {
  if (e instanceof Error) return e.name && e.name !== "Error" ? `${e.name}: ${e.message}` : e.message;
  return String(e);
}
