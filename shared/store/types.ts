import type { TrajectoryRecord } from "../schema/index.ts";

/** Result of `put` / `markFailed`: `stored` is false when the key was already written (idempotent). */
export interface PutResult {
  key: string;
  stored: boolean;
}

/** Which queue partition a group belongs to: training groups and validation groups never mix. */
export type Partition = "train" | "val";

/** Progress of one prompt group (`uid`). */
export interface GroupStatus {
  uid: string;
  partition: Partition;
  /** Sessions expected (`rollout.n`, or the row's `__rollout_n__`); null when the group was never registered. */
  expected: number | null;
  /** Keys written so far (successful or failed). */
  done: number;
  /** Keys written with an error. */
  failed: number;
  complete: boolean;
}

/** A complete group delivered to a consumer; ack it with `delivery_id` once processed. */
export interface CompleteGroup {
  uid: string;
  partition: Partition;
  delivery_id: string;
  /** How many of the group's records failed (have `error` set); 0 for a clean group. */
  failed: number;
  /** Every record of the group, ordered by `session_id` then `output_index`; failed ones have `error` set. */
  records: TrajectoryRecord[];
}

/** Options for {@link TransferQueue.readCompleteGroups}. */
export interface ReadGroupsOptions {
  /** Consumer name inside the consumer group (one per trainer process). */
  consumer: string;
  /** Most groups to return. */
  max: number;
  /** Wait up to this many milliseconds for a group when none is ready (0 = don't wait). */
  block_ms?: number;
  partition?: Partition;
}

/**
 * The transfer queue (DESIGN §4.5): finished trajectories written once per key,
 * grouped by `uid`, read by trainers as complete groups with at-least-once
 * delivery and explicit ack. One contract suite runs on every adapter.
 */
export interface TransferQueue {
  /** Declares that `uid` expects `n` sessions in `partition`. Idempotent; must precede puts for it. */
  expectGroup(uid: string, n: number, partition?: Partition): Promise<void>;
  /** Writes a record once per key; a second write of the same key stores nothing and says so. */
  put(record: TrajectoryRecord): Promise<PutResult>;
  /** The record stored under `key`, or null. */
  get(key: string): Promise<TrajectoryRecord | null>;
  groupStatus(uid: string): Promise<GroupStatus>;
  /** Records `key` as failed with `reason` (an empty record with `error` set) unless it was already written. */
  markFailed(key: string, reason: string, fields?: Partial<TrajectoryRecord>): Promise<PutResult>;
  /** Complete groups not yet delivered to this consumer group, plus groups whose delivery was never acked and timed out. */
  readCompleteGroups(opts: ReadGroupsOptions): Promise<CompleteGroup[]>;
  /** Acknowledges delivered groups; returns how many were pending. */
  ack(deliveryIds: readonly string[], partition?: Partition): Promise<number>;
  close(): Promise<void>;
}

/** Constructor options shared by every {@link TransferQueue} adapter. */
export interface TransferQueueOptions {
  /** Prefix of every Redis key (default `edgeloop:`); tests use a random one per file. */
  prefix?: string;
  /** Consumer-group name trainers read with (default `trainers`). */
  group?: string;
  /**
   * Milliseconds a delivered group may stay unacked before another consumer may
   * claim it (Redis `XAUTOCLAIM` min-idle; default 300 000 = 5 min).
   * @see https://redis.io/docs/latest/commands/xautoclaim/
   */
  visibilityTimeoutMs?: number;
}
