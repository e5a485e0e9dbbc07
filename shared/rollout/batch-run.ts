import { SpanStatusCode } from "@opentelemetry/api";
import { type AgentLoopOutput, type TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import { SpanAttr, withSpan } from "../telemetry/tracer.ts";
import { TracingTransferQueue } from "../telemetry/tracing-transfer-queue.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import { failedRecord, outputOfRecord, toTrajectoryRecord, type BatchPlan, type PlannedTrajectory } from "./batch.ts";
import { isStaleStep } from "../session/session-storage.ts";
import { BatchProgress, errorText, rowErrorText, type BatchFigures } from "./batch-progress.ts";
import { BatchWriter } from "./batch-writes.ts";
import { OversampleGroups } from "./batch-oversample.ts";
import { SurplusCancelledError, TrajectoryCarriedError, BatchCancelledError, TrajectoryAbandonedError, type TrajectoryExecutor, type BatchStats, type BatchRunOptions } from "./batch-types.ts";
export { SurplusCancelledError, TrajectoryCarriedError, BatchCancelledError, TrajectoryAbandonedError, type TrajectoryExecutor, type ExecutorFactory, type BatchStats, type BatchCancellation, type OversampleStats, type BatchCounts, type GroupWriteGate, type BatchRunOptions } from "./batch-types.ts";

/**
 * Runs a planned batch: declares its groups in the transfer queue, runs every
 * trajectory with at most `concurrency` at once, stores each record exactly
 * once (failed ones via `markFailed`, so their group still completes,
 * flagged), and keeps progress figures. A store write is retried with
 * capped backoff: for as long as the store is unreachable (a finished
 * record is held, never failed for an outage), five times for other
 * retryable errors ({@link holdWhileStoreDown}); a failure of one trajectory
 * never stops the batch.
 * The accounting lives in {@link BatchProgress}, the store writes and the
 * repair in {@link BatchWriter}, the group bookkeeping of over-sampled
 * batches in {@link OversampleGroups}; this class schedules trajectories,
 * runs each one, cancels and stops, and counts sessions of external batches.
 */
export class BatchRun {
  readonly plan: BatchPlan;
  private readonly opts: BatchRunOptions;
  private readonly progress: BatchProgress;
  private readonly writer: BatchWriter;
  private readonly groups: OversampleGroups;
  private readonly waiters = new Set<() => void>();
  /** The progress figures (mutated in place; {@link stats} snapshots them). */
  private readonly s: BatchFigures;
  private readonly queue: TransferQueue;
  private donePromise: Promise<void> | null = null;
  private readonly seen = new Set<string>();
  private allObserved: (() => void) | null = null;
  /** Trajectories given up because another owner took them over (nothing stored for them here). */
  abandoned = 0;
  /** Set by {@link cancel}: epoch ms. */
  private cancelledAt: number | null = null;
  /** Sessions stopped by the cancel so far. */
  private stoppedSessions = 0;
  /** The abort controller of each running trajectory (by key). */
  private readonly controllers = new Map<string, AbortController>();
  /** Trajectories waiting for a worker, and workers waiting for a replacement row. */
  private readonly runQueue: PlannedTrajectory[] = [];
  private readonly queueWaiters = new Set<() => void>();
  /** Trajectories inside their loop or store writes now. */
  private active = 0;
  /** Set once `target_groups` were delivered: how the rest is stopped. */
  private stopMode: "cancel" | "carry" | null = null;
  /** External over-sampled batches: session keys stopped as surplus (counted once). */
  private readonly surplusSeen = new Set<string>();
  /**
   * Why the batch ended early (e.g. its groups could not be registered in
   * the store), or null. A failed batch is done: {@link run} rejects with
   * this error and {@link stream} throws it after the records it has.
   */
  failure: Error | null = null;

  constructor(plan: BatchPlan, opts: BatchRunOptions) {
    this.plan = plan;
    this.opts = opts;
    this.queue = new TracingTransferQueue(opts.store);
    this.progress = new BatchProgress(plan, opts.startedAt ?? (opts.now ?? Date.now)());
    this.s = this.progress.s;
    this.writer = new BatchWriter(this.queue, this.progress);
    this.groups = new OversampleGroups(
      {
        plan,
        queue: this.queue,
        progress: this.progress,
        reusedUids: opts.reusedUids,
        stopMode: () => this.stopMode,
        cancelled: () => this.cancelledAt !== null,
        reached: () => this.stopSurplus(),
        enqueue: (ts) => {
          this.runQueue.push(...ts);
          this.wakeQueue();
        },
      },
      opts.external === true,
    );
  }

  /** Starts the batch (once) and resolves when every trajectory is stored. */
  run(): Promise<void> {
    if (this.opts.external) {
      this.donePromise ??= this.s.done ? Promise.resolve() : new Promise<void>((resolve) => (this.allObserved = resolve));
      return this.donePromise;
    }
    this.donePromise ??= this.execute();
    return this.donePromise;
  }

  /**
   * Counts a session finished in another process (external batches) with
   * its records (0…k, ordered by output_index): progress, metrics and the
   * NDJSON stream see them as if this run had produced them. `handedBack`:
   * the session had finished before this batch, so its records are streamed
   * but not counted again. Returns false for a session already counted
   * (completion events are at-least-once). The batch is done once every
   * session is counted.
   */
  observeSession(key: string, records: readonly TrajectoryRecord[], opts: { handedBack?: boolean } = {}): boolean {
    if (this.seen.has(key) || this.s.done || this.cancelledAt !== null) return false;
    this.seen.add(key);
    if (records.length === 0) this.writer.emptySessions.add(key);
    if (this.s.counts.pending > 0) this.s.counts.pending--;
    else if (this.s.counts.running > 0) this.s.counts.running--;
    this.sessionDone(records, opts.handedBack === true);
    // An over-sampled batch ends when its follower settles it ({@link settleExternal}), not when every key is counted.
    if (!this.plan.oversample && this.s.counts.finished + (this.s.lost?.count ?? 0) >= this.s.counts.total) this.finishExternal();
    this.wake();
    return true;
  }

  /**
   * Counts a session of an external over-sampled batch that a worker stopped
   * as surplus (`running`: it was inside its loop; else never started):
   * nothing stored for it. Returns false for a key already counted
   * (events are at-least-once).
   */
  observeSurplus(key: string, running: boolean): boolean {
    if (this.seen.has(key) || this.s.done || this.cancelledAt !== null || !this.s.oversample) return false;
    this.seen.add(key);
    this.surplusSeen.add(key);
    if (this.s.counts.pending > 0) this.s.counts.pending--;
    else if (this.s.counts.running > 0) this.s.counts.running--;
    const o = this.s.oversample;
    if (this.plan.oversample!.partial_rollout === "carry") o.carried++;
    else o.cancelled++;
    if (running) o.interrupted++;
    this.wake();
    return true;
  }

  /**
   * The cross-process figures of an external over-sampled batch, as the job
   * queue's batch hash holds them (delivered, filtered, replacements,
   * reached), and the reserve rows started so far (row order; registered
   * as launched).
   */
  setOversampleProgress(p: { delivered: number; filtered: number; replacements: number; reached: boolean; launched: readonly string[] }): void {
    const o = this.s.oversample;
    if (!o || this.s.done) return;
    o.delivered = p.delivered;
    o.filtered = p.filtered;
    o.replacements = p.replacements;
    o.reached = p.reached;
    this.groups.markLaunched(p.launched);
  }

  /**
   * Session keys of an external batch still to be counted: of an
   * over-sampled batch, only those of started groups (eager rows and
   * replacements; the reserve is not waited for).
   */
  openKeys(): string[] {
    const os = this.plan.oversample;
    return this.plan.trajectories.filter((t) => !this.seen.has(t.key) && (!os || this.groups.isLaunched(t.uid))).map((t) => t.key);
  }

  /** uids of the started groups of an over-sampled batch (eager rows, then replacements in launch order). */
  launchedUids(): string[] {
    return this.groups.launchedUids();
  }

  /**
   * Ends an external over-sampled batch once every session of its started
   * groups is counted: the reserve rows never started leave `pending`
   * (`unused_*`), and the groups left incomplete are reported withdrawn
   * (`cancel`) or carried (`carry`), as the follower settled them in the
   * store (once per batch: see `JobQueue.settleOversample`).
   */
  settleExternal(st: { groups_withdrawn: number; groups_carried: number; unused_groups: number; unused_sessions: number }): void {
    const o = this.s.oversample;
    if (!o || this.s.done) return;
    Object.assign(o, st);
    this.finishExternal();
    this.wake();
  }

  private finishExternal(): void {
    this.s.counts.running = 0;
    this.s.counts.pending = 0;
    this.s.done = true;
    this.s.finished_at = (this.opts.now ?? Date.now)();
    this.allObserved?.();
    this.donePromise ??= Promise.resolve();
  }

  /**
   * Reports trajectories of an external batch as lost (they will never be
   * counted): progress lists them under `lost`, and the batch is done once
   * every key is counted or lost. Keys already counted or reported are
   * ignored; a lost key's record arriving later is not counted.
   */
  markLost(keys: readonly string[], missing: readonly string[], reason: string): void {
    const fresh = keys.filter((k) => !this.seen.has(k));
    if ((fresh.length === 0 && missing.length === 0) || this.s.done) return;
    for (const k of fresh) this.seen.add(k);
    const l = (this.s.lost ??= { count: 0, keys: [], missing: [], reason });
    l.count += fresh.length;
    l.keys.push(...fresh.slice(0, Math.max(0, 1000 - l.keys.length)));
    for (const m of missing) if (!l.missing.includes(m) && l.missing.length < 1000) l.missing.push(m);
    const open = this.s.counts.total - this.s.counts.finished - l.count;
    this.s.counts.pending = Math.max(0, Math.min(this.s.counts.pending, open));
    this.s.counts.running = Math.max(0, open - this.s.counts.pending);
    if (open <= 0) this.finishExternal();
    this.wake();
  }

  /** Sets how many of the uncounted sessions are running elsewhere (external batches; the rest are pending). */
  setRunning(n: number): void {
    if (this.s.done) return;
    const open = this.s.counts.total - this.s.counts.finished - (this.s.lost?.count ?? 0) - this.surplusSeen.size;
    this.s.counts.running = Math.max(0, Math.min(n, open));
    this.s.counts.pending = open - this.s.counts.running;
  }

  /** Whether {@link cancel} was called. */
  get isCancelled(): boolean {
    return this.cancelledAt !== null;
  }

  /**
   * Cancels the batch: trajectories not started never start; running ones
   * are aborted through their loop's signal (engine requests, tool calls,
   * an admission hold); nothing more is stored by this run (a write already
   * under way completes). {@link run} resolves once every running
   * trajectory has returned. External batches: marks the uncounted sessions
   * stopped and the batch done at once (workers learn of it from the job
   * queue). Returns false when the batch was already done or cancelled.
   * The caller then withdraws the groups ({@link setCancellation}).
   */
  cancel(): boolean {
    if (this.s.done || this.cancelledAt !== null) return false;
    this.cancelledAt = (this.opts.now ?? Date.now)();
    const reason = new BatchCancelledError(`batch ${this.plan.batch_id} was cancelled`);
    for (const c of this.controllers.values()) c.abort(reason);
    if (this.opts.external) {
      this.stoppedSessions = this.s.counts.total - this.s.counts.finished - (this.s.lost?.count ?? 0);
      this.s.cancelled = { at: this.cancelledAt, sessions: this.stoppedSessions, groups_withdrawn: 0, groups_complete: 0 };
      this.finishExternal();
      this.wake();
    }
    return true;
  }

  /** Records what the cancel did to the batch's groups (and the final count of stopped sessions). */
  setCancellation(groups: { withdrawn: number; complete: number }): void {
    if (this.cancelledAt === null) return;
    this.s.cancelled = { at: this.cancelledAt, sessions: this.stoppedSessions, groups_withdrawn: groups.withdrawn, groups_complete: groups.complete };
  }

  /** Session keys (`{uid}_{session_id}_0`) counted so far (external batches). */
  observedKeys(): ReadonlySet<string> {
    return this.seen;
  }

  /** A snapshot of the progress figures and metrics. */
  stats(): BatchStats {
    return this.progress.snapshot();
  }

  /** Records stored so far, in completion order. */
  records(): readonly TrajectoryRecord[] {
    return this.progress.finished;
  }

  /**
   * Every record of the batch as it finishes: first those already stored,
   * then live ones, until the batch is done.
   * @throws the batch's {@link failure} once the records it has are yielded, when it failed.
   */
  async *stream(): AsyncGenerator<TrajectoryRecord> {
    let i = 0;
    for (;;) {
      while (i < this.progress.finished.length) yield this.progress.finished[i++]!;
      if (this.failure) throw this.failure;
      if (this.s.done) return;
      await new Promise<void>((resolve) => this.waiters.add(resolve));
    }
  }

  /** Runs the batch; whatever happens, it ends done (a failure kept in {@link failure}) and wakes every stream. */
  private async execute(): Promise<void> {
    try {
      const mode = this.plan.validate ? "val" : "train";
      const os = this.plan.oversample;
      if (os) await this.groups.prepare();
      for (const [uid, n] of this.plan.groups) {
        if (os && !this.groups.isLaunched(uid)) continue;
        await holdWhileStoreDown(() => this.queue.expectGroup(uid, n, mode, this.plan.fingerprints?.get(uid)));
      }
      const queue = this.runQueue;
      queue.push(...this.plan.trajectories.filter((t) => !os || this.groups.isLaunched(t.uid)));
      const worker = async () => {
        for (;;) {
          const t = queue.shift();
          if (t) {
            await this.runOne(t);
            continue;
          }
          // A filtered group may still start a reserve row: wait while trajectories run and reserve remains.
          if (!os || this.active === 0 || this.stopMode !== null || this.groups.reserveLeft === 0) break;
          await new Promise<void>((r) => this.queueWaiters.add(r));
        }
      };
      await Promise.all(Array.from({ length: Math.min(this.opts.concurrency, this.plan.trajectories.length) }, worker));
      if (os) await this.groups.settle();
      if (this.cancelledAt !== null) {
        this.s.cancelled = { ...(this.s.cancelled ?? { groups_withdrawn: 0, groups_complete: 0 }), at: this.cancelledAt, sessions: this.stoppedSessions };
        return;
      }
      const { incomplete } = await this.repairStore();
      if (incomplete.length) {
        const keys = this.plan.trajectories.filter((t) => incomplete.includes(t.uid)).map((t) => t.key);
        this.s.lost = { count: keys.length, keys: keys.slice(0, 1000), missing: incomplete.slice(0, 1000).map((u) => `group:${u}`), reason: "the store lost data while the batch ran and these groups could not be completed again" };
      }
    } catch (e) {
      this.failure = e instanceof Error ? e : new Error(String(e));
      this.progress.error("(batch)", `batch failed: ${errorText(e)}`);
      throw this.failure;
    } finally {
      this.s.done = true;
      this.s.finished_at = (this.opts.now ?? Date.now)();
      this.wake();
    }
  }

  /** Runs one trajectory (session) inside its `agent_loop.run` span (the parent of its turns, reward and `queue.put`). */
  private async runOne(t: PlannedTrajectory): Promise<void> {
    // A session that will run takes a slot of the process's admission first (shared with its other batches); it
    // stays pending meanwhile, and a cancel or stop while it waits is seen once it has the slot.
    const release = this.opts.admission && this.cancelledAt === null && this.stopMode === null && !this.groups.preFinishedOf(t.key) ? await this.opts.admission.acquire() : null;
    try {
      this.s.counts.pending--;
      if (this.cancelledAt !== null) {
        this.stoppedSessions++;
        return;
      }
      if (this.stopMode !== null) {
        this.groups.surplus(t, false);
        return;
      }
      const pre = this.groups.preFinishedOf(t.key);
      if (pre) {
        this.sessionDone(pre, true);
        this.wake();
        return;
      }
      this.s.counts.running++;
      this.active++;
      try {
        await this.runOneInner(t);
      } finally {
        this.active--;
        this.wakeQueue();
      }
    } finally {
      release?.();
    }
  }

  private async runOneInner(t: PlannedTrajectory): Promise<void> {
    if (this.opts.reusedUids?.has(t.uid)) {
      const before = await holdWhileStoreDown(() => this.queue.sessionRecords(t.uid, t.session_id)).catch(() => null);
      if (before) {
        this.s.counts.running--;
        this.sessionDone(before, true);
        this.wake();
        return;
      }
    }
    const attrs = { [SpanAttr.key]: t.key, [SpanAttr.uid]: t.uid, [SpanAttr.sessionId]: t.session_id, [SpanAttr.batchId]: this.plan.batch_id };
    const ctrl = new AbortController();
    this.controllers.set(t.key, ctrl);
    const stored = await withSpan("agent_loop.run", attrs, async (span) => {
      let records: TrajectoryRecord[];
      let abandoned = false;
      let agentName = t.row ? this.opts.executor.agentNameFor(t) : "unknown";
      try {
        if (t.row_error) throw new Error(t.row_error);
        const res = await this.runContested(t, ctrl.signal).catch((e: unknown) => {
          if (e instanceof TrajectoryAbandonedError) abandoned = true;
          throw e;
        });
        agentName = res.agentName;
        if (res.toolLatenciesMs?.length) this.progress.metrics.addToolLatencies(res.toolLatenciesMs.map((ms) => ms / 1000));
        records = res.outputs.map((o, i) => toTrajectoryRecord(t, agentName, o, this.opts.rollout, i, this.opts.model));
      } catch (e) {
        records = [failedRecord(t, agentName, rowErrorText(e, t.row_index), this.opts.model)];
      }
      if (abandoned) {
        this.abandoned++;
        return null;
      }
      // Cancelled: whatever the loop returned (an abort, an error) is not stored.
      if (this.cancelledAt !== null) return "cancelled" as const;
      // Over the target (or stopped since): nothing stored; a group-completing write reserves its delivery first.
      if (this.stopMode !== null) return "surplus" as const;
      const gate = this.opts.groupGate;
      const admitted = gate ? await gate.admit(t, records) : await this.groups.admit(t, records);
      if (!admitted) return "surplus" as const;
      span.setAttribute(SpanAttr.agentName, agentName);
      const r0 = records[0];
      if (r0 && span.isRecording()) {
        span.setAttribute(SpanAttr.numTurns, r0.num_turns);
        span.setAttribute(SpanAttr.truncated, r0.truncated);
        span.setAttribute(SpanAttr.finishReason, r0.finish_reason);
        span.setAttribute(SpanAttr.responseTokens, r0.response_ids.length);
        if (r0.reward_score !== null) span.setAttribute(SpanAttr.reward, r0.reward_score);
        if (r0.error !== null) span.setStatus({ code: SpanStatusCode.ERROR, message: r0.error.slice(0, 500) });
      }
      if (records.length === 0) await this.writer.finishEmpty(t);
      const out: TrajectoryRecord[] = [];
      let fresh = records.length === 0;
      for (let i = 0; i < records.length; i++) {
        if (this.cancelledAt !== null && i > 0) break;
        const w = await this.writer.store(records[i]!, i === records.length - 1);
        out.push(w.record);
        fresh ||= w.stored;
      }
      if (gate) await gate.settled(t, !out.some((r) => this.writer.unstored.has(r.key)));
      return { out, fresh };
    }).finally(() => this.controllers.delete(t.key));
    this.s.counts.running--;
    if (stored === "surplus") {
      this.groups.surplus(t, true);
      // Cancelled surplus leaves nothing; carried surplus keeps its checkpoint (a worker's run, which knows no mode, leaves it to the worker).
      if ((this.stopMode ?? this.plan.oversample?.partial_rollout) === "cancel") await this.discard(t);
      this.wake();
      return;
    }
    if (stored === "cancelled") {
      this.stoppedSessions++;
      await this.discard(t);
      this.wake();
      return;
    }
    if (stored && this.plan.oversample) this.groups.sessionDone(t, stored.out);
    // Every write found its key already stored: another batch (the same uid posted twice, a retried POST)
    // finished this session first. Its records are streamed but, as handed-back ones, not counted again.
    if (stored) this.sessionDone(stored.out, !stored.fresh);
    this.wake();
  }

  /**
   * Runs `t` with the executor; when another owner holds its session (the
   * fence refused a commit: N3, two inline processes on one prefix), waits
   * for that owner's records and returns them as this run's outputs — their
   * writes then find every key stored, so the session counts as handed back
   * (`reused`), never as a failure — or resumes the session once its owner
   * stalled (at most 3 times).
   */
  private async runContested(t: PlannedTrajectory, signal: AbortSignal): Promise<{ agentName: string; outputs: AgentLoopOutput[]; toolLatenciesMs?: number[] }> {
    const ex = this.opts.executor;
    for (let takeovers = 0; ; takeovers++) {
      try {
        return await ex.run(t, this.plan, signal);
      } catch (e) {
        if (!isStaleStep(e) || !ex.awaitOwner || takeovers >= 3 || signal.aborted) throw e;
        const recs = await ex.awaitOwner(t, signal);
        if (recs) {
          const failed = recs.find((r) => r.error !== null);
          // The other owner stored a failure: that is the session's outcome (handed back as stored).
          if (failed) throw new Error(failed.error!);
          return { agentName: recs[0]?.agent_name ?? ex.agentNameFor(t), outputs: recs.map(outputOfRecord) };
        }
      }
    }
  }

  /** `target_groups` delivered: aborts (cancel) or suspends (carry) every running trajectory; queued ones will not start. */
  private stopSurplus(): void {
    const os = this.plan.oversample!;
    this.stop(os.partial_rollout, os.target_groups);
  }

  /**
   * Stops the batch's surplus (its over-sampled batch reached
   * `target_groups`, here or — for a worker's one-trajectory run — in
   * another process): running trajectories are aborted (`cancel`:
   * {@link SurplusCancelledError}) or suspended at their last checkpoint
   * (`carry`: {@link TrajectoryCarriedError}); queued ones do not start;
   * nothing more is stored except writes already admitted. Idempotent.
   */
  stop(mode: "cancel" | "carry", target?: number): void {
    if (this.stopMode !== null) return;
    this.stopMode = mode;
    if (this.s.oversample) this.s.oversample.reached = true;
    const msg = `batch ${this.plan.batch_id} delivered its ${target ?? this.plan.oversample?.target_groups ?? ""} target groups`;
    const reason = this.stopMode === "carry" ? new TrajectoryCarriedError(`${msg}: carried to the next batch`) : new SurplusCancelledError(`${msg}: surplus cancelled`);
    for (const c of this.controllers.values()) c.abort(reason);
    this.wakeQueue();
  }

  /**
   * Sessions this run stopped as surplus (nothing stored for them), and of
   * them those that were running: what a worker reports for its job.
   */
  get surplusOutcome(): { sessions: number; interrupted: number } {
    return this.groups.surplusOutcome;
  }

  private wakeQueue(): void {
    const ws = [...this.queueWaiters];
    this.queueWaiters.clear();
    for (const w of ws) w();
  }

  /** Drops a stopped trajectory's durable state (see {@link TrajectoryExecutor.discard}); a failure only costs a stale checkpoint that expires. */
  private async discard(t: PlannedTrajectory): Promise<void> {
    await this.opts.executor.discard?.(t).catch(() => {});
  }

  /**
   * Puts back what the store lost of this batch (a Redis restart without
   * persistence, eviction, FLUSHALL while it ran): every group of the batch
   * that is not complete in the store is registered again when its
   * registration is gone, and every record this run holds for it is written
   * again (put-once: records still stored are left alone; each session's
   * last output flagged, sessions without output finished again), so a group
   * whose sessions all finished here completes and reaches the trainer.
   * Cheap when nothing was lost: one status read per group. Called at the
   * end of an in-process batch (groups still incomplete then are reported in
   * `lost`), and by the follower of a queued batch once the store is found
   * to have lost its data (it names what stays incomplete).
   * @returns groups completed again, records written again, and the uids of groups still incomplete.
   */
  repairStore(): Promise<{ groups: number; records: number; incomplete: string[] }> {
    // An over-sampled batch repairs the groups it started and left to complete (not the reserve, withdrawn or carried ones).
    const groups = [...this.plan.groups].filter(([uid]) => !this.plan.oversample || this.groups.repairable(uid));
    return this.writer.repair(this.plan, groups, this.progress.finished);
  }

  /** Counts a finished session and its records (`handedBack`: streamed, not counted again), and publishes the records. */
  private sessionDone(records: readonly TrajectoryRecord[], handedBack: boolean): void {
    this.progress.sessionDone(records, handedBack, this.opts.onRecord);
  }

  private wake(): void {
    const ws = [...this.waiters];
    this.waiters.clear();
    for (const w of ws) w();
  }
}
