import { keyPart } from "../store/key-encoding.ts";
import type { BatchRun } from "../rollout/batch-run.ts";
import { parseTrajectoryKey } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import type { JobQueue } from "./job-queue.ts";

/** Options of {@link followBatch}. */
export interface FollowOptions {
  /** Milliseconds between polls when nothing new arrived (default 200). */
  pollMs?: number;
  /**
   * Counts the trajectories of `keys` that have started (a session
   * checkpoint exists); lets progress split unfinished keys into running and
   * pending. Optional.
   */
  started?: (keys: string[]) => Promise<number>;
  /** Called with a poll's error (transport trouble); the follower backs off and goes on. */
  onError?: (e: unknown) => void;
  /**
   * Milliseconds an unfinished trajectory may be missing from the store —
   * no job in the job stream and no record, and its durable session (if
   * any) not moved on — before it is reported lost ({@link BatchRun.markLost};
   * default 30 000). Checked when the batch's hash is gone or no completion
   * arrived for this long.
   */
  lostGraceMs?: number;
  /** Prefix of the transfer queue's keys, to name vanished group hashes (default: the job queue's prefix). */
  prefix?: string;
  /**
   * Whether the batch was cancelled (by another API process: `DELETE
   * /v1/rollouts/{id}`), checked about once a second: the run is then marked
   * cancelled, with its groups' fate read from the store, and following ends.
   */
  cancelled?: () => Promise<boolean>;
}

/** A running {@link followBatch}: `stop` ends it; `ready` resolves once the first poll has caught up with what is stored. */
export interface BatchFollower {
  stop(): void;
  /**
   * Resolves once every completion event stored when following began is
   * counted (and the running count was read), or after the first poll that
   * failed: answer progress queries after it, so a rebuilt batch (another API
   * process, a restart) never reports a stale "nothing done yet".
   */
  ready: Promise<void>;
}

/**
 * Feeds a batch whose trajectories run in worker processes: polls the
 * batch's completion stream (`XRANGE` after the last id seen — works over
 * Upstash REST too; one event per finished session, keyed `{uid}_{sid}_0`),
 * reads each new session's records (0…k) from the transfer queue and hands
 * them to {@link BatchRun.observeSession}, until every session is counted or the
 * returned `stop` is called. Duplicate events (a worker that died between
 * writing the event and acknowledging its job) are ignored by `observeSession`.
 * Keys the store lost (Redis restarted without persistence, evicted or
 * flushed: no job and no record for `lostGraceMs`, and no session step
 * committed meanwhile) are reported with {@link BatchRun.markLost}, so a
 * batch never waits forever. A session hash alone keeps nothing alive: after
 * a loss it may be marked finished while its records are gone, or be left by
 * a worker that died; only a step committed within the grace (a worker whose
 * job vanished with the stream, still running it) postpones the verdict.
 * Runtime-free (timers only).
 */
