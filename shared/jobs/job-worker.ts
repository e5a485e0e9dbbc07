import type { SessionAdmission } from "../rollout/session-admission.ts";
import { ConflictError } from "../errors.ts";
import { failedRecord, type BatchPlan, type PlannedTrajectory } from "../rollout/batch.ts";
import { BatchRun, TrajectoryAbandonedError, type ExecutorFactory, type TrajectoryExecutor } from "../rollout/batch-run.ts";
import type { TransferQueue } from "../store/types.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import type { BatchSpec, Job, JobQueue } from "./job-queue.ts";
import { QueuedGroupGate } from "./queued-oversample.ts";
import type { ModelId } from "../schema/index.ts";
import type { StoreRunningCap } from "./running-cap.ts";
import { describeModelId, sameModel } from "../models/model-id.ts";

/** Options of a {@link JobWorker}. */
export interface JobWorkerOptions {
  jobs: JobQueue;
  /** Where records go: the session-completing transfer queue (records written once, sessions then marked done). */
  store: TransferQueue;
  /** The executor of a batch (durable sessions: `createSessionExecutor`, which resumes from checkpoints). */
  executorFor: ExecutorFactory;
  /** This worker's consumer name in the group (unique per process). */
  consumer: string;
  /** Jobs run at once. */
  concurrency: number;
  /**
   * The process's admission (its event-loop lag): while the lag holds new
   * sessions, the worker claims no more jobs (they stay in the stream for
   * other workers); each job it runs holds a slot. Absent: only `concurrency`.
   */
  admission?: SessionAdmission;
  /**
   * Exit after this many milliseconds with nothing claimed, nothing running and no job left in the
   * stream that this worker could claim now or reclaim after a lease ({@link JobQueue.outstanding};
   * null: run until stopped).
   */
  idleExitMs?: number | null;
  /** Longest XREADGROUP block, milliseconds (default 1000). */
  blockMs?: number;
  /** A job delivered more often than this is failed with a recorded reason instead of run again (default 5). */
  maxDeliveries?: number;
  /** One line per notable event (claims after a reclaim, retries, exits). */
  log?: (line: string) => void;
  /** Milliseconds between checks whether the batches of running jobs were cancelled (default 250). */
  cancelPollMs?: number;
  /**
   * Continues a session this worker runs whose tool result another process
   * committed (the session host's `wake`). When given, the worker follows
   * the wake stream ({@link JobQueue.wakes}) and calls it for the keys of
   * its running jobs, so a session resumes as soon as its callback arrives
   * rather than at the tool's deadline.
   */
  onWake?: (key: string) => void;
  /**
   * This worker's model (`modelIdOf` its tokenizer), recorded in its records.
   * A job whose batch names a model with another fingerprint is refused: its
   * trajectory is stored failed with an error naming both models (the batch
   * ends; the trainer sees which), the refusal is logged once per batch and
   * counted in {@link WorkerSummary.refused}. Required, so that no process
   * that runs jobs forgets it (the chaos worker did); null (tests with fake
   * executors only): nothing is checked and records name no model.
   */
  model: ModelId | null;
  /**
   * The store-wide cap on running sessions (queue mode, every worker of the
   * prefix; `worker --max-running-total`): before each claim the worker takes
   * slots from it and claims no more jobs than it was granted; while none is
   * granted it claims nothing (the jobs wait in the stream) and says why (at
   * most every 30 s). Absent: only `concurrency` and the admission bound it.
   */
  runningCap?: StoreRunningCap;
  /**
   * With a cap, claims do not block on the stream: ms between looks while the
   * cap grants nothing or the stream is empty (default 250; a job of this
   * worker ending looks at once). New jobs wait up to this long for a capped worker.
   */
  capPollMs?: number;
}

