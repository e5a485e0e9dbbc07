import { deliverGroups } from "./tree-delivery.ts";
import { ConflictError, GroupCancelledError, StoreError } from "../errors.ts";
import { parseTrajectoryKey, type TrajectoryRecord } from "../schema/index.ts";
import { decodeRecord, encodeRecord, failedRecord, validateAndEncode, type EncodedRecord, type RecordHead } from "./record-codec.ts";
import {
  checkFingerprint,
  checkGroupSize,
  checkKey,
  checkOutputs,
  checkSessionId,
  checkPartition,
  checkReadOptions,
  recordsOfRole,
  checkUid,
  compareKeys,
  DEFAULT_VISIBILITY_TIMEOUT_MS,
  fingerprintConflict,
  sessionConflict,
} from "./queue-args.ts";
import type {
  CompleteGroup,
  FilteredGroup,
  GroupStatus,
  Partition,
  PutOptions,
  PutResult,
  ReadGroupsOptions,
  TransferQueue,
  TransferQueueOptions,
} from "./types.ts";

interface Group {
  expected: number | null;
  partition: Partition;
  fingerprint: string | null;
  /** Sessions finished. */
  finished: number;
  /** Records stored. */
  records: number;
  failed: number;
  members: Set<string>;
  /** Per session: outputs stored, and (once known) outputs it has in all. */
  sessions: Map<number, { stored: number; total: number | null }>;
  enqueued: boolean;
  /** Withdrawn by a cancelled batch (`cancelGroups`). */
  cancelled?: boolean;
  /** Filtered by dynamic sampling (`filterGroup`): the reason. */
  filtered?: string;
}

interface Pending {
  consumer: string;
  delivered_at: number;
}

/** Options of {@link MemoryTransferQueue}: the shared ones plus an injectable clock (ms) for tests. */
export interface MemoryTransferQueueOptions extends TransferQueueOptions {
  now?: () => number;
}

/**
 * The in-process transfer queue (the embedded default): the same semantics as
 * the Redis layout — put-once per key, group completion, one consumer group
 * per partition with a pending list, redelivery after the visibility timeout —
 * held in maps. Records are stored encoded (as in Redis) so callers never
 * share arrays with the queue and log-probs come back as float32 everywhere.
 * Nothing survives a restart, and nothing is freed before it: every record,
 * group and batch stays in memory for the life of the process (no retention,
 * no `gc`; an acknowledged delivery is kept too). Meant for `rollout`, tests
 * and short-lived servers; `edgeloop serve` on it warns at start (see
 * docs/security.md, limits). Long-running servers use the Redis/Upstash store.
 */
export class MemoryTransferQueue implements TransferQueue {
  private readonly records = new Map<string, EncodedRecord>();
  private readonly groups = new Map<string, Group>();
  private readonly streams: Record<Partition, { id: string; uid: string; keys: string[] }[]> = { train: [], val: [] };
  /** uids of filtered groups, in the order they were filtered. */
  private readonly filtered: Record<Partition, string[]> = { train: [], val: [] };
  private readonly cursor: Record<Partition, number> = { train: 0, val: 0 };
  private readonly pending: Record<Partition, Map<string, Pending>> = { train: new Map(), val: new Map() };
  private readonly waiters = new Set<() => void>();
  private readonly visibilityMs: number;
  private readonly now: () => number;
  private lastMs = 0;
  private seq = 0;
  private closed = false;

  constructor(opts: MemoryTransferQueueOptions = {}) {
    this.visibilityMs = opts.visibilityTimeoutMs ?? DEFAULT_VISIBILITY_TIMEOUT_MS;
    this.now = opts.now ?? Date.now;
  }

  async expectGroup(uid: string, n: number, partition?: Partition, fingerprint?: string): Promise<void> {
    this.assertOpen();
    checkUid(uid);
    checkGroupSize(n);
    const part = checkPartition(partition);
    const fp = checkFingerprint(fingerprint);
    const g = this.group(uid);
    if (g.expected !== null) {
      if (g.expected !== n || g.partition !== part) {
        throw new ConflictError(`group ${uid} is registered with n=${g.expected} in ${g.partition}, not n=${n} in ${part}`);
      }
      if (fp !== null && g.fingerprint !== null && g.fingerprint !== fp) throw fingerprintConflict(uid);
      if (fp !== null) g.fingerprint = fp;
      return;
    }
    g.expected = n;
    g.partition = part;
    g.fingerprint = fp;
    this.maybeComplete(uid, g);
  }

  async put(record: TrajectoryRecord, opts: PutOptions = {}): Promise<PutResult> {
    this.assertOpen();
    const { head, encoded } = validateAndEncode(record);
    return this.store(head, encoded, opts.last === false ? "more" : "last");
  }

