import { SessionAdmission } from "../rollout/session-admission.ts";
import { processLoopLag } from "../telemetry/loop-lag.ts";
import { ConfigError, ConflictError, EdgeloopError, NotFoundError, NotImplementedError } from "../errors.ts";
import { AppConfig, mergeConfig, parseAppConfig } from "../config/app-config.ts";
import type { ModelId, RolloutConfig, TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import { followBatch } from "../jobs/batch-follower.ts";
import { MemoryPolicyVersions, type PolicyVersions } from "../rollout/policy-version.ts";
import { batchIndexMember, type BatchSpec, type JobQueue, type QueueStats } from "../jobs/job-queue.ts";
import { failedRecord, planBatch, type BatchPlan, type PlannedTrajectory, type RolloutRequest } from "../rollout/batch.ts";
import { BatchRun, type BatchStats, type ExecutorFactory, type TrajectoryExecutor } from "../rollout/batch-run.ts";
export type { ExecutorFactory } from "../rollout/batch-run.ts";
import { parseTrajectoryKey } from "../schema/index.ts";
import { checkPlanGroups, withFingerprints } from "../rollout/group-fingerprint.ts";


const NO_EXECUTOR: TrajectoryExecutor = {
  agentNameFor: () => "unknown",
  run: () => Promise.reject(new Error("this batch runs in worker processes")),
};

/** An accepted batch: its id and keys, its run (progress), and which of its uids named groups that already existed. */
export interface AcceptedBatch {
  batch_id: string;
  keys: string[];
  run: BatchRun;
  /**
   * uids whose group was registered before this request (same n, same
   * partition): a uid names one group, so the batch resumes it (a crash,
   * a retried POST) or — when complete — hands back its stored records;
   * new samples need new uids.
   */
  reused_uids: string[];
  /** Of {@link reused_uids}, those whose group was already complete (already delivered to trainers; no new group will appear). */
  complete_uids: string[];
}

/** Options of a {@link RolloutService}. */
export interface RolloutServiceOptions {
  config: AppConfig;
  store: TransferQueue;
  executorFor: ExecutorFactory;
  /** Batches kept in memory for progress queries (oldest finished ones are dropped first). */
  maxBatches?: number;
  onRecord?: (r: TrajectoryRecord) => void;
  /**
   * Queue mode: batches are enqueued as jobs (one per trajectory) for
   * `edgeloop worker` processes instead of run here; progress is derived
   * from the batch's completion stream and the transfer queue.
   */
  jobs?: JobQueue;
  /** Milliseconds between progress polls of a queued batch (default 200). */
  followPollMs?: number;
  /** Milliseconds a queued batch's unfinished trajectory may be missing from the store before it is reported lost (default 30 000). */
  lostGraceMs?: number;
  /** The deployment's policy versions (`POST /v1/model-version`); default an in-process one. */
  policy?: PolicyVersions;
  /**
   * The process's session admission, shared by every batch run here; default
   * one of `config.concurrency` slots holding by `config.limits.max_event_loop_lag_ms`
   * over {@link processLoopLag} (which holds nothing until something starts it).
   */
  admission?: SessionAdmission;
  /**
   * The model of this process's tokenizer (`modelIdOf`): recorded in every
   * record run here and in every queued batch's spec, where workers check it.
   */
  model?: ModelId;
}

/**
 * Accepts batches, runs them in the background and answers progress queries.
 * Only the `rollout` section can be overridden per batch; engine, tools and
 * store are the server's.
 */
export class RolloutService {
  readonly config: AppConfig;
  readonly store: TransferQueue;
  private readonly opts: RolloutServiceOptions;
  private readonly batches = new Map<string, BatchRun>();
  private readonly followers = new Map<string, () => void>();
  /** Followed batches whose first poll has not caught up yet (lookups wait for it). */
  private readonly catchingUp = new Map<string, Promise<void>>();
  /** Set in queue mode: where batches go. */
  readonly jobs: JobQueue | null;
  /** The current policy version and its history (`POST /v1/model-version`). */
  readonly policy: PolicyVersions;
  /** Slots of the sessions run in this process (every batch's). */
  readonly admission: SessionAdmission;

  constructor(opts: RolloutServiceOptions) {
    this.opts = opts;
    this.config = opts.config;
    this.store = opts.store;
    this.jobs = opts.jobs ?? null;
    this.policy = opts.policy ?? new MemoryPolicyVersions();
    this.admission = opts.admission ?? new SessionAdmission({ maxInFlight: opts.config.concurrency, maxLagMs: opts.config.limits.max_event_loop_lag_ms, lag: processLoopLag });
  }

  /**
   * Accepts a batch: run here (inline mode) or {@link enqueue}d (queue
   * mode). Every uid's group is checked against the store before anything
   * is registered, so a refused batch writes nothing.
   * @throws ConfigError (400); ConflictError (409) when a uid's group exists with another n or
   *   partition; StoreError (503) when the job queue is full or Redis refuses.
   */
  async accept(req: RolloutRequest): Promise<AcceptedBatch> {
    if (this.jobs) return this.enqueue(req);
    const cfg = this.effectiveConfig(req);
    const plan = await withFingerprints(planBatch(req, cfg.rollout, cfg.max_batch_trajectories, cfg.limits.max_prompt_chars));
    const reuse = await checkPlanGroups(this.store, plan);
    return { ...this.start(plan, cfg, req, new Set(reuse.reused_uids)), ...reuse };
  }



  /**
   * Queue mode: plans the batch, registers its groups, records rows that
   * failed validation, and enqueues one job per other trajectory; resolves
   * once everything is written (not run). The returned run counts records
   * as workers store them.
   * @throws ConfigError (400); ConflictError (409, nothing written) when a uid's group exists with
   *   another n or partition; StoreError (503, nothing enqueued) when the queue is full or Redis refuses;
   *   StoreError (413, `request_too_large`, nothing written) when a row is larger than one store request.
   */
  async enqueue(req: RolloutRequest): Promise<AcceptedBatch> {
    const jobs = this.jobs;
    if (!jobs) throw new ConfigError("jobs", "queue mode needs a job queue (a Redis or Upstash store)");
    const cfg = this.effectiveConfig(req);
    const plan = await withFingerprints(planBatch(req, cfg.rollout, cfg.max_batch_trajectories, cfg.limits.max_prompt_chars));
    const reuse = await checkPlanGroups(this.store, plan);
    // Over-sampled: the first eager_rows rows start; the rest wait in Redis as the reserve (started by workers, one per filtered group).
    const os = plan.oversample ?? null;
    const eager = os ? new Set([...plan.groups.keys()].slice(0, os.eager_rows)) : null;
    const started = (uid: string) => !eager || eager.has(uid);
    // Sessions of re-posted uids that already finished are handed back as stored, not run (or counted) again.
    const reusedSet = new Set(reuse.reused_uids);
    const handedBack = new Map<string, TrajectoryRecord[]>();
    for (const t of plan.trajectories) {
      if (!reusedSet.has(t.uid) || !started(t.uid)) continue;
      const recs = await this.store.sessionRecords(t.uid, t.session_id);
      if (recs) handedBack.set(t.key, recs);
    }
    // An over-sampled batch's invalid rows run as jobs too (failed by the worker): their group-completing write needs a delivery slot like any other.
    const runnable = plan.trajectories.filter((t) => started(t.uid) && (os || !t.row_error) && !handedBack.has(t.key));
    const reserveRows = os ? plan.trajectories.filter((t) => !started(t.uid)) : [];
    const spec: BatchSpec = {
      batch_id: plan.batch_id,
      validate: plan.validate,
      global_steps: plan.global_steps,
      model_version: plan.model_version,
      rollout: cfg.rollout,
      total: plan.trajectories.length,
      started_at: Date.now(),
      ...(os ? { oversample: os } : {}),
      ...(this.opts.model ? { model: this.opts.model } : {}),
    };
    const keys = plan.trajectories.map((t) => t.key);
    // Every write is built and checked against the store's request limit first: a batch refused for size writes nothing.
    const prepared = jobs.prepare(spec, keys, runnable, { reserve: reserveRows, ...(plan.fingerprints ? { fingerprints: plan.fingerprints } : {}) });
    await jobs.reserve(runnable.length);
    const mode = plan.validate ? "val" : "train";
    for (const [uid, n] of plan.groups) if (started(uid)) await this.store.expectGroup(uid, n, mode, plan.fingerprints?.get(uid));
    if (os) await this.seedOversample(plan, os, handedBack);
    await jobs.submitPrepared(prepared);
    const run = this.follow(plan, spec.started_at);
    for (const [key, recs] of handedBack) {
      run.observeSession(key, recs, { handedBack: true });
      // The completion event lets a batch rebuilt in another process count the session as finished.
      await jobs.completed(plan.batch_id, key);
    }
    for (const t of plan.trajectories.filter((x) => x.row_error && !handedBack.has(x.key))) {
      const rec = failedRecord(t, t.row ? (t.row.agent_name ?? cfg.rollout.agent.default_agent_loop) : "unknown", t.row_error!, this.opts.model);
      await this.store.markFailed(rec.key, rec.error!, { agent_name: rec.agent_name, data_source: rec.data_source, extra_fields: rec.extra_fields, ...(rec.model ? { model: rec.model } : {}) });
      await jobs.completed(plan.batch_id, t.key);
    }
    return { batch_id: plan.batch_id, keys, run, ...reuse };
  }

  /**
   * Seeds a queued over-sampled batch's state in Redis before its jobs run,
   * as BatchRun's set-up does inline: handed-back sessions (a carried
   * group's, finished in an earlier batch) are admitted, and re-posted
   * groups already complete count as delivered or filtered.
   */
  private async seedOversample(plan: BatchPlan, os: NonNullable<BatchPlan["oversample"]>, handedBack: ReadonlyMap<string, TrajectoryRecord[]>): Promise<void> {
    const admitted = [...handedBack.keys()].map((k) => parseTrajectoryKey(k));
    const perUid = new Map<string, number>();
    for (const a of admitted) perUid.set(a.uid, (perUid.get(a.uid) ?? 0) + 1);
    const delivered: string[] = [];
    const filtered: string[] = [];
    for (const [uid, k] of perUid) {
      if (k < plan.groups.get(uid)!) continue;
      ((await this.store.groupStatus(uid)).filtered ? filtered : delivered).push(uid);
    }
    await this.jobs!.seedOversample(plan.batch_id, { admitted, delivered, filtered, mode: os.partial_rollout, target: os.target_groups });
  }

  /**
   * A batch by id: the one held in memory, or — in queue mode — one rebuilt
   * from its stored spec and completion stream (a batch submitted to another
   * API process, or before a restart).
   * @throws NotFoundError (404) for an unknown batch id.
   */
  async lookup(id: string): Promise<BatchRun> {
    const b = this.batches.get(id);
    if (b || !this.jobs) return this.caughtUp(id);
    if (!/^[0-9a-f-]{36}$/.test(id)) return this.batch(id);
    const stored = await this.jobs.batch(id);
    if (!stored) return this.batch(id);
    if (this.batches.has(id)) return this.caughtUp(id);
    const { spec, keys } = stored;
    const trajectories = keys.map((key) => {
      const m = /^(.*)_(\d+)_\d+$/.exec(key)!;
      return { key, uid: m[1]!, session_id: Number(m[2]), row_index: -1, row: null, row_error: null, group_size: 0, trajectory_info: { step: spec.global_steps, sample_index: -1, rollout_n: Number(m[2]), validate: spec.validate } } satisfies PlannedTrajectory;
    });
    // An over-sampled batch's groups (uid → n, row order, from the keys) tell its eager rows and reserve apart.
    const groups = new Map<string, number>();
    if (spec.oversample) {
      for (const t of trajectories) groups.set(t.uid, (groups.get(t.uid) ?? 0) + 1);
      for (const t of trajectories) t.group_size = groups.get(t.uid)!;
    }
    this.follow({ batch_id: id, validate: spec.validate, global_steps: spec.global_steps, model_version: spec.model_version, trajectories, groups, oversample: spec.oversample ?? null }, spec.started_at);
    return this.caughtUp(id);
  }

  /** The batch, once its follower (queue mode) has read what is already stored: a rebuilt batch's first answer is already right. */
  private async caughtUp(id: string): Promise<BatchRun> {
    const pending = this.catchingUp.get(id);
    if (pending) await pending;
    return this.batch(id);
  }

  /** `GET /v1/queue`: the job queue's figures, or (inline mode) the trajectories waiting and running in this process. */
  async queueStats(): Promise<QueueStats> {
    if (this.jobs) return this.jobs.stats();
    let depth = 0;
    let inFlight = 0;
    let oldest = Infinity;
    for (const b of this.batches.values()) {
      const s = b.stats();
      if (s.done) continue;
      depth += s.counts.pending;
      inFlight += s.counts.running;
      oldest = Math.min(oldest, s.started_at);
    }
    return { mode: "inline", depth, in_flight: inFlight, oldest_age_ms: oldest === Infinity ? 0 : Math.max(0, Date.now() - oldest) };
  }

  /**
   * Cancels a batch (`DELETE /v1/rollouts/{id}`) and returns its final
   * stats, `cancelled` set:
   * - trajectories not started never start (queue mode: their jobs are
   *   removed from the job stream, {@link JobQueue.cancelBatch});
   * - running ones are aborted (inline: through their loop's AbortSignal —
   *   engine requests, tool calls, an admission hold; queue mode: workers
   *   poll the batch's `cancelled` flag and abort theirs); nothing is stored
   *   for them and their durable sessions are dropped (queue mode);
   * - the batch's groups not complete at the cancel are withdrawn
   *   ({@link TransferQueue.cancelGroups}): never delivered, later writes
   *   refused; records stored before stay readable by key and are counted
   *   (`counts.records`); groups already complete stay delivered.
   * Inline, it answers once the aborted trajectories have returned (at most
   * `waitMs`, default 30 s). Cancelling a cancelled batch returns its stats again.
   * @throws NotFoundError (404) for an unknown batch; ConflictError (409, code `batch_done`) for a batch
   *   already done; EdgeloopError (501) when the store cannot withdraw groups.
   */
  async cancel(id: string, opts: { waitMs?: number } = {}): Promise<BatchStats> {
    const run = await this.lookup(id);
    const st = run.stats();
    if (st.cancelled) return st;
    if (st.done) throw new ConflictError(`batch ${id.slice(0, 100)} is already done: nothing to cancel`, { code: "batch_done", field: "batch_id" });
    const store = this.store;
    if (!store.cancelGroups) throw new NotImplementedError("this store cannot cancel batches (no cancelGroups)");
    const uids = [...new Set([...run.plan.groups.keys(), ...run.plan.trajectories.map((t) => t.uid)])];
    if (this.jobs) {
      await this.jobs.cancelBatch(id);
      const groups = await store.cancelGroups(uids);
      // Sessions whose records landed before the groups were withdrawn are counted (their completion event may lag).
      const open = run.plan.trajectories.map((t) => t.key).filter((k) => !run.observedKeys().has(k));
      for (let i = 0; i < open.length; i += 256) {
        const chunk = open.slice(i, i + 256);
        const recs = await Promise.all(chunk.map((k) => store.sessionRecords(parseTrajectoryKey(k).uid, parseTrajectoryKey(k).session_id)));
        recs.forEach((r, j) => r && run.observeSession(chunk[j]!, r));
      }
      run.cancel();
      run.setCancellation({ withdrawn: groups.withdrawn.length, complete: groups.complete.length });
      this.followers.get(id)?.();
      this.followers.delete(id);
      return run.stats();
    }
    run.cancel();
    const waitMs = opts.waitMs ?? 30_000;
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([run.run().catch(() => {}), new Promise<void>((r) => (timer = setTimeout(r, waitMs)))]);
    clearTimeout(timer);
    const groups = await store.cancelGroups(uids);
    run.setCancellation({ withdrawn: groups.withdrawn.length, complete: groups.complete.length });
    return run.stats();
  }

  /** Stops following queued batches (the API process is shutting down). */
  close(): void {
    for (const stop of this.followers.values()) stop();
    this.followers.clear();
    if (!this.opts.admission) this.admission.close();
  }

  private follow(plan: BatchPlan, startedAt: number): BatchRun {
    const jobs = this.jobs!;
    const run = new BatchRun(plan, { executor: NO_EXECUTOR, store: this.store, rollout: this.config.rollout, concurrency: 1, external: true, startedAt, onRecord: this.opts.onRecord });
    this.remember(plan.batch_id, run);
    const { stop, ready } = followBatch(run, jobs, this.store, {
      pollMs: this.opts.followPollMs,
      cancelled: async () => (await jobs.cancelledBatches([plan.batch_id])).size > 0,
      started: (keys) => jobs.sessionsStarted(keys),
      ...(this.opts.lostGraceMs !== undefined ? { lostGraceMs: this.opts.lostGraceMs } : {}),
    });
    this.followers.set(plan.batch_id, stop);
    this.catchingUp.set(plan.batch_id, ready);
    void ready.then(() => this.catchingUp.delete(plan.batch_id));
    void run.run().then(() => {
      stop();
      this.followers.delete(plan.batch_id);
    });
    return run;
  }

  private effectiveConfig(req: RolloutRequest): AppConfig {
    if (req.config) {
      const extra = Object.keys(req.config).filter((k) => k !== "rollout");
      if (extra.length) throw new ConfigError(extra[0]!, "only the rollout section can be set per batch");
    }
    return req.config ? parseAppConfig(mergeConfig(this.config, req.config), "request config") : this.config;
  }

  /**
   * Plans and starts a batch in this process without reading the store
   * first: no uid check, no fingerprint, no hand-back of finished sessions.
   * For embedders and tests that choose fresh uids; the CLI and the HTTP API
   * go through {@link accept}.
   * @throws ConfigError (400) when `config` overrides anything but `rollout`, or an invalid value.
   */
  submit(req: RolloutRequest): { batch_id: string; keys: string[]; run: BatchRun } {
    const cfg = this.effectiveConfig(req);
    return this.start(planBatch(req, cfg.rollout, cfg.max_batch_trajectories, cfg.limits.max_prompt_chars), cfg, req);
  }

  private start(plan: BatchPlan, cfg: AppConfig, req: RolloutRequest, reusedUids?: ReadonlySet<string>): { batch_id: string; keys: string[]; run: BatchRun } {
    const executor = this.opts.executorFor(cfg.rollout, { model_version: req.model_version, validate: req.validate });
    const run = new BatchRun(plan, {
      executor,
      store: this.store,
      rollout: cfg.rollout,
      concurrency: cfg.concurrency,
      admission: this.admission,
      onRecord: this.opts.onRecord,
      ...(reusedUids?.size ? { reusedUids } : {}),
      ...(this.opts.model ? { model: this.opts.model } : {}),
    });
    this.remember(plan.batch_id, run);
    void run.run().catch(() => {});
    return { batch_id: plan.batch_id, keys: plan.trajectories.map((t) => t.key), run };
  }

  /** @throws NotFoundError (404) for an unknown batch id. */
  batch(id: string): BatchRun {
    const b = this.batches.get(id);
    if (!b) throw new NotFoundError(`no batch '${id.slice(0, 100)}'`, { field: "batch_id" });
    return b;
  }

  /**
   * One page of batches, newest first (`GET /v1/rollouts?limit=&cursor=`).
   * Queue mode: the batches stored in the job queue's index (any API
   * process's, and this one's before a restart), each rebuilt from the store
   * as {@link lookup} does, merged with the batches this process holds (a
   * batch whose stored hash Redis lost is still listed here). Inline mode:
   * the batches this process holds (an
   * inline batch stores records and groups, no batch metadata, so it is not
   * listed after a restart). `cursor` is the previous page's `next_cursor`;
   * `next_cursor` is null on the last page.
   * @throws StoreError (503) when the store fails.
   */
  async listBatches(opts: { limit: number; cursor?: string | null }): Promise<{ runs: BatchRun[]; next_cursor: string | null }> {
    const desc = (a: { member: string }, b: { member: string }) => (a.member < b.member ? 1 : a.member > b.member ? -1 : 0);
    // This process's batches: all of them inline; in queue mode also the ones whose stored hash Redis lost (still reported, `lost`).
    const held = [...this.batches].map(([id, run]) => ({ id, member: batchIndexMember(run.stats().started_at, id), run: run as BatchRun | null }));
    const after = (opts.cursor ? held.filter((b) => b.member < opts.cursor!) : held).sort(desc);
    if (!this.jobs) {
      const page = after.slice(0, opts.limit);
      return { runs: page.map((b) => b.run!), next_cursor: after.length > opts.limit ? page.at(-1)!.member : null };
    }
    // The next `limit` of the index and of memory hold the next `limit` of their union.
    const stored = await this.jobs.listBatches(opts);
    const indexed = new Set(stored.members);
    // A finished batch this process holds whose stored hash is gone, with nothing lost, was collected
    // (`edgeloop gc`, or its retention expired): every other process has forgotten it, so this one does too.
    const held0 = after.slice(0, opts.limit);
    const unindexed = held0.filter((b) => !indexed.has(b.member) && b.run!.stats().done && !b.run!.stats().lost);
    const exist = await this.jobs.batchesExist(unindexed.map((b) => b.id));
    const collected = new Set(unindexed.filter((_, i) => !exist[i]).map((b) => b.id));
    for (const id of collected) this.forget(id);
    const merged = new Map<string, { id: string; member: string; run: BatchRun | null }>();
    for (const b of held0) if (!collected.has(b.id)) merged.set(b.id, b);
    for (const m of stored.members) {
      const id = m.slice(m.indexOf(":") + 1);
      if (!merged.has(id)) merged.set(id, { id, member: m, run: null });
    }
    const all = [...merged.values()].sort(desc);
    const page = all.slice(0, opts.limit);
    const runs: BatchRun[] = [];
    for (const b of page) {
      try {
        runs.push(b.run ?? (await this.lookup(b.id)));
      } catch (e) {
        // Collected between the index read and the lookup: not listed.
        if (!(e instanceof NotFoundError)) throw e;
      }
    }
    const more = stored.next_cursor !== null || after.length > opts.limit || all.length > opts.limit;
    return { runs, next_cursor: more && page.length ? page.at(-1)!.member : null };
  }

  /** Ids of the batches kept in memory, oldest first. */
  batchIds(): string[] {
    return [...this.batches.keys()];
  }

  /** Drops a batch this process holds (and stops following it). */
  private forget(id: string): void {
    this.batches.delete(id);
    this.followers.get(id)?.();
    this.followers.delete(id);
  }

  private remember(id: string, run: BatchRun): void {
    this.batches.set(id, run);
    const max = this.opts.maxBatches ?? 1000;
    for (const [k, b] of this.batches) {
      if (this.batches.size <= max) break;
      if (b.stats().done) {
        this.batches.delete(k);
        this.followers.get(k)?.();
        this.followers.delete(k);
      }
    }
  }
}