/** What a worker did, when {@link JobWorker.run} returns. */
export interface WorkerSummary {
  claimed: number;
  /** Jobs whose record was stored (or found stored) and that were acknowledged. */
  completed: number;
  /** Of those, records with an error. */
  failed: number;
  /** Jobs claimed from a dead worker (delivered more than once). */
  reclaimed: number;
  /** Jobs given up because another worker took their session over (not acknowledged here). */
  abandoned: number;
  /** Jobs of cancelled batches: dropped before running, or aborted while running (nothing stored). */
  cancelled: number;
  /**
   * Jobs of over-sampled batches stopped as surplus once their batch
   * reached `target_groups` (nothing stored): dropped before running, or
   * aborted (`cancel`) or suspended at their checkpoint (`carry`) while running.
   */
  surplus: number;
  /** Jobs refused because their batch was submitted with another model (stored failed; also counted in `completed` and `failed`). */
  refused: number;
  /** Times the store-wide running cap ({@link JobWorkerOptions.runningCap}) held this worker from claiming (one per spell). */
  capped: number;
  /** Why the loop ended: `idle` (scale to zero) or `stopped`. */
  exit: "idle" | "stopped";
}

/**
 * A job-queue worker (DESIGN §4.6): claims jobs (its own consumer in the
 * `workers` group; a dead worker's jobs come back by XAUTOCLAIM after the
 * lease), runs each trajectory's durable session through a one-trajectory
 * {@link BatchRun} (record conversion, validation, store write with retries,
 * spans — exactly what the inline path does), emits the completion event and
 * acknowledges. Heartbeats keep running jobs from being reclaimed. A job is
 * acknowledged only after its record is stored, so a crash at any point
 * leaves it to be reclaimed and resumed from its checkpoint; the session's
 * step fence and the queue's put-once make a record appear exactly once.
 * Redis trouble (connection loss) is retried with backoff. Runtime-free.
 */
export class JobWorker {
  private readonly opts: JobWorkerOptions;
  private readonly inflight = new Map<string, Promise<void>>();
  /** Trajectory keys of the running jobs (how many jobs hold each). */
  private readonly runningKeys = new Map<string, number>();
  private readonly specs = new Map<string, Promise<BatchSpec | null>>();
  /** The one-trajectory run of each running job (by job id), with its batch: what a cancel aborts. */
  private readonly runs = new Map<string, RunEntry>();
  private stopped = false;
  /** Batches whose model mismatch was logged (said once per batch). */
  private readonly refusedBatches = new Set<string>();
  private readonly summary: WorkerSummary = { claimed: 0, completed: 0, failed: 0, reclaimed: 0, abandoned: 0, cancelled: 0, surplus: 0, refused: 0, capped: 0, exit: "stopped" };
  /** Slots the running cap granted that no claimed job holds yet (counted as held until the claim is done). */
  private capReserved = 0;
  /** The running cap's calls, one at a time (each reads the held count when it runs, so a late one never lowers a newer one). */
  private capChain: Promise<unknown> = Promise.resolve();

  constructor(opts: JobWorkerOptions) {
    this.opts = opts;
  }

  /** Jobs running now. */
  get running(): number {
    return this.inflight.size;
  }

  /** The counts so far (a copy; `exit` reads `stopped` until {@link run} ends idle): what `worker --metrics-port` exports and a drain timeout reports. */
  get progress(): WorkerSummary {
    return { ...this.summary };
  }