  async markFailed(key: string, reason: string, fields?: Partial<TrajectoryRecord>): Promise<PutResult> {
    this.assertOpen();
    checkKey(key);
    if (this.groups.get(parseTrajectoryKey(key).uid)?.cancelled) throw new GroupCancelledError(parseTrajectoryKey(key).uid);
    if (this.records.has(key)) {
      // Already written: only finish its session (with the records it has) if nothing else did.
      const { uid, session_id } = parseTrajectoryKey(key);
      const g = this.group(uid);
      const s = this.session(g, session_id);
      if (s.total === null) {
        s.total = s.stored;
        this.sessionFinished(uid, g);
      }
      return { key, stored: false };
    }
    const rec = failedRecord(key, reason, fields);
    return this.store(rec, encodeRecord(rec), "fail");
  }

  async finishSession(uid: string, session_id: number, outputs: number): Promise<boolean> {
    this.assertOpen();
    checkUid(uid);
    checkSessionId(session_id);
    checkOutputs(outputs);
    const g = this.group(uid);
    if (g.cancelled) throw new GroupCancelledError(uid);
    const s = this.session(g, session_id);
    if (s.total !== null) {
      if (s.total !== outputs) throw sessionConflict(uid, session_id, `finished with ${s.total} outputs, not ${outputs}`);
      return false;
    }
    if (s.stored > outputs) throw sessionConflict(uid, session_id, `has ${s.stored} outputs stored, more than ${outputs}`);
    s.total = outputs;
    if (s.stored !== outputs) return false;
    this.sessionFinished(uid, g);
    return true;
  }

  async sessionRecords(uid: string, session_id: number): Promise<TrajectoryRecord[] | null> {
    checkUid(uid);
    checkSessionId(session_id);
    const g = this.groups.get(uid);
    const s = g?.sessions.get(session_id);
    if (!g || !s || s.total === null || s.stored !== s.total) return null;
    const prefix = `${uid}_${session_id}_`;
    return [...g.members]
      .filter((k) => k.startsWith(prefix))
      .sort(compareKeys)
      .map((k) => decodeRecord({ ...this.records.get(k)! }));
  }

  async get(key: string): Promise<TrajectoryRecord | null> {
    checkKey(key);
    const enc = this.records.get(key);
    return enc ? decodeRecord({ ...enc }) : null;
  }

  async groupStatus(uid: string): Promise<GroupStatus> {
    checkUid(uid);
    const g = this.groups.get(uid);
    if (!g) return { uid, partition: "train", expected: null, finished: 0, records: 0, failed: 0, complete: false, fingerprint: null };
    return {
      uid,
      partition: g.partition,
      expected: g.expected,
      finished: g.finished,
      records: g.records,
      failed: g.failed,
      complete: g.expected !== null && g.finished >= g.expected,
      fingerprint: g.fingerprint,
      ...(g.cancelled ? { cancelled: true as const } : {}),
      ...(g.filtered !== undefined ? { filtered: true as const } : {}),
    };
  }

