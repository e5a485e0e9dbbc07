import { KeyedChain } from "./keyed-chain.ts";
import { globalTimers, type Timers } from "../agent-loop/trajectory-deadline.ts";
import { NotFoundError } from "../errors.ts";
import type { AgentLoopOutput } from "../schema/index.ts";
import type { SessionInputArg } from "./checkpoint.ts";
import { isStaleStep } from "./session-storage.ts";
import { isStoreOutage } from "../store/store-outage.ts";
import { TrajectorySession, type SessionDeps, type SessionOutcome, type ToolResultDelivery } from "./trajectory-session.ts";

/** How a hosted session ended: its outputs (owner writes them), already written (`done`), or failed. */
export type SessionResult = Exclude<SessionOutcome, { status: "waiting" }>;

/** Timers as the host uses them (defaults: the global `setTimeout`/`clearTimeout`). */
export type HostTimers = Timers;

/**
 * Options of {@link SessionHost}: the session deps (their `timers` are the
 * host's too: a waiting session's wake-up at its earliest deadline) plus
 * retry tuning.
 */
export interface SessionHostOptions extends SessionDeps {
  /**
   * Retries of a session step that failed with a retryable storage error
   * (default 3; backoff 100 ms × 4ⁱ, at most 5 s). While the store is
   * unreachable (an outage) the step is retried without limit: a session is
   * held, never failed for an outage.
   */
  storageRetries?: number;
}

interface Waiter {
  resolve(r: SessionResult): void;
  reject(e: unknown): void;
}

/**
 * The in-process session host (Bun, Node, Deno — Web-standard timers only):
 * at most one live {@link TrajectorySession} per key in this process, every
 * operation on a key serialised, a timer per waiting session for its earliest
 * deadline (an awaited tool call's, or the trajectory's own). A session that waits for callbacks is dropped from memory
 * (its state is in storage): only a resolver and a timer remain, and a
 * callback or the timer re-opens it from its checkpoint.
 */
export class SessionHost {
  private readonly opts: SessionHostOptions;
  private readonly timers: HostTimers;
  private readonly chains = new KeyedChain();
  private readonly waiters = new Map<string, Waiter[]>();
  private readonly timeouts = new Map<string, unknown>();
  private closed = false;

  constructor(opts: SessionHostOptions) {
    this.opts = opts;
    this.timers = opts.timers ?? globalTimers;
  }

  /**
   * Starts the session of `input.key` — or resumes it from its checkpoint
   * when one is stored (then `input` is ignored) — and resolves when it has
   * finished, failed or was already done, however many callbacks it waits
   * for in between. `suspend` (partial rollouts carried to the next batch):
   * once it fires no further step is committed and the run rejects with
   * `SessionSuspendedError`; the session stays at its last committed step.
   */
  run(input: SessionInputArg, opts: { suspend?: AbortSignal } = {}): Promise<SessionResult> {
    const key = input.key;
    const p = new Promise<SessionResult>((resolve, reject) => {
      const ws = this.waiters.get(key) ?? [];
      ws.push({ resolve, reject });
      this.waiters.set(key, ws);
    });
    void this.drive(key, input, opts.suspend);
    return p;
  }

  /**
   * Delivers an asynchronous tool result and lets the session go on (in the
   * background; the call returns once the result is committed).
   * @throws NotFoundError (404) for a key without a session; ConflictError (409) for an
   *   unknown or already-answered `call_id`.
   */
  async deliver(key: string, r: ToolResultDelivery): Promise<void> {
    await this.commitResult(key, r);
    void this.drive(key);
  }

  /**
   * Commits an asynchronous tool result into the session's checkpoint
   * (fenced by its step) without continuing the session here: in queue mode
   * the API process only records the result and wakes the worker that runs
   * the session (see {@link wake}), so it needs no engine. A commit that
   * loses the fence to a concurrent step (a worker advancing or expiring the
   * session) is read again and retried.
   * @throws NotFoundError (404) for a key without a session; ConflictError (409) for an
   *   unknown or already-answered `call_id`, or a session not waiting for tools.
   */
  async deliverOnly(key: string, r: ToolResultDelivery): Promise<void> {
    await this.commitResult(key, r);
  }

  /**
   * Continues the session of `key` now, when a caller of {@link run} in this
   * process waits on it: another process committed a tool result for it
   * ({@link deliverOnly}). Its deadline timer is dropped (re-armed if it
   * still waits). Returns false — and does nothing — for keys this host
   * does not run.
   */
  wake(key: string): boolean {
    if (this.closed || !this.waiters.has(key)) return false;
    const old = this.timeouts.get(key);
    if (old !== undefined) {
      this.timers.clear(old);
      this.timeouts.delete(key);
    }
    void this.drive(key);
    return true;
  }

  /** The stored state of a session (phase, step, awaited calls), or null. */
  async status(key: string): Promise<{ phase: string; step: number; loop_state: string; deadline_ms: number | null; awaited: { call_id: string; name: string; deadline_ms: number }[] } | null> {
    return this.serial(key, async () => {
      const s = await TrajectorySession.open(key, this.opts);
      if (!s) return null;
      const cp = s.checkpoint;
      return { phase: cp.phase, step: cp.step, loop_state: cp.loop_state, deadline_ms: cp.deadline_ms, awaited: s.awaitedCalls() };
    });
  }