  /** Claims and runs jobs until idle for `idleExitMs` or {@link stop}; waits for running jobs before resolving. */
  async run(): Promise<WorkerSummary> {
    const { jobs, consumer, concurrency } = this.opts;
    const blockMs = this.opts.blockMs ?? 1000;
    // During a store outage every beat fails: say so once, and once when beats land again.
    let beatFailing = false;
    const cap = this.opts.runningCap;
    const beat = setInterval(() => {
      if (!this.inflight.size) return;
      // The cap entry lives as long as the job lease: renewed with the jobs' heartbeat (a miss is retried next beat).
      if (cap) void this.capReserve(0).catch(() => {});
      jobs.heartbeat(consumer, [...this.inflight.keys()]).then(
        () => {
          if (beatFailing) this.log("heartbeats land again");
          beatFailing = false;
        },
        (e) => {
          if (!beatFailing) this.log(`heartbeat failed: ${message(e)} (said once until heartbeats land again)`);
          beatFailing = true;
        },
      );
    }, Math.max(50, Math.floor(jobs.leaseMs / 3)));
    // Cancelled batches (DELETE /v1/rollouts/{id}): their running jobs are aborted. Over-sampled batches that
    // reached their target: their running jobs are aborted (cancel) or suspended (carry).
    let polling = false;
    const cancelPoll = setInterval(() => {
      if (!this.runs.size || polling) return;
      polling = true;
      const batches = [...this.runs.values()].map((r) => r.batch);
      const oversampled = [...this.runs.values()].filter((r) => r.oversampled).map((r) => r.batch);
      Promise.all([jobs.cancelledBatches(batches), jobs.stoppedBatches(oversampled)])
        .then(([gone, stopped]) => {
          for (const r of this.runs.values()) {
            const mode = stopped.get(r.batch);
            if (mode && !r.stopped) {
              r.stopped = mode;
              r.run?.stop(mode);
            }
            if (!gone.has(r.batch) || r.cancelled) continue;
            r.cancelled = true;
            r.run?.cancel();
          }
        })
        .catch(() => {})
        .finally(() => (polling = false));
    }, this.opts.cancelPollMs ?? 250);
    let lastBusy = Date.now();
    let backoff = 100;
    /** Said once per idle spell: the worker stays because other workers hold jobs. */
    let waitingOnOthers = false;
    /** The store-wide running cap grants nothing now (a spell, counted once in `capped`). */
    let capHeld = false;
    /** When the held line was last said (at most every 30 s). */
    let capSaidAt = -Infinity;
    /** Said once: another worker of the prefix has a smaller cap. */
    let capMismatchSaid = false;
    const wakes = this.opts.onWake ? await this.followWakes(blockMs) : null;
    try {
      while (!this.stopped) {
        if (this.inflight.size >= concurrency) {
          await Promise.race(this.inflight.values());
          continue;
        }
        // Back-pressure: past this process's ceiling (event-loop lag over its bound) claim nothing more until it calms
        // or a job ends; the jobs stay in the stream for other workers (one job always runs).
        if (this.inflight.size > 0 && this.opts.admission?.holdReason() === "loop_lag") {
          await Promise.race([Promise.race(this.inflight.values()), this.opts.admission.lagCleared()]);
          continue;
        }
        if (this.inflight.size > 0) lastBusy = Date.now();
        const idleMs = this.opts.idleExitMs;
        if (idleMs != null && this.inflight.size === 0 && Date.now() - lastBusy >= idleMs) {
          // "Nothing is left" only when the stream holds no job this worker could claim, now or once
          // another worker stops heart-beating it (N1: a SIGKILLed worker's jobs wait for their lease).
          let left: number;
          try {
            left = await jobs.outstanding(consumer);
          } catch (e) {
            left = -1;
            this.log(`idle check failed (${message(e)}); not exiting`);
          }
          if (left === 0) {
            this.summary.exit = "idle";
            break;
          }
          if (left > 0 && !waitingOnOthers) this.log(`idle, but ${left} jobs are left in the stream (waiting to be claimed or held by other workers): staying to claim them, or reclaim them if their worker stops heart-beating (lease ${jobs.leaseMs} ms)`);
          waitingOnOthers = true;
          // Idle is counted again from here: checked once more idleExitMs later (claims go on meanwhile).
          lastBusy = Date.now();
        } else if (this.inflight.size > 0) waitingOnOthers = false;
        let claimed: Job[];
        try {
          const wait = idleMs != null && this.inflight.size === 0 ? Math.min(blockMs, Math.max(1, idleMs - (Date.now() - lastBusy))) : blockMs;
          // Lagging with nothing running: one job (a lagging process still makes progress), not a full claim.
          let room = this.opts.admission?.lagging() ? 1 : concurrency - this.inflight.size;
          if (cap) {
            const g = await this.capReserve(room);
            if (g.cap < cap.cap && !capMismatchSaid) {
              capMismatchSaid = true;
              this.log(`another worker of this store prefix was given a smaller store-wide cap (${g.cap}; this one ${cap.cap}): every worker obeys the smallest, ${g.cap}; give all of them the same --max-running-total`);
            }
            if (g.granted === 0) {
              if (!capHeld) {
                this.summary.capped++;
                this.opts.admission?.setStoreCapHeld(true);
              }
              // Said at the first spell, then at most every 30 s while the cap keeps holding claims.
              if (Date.now() - capSaidAt >= 30_000) {
                capSaidAt = Date.now();
                this.log(`held by the store-wide cap: ${g.cap} sessions at once across workers (${g.others} held by other workers, ${this.inflight.size} running here); claiming again when a slot frees`);
              }
              capHeld = true;
              // Not busy: a held worker with nothing running still idle-exits once no job is left that it could take
              // (the idle check above asks the stream), so held workers do not keep each other alive.
              backoff = 100;
              await Promise.race([...this.inflight.values(), sleep(this.opts.capPollMs ?? 250)]);
              continue;
            }
            capHeld = false;
            this.opts.admission?.setStoreCapHeld(false);
            room = g.granted;
          }
          try {
            // With the cap, a claim never blocks: its granted slots are counted in the store while it runs, and a
            // blocking read would hold them for nothing (idle workers starving each other, entries outliving a short lease).
            claimed = await jobs.claim(consumer, room, cap ? 0 : this.inflight.size ? Math.min(wait, 200) : wait);
          } catch (e) {
            this.capReserved = 0;
            throw e;
          }
          backoff = 100;
        } catch (e) {
          // A worker that cannot claim is not idle: it never idle-exits (nor reports idle) during a store outage.
          lastBusy = Date.now();
          this.log(`claim failed (${message(e)}); retrying in ${backoff} ms`);
          await sleep(backoff);
          lastBusy = Date.now();
          backoff = Math.min(backoff * 2, 5_000);
          continue;
        }
        for (const job of claimed) {
          if (this.inflight.has(job.id)) continue;
          lastBusy = Date.now();
          this.summary.claimed++;
          if (job.deliveries > 1) {
            this.summary.reclaimed++;
            this.log(`reclaimed ${job.trajectory.key} (delivery ${job.deliveries})`);
          }
          const key = job.trajectory.key;
          this.runningKeys.set(key, (this.runningKeys.get(key) ?? 0) + 1);
          const slot = this.opts.admission?.track();
          const p = this.runJob(job)
            .catch((e) => this.log(`job ${key} left for a retry: ${message(e)}`))
            .finally(() => {
              slot?.();
              this.inflight.delete(job.id);
              // Its slot goes back to the store-wide cap at once (other workers may be held).
              if (cap) void this.capReserve(0).catch(() => {});
              const n = (this.runningKeys.get(key) ?? 1) - 1;
              if (n > 0) this.runningKeys.set(key, n);
              else this.runningKeys.delete(key);
            });
          this.inflight.set(job.id, p);
        }
        if (cap && this.capReserved > 0) {
          // The grant is now held by the jobs claimed; what the claim did not use goes back (one call, counted at once).
          const unused = this.capReserved > claimed.length;
          this.capReserved = 0;
          if (unused) void this.capReserve(0).catch(() => {});
        }
        // A capped claim does not block: with nothing claimed, look again after the poll interval (or when a job here ends).
        if (cap && claimed.length === 0) await Promise.race([...this.inflight.values(), sleep(this.opts.capPollMs ?? 250)]);
      }
      await Promise.all(this.inflight.values());
    } finally {
      clearInterval(beat);
      clearInterval(cancelPoll);
      if (cap) {
        this.opts.admission?.setStoreCapHeld(false);
        await this.capChain.then(() => cap.leave(consumer)).catch(() => {});
      }
      await wakes?.stop();
    }
    return { ...this.summary };
  }

