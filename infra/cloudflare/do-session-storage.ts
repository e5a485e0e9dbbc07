import type { DurableObjectStorage } from "./cf-types.ts";
import { staleStep, type PutOptions, type SessionStorage, type StoredSession } from "../../shared/session/session-storage.ts";

/**
 * {@link SessionStorage} in a Durable Object's own storage (SQLite-backed KV
 * API). One object holds one session, so the key only names it: entries are
 * `input`, `cp` and `step`. The three writes of a commit happen without an
 * intervening `await`, so they are committed atomically; the output gate
 * holds replies until they are durable. A TTL is not needed (the object's
 * storage is deleted with `deleteAll` by the owner when wanted).
 * @see https://developers.cloudflare.com/durable-objects/api/sqlite-storage-api/
 */
export class DurableObjectSessionStorage implements SessionStorage {
  constructor(private readonly storage: DurableObjectStorage) {}

  async get(_key: string): Promise<StoredSession | null> {
    const m = await this.storage.get<string | number>(["input", "cp", "step"]);
    if (!m.has("step") && !m.has("input")) return null;
    return { input: (m.get("input") as string | undefined) ?? null, checkpoint: (m.get("cp") as string | undefined) ?? null, step: (m.get("step") as number | undefined) ?? -1 };
  }

  async put(key: string, step: number, checkpoint: string, opts: PutOptions = {}): Promise<void> {
    const cur = ((await this.storage.get<number>("step")) as number | undefined) ?? -1;
    if (cur >= step) throw staleStep(key, step, cur);
    const entries: Record<string, string | number> = { cp: checkpoint, step };
    if (opts.input !== undefined && !(await this.storage.get("input"))) entries.input = opts.input;
    await this.storage.put(entries);
  }

  async delete(_key: string): Promise<void> {
    await this.storage.delete(["input", "cp", "step"]);
  }
}
