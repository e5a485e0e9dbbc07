import { parseTrajectoryKey, type TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import { holdWhileStoreDown, isStoreOutage } from "../store/store-outage.ts";
import type { BatchPlan, PlannedTrajectory } from "./batch.ts";
import { errorText, type BatchProgress } from "./batch-progress.ts";

/**
 * The transfer-queue writes of a {@link BatchRun} (batch-run.ts): each
 * record written once (a failed one through `markFailed`), a session without
 * output finished with none, each retried while the store is down
 * ({@link holdWhileStoreDown}), and the repair that puts back what the store
 * lost. Remembers which sessions had no output and which writes failed, as
 * the repair needs them.
 */
export class BatchWriter {
  /** Keys of sessions that finished with no output (a store repair finishes them again). */
  readonly emptySessions = new Set<string>();
  /** Keys whose write failed (held in memory with a "transfer queue write failed" error; a rerun writes them, a repair must not). */
  readonly unstored = new Set<string>();

  constructor(
    private readonly queue: TransferQueue,
    private readonly progress: BatchProgress,
  ) {}

  /** A loop that returned no output: its session is finished with none (the group does not wait for it); a failed write is kept as an error. */
  async finishEmpty(t: PlannedTrajectory): Promise<void> {
    this.emptySessions.add(t.key);
    try {
      await holdWhileStoreDown(() => this.queue.finishSession(t.uid, t.session_id, 0));
    } catch (e) {
      this.progress.error(t.key, `transfer queue write failed: ${errorText(e)}`);
    }
  }

  /**
   * Writes one record (`last`: its session's last output) with retries;
   * returns it as counted (with `error` set when the write failed) and
   * whether this write stored it (false: the key was already written).
   * An attempt cut off by a store outage may have landed (the reply was
   * lost, or `store.durability: replicated` found too few replicas after the
   * primary wrote it): a retry that then finds the key stored counts it as
   * this write's, not as another batch's (`reused`).
   */
  async store(r: TrajectoryRecord, last: boolean): Promise<{ record: TrajectoryRecord; stored: boolean }> {
    let ambiguous = false;
    try {
      const res = await holdWhileStoreDown(() => writeRecord(this.queue, r, last), { onRetry: (e) => (ambiguous ||= isStoreOutage(e)) });
      return { record: r, stored: res.stored || ambiguous };
    } catch (e) {
      this.unstored.add(r.key);
      return { record: { ...r, error: `transfer queue write failed: ${errorText(e)}`, finish_reason: "error" }, stored: true };
    }
  }

  /**
   * Puts back what the store lost of `groups` (uid → sessions; see
   * `BatchRun.repairStore`): each one not complete in the store is
   * registered again when its registration is gone, and every record of
   * `finished` for it is written again (put-once; each session's last
   * output flagged, sessions without output finished again). A group this
   * run did not see finish, or holding a record whose write failed, is left
   * alone. Sets `repaired` (and an error) in the progress when a group was
   * found incomplete.
   * @returns groups completed again, records written again, and the uids of groups still incomplete.
   */
  async repair(plan: BatchPlan, groups: readonly [string, number][], finished: readonly TrajectoryRecord[]): Promise<{ groups: number; records: number; incomplete: string[] }> {
    const mode = plan.validate ? "val" : "train";
    const byUid = new Map<string, TrajectoryRecord[]>();
    for (const r of finished) {
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
        if (st.expected === null) await holdWhileStoreDown(() => this.queue.expectGroup(uid, n, mode, plan.fingerprints?.get(uid)));
        const bySession = new Map<number, TrajectoryRecord[]>();
        for (const r of recs) bySession.set(r.session_id, [...(bySession.get(r.session_id) ?? []), r]);
        for (const list of bySession.values()) {
          list.sort((a, b) => a.output_index - b.output_index);
          for (const [k, r] of list.entries()) {
            if ((await holdWhileStoreDown(() => writeRecord(this.queue, r, k === list.length - 1))).stored) rewritten++;
          }
        }
        for (const sid of empty.get(uid) ?? []) await holdWhileStoreDown(() => this.queue.finishSession(uid, sid, 0));
        if (!(await holdWhileStoreDown(() => this.queue.groupStatus(uid))).complete) incomplete.push(uid);
      }
    }
    const s = this.progress.s;
    if (repairedGroups > 0) {
      s.repaired = { groups: repairedGroups - incomplete.length, records: rewritten };
      this.progress.error("(store)", `the store lost data while the batch ran: ${repairedGroups} groups found incomplete, ${rewritten} records written again`);
    }
    return { ...(s.repaired ?? { groups: 0, records: 0 }), incomplete };
  }
}

/** One record's write: `put` (`last`: its session's last output), or `markFailed` for a failed record. */
function writeRecord(queue: TransferQueue, r: TrajectoryRecord, last: boolean): Promise<{ stored: boolean }> {
  return r.error === null
    ? queue.put(r, { last })
    : queue.markFailed(r.key, r.error, { agent_name: r.agent_name, data_source: r.data_source, extra_fields: r.extra_fields, ...(r.model ? { model: r.model } : {}) });
}