  /**
   * Reads the wake stream from its newest entry on, in the background, and
   * hands the keys of running jobs to `onWake`. Starts before the first
   * claim, so no wake for a job claimed later is missed (and a result
   * committed before the claim is in the checkpoint the job resumes from).
   */
  private async followWakes(blockMs: number): Promise<{ stop(): Promise<void> }> {
    const { jobs } = this.opts;
    const onWake = this.opts.onWake!;
    let after = await jobs.lastWake().catch(() => "0-0");
    let stopped = false;
    const loop = (async () => {
      let backoff = 100;
      while (!stopped) {
        try {
          for (const w of await jobs.wakes(after, Math.min(blockMs, 1000))) {
            after = w.id;
            if (this.runningKeys.has(w.key)) onWake(w.key);
          }
          backoff = 100;
        } catch (e) {
          if (stopped) break;
          this.log(`reading wakes failed (${message(e)}); retrying in ${backoff} ms`);
          await sleep(backoff);
          backoff = Math.min(backoff * 2, 5_000);
        }
      }
    })();
    return {
      stop: async () => {
        stopped = true;
        await loop;
      },
    };
  }

  /**
   * Asks the running cap for `want` slots, recording this worker's held
   * count (running jobs plus slots granted and not yet claimed) as the call
   * runs; a call with `want` > 0 sets the slots granted and not yet claimed.
   * Calls are serialized. @throws StoreError
   */
  private capReserve(want: number): Promise<{ granted: number; others: number; cap: number }> {
    const cap = this.opts.runningCap!;
    const next = this.capChain.then(async () => {
      const g = await cap.reserve(this.opts.consumer, this.inflight.size + this.capReserved, want);
      // A grant is held from the moment the script gave it, before the next queued call counts.
      if (want > 0) this.capReserved = g.granted;
      return g;
    });
    this.capChain = next.catch(() => {});
    return next;
  }

