import { ConflictError } from "../errors.ts";

/** What is stored for one session: its input (written once) and its last committed checkpoint, both JSON text. */
export interface StoredSession {
  input: string | null;
  checkpoint: string | null;
  /** The step of the stored checkpoint (−1 when none). */
  step: number;
}

/** Options of {@link SessionStorage.put}. */
export interface PutOptions {
  /** The session's input JSON, stored with the first commit (ignored when already stored). */
  input?: string;
  /** Seconds until the whole session entry expires (terminal sessions); 0/absent keeps it. */
  ttlSeconds?: number;
}

/**
 * Where durable sessions keep their checkpoints: one entry per trajectory
 * key. `put` is fenced by the step number — a commit whose `step` is not
 * greater than the stored one is refused with a {@link ConflictError}
 * (another owner has moved on; this one must stop). Implementations:
 * memory, Redis (a hash per session), Durable Object storage.
 */
export interface SessionStorage {
  /** The stored entry, or null when the key has none. */
  get(key: string): Promise<StoredSession | null>;
  /**
   * Commits a checkpoint (JSON text) at `step`.
   * @throws ConflictError when the stored step is ≥ `step`.
   */
  put(key: string, step: number, checkpoint: string, opts?: PutOptions): Promise<void>;
  /** Deletes the entry (no-op when absent). */
  delete(key: string): Promise<void>;
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

/**
 * In-process {@link SessionStorage} (a Map of strings): for single-process
 * runs and tests. Entries with a TTL are dropped lazily when read after expiry.
 */
export class MemorySessionStorage implements SessionStorage {
  private readonly m = new Map<string, StoredSession & { expires: number }>();
  constructor(private readonly nowMs: () => number = () => Date.now()) {}

  async get(key: string): Promise<StoredSession | null> {
    const e = this.m.get(key);
    if (!e) return null;
    if (e.expires && e.expires <= this.nowMs()) {
      this.m.delete(key);
      return null;
    }
    return { input: e.input, checkpoint: e.checkpoint, step: e.step };
  }

  async put(key: string, step: number, checkpoint: string, opts: PutOptions = {}): Promise<void> {
    const cur = await this.get(key);
    if (cur && cur.step >= step) throw staleStep(key, step, cur.step);
    this.m.set(key, {
      input: cur?.input ?? opts.input ?? null,
      checkpoint,
      step,
      expires: opts.ttlSeconds ? this.nowMs() + opts.ttlSeconds * 1000 : 0,
    });
  }

  async delete(key: string): Promise<void> {
    this.m.delete(key);
  }

  /** Entries held (tests, benchmarks). */
  get size(): number {
    return this.m.size;
  }

  /** Bytes of JSON text held (UTF-16 length ≈ bytes for this ASCII content). */
  bytes(): number {
    let n = 0;
    for (const e of this.m.values()) n += (e.input?.length ?? 0) + (e.checkpoint?.length ?? 0);
    return n;
  }
}
