import type { DurableObjectStorage } from "./cf-types.ts";
import { StoreError } from "../../shared/errors.ts";
import { staleStep, type AppendOptions, type SessionStorage, type StoredSession } from "../../shared/session/session-storage.ts";
import { fromParts, toParts } from "../../shared/session/value-parts.ts";

/**
 * Largest value this storage writes, bytes as V8 serialises strings (2 per
 * UTF-16 unit, the worst case): 1,000,000 — half of the SQLite backend's
 * 2 MB key-plus-value limit, leaving room for keys and tags. For objects on
 * the legacy KV backend (128 KiB values) pass {@link KV_BACKEND_VALUE_BYTES}.
 * @see https://developers.cloudflare.com/durable-objects/platform/limits/
 */
export const SQLITE_BACKEND_VALUE_BYTES = 1_000_000;
/** Largest value for KV-backed objects: 128 KiB minus room for serialisation tags. */
export const KV_BACKEND_VALUE_BYTES = 128 * 1024 - 256;
/** Keys per `get`/`put` call (the KV API's limit). */
const KEYS_PER_CALL = 128;

/** Options of {@link DurableObjectSessionStorage}. */
export interface DurableObjectSessionStorageOptions {
  /** Largest stored value, bytes (default {@link SQLITE_BACKEND_VALUE_BYTES}). */
  maxValueBytes?: number;
  /**
   * Prefix of every entry name (default `""`: the trajectory session's
   * entries). A second log in the same object needs its own, e.g. the agent
   * session of the trajectory ({@link AGENT_ENTRY_PREFIX}).
   */
  prefix?: string;
}

/** Entry-name prefix of the agent-gateway session kept in a trajectory's object (its entries are `a/step`, `a/n`, `a/p:{i}`, …). */
export const AGENT_ENTRY_PREFIX = "a/";

/**
 * {@link SessionStorage} in a Durable Object's own storage (KV API, on
 * SQLite-backed objects). One object holds one session, so the key only
 * names it: entries `in` and `i:{j}` (the input, in parts, written once),
 * `p:{i}` (the checkpoint deltas' parts, append-only; see value-parts.ts),
 * `n` (parts committed) and `step`. Every value is at most `maxValueBytes`
 * (the backend refuses larger ones, e.g. `SQLITE_TOOBIG`). The writes of a
 * commit are issued without an intervening `await`, so they are committed
 * atomically; the output gate holds replies until they are durable. A TTL is
 * not needed (the owner deletes the object's storage when wanted). With
 * `prefix` set, every entry name above is prefixed: several logs (the
 * trajectory session and its agent session) share one object.
 * @see https://developers.cloudflare.com/durable-objects/api/storage-api/
 */
export class DurableObjectSessionStorage implements SessionStorage {
  readonly maxValueBytes: number;
  private readonly prefix: string;

  constructor(
    private readonly storage: DurableObjectStorage,
    opts: DurableObjectSessionStorageOptions = {},
  ) {
    this.maxValueBytes = opts.maxValueBytes ?? SQLITE_BACKEND_VALUE_BYTES;
    this.prefix = opts.prefix ?? "";
  }

  /** The stored names of entries `names` (prefixed). */
  private names(names: readonly string[]): string[] {
    return this.prefix ? names.map((n) => this.prefix + n) : [...names];
  }

  /** The values of `names` by unprefixed name. */
  private async head<T>(names: readonly string[]): Promise<Map<string, T>> {
    const m = await this.storage.get<T>(this.names(names));
    if (!this.prefix) return m;
    const out = new Map<string, T>();
    for (const [k, v] of m) out.set(k.slice(this.prefix.length), v);
    return out;
  }

  async get(key: string): Promise<StoredSession | null> {
    const head = await this.head<unknown>(["step", "n", "in", "cp"]);
    if (head.has("cp")) {
      throw new StoreError(`session '${key}': stored checkpoint is version 1 (one whole snapshot); this edgeloop reads versions 2 and 3 only`, { retryable: false, code: "checkpoint_version" });
    }
    if (!head.has("step") && !head.has("in")) return null;
    const nin = Number(head.get("in") ?? 0);
    const n = Number(head.get("n") ?? 0);
    const names = [...Array.from({ length: nin }, (_, j) => `i:${j}`), ...Array.from({ length: n }, (_, i) => `p:${i}`)];
    const values = await readMany(this.storage, this.names(names), key);
    return { input: nin ? values.slice(0, nin).join("") : null, deltas: fromParts(values.slice(nin)), step: Number(head.get("step") ?? -1) };
  }

  /** The stored step (−1 with the input only; null when nothing is stored): one read of one entry. */
  async stepOf(_key: string): Promise<number | null> {
    const head = await this.head<number>(["step", "in"]);
    if (!head.has("step")) return head.has("in") ? -1 : null;
    return Number(head.get("step"));
  }

  async append(key: string, step: number, delta: string, opts: AppendOptions = {}): Promise<void> {
    const head = await this.head<number>(["step", "n", "in"]);
    const cur = head.get("step") ?? -1;
    if (cur >= step) throw staleStep(key, step, cur);
    let n = head.get("n") ?? 0;
    const entries: Record<string, string | number> = {};
    const p = this.prefix;
    if (opts.input !== undefined && !head.has("in")) {
      const pieces = toParts(opts.input, this.maxValueBytes, "utf16").map((x) => x.slice(1));
      pieces.forEach((x, j) => (entries[`${p}i:${j}`] = x));
      entries[`${p}in`] = pieces.length;
    }
    for (const x of toParts(delta, this.maxValueBytes, "utf16")) entries[`${p}p:${n++}`] = x;
    entries[`${p}n`] = n;
    entries[`${p}step`] = step;
    await writeMany(this.storage, entries);
  }

  async delete(_key: string): Promise<void> {
    const head = await this.head<number>(["n", "in"]);
    const names = this.names(["step", "n", "in", "cp", ...Array.from({ length: head.get("in") ?? 0 }, (_, j) => `i:${j}`), ...Array.from({ length: head.get("n") ?? 0 }, (_, i) => `p:${i}`)]);
    for (let i = 0; i < names.length; i += KEYS_PER_CALL) await this.storage.delete(names.slice(i, i + KEYS_PER_CALL));
  }
}

/** Values of `names`, in order, `KEYS_PER_CALL` at a time. @throws StoreError when one is missing. */
export async function readMany(storage: DurableObjectStorage, names: readonly string[], what: string): Promise<string[]> {
  const out: string[] = [];
  for (let i = 0; i < names.length; i += KEYS_PER_CALL) {
    const chunk = names.slice(i, i + KEYS_PER_CALL);
    const m = await storage.get<string>(chunk);
    for (const k of chunk) {
      const v = m.get(k);
      if (typeof v !== "string") throw new StoreError(`'${what}': stored part ${k} is missing`, { retryable: false });
      out.push(v);
    }
  }
  return out;
}

/**
 * Writes `entries` in puts of at most `KEYS_PER_CALL` keys, issued together
 * without an `await` in between, so the runtime commits them as one atomic
 * batch (write coalescing); the last entries written are the commit marks.
 */
export async function writeMany(storage: DurableObjectStorage, entries: Record<string, unknown>): Promise<void> {
  const keys = Object.keys(entries);
  const puts: Promise<void>[] = [];
  for (let i = 0; i < keys.length; i += KEYS_PER_CALL) {
    const batch: Record<string, unknown> = {};
    for (const k of keys.slice(i, i + KEYS_PER_CALL)) batch[k] = entries[k];
    puts.push(storage.put(batch));
  }
  await Promise.all(puts);
}