  /** Stops claiming; {@link run} resolves once the running jobs are done. */
  stop(): void {
    this.stopped = true;
  }

  private async runJob(job: Job): Promise<void> {
    const entry: RunEntry = { batch: job.batch_id, run: null, cancelled: false, oversampled: false, stopped: null };
    this.runs.set(job.id, entry);
    try {
      await this.runTracked(job, entry);
    } finally {
      this.runs.delete(job.id);
    }
  }

  private async runTracked(job: Job, entry: RunEntry): Promise<void> {
    const { jobs, store } = this.opts;
    const t = job.trajectory;
    const spec = await this.spec(job.batch_id);
    if (!spec) {
      // The batch expired or was never stored: nothing can run it.
      await jobs.ack([job.id]);
      return;
    }
    if ((await retry(() => jobs.cancelledBatches([job.batch_id]))).size > 0) {
      // Claimed before the cancel removed it: dropped unrun.
      await retry(() => jobs.ack([job.id]));
      this.summary.cancelled++;
      return;
    }
    if (job.rowLost && !(await retry(() => jobs.batchStored(job.batch_id)))) {
      // The store lost the batch's data between the claim and the row read (a flush, a restart without
      // persistence): like a vanished job, the trajectory is the follower's to report lost, not a failed record.
      this.log(`${t.key}: its batch's data is gone from the store; dropped (reported lost by GET /v1/rollouts/${job.batch_id})`);
      await jobs.ack([job.id]);
      return;
    }
    const os = spec.oversample ?? null;
    if (os) {
      entry.oversampled = true;
      // Stopped before this job ran (claimed before the stop removed it, or reclaimed after): surplus, unless its
      // session was admitted to write before the stop (a redelivery: it must complete its group).
      const adm = await retry(() => jobs.admission(job.batch_id, t.uid, t.session_id));
      if (adm.stopped && !adm.admitted) {
        await this.dropSurplus(job, adm.stopped, false);
        return;
      }
      // A reserve row's job registers its group first (the worker that started the row may have died before it did).
      if (job.expect) await retry(() => store.expectGroup(t.uid, job.expect!.n, job.expect!.part, job.expect!.fp));
    }
    const groupGate = os ? new QueuedGroupGate({ jobs, store, batchId: job.batch_id, plan: os, log: (l) => this.log(l) }) : undefined;
    const max = this.opts.maxDeliveries ?? 5;
    const own = this.opts.model;
    // Another model's batch: running it would write this tokenizer's ids into a batch read with the other's.
    const mismatch = own && spec.model && !sameModel(spec.model, own) ? spec.model : null;
    if (mismatch || job.deliveries > max) {
      const error = mismatch
        ? `model mismatch: batch ${job.batch_id} was submitted with model ${describeModelId(mismatch)}, this worker (${this.opts.consumer}) runs ${describeModelId(own!)}; refused, not run: start workers with the serve's model (--model ${mismatch.name})`
        : `job failed: delivered ${job.deliveries} times without completing (worker crashes?)`;
      if (mismatch && !this.refusedBatches.has(job.batch_id)) {
        if (this.refusedBatches.size > 256) this.refusedBatches.clear();
        this.refusedBatches.add(job.batch_id);
        this.log(`${error} (said once per batch; its jobs are stored failed with this error)`);
      }
      const agentName = t.row?.agent_name ?? spec.rollout.agent.default_agent_loop;
      // An over-sampled batch's failed record completes its group like any other: it needs the gate's admission too.
      if (groupGate && !(await groupGate.admit(t, [failedRecord(t, agentName, error)]))) {
        await this.dropSurplus(job, os!.partial_rollout, false);
        return;
      }
      // The failed record names the batch's model: it holds no tokens, and readers group it with its batch.
      const model = mismatch ?? own;
      // A refusal says so in fields too (trainers and tools decide by fields, not by the error text).
      const refusal = mismatch ? { model_mismatch: { batch: mismatch, worker: own! } } : {};
      await store.markFailed(t.key, error, { agent_name: agentName, data_source: t.row?.data_source ?? "unknown", extra_fields: { trajectory_info: t.trajectory_info, ...refusal }, ...(model ? { model } : {}) });
      await groupGate?.settled(t, true);
      if (mismatch) this.summary.refused++;
      await this.finish(job, true);
      return;
    }
    const plan: BatchPlan = {
      batch_id: spec.batch_id,
      validate: spec.validate,
      global_steps: spec.global_steps,
      model_version: spec.model_version,
      trajectories: [t],
      groups: new Map([[t.uid, t.group_size]]),
    };
    const executor = abandonOnConflict(this.opts.executorFor(spec.rollout, { model_version: spec.model_version, validate: spec.validate }));
    const run = new BatchRun(plan, { executor, store, rollout: spec.rollout, concurrency: 1, ...(groupGate ? { groupGate } : {}), ...(own ? { model: own } : {}) });
    entry.run = run;
    if (entry.cancelled) run.cancel();
    if (entry.stopped) run.stop(entry.stopped);
    await run.run().catch((e: unknown) => {
      if (!run.isCancelled) throw e;
    });
    // A cancel this worker had not yet seen may have refused the record (its group withdrawn): asked once more.
    const cancelled = run.isCancelled || entry.cancelled || (await retry(() => jobs.cancelledBatches([job.batch_id]))).size > 0;
    if (cancelled) {
      // Aborted by the cancel (or its record refused: the group was withdrawn): nothing stored for it here;
      // the session's checkpoint goes too, and no completion event.
      await retry(() => jobs.dropSessions([t.key])).catch(() => {});
      await retry(() => jobs.ack([job.id]));
      this.summary.cancelled++;
      this.log(`${t.key}: batch ${job.batch_id} was cancelled; aborted, nothing stored`);
      return;
    }
    const surplus = run.surplusOutcome;
    if (os && surplus.sessions > 0) {
      await this.dropSurplus(job, os.partial_rollout, surplus.interrupted > 0);
      return;
    }
    if (run.abandoned) {
      this.summary.abandoned++;
      this.log(`${t.key} was taken over by another worker`);
      return;
    }
    // A session emits 0…k records; the job is done once all are stored and the session finished (a failed write leaves the job for a retry).
    const lost = run.stats().errors.find((e) => e.error.startsWith("transfer queue write failed"));
    if (lost) throw new Error(lost.error);
    // Stored before by another batch (the same uid posted twice): counted there, not again. A redelivered job's
    // records found stored were written by its own earlier delivery (a worker that died after writing): counted here.
    await this.finish(job, run.records().some((r) => r.error !== null), run.stats().counts.reused > 0 && job.deliveries === 1);
  }

