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
 * writing the event and acknowledging its job) are ignored by `observe`.
 * Runtime-free (timers only).
 */
export function followBatch(run: BatchRun, jobs: JobQueue, store: TransferQueue, opts: FollowOptions = {}): BatchFollower {
  let stopped = false;
  let caughtUp!: () => void;
  const ready = new Promise<void>((r) => (caughtUp = r));
  let after = "0-0";
  const retry = new Set<string>();
  const allKeys = run.plan.trajectories.map((t) => t.key);
  const pollMs = opts.pollMs ?? 200;
  let lastStartedCheck = 0;
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  const loop = async () => {
    let backoff = pollMs;
    while (!stopped && !run.stats().done) {
      try {
        const events = await jobs.completions(run.plan.batch_id, after);
        if (events.length) after = events[events.length - 1]!.id;
        const keys = [...retry, ...events.map((e) => e.key)].filter((k) => k && !run.observedKeys().has(k));
        retry.clear();
        const sessions = await Promise.all(
          keys.map((k) => {
            const { uid, session_id } = parseTrajectoryKey(k);
            return store.sessionRecords(uid, session_id);
          }),
        );
        sessions.forEach((recs, i) => (recs ? run.observeSession(keys[i]!, recs) : retry.add(keys[i]!)));
        if (opts.started && Date.now() - lastStartedCheck > 1000 && !run.stats().done) {
          lastStartedCheck = Date.now();
          const open = allKeys.filter((k) => !run.observedKeys().has(k)).slice(0, 10_000);
          run.setRunning(await opts.started(open));
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
