import { keyPart } from "../store/key-encoding.ts";

/**
 * The Redis key layout of the job queue under a prefix (default
 * `edgeloop:`; docs/queue-layout.md): the job stream, the wake stream, the
 * workers' set and lease, the batch index, and each batch's hashes, streams
 * and lists. Ids are encoded with {@link keyPart}, so any batch id or uid
 * gives one key of the layout.
 */
export class JobKeys {
  /** The job stream (`{p}jobs`). */
  readonly stream: string;
  /** The wake stream (`{p}jobs:wake`). */
  readonly wakeStream: string;
  /** The workers' sorted set (`{p}jobs:workers`). */
  readonly workersKey: string;
  /** The lease the workers claim with (`{p}jobs:lease`). */
  readonly leaseKey: string;

  constructor(readonly prefix: string) {
    this.stream = `${prefix}jobs`;
    this.wakeStream = `${prefix}jobs:wake`;
    this.workersKey = `${prefix}jobs:workers`;
    this.leaseKey = `${prefix}jobs:lease`;
  }

  /** The hash of a batch's spec and keys. */
  batchKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}`;
  }

  /**
   * The batch index (ZSET, every score 0): one member `{started_at, 15 digits}:{batch_id}` per
   * submitted batch, so `ZREVRANGEBYLEX` lists batches newest first with a stable cursor (the last
   * member seen). Members of batches whose hash expired or was collected are skipped and removed.
   */
  batchesKey(): string {
    return `${this.prefix}jobs:batches`;
  }

  /** The stream of a batch's completion events. */
  doneKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:done`;
  }

  /** The hash of a batch's rows: field = the row's index in the request, value = the row (JSON); stored once per batch. */
  rowsKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:rows`;
  }

  /** Over-sampled batches: the reserve rows' uids not started yet, in row order (LIST). */
  reserveKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:reserve`;
  }

  /** Over-sampled batches: the reserve uids started in place of filtered groups, in launch order (LIST). */
  launchedKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:launched`;
  }

  /** Over-sampled batches: per reserve uid, its group and job entries (HASH, JSON values). */
  reserveJobsKey(batchId: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:reserve-jobs`;
  }

  /** Over-sampled batches: the session ids of `uid`'s group admitted to write (SET). */
  admittedKey(batchId: string, uid: string): string {
    return `${this.prefix}jobs:batch:${keyPart(batchId, "batch_id")}:w:${keyPart(uid, "uid")}`;
  }

  /** The durable-session hash of trajectory key `key` (`{p}session:{key}`). */
  sessionKey(key: string): string {
    return `${this.prefix}session:${keyPart(key)}`;
  }
}

/** The batch index's member for a batch: its start (epoch ms, zero-padded to 15 digits, so members sort by time) and id. */
export function batchIndexMember(startedAt: number, batchId: string): string {
  return `${String(Math.max(0, Math.floor(startedAt))).padStart(15, "0")}:${batchId}`;
}