  /**
   * A job of an over-sampled batch stopped as surplus: nothing stored;
   * `cancel` drops its durable session, `carry` keeps it (the next batch
   * naming its uid resumes it from there); a `surplus` event tells
   * followers, then the job is acknowledged.
   */
  private async dropSurplus(job: Job, mode: "cancel" | "carry", running: boolean): Promise<void> {
    const key = job.trajectory.key;
    if (mode === "cancel") await retry(() => this.opts.jobs.dropSessions([key])).catch(() => {});
    await retry(() => this.opts.jobs.surplus(job.batch_id, [key], running));
    await retry(() => this.opts.jobs.ack([job.id]));
    this.summary.surplus++;
    this.log(`${key}: batch ${job.batch_id} reached its target; ${mode === "carry" ? "carried (session kept)" : "cancelled, nothing stored"}${running ? " (was running)" : ""}`);
  }

  private async finish(job: Job, failed: boolean, reused = false): Promise<void> {
    await retry(() => this.opts.jobs.completed(job.batch_id, job.trajectory.key, reused));
    await retry(() => this.opts.jobs.ack([job.id]));
    this.summary.completed++;
    if (failed) this.summary.failed++;
  }

  private spec(batchId: string): Promise<BatchSpec | null> {
    let p = this.specs.get(batchId);
    if (!p) {
      p = retry(() => this.opts.jobs.batch(batchId)).then((b) => b?.spec ?? null);
      p.catch(() => this.specs.delete(batchId));
      if (this.specs.size > 256) this.specs.clear();
      this.specs.set(batchId, p);
    }
    return p;
  }

