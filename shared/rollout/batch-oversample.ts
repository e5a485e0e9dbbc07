import type { TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import { holdWhileStoreDown } from "../store/store-outage.ts";
import type { BatchPlan, PlannedTrajectory } from "./batch.ts";
import type { BatchProgress } from "./batch-progress.ts";

/** What {@link OversampleGroups} needs of its batch run. */
export interface OversampleHost {
  readonly plan: BatchPlan;
  readonly queue: TransferQueue;
  readonly progress: BatchProgress;
  /** uids whose group existed before this batch (see `BatchRunOptions.reusedUids`). */
  readonly reusedUids?: ReadonlySet<string>;
  /** How the run's surplus was stopped; null while it was not. */
  stopMode(): "cancel" | "carry" | null;
  /** Whether the batch was cancelled. */
  cancelled(): boolean;
  /** `target_groups` were delivered: stop the surplus. */
  reached(): void;
  /** Queue a started reserve row's trajectories to run. */
  enqueue(ts: PlannedTrajectory[]): void;
}

/**
 * The group bookkeeping of an over-sampled {@link BatchRun} (batch-run.ts):
 * which rows were started and which wait in reserve, the sessions of each
 * group admitted to write and finished, the groups delivered, filtered
 * (`filter_groups`) or left incomplete, and the surplus stopped once
 * `target_groups` were delivered. Its figures are the progress's
 * `oversample` ones. Surplus is counted for any batch (a worker's gated run too).
 */
export class OversampleGroups {
  /** uids started (their groups registered), in launch order; the reserve's uids not started yet (row order). */
  private readonly launched = new Set<string>();
  private reserve: string[] = [];
  /** Sessions of re-posted uids found finished before the batch ran (handed back, already counted in the group tracking). */
  private readonly preFinished = new Map<string, TrajectoryRecord[]>();
  /** Per uid: sessions finished and their records. */
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
  /** Groups left incomplete by the stop (withdrawn or carried). */
  private readonly stoppedGroups = new Set<string>();
  /** Sessions this run stopped as surplus (any batch, over-sampled or gated) and how many of them were running. */
  private readonly surplusOut = { sessions: 0, interrupted: 0 };

  /** `external`: the batch runs in workers; its eager rows count as started at once. */
  constructor(
    private readonly host: OversampleHost,
    external: boolean,
  ) {
    const os = host.plan.oversample;
    if (external && os) this.launchEager(os.eager_rows);
  }

  /** Whether `uid`'s group was started (an eager row or a replacement). */
  isLaunched(uid: string): boolean {
    return this.launched.has(uid);
  }

  /** uids of the started groups (eager rows, then replacements in launch order). */
  launchedUids(): string[] {
    return [...this.launched];
  }

  /** Reserve rows not started yet. */
  get reserveLeft(): number {
    return this.reserve.length;
  }

  /** Whether a store repair may complete `uid`'s group again: started and not left incomplete by the stop. */
  repairable(uid: string): boolean {
    return this.launched.has(uid) && !this.stoppedGroups.has(uid);
  }

  /** The records of `key`'s session when it had finished before the batch ran (read by {@link prepare}). */
  preFinishedOf(key: string): TrajectoryRecord[] | undefined {
    return this.preFinished.get(key);
  }

  /** Reserve rows started in another process (external batches; row order): registered as launched. */
  markLaunched(uids: readonly string[]): void {
    for (const u of uids) {
      if (this.launched.has(u)) continue;
      this.launched.add(u);
      this.reserve = this.reserve.filter((x) => x !== u);
    }
  }

  private launchEager(eager: number): void {
    const uids = [...this.host.plan.groups.keys()];
    for (const u of uids.slice(0, eager)) this.launched.add(u);
    this.reserve = uids.slice(eager);
  }

  /**
   * Over-sampled batch set-up: the first `eager_rows` rows are launched, the
   * rest kept as reserve; sessions of re-posted uids that already finished
   * (a carried group's) are read back so the group tracking starts from what
   * the store holds.
   */
  async prepare(): Promise<void> {
    const { plan, queue } = this.host;
    this.launchEager(plan.oversample!.eager_rows);
    const reused = this.host.reusedUids;
    if (!reused?.size) return;
    for (const t of plan.trajectories) {
      if (!reused.has(t.uid) || !this.launched.has(t.uid)) continue;
      const recs = await holdWhileStoreDown(() => queue.sessionRecords(t.uid, t.session_id));
      if (!recs) continue;
      this.preFinished.set(t.key, recs);
      this.groupDone.set(t.uid, (this.groupDone.get(t.uid) ?? 0) + 1);
      this.groupRecords.set(t.uid, [...(this.groupRecords.get(t.uid) ?? []), ...recs]);
      this.groupAdmitted.set(t.uid, (this.groupAdmitted.get(t.uid) ?? 0) + 1);
      this.groupAdmittedRecords.set(t.uid, [...(this.groupAdmittedRecords.get(t.uid) ?? []), ...recs]);
    }
    const o = this.host.progress.s.oversample!;
    for (const uid of reused) {
      if (!this.launched.has(uid) || (this.groupDone.get(uid) ?? 0) < plan.groups.get(uid)!) continue;
      const st = await holdWhileStoreDown(() => queue.groupStatus(uid));
      if (st.filtered) {
        this.filteredUids.add(uid);
        o.filtered++;
      } else o.delivered++;
    }
    if (o.delivered >= o.target_groups) this.host.reached();
  }

  /**
   * Decides the write of a finished session of an over-sampled batch (true
   * for a plain batch). A session that is not its group's last is written.
   * The last one: with `filter_groups`, a group whose rewards are all equal
   * is flagged filtered in the store first (never delivered) and a reserve
   * row is started in its place; otherwise the write is admitted only while
   * delivered plus in-flight completions stay under `target_groups` (so
   * exactly the target is delivered). Returns false: surplus, store nothing.
   */
  async admit(t: PlannedTrajectory, records: readonly TrajectoryRecord[]): Promise<boolean> {
    const { plan, queue } = this.host;
    const os = plan.oversample;
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
      const filter = queue.filterGroup ? await holdWhileStoreDown(() => queue.filterGroup!(t.uid, `reward all_equal ${first}`)) : false;
      if (filter) {
        this.filteredUids.add(t.uid);
        this.host.progress.s.oversample!.filtered++;
        await this.launchReserve();
        return true;
      }
      // Not filtered after all (the store cannot, or the group was already delivered): a delivery slot as any group.
      const o = this.host.progress.s.oversample!;
      if (o.delivered + this.completing.size >= o.target_groups) {
        this.groupAdmitted.set(t.uid, admitted);
        this.groupAdmittedRecords.set(t.uid, all.slice(0, all.length - records.length));
        return false;
      }
      this.completing.add(t.uid);
      return true;
    }
    const o = this.host.progress.s.oversample!;
    if (o.delivered + this.completing.size >= o.target_groups) return false;
    this.completing.add(t.uid);
    return admit();
  }

  /** Starts the next reserve row (registers its group, queues its sessions) unless the batch is stopping. */
  private async launchReserve(): Promise<void> {
    const { plan, queue } = this.host;
    if (this.host.stopMode() !== null || this.host.cancelled()) return;
    const uid = this.reserve.shift();
    if (uid === undefined) return;
    this.launched.add(uid);
    this.host.progress.s.oversample!.replacements++;
    const mode = plan.validate ? "val" : "train";
    await holdWhileStoreDown(() => queue.expectGroup(uid, plan.groups.get(uid)!, mode, plan.fingerprints?.get(uid)));
    this.host.enqueue(plan.trajectories.filter((x) => x.uid === uid));
  }

  /** Counts a stored session toward its group; a delivered group that reaches the target stops the rest. */
  sessionDone(t: PlannedTrajectory, out: readonly TrajectoryRecord[]): void {
    const n = (this.groupDone.get(t.uid) ?? 0) + 1;
    this.groupDone.set(t.uid, n);
    this.groupRecords.set(t.uid, [...(this.groupRecords.get(t.uid) ?? []), ...out]);
    if (n < t.group_size || this.filteredUids.has(t.uid)) return;
    this.completing.delete(t.uid);
    const o = this.host.progress.s.oversample!;
    o.delivered++;
    if (o.delivered >= o.target_groups) this.host.reached();
  }

  /**
   * Sessions this run stopped as surplus (nothing stored for them), and of
   * them those that were running.
   */
  get surplusOutcome(): { sessions: number; interrupted: number } {
    return { ...this.surplusOut };
  }

  /** A session stopped by over-sampling (`running`: it was inside its loop): nothing stored for it. */
  surplus(t: PlannedTrajectory, running: boolean): void {
    this.surplusOut.sessions++;
    if (running) this.surplusOut.interrupted++;
    const o = this.host.progress.s.oversample;
    if (!o) return;
    if (this.host.plan.oversample!.partial_rollout === "carry") o.carried++;
    else o.cancelled++;
    if (running) o.interrupted++;
    this.stoppedGroups.add(t.uid);
  }

  /**
   * End of an over-sampled batch: unused reserve rows leave `pending`; the
   * started groups left incomplete are withdrawn (`cancel`: never delivered,
   * later writes refused) or left open for the next batch (`carry`).
   */
  async settle(): Promise<void> {
    const { plan, queue, progress } = this.host;
    const o = progress.s.oversample!;
    o.unused_groups = this.reserve.length;
    o.unused_sessions = this.reserve.reduce((n, u) => n + plan.groups.get(u)!, 0);
    progress.s.counts.pending -= o.unused_sessions;
    const stopMode = this.host.stopMode();
    if (stopMode === null) return;
    const open = [...this.launched].filter((u) => (this.groupDone.get(u) ?? 0) < plan.groups.get(u)!);
    for (const u of open) this.stoppedGroups.add(u);
    if (!open.length) return;
    if (stopMode === "carry") {
      o.groups_carried = open.length;
      return;
    }
    if (!queue.cancelGroups) {
      progress.error("(batch)", "this store cannot withdraw the surplus groups (no cancelGroups)");
      return;
    }
    const res = await holdWhileStoreDown(() => queue.cancelGroups!(open));
    o.groups_withdrawn = res.withdrawn.length;
  }
}