  /**
   * The stored step of `key` (−1 with no delta; null when absent), read
   * without folding the session (`SessionStorage.stepOf`, else a whole
   * read): what a process waiting on another owner polls.
   */
  async stepOf(key: string): Promise<number | null> {
    const st = this.opts.storage;
    return st.stepOf ? st.stepOf(key) : ((await st.get(key))?.step ?? null);
  }

  /** Commits `done` for a finished session whose records its owner has written. */
  async markDone(key: string): Promise<void> {
    await this.serial(key, async () => {
      const s = await TrajectorySession.open(key, this.opts);
      if (s && s.phase === "finished") await s.markDone();
      else if (s && s.phase === "failed") await s.markDone();
    });
  }

  /** Keys with a caller waiting on {@link run} (live or waiting for callbacks). */
  get pending(): number {
    return this.waiters.size;
  }

  /** Keys with an armed deadline timer. */
  get timed(): number {
    return this.timeouts.size;
  }

  /** Clears every timer; callers still waiting are rejected. */
  close(): void {
    this.closed = true;
    for (const h of this.timeouts.values()) this.timers.clear(h);
    this.timeouts.clear();
    for (const [key, ws] of this.waiters) for (const w of ws) w.reject(new Error(`session host closed while '${key}' was running`));
    this.waiters.clear();
  }

  private async drive(key: string, input?: SessionInputArg, suspend?: AbortSignal): Promise<void> {
    const retries = this.opts.storageRetries ?? 3;
    let raced = 0;
    for (let attempt = 0; ; attempt++) {
      let benign = false;
      try {
        const outcome = await this.serial(key, async () => {
          const s = await TrajectorySession.open(key, suspend ? { ...this.opts, suspend } : this.opts, input);
          if (!s) throw new NotFoundError(`no session '${key.slice(0, 200)}'`, { field: "key" });
          const opened = s.checkpoint;
          try {
            return await s.run();
          } catch (e) {
            // The first commit after awaiting tools has no side effect behind it (no engine or tool
            // call; at most reads of MCP tasks' status and results, which may be read again); when the fence refuses it, another process delivered a tool result meanwhile
            // (deliverOnly), not a second owner: read the session again and go on.
            benign = isStaleStep(e) && opened.loop_state === "awaiting_tools" && s.checkpoint.step === opened.step;
            throw e;
          }
        });
        this.settle(key, outcome);
        return;
      } catch (e) {
        if (benign && raced < 5 && !this.closed) {
          raced++;
          attempt--;
          continue;
        }
        const retryable = (e as { retryable?: unknown }).retryable === true;
        const outage = isStoreOutage(e);
        if (!retryable || (attempt >= retries && !outage) || this.closed) {
          this.fail(key, e);
          return;
        }
        await new Promise((r) => setTimeout(r, Math.min(100 * 4 ** attempt, 5_000)));
      }
    }
  }

  private async commitResult(key: string, r: ToolResultDelivery): Promise<void> {
    for (let attempt = 0; ; attempt++) {
      try {
        await this.serial(key, async () => {
          const s = await TrajectorySession.open(key, this.opts);
          if (!s) throw new NotFoundError(`no session '${key.slice(0, 200)}'`, { field: "key" });
          await s.deliverToolResult(r);
        });
        return;
      } catch (e) {
        // Another process committed a step of this session between the read and the commit: read it again.
        if (!isStaleStep(e) || attempt >= 4) throw e;
      }
    }
  }

  private settle(key: string, outcome: SessionOutcome): void {
    const old = this.timeouts.get(key);
    if (old !== undefined) {
      this.timers.clear(old);
      this.timeouts.delete(key);
    }
    if (outcome.status === "waiting") {
      if (outcome.deadline_ms !== null && !this.closed) {
        const wall = this.opts.wallClockMs ?? Date.now;
        const h = this.timers.set(() => {
          this.timeouts.delete(key);
          void this.drive(key);
        }, Math.max(0, outcome.deadline_ms - wall()));
        this.timeouts.set(key, h);
      }
      return;
    }
    const ws = this.waiters.get(key) ?? [];
    this.waiters.delete(key);
    for (const w of ws) w.resolve(outcome);
  }

  private fail(key: string, e: unknown): void {
    const ws = this.waiters.get(key) ?? [];
    this.waiters.delete(key);
    for (const w of ws) w.reject(e);
  }

  /**
   * Deletes the stored session of `key` (its checkpoint hash: Redis `{p}session:{key}`, or the memory entry),
   * after every earlier operation on it: a trajectory cancelled (a cancelled batch, or surplus of an
   * over-sampled one with `partial_rollout: cancel`) leaves nothing behind. No-op when absent.
   */
  async drop(key: string): Promise<void> {
    await this.serial(key, () => this.opts.storage.delete(key));
  }

  /** Runs `fn` after every earlier operation on `key` (one at a time per key). */
  private serial<T>(key: string, fn: () => Promise<T>): Promise<T> {
    return this.chains.run(key, fn);
  }
}

/** Outputs of a finished {@link SessionResult}, for callers that only accept success. */
export function outputsOf(r: SessionResult): AgentLoopOutput[] | null {
  return r.status === "finished" ? r.outputs : null;
}