  private log(line: string): void {
    this.opts.log?.(`[${this.opts.consumer}] ${line}`);
  }
}

/** What the worker tracks of a running job: its batch, its one-trajectory run, and what stopped it. */
interface RunEntry {
  batch: string;
  run: BatchRun | null;
  cancelled: boolean;
  /** Its batch is over-sampled (polled for `stopped`). */
  oversampled: boolean;
  /** Set once its over-sampled batch reached the target. */
  stopped: "cancel" | "carry" | null;
}

/** Maps the session fence's ConflictError (another owner committed a newer step) to {@link TrajectoryAbandonedError}. */
function abandonOnConflict(ex: TrajectoryExecutor): TrajectoryExecutor {
  return {
    agentNameFor: (t) => ex.agentNameFor(t),
    ...(ex.discard ? { discard: (t: PlannedTrajectory) => ex.discard!(t) } : {}),
    run: (t, plan, signal) =>
      ex.run(t, plan, signal).catch((e: unknown) => {
        if (e instanceof ConflictError) throw new TrajectoryAbandonedError(e.message);
        throw e;
      }),
  };
}

/** Retries a Redis operation: for as long as the store is unreachable, 5 attempts for other retryable failures (100 ms × 3ⁱ, capped at 5 s). */
function retry<T>(fn: () => Promise<T>): Promise<T> {
  return holdWhileStoreDown(fn, { minTimeoutMs: 100 });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function message(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
