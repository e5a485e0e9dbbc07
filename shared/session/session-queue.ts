import { parseTrajectoryKey, trajectoryKey, type TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import type { SessionHost } from "./session-host.ts";
import { isStaleStep, type SessionStorage } from "./session-storage.ts";

/**
 * Wraps the transfer queue a batch writes to when its trajectories run as
 * durable sessions (one session per `{uid}_{session_id}_0`, which may emit
 * several records): a record whose session is already `done` is not written
 * again (a rerun after a crash hands such records back to the batch), and
 * once the session's last record is written (a put with `last` unset or
 * true, `markFailed`, `finishSession`) the session is committed `done`. The
 * queue's own once-per-key write covers the window between the two (a crash
 * after the write, before `done`). Everything else passes through.
 */
export function sessionCompletingQueue(inner: TransferQueue, storage: SessionStorage, host: SessionHost): TransferQueue {
  const isDone = async (key: string): Promise<boolean> => {
    const s = await storage.get(key);
    const last = s?.deltas[s.deltas.length - 1];
    if (!last) return false;
    return (JSON.parse(last) as { phase?: unknown }).phase === "done";
  };
  const sessionOf = (key: string): string => {
    const { uid, session_id } = parseTrajectoryKey(key);
    return trajectoryKey(uid, session_id, 0);
  };
  const write = async <R>(session: string, last: boolean, dflt: R, w: () => Promise<R>): Promise<R> => {
    if (await isDone(session)) return dflt;
    const r = await w();
    // The fence refusing `done` means another owner committed after this one (two processes ran the session,
    // N3): the records are stored once either way, and that owner marks the session done itself.
    if (last) await host.markDone(session).catch((e: unknown) => {
      if (!isStaleStep(e)) throw e;
    });
    return r;
  };
  return {
    expectGroup: (uid, n, partition, fingerprint) => inner.expectGroup(uid, n, partition, fingerprint),
    put: (record: TrajectoryRecord, opts) => write(sessionOf(record.key), opts?.last !== false, { key: record.key, stored: false }, () => inner.put(record, opts)),
    markFailed: (key, reason, fields) => write(sessionOf(key), true, { key, stored: false }, () => inner.markFailed(key, reason, fields)),
    finishSession: (uid, sid, outputs) => write(trajectoryKey(uid, sid, 0), true, false, () => inner.finishSession(uid, sid, outputs)),
    sessionRecords: (uid, sid) => inner.sessionRecords(uid, sid),
    get: (key) => inner.get(key),
    groupStatus: (uid) => inner.groupStatus(uid),
    ...(inner.cancelGroups ? { cancelGroups: (uids: readonly string[]) => inner.cancelGroups!(uids) } : {}),
    ...(inner.filterGroup ? { filterGroup: (uid: string, reason: string) => inner.filterGroup!(uid, reason) } : {}),
    ...(inner.filteredGroups ? { filteredGroups: (o: { partition?: "train" | "val"; max: number }) => inner.filteredGroups!(o) } : {}),
    readCompleteGroups: (opts) => inner.readCompleteGroups(opts),
    ack: (ids, partition) => inner.ack(ids, partition),
    close: () => inner.close(),
  };
}
