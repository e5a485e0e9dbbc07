import { SpanStatusCode } from "@opentelemetry/api";
import { InputError } from "../errors.ts";
import { parseTrajectoryKey, type AgentLoopOutput, type TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import { BatchMetricsAccumulator, type BatchMetrics } from "../telemetry/batch-metrics.ts";
import { SpanAttr, withSpan } from "../telemetry/tracer.ts";
import { TracingTransferQueue } from "../telemetry/tracing-transfer-queue.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import { failedRecord, outputOfRecord, toTrajectoryRecord, type BatchPlan, type PlannedTrajectory } from "./batch.ts";
import { isStaleStep } from "../session/session-storage.ts";
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
 */
export class BatchRun {
  readonly plan: BatchPlan;
  private readonly opts: BatchRunOptions;
  private readonly finished: TrajectoryRecord[] = [];
  private readonly waiters = new Set<() => void>();
  private readonly s: Omit<BatchStats, keyof BatchMetrics>;
  private readonly metrics = new BatchMetricsAccumulator();
  private readonly queue: TransferQueue;
  private rewardSum = 0;
  private donePromise: Promise<void> | null = null;
  private readonly seen = new Set<string>();
  /** Keys of sessions that finished with no output (a store repair finishes them again). */
  private readonly emptySessions = new Set<string>();
  /** Keys whose write failed (held in memory with a "transfer queue write failed" error; a rerun writes them, a repair must not). */
  private readonly unstored = new Set<string>();
  private allObserved: (() => void) | null = null;
  /** Trajectories given up because another owner took them over (nothing stored for them here). */
  abandoned = 0;
  /** Set by {@link cancel}: epoch ms. */
  private cancelledAt: number | null = null;
  /** Sessions stopped by the cancel so far. */
  private stoppedSessions = 0;
  /** The abort controller of each running trajectory (by key). */
  private readonly controllers = new Map<string, AbortController>();
  /** Over-sampling: uids started (their groups registered), the reserve's uids not started yet (row order). */
  private readonly launched = new Set<string>();
  private reserve: string[] = [];
  /** Trajectories waiting for a worker, and workers waiting for a replacement row. */
  private readonly runQueue: PlannedTrajectory[] = [];
  private readonly queueWaiters = new Set<() => void>();
  /** Trajectories inside their loop or store writes now. */
  private active = 0;
  /** Set once `target_groups` were delivered: how the rest is stopped. */
  private stopMode: "cancel" | "carry" | null = null;
  /** Groups left incomplete by the stop (withdrawn or carried). */
  private readonly stoppedGroups = new Set<string>();
  /** Sessions of re-posted uids found finished before the batch ran (handed back, already counted in the group tracking). */
  private readonly preFinished = new Map<string, TrajectoryRecord[]>();
  /** Per uid: sessions finished and their records (over-sampled batches). */
  private readonly groupDone = new Map<string, number>();
  private readonly groupRecords = new Map<string, TrajectoryRecord[]>();
  /**
   * Sessions of each group admitted to write (counted when admitted, before
   * their writes finish) and their records: the session that completes the
   * count is its group's last, even when two finish at once and an earlier
   * one's write is still in flight (counting stored sessions instead let both
   * pass as "not the last" and complete a group past `target_groups`).
   */
  private readonly groupAdmitted = new Map<string, number>();
  private readonly groupAdmittedRecords = new Map<string, TrajectoryRecord[]>();
  private readonly filteredUids = new Set<string>();
  /** Group-completing writes admitted but not finished yet (they count toward the target). */
  private readonly completing = new Set<string>();
  /** Sessions this run stopped as surplus (any batch, over-sampled or gated) and how many of them were running. */
  private readonly surplusOut = { sessions: 0, interrupted: 0 };
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
      started_at: opts.startedAt ?? (opts.now ?? Date.now)(),
      finished_at: null,
    };
    if (opts.external && plan.oversample) {
      const uids = [...plan.groups.keys()];
      for (const u of uids.slice(0, plan.oversample.eager_rows)) this.launched.add(u);
      this.reserve = uids.slice(plan.oversample.eager_rows);
    }
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
    if (records.length === 0) this.emptySessions.add(key);
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
    for (const u of p.launched) {
      if (this.launched.has(u)) continue;
      this.launched.add(u);
      this.reserve = this.reserve.filter((x) => x !== u);
    }
  }

  /**
   * Session keys of an external batch still to be counted: of an
   * over-sampled batch, only those of started groups (eager rows and
   * replacements; the reserve is not waited for).
   */
  openKeys(): string[] {
    const os = this.plan.oversample;
    return this.plan.trajectories.filter((t) => !this.seen.has(t.key) && (!os || this.launched.has(t.uid))).map((t) => t.key);
  }

  /** uids of the started groups of an over-sampled batch (eager rows, then replacements in launch order). */
  launchedUids(): string[] {
    return [...this.launched];
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
    return { ...structuredClone(this.s), ...this.metrics.snapshot() };
  }

  /** Records stored so far, in completion order. */
  records(): readonly TrajectoryRecord[] {
    return this.finished;
  }

  /**
   * Every record of the batch as it finishes: first those already stored,
   * then live ones, until the batch is done.
   * @throws the batch's {@link failure} once the records it has are yielded, when it failed.
   */
  async *stream(): AsyncGenerator<TrajectoryRecord> {
    let i = 0;
    for (;;) {
      while (i < this.finished.length) yield this.finished[i++]!;
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
      if (os) await this.prepareOversample(os.eager_rows);
      for (const [uid, n] of this.plan.groups) {
        if (os && !this.launched.has(uid)) continue;
        await holdWhileStoreDown(() => this.queue.expectGroup(uid, n, mode, this.plan.fingerprints?.get(uid)));
      }
      const queue = this.runQueue;
      queue.push(...this.plan.trajectories.filter((t) => !os || this.launched.has(t.uid)));
      const worker = async () => {
        for (;;) {
          const t = queue.shift();
          if (t) {
            await this.runOne(t);
            continue;
          }
          // A filtered group may still start a reserve row: wait while trajectories run and reserve remains.
          if (!os || this.active === 0 || this.stopMode !== null || this.reserve.length === 0) break;
          await new Promise<void>((r) => this.queueWaiters.add(r));
        }
      };
      await Promise.all(Array.from({ length: Math.min(this.opts.concurrency, this.plan.trajectories.length) }, worker));
      if (os) await this.settleOversample();
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
      if (this.s.errors.length < 50) this.s.errors.push({ key: "(batch)", error: `batch failed: ${errorText(e)}` });
      throw this.failure;
    } finally {
      this.s.done = true;
      this.s.finished_at = (this.opts.now ?? Date.now)();
      this.wake();
    }
  }

  /** Runs one trajectory (session) inside its `agent_loop.run` span (the parent of its turns, reward and `queue.put`). */
  private async runOne(t: PlannedTrajectory): Promise<void> {
    this.s.counts.pending--;
    if (this.cancelledAt !== null) {
      this.stoppedSessions++;
      return;
    }
    if (this.stopMode !== null) {
      this.surplus(t, false);
      return;
    }
    const pre = this.preFinished.get(t.key);
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
        if (res.toolLatenciesMs?.length) this.metrics.addToolLatencies(res.toolLatenciesMs.map((ms) => ms / 1000));
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
      const admitted = gate ? await gate.admit(t, records) : await this.admitGroupWrite(t, records);
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
      if (records.length === 0) await this.finishEmpty(t);
      const out: TrajectoryRecord[] = [];
      let fresh = records.length === 0;
      for (let i = 0; i < records.length; i++) {
        if (this.cancelledAt !== null && i > 0) break;
        const w = await this.store(records[i]!, i === records.length - 1);
        out.push(w.record);
        fresh ||= w.stored;
      }
      if (gate) await gate.settled(t, !out.some((r) => this.unstored.has(r.key)));
      return { out, fresh };
    }).finally(() => this.controllers.delete(t.key));
    this.s.counts.running--;
    if (stored === "surplus") {
      this.surplus(t, true);
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
    if (stored && this.plan.oversample) this.groupSessionDone(t, stored.out);
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

  /**
   * Over-sampled batch set-up: the first `eager` rows are launched, the rest
   * kept as reserve; sessions of re-posted uids that already finished (a
   * carried group's) are read back so the group tracking starts from what
   * the store holds.
   */
  private async prepareOversample(eager: number): Promise<void> {
    const uids = [...this.plan.groups.keys()];
    for (const u of uids.slice(0, eager)) this.launched.add(u);
    this.reserve = uids.slice(eager);
    const reused = this.opts.reusedUids;
    if (!reused?.size) return;
    for (const t of this.plan.trajectories) {
      if (!reused.has(t.uid) || !this.launched.has(t.uid)) continue;
      const recs = await holdWhileStoreDown(() => this.queue.sessionRecords(t.uid, t.session_id));
      if (!recs) continue;
      this.preFinished.set(t.key, recs);
      this.groupDone.set(t.uid, (this.groupDone.get(t.uid) ?? 0) + 1);
      this.groupRecords.set(t.uid, [...(this.groupRecords.get(t.uid) ?? []), ...recs]);
      this.groupAdmitted.set(t.uid, (this.groupAdmitted.get(t.uid) ?? 0) + 1);
      this.groupAdmittedRecords.set(t.uid, [...(this.groupAdmittedRecords.get(t.uid) ?? []), ...recs]);
    }
    const o = this.s.oversample!;
    for (const uid of reused) {
      if (!this.launched.has(uid) || (this.groupDone.get(uid) ?? 0) < this.plan.groups.get(uid)!) continue;
      const st = await holdWhileStoreDown(() => this.queue.groupStatus(uid));
      if (st.filtered) {
        this.filteredUids.add(uid);
        o.filtered++;
      } else o.delivered++;
    }
    if (o.delivered >= o.target_groups) this.stopSurplus();
  }

  /**
   * Decides the write of a finished session of an over-sampled batch. A
   * session that is not its group's last is written. The last one: with
   * `filter_groups`, a group whose rewards are all equal is flagged filtered
   * in the store first (never delivered) and a reserve row is started in
   * its place; otherwise the write is admitted only while delivered plus
   * in-flight completions stay under `target_groups` (so exactly the target
   * is delivered). Returns false: surplus, store nothing.
   */
  private async admitGroupWrite(t: PlannedTrajectory, records: readonly TrajectoryRecord[]): Promise<boolean> {
    const os = this.plan.oversample;
    if (!os) return true;
    // Decided synchronously (no await before the count): a concurrent finisher of the same group sees this one.
    const admitted = this.groupAdmitted.get(t.uid) ?? 0;
    const all = [...(this.groupAdmittedRecords.get(t.uid) ?? []), ...records];
    const admit = () => {
      this.groupAdmitted.set(t.uid, admitted + 1);
      this.groupAdmittedRecords.set(t.uid, all);
      return true;
    };
    if (admitted + 1 < t.group_size) return admit();
    const first = all[0]?.reward_score ?? null;
    if (os.filter && first !== null && all.every((r) => r.error === null && r.reward_score === first)) {
      admit();
      const filter = this.queue.filterGroup ? await holdWhileStoreDown(() => this.queue.filterGroup!(t.uid, `reward all_equal ${first}`)) : false;
      if (filter) {
        this.filteredUids.add(t.uid);
        this.s.oversample!.filtered++;
        await this.launchReserve();
        return true;
      }
      // Not filtered after all (the store cannot, or the group was already delivered): a delivery slot as any group.
      const o = this.s.oversample!;
      if (o.delivered + this.completing.size >= o.target_groups) {
        this.groupAdmitted.set(t.uid, admitted);
        this.groupAdmittedRecords.set(t.uid, all.slice(0, all.length - records.length));
        return false;
      }
      this.completing.add(t.uid);
      return true;
    }
    const o = this.s.oversample!;
    if (o.delivered + this.completing.size >= o.target_groups) return false;
    this.completing.add(t.uid);
    return admit();
  }

  /** Starts the next reserve row (registers its group, queues its sessions) unless the batch is stopping. */
  private async launchReserve(): Promise<void> {
    if (this.stopMode !== null || this.cancelledAt !== null) return;
    const uid = this.reserve.shift();
    if (uid === undefined) return;
    this.launched.add(uid);
    this.s.oversample!.replacements++;
    const mode = this.plan.validate ? "val" : "train";
    await holdWhileStoreDown(() => this.queue.expectGroup(uid, this.plan.groups.get(uid)!, mode, this.plan.fingerprints?.get(uid)));
    this.runQueue.push(...this.plan.trajectories.filter((x) => x.uid === uid));
    this.wakeQueue();
  }

  /** Counts a stored session of an over-sampled batch toward its group; a delivered group that reaches the target stops the rest. */
  private groupSessionDone(t: PlannedTrajectory, out: readonly TrajectoryRecord[]): void {
    const n = (this.groupDone.get(t.uid) ?? 0) + 1;
    this.groupDone.set(t.uid, n);
    this.groupRecords.set(t.uid, [...(this.groupRecords.get(t.uid) ?? []), ...out]);
    if (n < t.group_size || this.filteredUids.has(t.uid)) return;
    this.completing.delete(t.uid);
    const o = this.s.oversample!;
    o.delivered++;
    if (o.delivered >= o.target_groups) this.stopSurplus();
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
    return { ...this.surplusOut };
  }

  /** A session stopped by over-sampling (`running`: it was inside its loop): nothing stored for it. */
  private surplus(t: PlannedTrajectory, running: boolean): void {
    this.surplusOut.sessions++;
    if (running) this.surplusOut.interrupted++;
    const o = this.s.oversample;
    if (!o) return;
    if (this.plan.oversample!.partial_rollout === "carry") o.carried++;
    else o.cancelled++;
    if (running) o.interrupted++;
    this.stoppedGroups.add(t.uid);
  }

  /**
   * End of an over-sampled batch: unused reserve rows leave `pending`; the
   * started groups left incomplete are withdrawn (`cancel`: never delivered,
   * later writes refused) or left open for the next batch (`carry`).
   */
  private async settleOversample(): Promise<void> {
    const o = this.s.oversample!;
    o.unused_groups = this.reserve.length;
    o.unused_sessions = this.reserve.reduce((n, u) => n + this.plan.groups.get(u)!, 0);
    this.s.counts.pending -= o.unused_sessions;
    if (this.stopMode === null) return;
    const open = [...this.launched].filter((u) => (this.groupDone.get(u) ?? 0) < this.plan.groups.get(u)!);
    for (const u of open) this.stoppedGroups.add(u);
    if (!open.length) return;
    if (this.stopMode === "carry") {
      o.groups_carried = open.length;
      return;
    }
    if (!this.queue.cancelGroups) {
      if (this.s.errors.length < 50) this.s.errors.push({ key: "(batch)", error: "this store cannot withdraw the surplus groups (no cancelGroups)" });
      return;
    }
    const res = await holdWhileStoreDown(() => this.queue.cancelGroups!(open));
    o.groups_withdrawn = res.withdrawn.length;
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

  /** A loop that returned no output: its session is finished with none (the group does not wait for it). */
  private async finishEmpty(t: PlannedTrajectory): Promise<void> {
    this.emptySessions.add(t.key);
    try {
      await holdWhileStoreDown(() => this.queue.finishSession(t.uid, t.session_id, 0));
    } catch (e) {
      if (this.s.errors.length < 50) this.s.errors.push({ key: t.key, error: `transfer queue write failed: ${errorText(e)}` });
    }
  }

  /**
   * Writes one record (`last`: its session's last output) with retries;
   * returns it as counted (with `error` set when the write failed) and
   * whether this write stored it (false: the key was already written).
   */
  private async store(r: TrajectoryRecord, last: boolean): Promise<{ record: TrajectoryRecord; stored: boolean }> {
    const write = () =>
      r.error === null
        ? this.queue.put(r, { last })
        : this.queue.markFailed(r.key, r.error, { agent_name: r.agent_name, data_source: r.data_source, extra_fields: r.extra_fields, ...(r.model ? { model: r.model } : {}) });
    try {
      return { record: r, stored: (await holdWhileStoreDown(write)).stored };
    } catch (e) {
      this.unstored.add(r.key);
      return { record: { ...r, error: `transfer queue write failed: ${errorText(e)}`, finish_reason: "error" }, stored: true };
    }
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
  async repairStore(): Promise<{ groups: number; records: number; incomplete: string[] }> {
    const mode = this.plan.validate ? "val" : "train";
    // An over-sampled batch repairs the groups it started and left to complete (not the reserve, withdrawn or carried ones).
    const groups = [...this.plan.groups].filter(([uid]) => !this.plan.oversample || (this.launched.has(uid) && !this.stoppedGroups.has(uid)));
    const byUid = new Map<string, TrajectoryRecord[]>();
    for (const r of this.finished) {
      const list = byUid.get(r.uid);
      if (list) list.push(r);
      else byUid.set(r.uid, [r]);
    }
    const empty = new Map<string, number[]>();
    for (const k of this.emptySessions) {
      const { uid, session_id } = parseTrajectoryKey(k);
      empty.set(uid, [...(empty.get(uid) ?? []), session_id]);
    }
    let repairedGroups = 0;
    let rewritten = 0;
    const incomplete: string[] = [];
    for (let i = 0; i < groups.length; i += 256) {
      const chunk = groups.slice(i, i + 256);
      const statuses = await Promise.all(chunk.map(([uid]) => holdWhileStoreDown(() => this.queue.groupStatus(uid))));
      for (const [j, st] of statuses.entries()) {
        if (st.complete) continue;
        const [uid, n] = chunk[j]!;
        const recs = byUid.get(uid) ?? [];
        // A record this run never stored is no outcome to put back: the group waits for a rerun.
        if (recs.some((r) => this.unstored.has(r.key))) continue;
        const sessions = new Set([...recs.map((r) => r.session_id), ...(empty.get(uid) ?? [])]);
        // A group this run did not see finish (still running elsewhere, or interrupted) is not ours to repair;
        // one it holds nothing of stays as it is (named when incomplete).
        if (st.expected !== null && sessions.size < n) continue;
        if (sessions.size === 0) {
          incomplete.push(uid);
          continue;
        }
        repairedGroups++;
        if (st.expected === null) await holdWhileStoreDown(() => this.queue.expectGroup(uid, n, mode, this.plan.fingerprints?.get(uid)));
        const bySession = new Map<number, TrajectoryRecord[]>();
        for (const r of recs) bySession.set(r.session_id, [...(bySession.get(r.session_id) ?? []), r]);
        for (const list of bySession.values()) {
          list.sort((a, b) => a.output_index - b.output_index);
          for (const [k, r] of list.entries()) {
            const write = () =>
              r.error === null
                ? this.queue.put(r, { last: k === list.length - 1 })
                : this.queue.markFailed(r.key, r.error, { agent_name: r.agent_name, data_source: r.data_source, extra_fields: r.extra_fields, ...(r.model ? { model: r.model } : {}) });
            if ((await holdWhileStoreDown(write)).stored) rewritten++;
          }
        }
        for (const sid of empty.get(uid) ?? []) await holdWhileStoreDown(() => this.queue.finishSession(uid, sid, 0));
        if (!(await holdWhileStoreDown(() => this.queue.groupStatus(uid))).complete) incomplete.push(uid);
      }
    }
    if (repairedGroups > 0) {
      this.s.repaired = { groups: repairedGroups - incomplete.length, records: rewritten };
      if (this.s.errors.length < 50) {
        this.s.errors.push({ key: "(store)", error: `the store lost data while the batch ran: ${repairedGroups} groups found incomplete, ${rewritten} records written again` });
      }
    }
    return { ...(this.s.repaired ?? { groups: 0, records: 0 }), incomplete };
  }

  /** Counts a finished session and its records (`handedBack`: streamed, not counted again), and publishes the records. */
  private sessionDone(records: readonly TrajectoryRecord[], handedBack: boolean): void {
    this.s.counts.finished++;
    if (handedBack) this.s.counts.reused++;
    for (const r of records) {
      if (!handedBack) this.count(r);
      this.finished.push(r);
      this.opts.onRecord?.(r);
    }
  }

  private count(r: TrajectoryRecord): void {
    this.metrics.addRecord(r);
    const c = this.s.counts;
    c.records++;
    if (r.error !== null) {
      c.failed++;
      if (this.s.errors.length < 50) this.s.errors.push({ key: r.key, error: r.error });
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

  private wake(): void {
    const ws = [...this.waiters];
    this.waiters.clear();
    for (const w of ws) w();
  }
}

/**
 * The reason stored for a failed trajectory. An input error (a bad field of
 * the row, an unknown `agent_name`, a multimodal prompt) names the row, as
 * schema errors do: `rows[3].agent_name: unknown agent loop …`.
 */
function rowErrorText(e: unknown, rowIndex: number): string {
  if (e instanceof InputError && e.field && !e.field.startsWith("rows[")) {
    // Config and loop-output errors are not the row's: they keep their own field.
    return e.field.startsWith("rollout.") || e.field.startsWith("config") || e.field.startsWith("agent_loop ") ? e.message : `rows[${rowIndex}].${e.message}`;
  }
  return errorText(e);
}

function errorText(e: unknown): string {
  if (e instanceof Error) return e.name && e.name !== "Error" ? `${e.name}: ${e.message}` : e.message;
  return String(e);
}
