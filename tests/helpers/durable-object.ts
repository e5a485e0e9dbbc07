import type { DurableObjectState, DurableObjectStorage } from "../../infra/cloudflare/cf-types.ts";
import type { Env } from "../../infra/cloudflare/env.ts";
import { TrajectorySessionObject } from "../../infra/cloudflare/session-object.ts";

/** A fake Durable Object storage: its KV entries in `m`, its one alarm (epoch ms, null when none) in `alarm`. */
export type FakeDurableObjectStorage = DurableObjectStorage & { m: Map<string, unknown>; alarm: number | null };

/**
 * A Durable Object's storage as a Map plus its one alarm: `get` of one key or
 * of a list (a Map of the present ones), `put` of one key or of an entries
 * object, `delete` (count deleted), `deleteAll`, and set/get/delete of the alarm.
 */
export function fakeDurableObjectStorage(): FakeDurableObjectStorage {
  const m = new Map<string, unknown>();
  const s = {
    m,
    alarm: null as number | null,
    get: (async (k: string | string[]) => {
      if (typeof k === "string") return m.get(k);
      const out = new Map<string, unknown>();
      for (const x of k) if (m.has(x)) out.set(x, m.get(x));
      return out;
    }) as DurableObjectStorage["get"],
    put: (async (k: string | Record<string, unknown>, v?: unknown) => {
      if (typeof k === "string") m.set(k, v);
      else for (const [x, y] of Object.entries(k)) m.set(x, y);
    }) as DurableObjectStorage["put"],
    delete: async (keys: string[]) => keys.filter((k) => m.delete(k)).length,
    deleteAll: async () => m.clear(),
    setAlarm: async (when: number | Date) => void (s.alarm = Number(when)),
    getAlarm: async () => s.alarm,
    deleteAlarm: async () => void (s.alarm = null),
  };
  return s;
}

/**
 * A `TrajectorySessionObject` over `storage` (id "id", `waitUntil` a no-op,
 * `blockConcurrencyWhile` runs its function at once) with the Worker's `env`
 * (default: an empty one, for paths that never read it).
 */
export function sessionObject(storage: DurableObjectStorage, env: Env = {} as Env): TrajectorySessionObject {
  const ctx: DurableObjectState = { storage, id: { toString: () => "id" }, waitUntil: () => {}, blockConcurrencyWhile: (fn) => fn() };
  return new TrajectorySessionObject(ctx, env);
}
