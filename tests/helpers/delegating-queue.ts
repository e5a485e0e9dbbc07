import type { TransferQueue } from "../../shared/store/types.ts";

/**
 * A transfer queue whose required methods call `q`'s, with `over` replacing
 * any of them: a queue without the optional capabilities (cancelGroups,
 * filterGroup, filteredGroups) even when `q` has them, as a third-party
 * adapter would be. For tests that watch or break one method.
 */
export function delegatingQueue(q: TransferQueue, over: Partial<TransferQueue> = {}): TransferQueue {
  return {
    expectGroup: (u, n, p, fp) => q.expectGroup(u, n, p, fp),
    put: (r, o) => q.put(r, o),
    finishSession: (u, s, k) => q.finishSession(u, s, k),
    sessionRecords: (u, s) => q.sessionRecords(u, s),
    get: (k) => q.get(k),
    groupStatus: (u) => q.groupStatus(u),
    markFailed: (k, r, f) => q.markFailed(k, r, f),
    readCompleteGroups: (o) => q.readCompleteGroups(o),
    ack: (ids, p) => q.ack(ids, p),
    close: () => q.close(),
    ...over,
  };
}
