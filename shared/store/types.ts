import type { TrajectoryRecord } from "../schema/index.ts";

/** Result of `put` / `markFailed`: `stored` is false when the key was already written (idempotent). */
export interface PutResult {
  key: string;
  stored: boolean;
}

/** Which queue partition a group belongs to: training groups and validation groups never mix. */
export type Partition = "train" | "val";

/**
 * Options of {@link TransferQueue.put}. A session (one rollout of a prompt)
 * may emit 0…k outputs, each stored as one record `{uid}_{session_id}_{output_index}`;
 * the queue counts the session finished once its last output is stored and
 * so are all outputs before it (in any order), so groups count sessions,
 * not records (DESIGN §6).
 */
export interface PutOptions {
  /**
   * This record is its session's last output (default true: a single-output
   * loop finishes its session with one write). Write earlier outputs of a
   * multi-output session with `last: false`.
   */
  last?: boolean;
}

/** Progress of one prompt group (`uid`): sessions and records counted apart. */
export interface GroupStatus {
  uid: string;
  partition: Partition;
  /** Sessions expected (`rollout.n`, or the row's `__rollout_n__`); null when the group was never registered. */
  expected: number | null;
  /** Sessions finished (every output stored, or finished with none, or failed). */
  finished: number;
  /** Records stored so far (successful or failed), over every session. */
  records: number;
  /** Records stored with an error (a failed session stores one). */
  failed: number;
  /** Present (true) only for a group withdrawn by a cancelled batch ({@link TransferQueue.cancelGroups}): never delivered. */
  cancelled?: true;
  /** Present (true) only for a group filtered by dynamic sampling ({@link TransferQueue.filterGroup}): complete, never delivered. */
  filtered?: true;
  /** `expected` is set and every expected session has finished (the group is then delivered once). */
  complete: boolean;
  /** Fingerprint of the prompt group the uid names (see `groupFingerprint`), or null when none was registered. */
  fingerprint: string | null;
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

/**
 * A complete group that dynamic sampling kept from the trainers
 * ({@link TransferQueue.filterGroup}), as `GET /v1/groups?include_filtered=1`
 * lists it: its records and why it was filtered.
 */
export interface FilteredGroup {
  uid: string;
  partition: Partition;
  /** Why it was not delivered, e.g. `reward all_equal 1`. */
  reason: string;
  failed: number;
  /** Every record of the group, ordered by `session_id` then `output_index`. */
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
  /**
   * Deliver one agent role's records: every group is still delivered (and
   * acked) as a whole, holding only its records whose `agent_role` equals
   * this (`failed` counted over them; `records: []` when none). One trainer
   * per role reads with a consumer group of its own (`TransferQueueOptions.group`),
   * so each sees every group. Absent: every record.
   */
  agent_role?: string;
  /**
   * `leaves` (default): every record whole, as stored; `tree`: a branch whose
   * parent is in the same delivered group holds only its own tokens (from
   * `branch_at` on, `tree_prompt_length` set): see `TreeDelivery` in
   * shared/store/tree-delivery.ts. Applied after `agent_role`.
   */
  deliver?: "leaves" | "tree";
}

/**
 * The transfer queue (DESIGN §4.5): finished trajectories written once per key,
 * grouped by `uid`, read by trainers as complete groups with at-least-once
 * delivery and explicit ack. One contract suite runs on every adapter.
 */
export interface TransferQueue {
  /**
   * Declares that `uid` expects `n` sessions in `partition`, naming the prompt
   * group `fingerprint` (optional). Idempotent for the same values.
   * @throws ConflictError when the uid is registered with another n, partition or fingerprint.
   */
  expectGroup(uid: string, n: number, partition?: Partition, fingerprint?: string): Promise<void>;
  /**
   * Writes a record once per key; a second write of the same key stores
   * nothing and says so. With `last` (the default) the record is its
   * session's last output: the session finishes once outputs
   * `0..output_index` are all stored.
   * @throws ConflictError when the record's session already finished with fewer outputs, or
   *   `last` is set below an output already stored.
   */
  put(record: TrajectoryRecord, opts?: PutOptions): Promise<PutResult>;
  /**
   * Declares that session `session_id` of `uid` emitted `outputs` records in
   * all (0 = none: a loop that returned no output); it finishes once that
   * many are stored. Idempotent for the same count. Returns true when this
   * call finished the session.
   * @throws ConflictError when the session finished with another count, or more records are stored.
   */
  finishSession(uid: string, session_id: number, outputs: number): Promise<boolean>;
  /**
   * Every record of a finished session, ordered by `output_index` (empty for a
   * session finished with no output), or null while it has not finished.
   */
  sessionRecords(uid: string, session_id: number): Promise<TrajectoryRecord[] | null>;
  /** The record stored under `key`, or null. */
  get(key: string): Promise<TrajectoryRecord | null>;
  groupStatus(uid: string): Promise<GroupStatus>;
  /**
   * Records `key` as failed with `reason` (an empty record with `error` set)
   * unless it was already written, and finishes its session either way (with
   * the records it has stored): a failed session never holds its group open.
   */
  markFailed(key: string, reason: string, fields?: Partial<TrajectoryRecord>): Promise<PutResult>;
  /**
   * Withdraws the groups of a cancelled batch: each group of `uids` not yet
   * complete is flagged cancelled — it is never delivered, and later writes
   * to it (`put`, `markFailed`, `finishSession`) store nothing and throw a
   * {@link GroupCancelledError}; records stored before stay readable by key.
   * Groups already complete (delivered to the trainers' stream) are left as
   * they are. Optional: adapters without it cannot cancel batches.
   */
  cancelGroups?(uids: readonly string[]): Promise<{ withdrawn: string[]; complete: string[] }>;
  /**
   * Dynamic sampling (DAPO): flags `uid`'s group filtered with `reason`
   * before its last session is written; when it completes it is not
   * delivered to the trainers' stream but listed by {@link filteredGroups}.
   * Writes to it go on as usual. Returns false (nothing changed) when the
   * group was already delivered or withdrawn. Idempotent. `reason` is kept
   * to its first 500 characters. Optional.
   */
  filterGroup?(uid: string, reason: string): Promise<boolean>;
  /** Complete filtered groups of `partition` (default train), oldest first, at most `max`: read-only (no delivery, no ack). */
  filteredGroups?(opts: { partition?: Partition; max: number }): Promise<FilteredGroup[]>;
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