  async readCompleteGroups(opts: ReadGroupsOptions): Promise<CompleteGroup[]> {
    const o = checkReadOptions(opts);
    const deadline = this.now() + o.block_ms;
    for (;;) {
      this.assertOpen();
      const ids = this.claim(o.partition, o.consumer, o.max);
      if (ids.length > 0 || o.block_ms === 0) return deliverGroups(recordsOfRole(ids.map((e) => this.deliver(o.partition, e)), o.agent_role), o.deliver);
      const left = deadline - this.now();
      if (left <= 0) return [];
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          this.waiters.delete(wake);
          resolve();
        };
        const timer = setTimeout(wake, left);
        this.waiters.add(wake);
      });
    }
  }

  async ack(deliveryIds: readonly string[], partition?: Partition): Promise<number> {
    const pend = this.pending[checkPartition(partition)];
    let n = 0;
    for (const id of deliveryIds) if (pend.delete(id)) n++;
    return n;
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const w of [...this.waiters]) w();
  }

  private assertOpen(): void {
    if (this.closed) throw new StoreError("transfer queue is closed", { retryable: false });
  }

  private group(uid: string): Group {
    let g = this.groups.get(uid);
    if (!g) {
      g = { expected: null, partition: "train", fingerprint: null, finished: 0, records: 0, failed: 0, members: new Set(), sessions: new Map(), enqueued: false };
      this.groups.set(uid, g);
    }
    return g;
  }

  private session(g: Group, sid: number): { stored: number; total: number | null } {
    let s = g.sessions.get(sid);
    if (!s) {
      s = { stored: 0, total: null };
      g.sessions.set(sid, s);
    }
    return s;
  }

  /**
   * The put-once write with session accounting, as the Redis script does it:
   * `last` declares the session's output count (`output_index + 1`), `more`
   * leaves it open, `fail` (markFailed) finishes it with what it has stored.
   */
  private store(rec: RecordHead, encoded: EncodedRecord, mode: "last" | "more" | "fail"): PutResult {
    if (this.groups.get(rec.uid)?.cancelled) throw new GroupCancelledError(rec.uid);
    if (this.records.has(rec.key)) return { key: rec.key, stored: false };
    const g = this.group(rec.uid);
    const s = this.session(g, rec.session_id);
    if (s.total !== null) {
      if (mode === "fail") return { key: rec.key, stored: false };
      if (rec.output_index >= s.total) throw sessionConflict(rec.uid, rec.session_id, `finished with ${s.total} outputs; output_index ${rec.output_index} is past its last`);
    }
    if (mode === "last" && s.stored > rec.output_index) {
      throw sessionConflict(rec.uid, rec.session_id, `has ${s.stored} outputs stored; output ${rec.output_index} cannot be its last`);
    }
    this.records.set(rec.key, encoded);
    g.members.add(rec.key);
    g.records++;
    if (rec.error !== null) g.failed++;
    s.stored++;
    if (s.total === null && mode === "last") s.total = rec.output_index + 1;
    if (s.total === null && mode === "fail") s.total = s.stored;
    if (s.stored === s.total) this.sessionFinished(rec.uid, g);
    return { key: rec.key, stored: true };
  }

  private sessionFinished(uid: string, g: Group): void {
    g.finished++;
    this.maybeComplete(uid, g);
  }

  async cancelGroups(uids: readonly string[]): Promise<{ withdrawn: string[]; complete: string[] }> {
    this.assertOpen();
    const withdrawn: string[] = [];
    const complete: string[] = [];
    for (const uid of new Set(uids)) {
      checkUid(uid);
      const g = this.group(uid);
      if (g.enqueued || (g.filtered !== undefined && g.expected !== null && g.finished >= g.expected)) complete.push(uid);
      else {
        g.cancelled = true;
        withdrawn.push(uid);
      }
    }
    return { withdrawn, complete };
  }

  async filterGroup(uid: string, reason: string): Promise<boolean> {
    this.assertOpen();
    checkUid(uid);
    const g = this.group(uid);
    if (g.enqueued || g.cancelled) return false;
    if (g.filtered === undefined) this.filtered[g.partition].push(uid);
    g.filtered = reason.slice(0, 500);
    return true;
  }

  async filteredGroups(opts: { partition?: Partition; max: number }): Promise<FilteredGroup[]> {
    const part = checkPartition(opts.partition);
    const out: FilteredGroup[] = [];
    for (const uid of this.filtered[part]) {
      if (out.length >= opts.max) break;
      const g = this.groups.get(uid)!;
      if (g.expected === null || g.finished < g.expected || g.partition !== part) continue;
      const records = [...g.members].sort(compareKeys).map((k) => decodeRecord({ ...this.records.get(k)! }));
      out.push({ uid, partition: part, reason: g.filtered!, failed: g.failed, records });
    }
    return out;
  }

  private maybeComplete(uid: string, g: Group): void {
    if (g.cancelled || g.filtered !== undefined || g.enqueued || g.expected === null || g.finished < g.expected) return;
    g.enqueued = true;
    this.streams[g.partition].push({ id: this.nextId(), uid, keys: [...g.members].sort(compareKeys) });
    for (const w of [...this.waiters]) w();
  }

  /** Stream-style ids (`ms-seq`), as Redis XADD `*` makes them. */
  private nextId(): string {
    const ms = Math.max(this.now(), this.lastMs);
    this.seq = ms === this.lastMs ? this.seq + 1 : 0;
    this.lastMs = ms;
    return `${ms}-${this.seq}`;
  }

  /** Timed-out pending entries first (as XAUTOCLAIM), then new ones (as XREADGROUP `>`). */
  private claim(part: Partition, consumer: string, max: number): { id: string; uid: string; keys: string[] }[] {
    const now = this.now();
    const stream = this.streams[part];
    const pend = this.pending[part];
    const out: { id: string; uid: string; keys: string[] }[] = [];
    for (const [id, p] of pend) {
      if (out.length >= max) break;
      if (now - p.delivered_at < this.visibilityMs) continue;
      p.consumer = consumer;
      p.delivered_at = now;
      const e = stream.find((s) => s.id === id);
      if (e) out.push(e);
    }
    while (out.length < max && this.cursor[part] < stream.length) {
      const e = stream[this.cursor[part]++]!;
      pend.set(e.id, { consumer, delivered_at: now });
      out.push(e);
    }
    return out;
  }

  private deliver(part: Partition, e: { id: string; uid: string; keys: string[] }): CompleteGroup {
    const records: TrajectoryRecord[] = [];
    for (const k of e.keys) {
      const enc = this.records.get(k);
      if (enc) records.push(decodeRecord({ ...enc }));
    }
    return { uid: e.uid, partition: part, delivery_id: e.id, failed: records.filter((r) => r.error !== null).length, records };
  }
}
