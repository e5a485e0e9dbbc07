import type { GroupWriteGate } from "../rollout/batch-run.ts";
import type { OversamplePlan, PlannedTrajectory } from "../rollout/batch.ts";
import type { TrajectoryRecord } from "../schema/index.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import type { TransferQueue } from "../store/types.ts";
import type { JobQueue } from "./job-queue.ts";

/** Options of a {@link QueuedGroupGate}. */
export interface QueuedGroupGateOptions {
  jobs: JobQueue;
  /** The worker's transfer queue (records of the group's other sessions are read from it; groups filtered and registered in it). */
  store: TransferQueue;
  batchId: string;
  plan: OversamplePlan;
  /**
   * Milliseconds the session completing a group waits for its other
   * sessions' records (admitted, still being written) before it judges the
   * group's rewards; after that the group is not filtered (default 60 000).
   */
  recordWaitMs?: number;
  /** Called once this worker's delivery reached the target (it then removes the batch's waiting jobs). */
  onStop?: (mode: "cancel" | "carry") => void;
  log?: (line: string) => void;
}

/**
 * The write decisions of an over-sampled batch whose sessions run in
 * several job-queue workers, made atomically in Redis (the job queue's
 * batch hash; scripts in oversample-lua.ts), with the semantics BatchRun
 * applies in one process:
 * - every finished session is admitted to write unless the batch was
 *   stopped (then it is surplus); the admission that completes a group's
 *   set of sessions makes that session its group's last;
 * - with `filter_groups` (DAPO), the last session reads the group's other
 *   records and, when every reward is equal (and none failed), flags the
 *   group filtered (`TransferQueue.filterGroup`: complete, never delivered)
 *   and starts the next reserve row (`JobQueue.groupFiltered`: popped and
 *   enqueued in one script; its group registered here);
 * - otherwise the last session needs a delivery slot: granted only while
 *   delivered + completing < `target_groups`, released when its write
 *   fails, turned into a delivery once stored; the delivery that reaches
 *   the target sets the batch's `stopped` flag, and this worker removes the
 *   batch's waiting jobs (`JobQueue.stopQueued`) while workers stop the
 *   running ones (they poll the flag).
 * @see https://arxiv.org/abs/2503.14476 (DAPO: dynamic sampling drops groups whose accuracy is all 0 or all 1)
 */
export class QueuedGroupGate implements GroupWriteGate {
  private readonly o: QueuedGroupGateOptions;
  /** Keys of sessions holding a delivery slot (admitted as their group's completing write). */
  private readonly reserved = new Set<string>();

  constructor(opts: QueuedGroupGateOptions) {
    this.o = opts;
  }

  async admit(t: PlannedTrajectory, records: readonly TrajectoryRecord[]): Promise<boolean> {
    const { jobs, store, batchId, plan } = this.o;
    const a = await retry(() => jobs.admitSession(batchId, t.uid, t.session_id, t.group_size));
    if (a === "surplus" || a === "cancelled") return false;
    if (a === "write") return true;
    if (plan.filter && store.filterGroup) {
      const all = await this.groupRecords(t, records);
      const first = all?.[0]?.reward_score ?? null;
      if (all && first !== null && all.every((r) => r.error === null && r.reward_score === first)) {
        if (await retry(() => store.filterGroup!(t.uid, `reward all_equal ${first}`))) {
          const row = await retry(() => jobs.groupFiltered(batchId, t.uid));
          if (row) {
            await retry(() => store.expectGroup(row.uid, row.group.n, row.group.part, row.group.fp));
            this.o.log?.(`${t.uid} filtered (reward all_equal ${first}); reserve row ${row.uid} started`);
          }
          return true;
        }
      }
    }
    if (!(await retry(() => jobs.reserveDelivery(batchId, t.uid)))) return false;
    this.reserved.add(t.key);
    return true;
  }

  async settled(t: PlannedTrajectory, stored: boolean): Promise<void> {
    const { jobs, batchId } = this.o;
    if (!this.reserved.delete(t.key)) return;
    if (!stored) {
      await retry(() => jobs.releaseDelivery(batchId, t.uid));
      return;
    }
    if (!(await retry(() => jobs.commitDelivery(batchId, t.uid)))) return;
    this.o.onStop?.(this.o.plan.partial_rollout);
    const removed = await retry(() => jobs.stopQueued(batchId));
    this.o.log?.(`batch ${batchId} reached its ${this.o.plan.target_groups} target groups with ${t.uid}: ${removed.length} waiting jobs removed (${this.o.plan.partial_rollout})`);
  }

  /**
   * Every record of `t`'s group: the other sessions' (admitted before this
   * one, their writes possibly still under way: polled until stored) and
   * this session's `mine`. Null when some did not appear within the wait.
   */
  private async groupRecords(t: PlannedTrajectory, mine: readonly TrajectoryRecord[]): Promise<TrajectoryRecord[] | null> {
    const deadline = Date.now() + (this.o.recordWaitMs ?? 60_000);
    const got = new Map<number, TrajectoryRecord[]>([[t.session_id, [...mine]]]);
    for (;;) {
      for (let sid = 0; sid < t.group_size; sid++) {
        if (got.has(sid)) continue;
        const recs = await retry(() => this.o.store.sessionRecords(t.uid, sid));
        if (recs) got.set(sid, recs);
      }
      if (got.size >= t.group_size) return [...got.values()].flat();
      if (Date.now() > deadline) {
        this.o.log?.(`${t.uid}: the group's other records did not appear within ${this.o.recordWaitMs ?? 60_000} ms; not filtered`);
        return null;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

function retry<T>(fn: () => Promise<T>): Promise<T> {
  return holdWhileStoreDown(fn, { minTimeoutMs: 100 });
}