export function followBatch(run: BatchRun, jobs: JobQueue, store: TransferQueue, opts: FollowOptions = {}): BatchFollower {
  let stopped = false;
  let caughtUp!: () => void;
  const ready = new Promise<void>((r) => (caughtUp = r));
  let after = "0-0";
  const retry = new Set<string>();
  /** Sessions another batch had finished first (completion events with `reused`): counted as handed back. */
  const reusedKeys = new Set<string>();
  const allKeys = run.plan.trajectories.map((t) => t.key);
  const pollMs = opts.pollMs ?? 200;
  let lastStartedCheck = 0;
  const graceMs = opts.lostGraceMs ?? 30_000;
  const checkEveryMs = Math.max(100, Math.min(5_000, graceMs / 2));
  let lastLostCheck = Date.now();
  let lastProgress = Date.now();
  const absentSince = new Map<string, number>();
  /** The session step (`step:n`, or "" without a session hash) each absent key had at the last check. */
  const lastStep = new Map<string, string>();
  const prefix = opts.prefix ?? jobs.prefix;

  /**
   * Finds keys the store lost: of the uncounted keys, those with no job in
   * the stream and no record (a record found without its completion event
   * is counted instead) for longer than the grace, during which their
   * session, if any, committed no step.
   */
  const checkLost = async () => {
    const open = run.openKeys();
    if (open.length === 0) return;
    const batchGone = !(await jobs.batchStored(run.plan.batch_id));
    if (!batchGone && Date.now() - lastProgress < graceMs) return;
    const queued = await jobs.queuedKeys(run.plan.batch_id);
    const candidates = open.filter((k) => !queued.has(k));
    const [finished, steps] = await Promise.all([
      Promise.all(
        candidates.map((k) => {
          const { uid, session_id } = parseTrajectoryKey(k);
          return store.sessionRecords(uid, session_id);
        }),
      ),
      jobs.sessionSteps(candidates),
    ]);
    const absent = new Set<string>();
    finished.forEach((recs, i) => (recs ? run.observeSession(candidates[i]!, recs) : absent.add(candidates[i]!)));
    const now = Date.now();
    for (const k of [...absentSince.keys()]) if (!absent.has(k)) (absentSince.delete(k), lastStep.delete(k));
    for (const k of absent) {
      const step = steps.get(k) ?? "";
      // A session that committed a step since the last check is being run (by a worker whose job vanished): not lost yet.
      if (!absentSince.has(k) || lastStep.get(k) !== step) absentSince.set(k, now);
      lastStep.set(k, step);
    }
    const lost = [...absent].filter((k) => now - absentSince.get(k)! >= graceMs);
    if (lost.length === 0) return;
    // Put back what this process counted and the store lost (records, group registrations) before naming what is gone.
    if (batchGone) await run.repairStore();
    // Every uid of the batch: a group whose hash vanished is never delivered, even when its later records land.
    const uids = [...new Set(allKeys.map((k) => parseTrajectoryKey(k).uid))];
    const statuses = await Promise.all(uids.map((u) => store.groupStatus(u)));
    // A group is named when its hash vanished, or when one of its sessions is lost: repairStore may have put the
    // hash back (another of its sessions landed), but the group can never complete, so it is never delivered.
    const lostUids = new Set(lost.map((k) => parseTrajectoryKey(k).uid));
    const missing = [
      ...(batchGone ? [jobs.batchKey(run.plan.batch_id)] : []),
      ...uids.filter((u, i) => statuses[i]!.expected === null || (lostUids.has(u) && !statuses[i]!.complete)).map((u) => `${prefix}group:${keyPart(u, "uid")}`),
    ];
    const reason =
      `no job in ${jobs.stream} and no record for ${Math.round(graceMs / 1000)} s, no session step committed meanwhile` +
      (batchGone ? ` (the batch hash ${jobs.batchKey(run.plan.batch_id)} is gone: the store lost its data)` : "");
    run.markLost(lost, missing, reason);
    for (const k of lost) (absentSince.delete(k), lastStep.delete(k));
  };
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  const loop = async () => {
    let backoff = pollMs;
    while (!stopped && !run.stats().done) {
      try {
        const events = await jobs.completions(run.plan.batch_id, after);
        if (events.length) {
          after = events[events.length - 1]!.id;
          lastProgress = Date.now();
        }
        for (const e of events) if (e.reused) reusedKeys.add(e.key);
        const keys = [...retry, ...events.filter((e) => !e.surplus).map((e) => e.key)].filter((k) => k && !run.observedKeys().has(k));
        retry.clear();
        const sessions = await Promise.all(
          keys.map((k) => {
            const { uid, session_id } = parseTrajectoryKey(k);
            return store.sessionRecords(uid, session_id);
          }),
        );
        sessions.forEach((recs, i) => (recs ? run.observeSession(keys[i]!, recs, { handedBack: reusedKeys.has(keys[i]!) }) : retry.add(keys[i]!)));
        // Sessions of an over-sampled batch stopped as surplus (nothing stored for them); a key with a completion wins.
        for (const e of events) if (e.surplus && !retry.has(e.key)) run.observeSurplus(e.key, e.surplus.running);
        if (opts.started && Date.now() - lastStartedCheck > 1000 && !run.stats().done) {
          lastStartedCheck = Date.now();
          if (opts.cancelled && (await opts.cancelled())) {
            const uids = [...new Set(allKeys.map((k) => parseTrajectoryKey(k).uid))];
            const st = await Promise.all(uids.map((u) => store.groupStatus(u)));
            run.cancel();
            run.setCancellation({ withdrawn: st.filter((g) => g.cancelled).length, complete: st.filter((g) => g.complete).length });
            break;
          }
          const open = run.openKeys().slice(0, 10_000);
          run.setRunning(await opts.started(open));
        }
        // Read after the events: a reserve row is started before the completion event of the session that filtered its group.
        if (run.plan.oversample && !run.stats().done && (await followOversample(run, jobs, store))) break;
        if (Date.now() - lastLostCheck >= checkEveryMs && !run.stats().done) {
          lastLostCheck = Date.now();
          await checkLost();
        }
        backoff = pollMs;
        if (events.length < 1000) caughtUp();
        if (events.length < 1000) await sleep(pollMs);
      } catch (e) {
        caughtUp();
        opts.onError?.(e);
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 5_000);
      }
    }
  };
  void loop().finally(() => caughtUp());
  return {
    stop: () => {
      stopped = true;
      caughtUp();
    },
    ready,
  };
}

/**
 * One poll of an over-sampled queued batch's cross-process state: the
 * figures workers keep in the batch hash and the reserve rows started
 * since; once every session of the started groups is counted (finished,
 * surplus or lost), settles the batch — once per batch, whichever API
 * process gets there first (`JobQueue.settleOversample`): reserve rows
 * never started are `unused`; when the target was reached, the started
 * groups left incomplete are withdrawn (`cancel`, `TransferQueue.cancelGroups`:
 * never delivered) or left open for the next batch (`carry`). Returns true
 * once the batch is settled.
 */
async function followOversample(run: BatchRun, jobs: JobQueue, store: TransferQueue): Promise<boolean> {
  const id = run.plan.batch_id;
  const known = run.launchedUids().length - run.plan.oversample!.eager_rows;
  const st = await jobs.oversampleState(id, Math.max(0, known));
  run.setOversampleProgress({ delivered: st.delivered, filtered: st.filtered, replacements: st.replacements, reached: st.stopped !== null, launched: st.launched });
  if (run.openKeys().length > 0) return false;
  let settled = await jobs.oversampleSettlement(id);
  if (!settled) {
    const launched = new Set(run.launchedUids());
    const unused = [...run.plan.groups].filter(([u]) => !launched.has(u));
    const s = { groups_withdrawn: 0, groups_carried: 0, unused_groups: unused.length, unused_sessions: unused.reduce((n, [, k]) => n + k, 0) };
    if (st.stopped) {
      const statuses = await Promise.all([...launched].map((u) => store.groupStatus(u)));
      const open = statuses.filter((g) => !g.complete).map((g) => g.uid);
      if (st.stopped === "carry") s.groups_carried = open.length;
      else if (open.length && store.cancelGroups) s.groups_withdrawn = (await store.cancelGroups(open)).withdrawn.length;
    }
    settled = await jobs.settleOversample(id, s);
  }
  run.settleExternal(settled);
  return true;
}
