import { EdgeloopError } from "../errors.ts";
import { MAX_TIMER_MS, type RolloutConfig } from "../schema/config.ts";

/**
 * The abort reason of a trajectory that passed its wall-clock deadline
 * (`rollout.trajectory_deadline_s`). Unlike a batch's own cancel or surplus
 * aborts, a loop that sees it ends the trajectory normally with what it has
 * sampled (`extra_fields.terminated_by: "deadline"`) and the record is
 * stored; a loop that has nothing to record (no prompt rendered yet) throws
 * it, and the trajectory fails with its text.
 */
export class TrajectoryDeadlineError extends EdgeloopError {
  override name = "TrajectoryDeadlineError";
  /** The deadline that passed, wall-clock epoch milliseconds. */
  readonly deadline_ms: number;
  constructor(key: string, deadlineMs: number) {
    super(`trajectory '${key.slice(0, 200)}' passed its deadline (rollout.trajectory_deadline_s) at ${new Date(deadlineMs).toISOString()}`, {
      status: 504,
      code: "trajectory_deadline",
      key,
    });
    this.deadline_ms = deadlineMs;
  }
}

/** Whether `signal` was aborted by a trajectory's deadline ({@link TrajectoryDeadlineError}), not by a cancel. */
export function isDeadlineAbort(signal: AbortSignal | undefined): boolean {
  return signal?.aborted === true && signal.reason instanceof TrajectoryDeadlineError;
}

/** Timers as deadlines use them (default: the global `setTimeout`/`clearTimeout`); `ms` is at most {@link MAX_TIMER_MS}. */
export interface Timers {
  set(fn: () => void, ms: number): unknown;
  clear(handle: unknown): void;
}

/** The global `setTimeout`/`clearTimeout` as {@link Timers}. */
export const globalTimers: Timers = { set: (fn, ms) => setTimeout(fn, ms), clear: (h) => clearTimeout(h as ReturnType<typeof setTimeout>) };

/**
 * The absolute deadline (epoch ms) of a trajectory that starts at `startMs`
 * (epoch ms) under `rollout.trajectory_deadline_s`, or null when the config
 * sets no deadline (null, or absent in an input written before the field existed and not re-parsed).
 */
export function trajectoryDeadlineAt(rollout: Pick<RolloutConfig, "trajectory_deadline_s">, startMs: number): number | null {
  const s = rollout.trajectory_deadline_s;
  return s == null ? null : startMs + s * 1000;
}

/**
 * A signal that aborts when `a` or `b` does, with the first one's reason
 * (what `AbortSignal.any` does, written out for runtimes without it). The
 * listener on the other signal is removed once one fires; `undefined` inputs
 * are skipped (one signal alone is returned as it is).
 */
export function eitherSignal(a: AbortSignal | undefined, b: AbortSignal | undefined): AbortSignal | undefined {
  if (!a || !b) return a ?? b;
  if (a.aborted) return a;
  if (b.aborted) return b;
  const c = new AbortController();
  const onA = () => fire(a);
  const onB = () => fire(b);
  const fire = (s: AbortSignal) => {
    a.removeEventListener("abort", onA);
    b.removeEventListener("abort", onB);
    c.abort(s.reason);
  };
  a.addEventListener("abort", onA, { once: true });
  b.addEventListener("abort", onB, { once: true });
  return c.signal;
}

/**
 * One trajectory's deadline as an abort signal: {@link signal} aborts with
 * `parent`'s reason when `parent` (the batch's cancel/surplus signal) aborts,
 * and with a {@link TrajectoryDeadlineError} once the wall clock reaches
 * `atMs` after {@link start} (at once when it already has). `atMs` null: no
 * deadline (only the parent's aborts). The timer re-checks the wall clock
 * when it fires (a timer that fires early, or a delay above
 * {@link MAX_TIMER_MS}, is re-armed for the rest).
 */
export class TrajectoryDeadline {
  private readonly ctl = new AbortController();
  private handle: unknown = undefined;
  private readonly unhook: (() => void) | null = null;
  private readonly wall: () => number;
  private readonly timers: Timers;

  /** @param opts.key the trajectory key (named in the error); `wallClockMs` epoch ms (default `Date.now`); `timers` (default global). */
  constructor(private readonly opts: { key: string; atMs: number | null; parent?: AbortSignal; wallClockMs?: () => number; timers?: Timers }) {
    this.wall = opts.wallClockMs ?? Date.now;
    this.timers = opts.timers ?? globalTimers;
    const parent = opts.parent;
    if (parent?.aborted) this.ctl.abort(parent.reason);
    else if (parent) {
      const on = () => this.ctl.abort(parent.reason);
      parent.addEventListener("abort", on, { once: true });
      this.unhook = () => parent.removeEventListener("abort", on);
    }
  }

  /** Aborts on the parent's abort or at the deadline (the trajectory's engine, tool and interaction calls take it). */
  get signal(): AbortSignal {
    return this.ctl.signal;
  }

  /** The absolute deadline, epoch ms (null: none). */
  get atMs(): number | null {
    return this.opts.atMs;
  }

  /** Whether the deadline has fired ({@link signal} aborted with a {@link TrajectoryDeadlineError}). */
  get passed(): boolean {
    return isDeadlineAbort(this.ctl.signal);
  }

  /** Arms the deadline's timer (aborts at once when the deadline has passed). Idempotent while armed. */
  start(): void {
    if (this.opts.atMs === null || this.ctl.signal.aborted || this.handle !== undefined) return;
    const left = this.opts.atMs - this.wall();
    if (left <= 0) {
      this.ctl.abort(new TrajectoryDeadlineError(this.opts.key, this.opts.atMs));
      return;
    }
    this.handle = this.timers.set(() => {
      this.handle = undefined;
      this.start();
    }, Math.min(left, MAX_TIMER_MS));
  }

  /** Clears the timer (a later {@link start} re-arms it); the signal keeps its state. */
  stop(): void {
    if (this.handle !== undefined) this.timers.clear(this.handle);
    this.handle = undefined;
  }

  /** {@link stop}, and stops following the parent signal: call when the trajectory's run returns. */
  dispose(): void {
    this.stop();
    this.unhook?.();
  }
}
