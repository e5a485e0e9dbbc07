import type { TrajectoryRecord } from "../schema/index.ts";
import type { CompleteGroup, FilteredGroup, GroupStatus, Partition, PutOptions, PutResult, ReadGroupsOptions, TransferQueue } from "../store/types.ts";
import { SpanAttr, withSpan } from "./tracer.ts";

/**
 * A {@link TransferQueue} whose writes are traced as `queue.put` spans
 * (`edgeloop.queue.op` = `put` or `mark_failed`, the trajectory key, and
 * whether the write stored anything); every other call passes through.
 */
export class TracingTransferQueue implements TransferQueue {
  constructor(readonly inner: TransferQueue) {}

  put(record: TrajectoryRecord, opts?: PutOptions): Promise<PutResult> {
    return withSpan("queue.put", { [SpanAttr.key]: record.key, [SpanAttr.queueOp]: "put" }, async (span) => {
      const r = await this.inner.put(record, opts);
      span.setAttribute(SpanAttr.stored, r.stored);
      return r;
    });
  }

  markFailed(key: string, reason: string, fields?: Partial<TrajectoryRecord>): Promise<PutResult> {
    return withSpan("queue.put", { [SpanAttr.key]: key, [SpanAttr.queueOp]: "mark_failed" }, async (span) => {
      const r = await this.inner.markFailed(key, reason, fields);
      span.setAttribute(SpanAttr.stored, r.stored);
      return r;
    });
  }

  expectGroup(uid: string, n: number, partition?: Partition, fingerprint?: string): Promise<void> {
    return this.inner.expectGroup(uid, n, partition, fingerprint);
  }
  finishSession(uid: string, session_id: number, outputs: number): Promise<boolean> {
    return this.inner.finishSession(uid, session_id, outputs);
  }
  sessionRecords(uid: string, session_id: number): Promise<TrajectoryRecord[] | null> {
    return this.inner.sessionRecords(uid, session_id);
  }
  get(key: string): Promise<TrajectoryRecord | null> {
    return this.inner.get(key);
  }
  groupStatus(uid: string): Promise<GroupStatus> {
    return this.inner.groupStatus(uid);
  }
  cancelGroups(uids: readonly string[]): Promise<{ withdrawn: string[]; complete: string[] }> {
    if (!this.inner.cancelGroups) return Promise.reject(new Error("this transfer queue cannot cancel groups"));
    return this.inner.cancelGroups(uids);
  }
  filterGroup(uid: string, reason: string): Promise<boolean> {
    if (!this.inner.filterGroup) return Promise.reject(new Error("this transfer queue cannot filter groups"));
    return this.inner.filterGroup(uid, reason);
  }
  filteredGroups(opts: { partition?: Partition; max: number }): Promise<FilteredGroup[]> {
    if (!this.inner.filteredGroups) return Promise.resolve([]);
    return this.inner.filteredGroups(opts);
  }
  readCompleteGroups(opts: ReadGroupsOptions): Promise<CompleteGroup[]> {
    return this.inner.readCompleteGroups(opts);
  }
  ack(deliveryIds: readonly string[], partition?: Partition): Promise<number> {
    return this.inner.ack(deliveryIds, partition);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}
