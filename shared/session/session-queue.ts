import type { TrajectoryRecord } from "../schema/index.ts";
import type { PutResult, TransferQueue } from "../store/types.ts";
import type { SessionHost } from "./session-host.ts";
import type { SessionStorage } from "./session-storage.ts";

/**
 * Wraps the transfer queue a batch writes to when its trajectories run as
 * durable sessions: a record whose session is already `done` is not written
 * again (a rerun after a crash hands such records back to the batch), and
 * after a record is written its session is committed `done`. The queue's
 * own once-per-key write covers the window between the two (a crash after
 * the write, before `done`). Everything else passes through.
 */
export function sessionCompletingQueue(inner: TransferQueue, storage: SessionStorage, host: SessionHost): TransferQueue {
  const isDone = async (key: string): Promise<boolean> => {
    const s = await storage.get(key);
    const last = s?.deltas[s.deltas.length - 1];
    if (!last) return false;
    return (JSON.parse(last) as { phase?: unknown }).phase === "done";
  };
  const write = async (key: string, w: () => Promise<PutResult>): Promise<PutResult> => {
    if (await isDone(key)) return { key, stored: false };
    const r = await w();
    await host.markDone(key);
    return r;
  };
  return {
    expectGroup: (uid, n, partition) => inner.expectGroup(uid, n, partition),
    put: (record: TrajectoryRecord) => write(record.key, () => inner.put(record)),
    markFailed: (key, reason, fields) => write(key, () => inner.markFailed(key, reason, fields)),
    get: (key) => inner.get(key),
    groupStatus: (uid) => inner.groupStatus(uid),
    readCompleteGroups: (opts) => inner.readCompleteGroups(opts),
    ack: (ids, partition) => inner.ack(ids, partition),
    close: () => inner.close(),
  };
}
