import { ConflictError } from "../errors.ts";
import { fromParts, toParts } from "./value-parts.ts";

/** What is stored for one session: its input (written once) and every committed checkpoint delta, JSON text each. */
export interface StoredSession {
  input: string | null;
  /** The committed checkpoint deltas, oldest first (a session is their fold). */
  deltas: string[];
  /** The step of the last committed delta (−1 when none). */
  step: number;
}

/** Options of {@link SessionStorage.append}. */
export interface AppendOptions {
  /** The session's input JSON, stored with the first commit (ignored when already stored). */
  input?: string;
  /** Seconds until the whole session entry expires (terminal sessions); 0/absent keeps it. */
  ttlSeconds?: number;
}
/** @deprecated the name of {@link AppendOptions} before checkpoints became append-only. */
export type PutOptions = AppendOptions;

/**
 * Where durable sessions keep their checkpoints: one append-only log of
 * checkpoint deltas per trajectory key. `append` is fenced by the step
 * number — a commit whose `step` is not greater than the stored one is
 * refused with a {@link ConflictError} (another owner has moved on; this one
 * must stop) and writes nothing visible. A delta (or input) larger than the
 * backend's value limit is stored as several values (see value-parts.ts),
 * committed together or not at all. Implementations: memory, Redis (a hash
 * per session, TCP or Upstash REST), Durable Object storage.
 */
export interface SessionStorage {
  /** The stored entry, or null when the key has none. */
  get(key: string): Promise<StoredSession | null>;
  /**
   * Commits a checkpoint delta (JSON text) at `step`, after every delta already stored.
   * @throws ConflictError when the stored step is ≥ `step`; StoreError when the backend fails.
   */
  append(key: string, step: number, delta: string, opts?: AppendOptions): Promise<void>;
  /** Deletes the entry (no-op when absent). */
  delete(key: string): Promise<void>;
  /**
   * The stored step of `key` (−1 when it has no delta; null when absent), read
   * without the deltas: lets a holder of a folded copy check that no one
   * moved the session on (one small read instead of the whole log).
   */
  stepOf?(key: string): Promise<number | null>;
}

/** The `code` of the ConflictError a fenced `put` throws (tells it apart from other 409s, e.g. an already-answered call id). */
export const STALE_STEP = "stale_step";

/** The error a fenced `put` throws (ConflictError, code {@link STALE_STEP}). */
export function staleStep(key: string, step: number, stored: number): ConflictError {
  return new ConflictError(`session '${key}': commit of step ${step} refused, step ${stored} is already stored (another owner resumed it)`, { code: STALE_STEP });
}

/** Whether `e` is the step fence's refusal ({@link staleStep}). */
export function isStaleStep(e: unknown): boolean {
  return e instanceof ConflictError && e.code === STALE_STEP;
}

/** Options of {@link MemorySessionStorage}. */
export interface MemorySessionStorageOptions {
  /** Largest stored value in bytes (UTF-8; default 1 MiB): longer deltas are kept as several parts, as on the other backends. */
  maxValueBytes?: number;
  /**
   * Milliseconds an entry may go unwritten before it is dropped (default:
   * never): for checkpoints that may never be resumed, e.g. trajectories
   * carried to a next batch that never comes. Expired entries are dropped
   * when read, and swept at most once per `min(idleTtlMs, 60 s)` on writes.
   */
  idleTtlMs?: number;
}

/**
 * In-process {@link SessionStorage} (strings in a Map; deltas kept as parts
 * of at most `maxValueBytes`, like the other backends): for single-process
 * runs and tests. Entries with a TTL are dropped lazily when read after expiry.
 */
export class MemorySessionStorage implements SessionStorage {
  private readonly m = new Map<string, { input: string[] | null; parts: string[]; step: number; expires: number; written: number }>();
  private readonly nowMs: () => number;
  readonly maxValueBytes: number;
  private readonly idleTtlMs: number | null;
  private lastSweep: number;

  constructor(nowMs: () => number = () => Date.now(), opts: MemorySessionStorageOptions = {}) {
    this.nowMs = nowMs;
    this.maxValueBytes = opts.maxValueBytes ?? 1024 * 1024;
    this.idleTtlMs = opts.idleTtlMs ?? null;
    this.lastSweep = nowMs();
  }

  private expired(e: { expires: number; written: number }, now: number): boolean {
    return (e.expires !== 0 && e.expires <= now) || (this.idleTtlMs !== null && e.written + this.idleTtlMs <= now);
  }

  private entry(key: string) {
    const e = this.m.get(key);
    if (!e) return null;
    if (this.expired(e, this.nowMs())) {
      this.m.delete(key);
      return null;
    }
    return e;
  }

  /** Drops every expired entry (idle TTL), at most once per min(idleTtlMs, 60 s). */
  private sweep(): void {
    if (this.idleTtlMs === null) return;
    const now = this.nowMs();
    if (now - this.lastSweep < Math.min(this.idleTtlMs, 60_000)) return;
    this.lastSweep = now;
    for (const [k, e] of this.m) if (this.expired(e, now)) this.m.delete(k);
  }

  async get(key: string): Promise<StoredSession | null> {
    const e = this.entry(key);
    if (!e) return null;
    return { input: e.input ? fromParts(e.input)[0] ?? null : null, deltas: fromParts(e.parts), step: e.step };
  }

  async append(key: string, step: number, delta: string, opts: AppendOptions = {}): Promise<void> {
    this.sweep();
    const cur = this.entry(key);
    if (cur && cur.step >= step) throw staleStep(key, step, cur.step);
    const parts = toParts(delta, this.maxValueBytes);
    this.m.set(key, {
      input: cur?.input ?? (opts.input !== undefined ? toParts(opts.input, this.maxValueBytes) : null),
      parts: cur ? (cur.parts.push(...parts), cur.parts) : parts,
      step,
      expires: opts.ttlSeconds ? this.nowMs() + opts.ttlSeconds * 1000 : 0,
      written: this.nowMs(),
    });
  }

  async delete(key: string): Promise<void> {
    this.m.delete(key);
  }

  async stepOf(key: string): Promise<number | null> {
    return this.entry(key)?.step ?? null;
  }

  /** Entries held (tests, benchmarks). */
  get size(): number {
    return this.m.size;
  }

  /** Stored values of a key (input parts plus delta parts; tests). */
  values(key: string): number {
    const e = this.entry(key);
    return e ? (e.input?.length ?? 0) + e.parts.length : 0;
  }

  /** Bytes of text held (UTF-16 length ≈ bytes for this ASCII content). */
  bytes(): number {
    let n = 0;
    for (const e of this.m.values()) for (const p of [...(e.input ?? []), ...e.parts]) n += p.length;
    return n;
  }
}
