import { expect, test } from "bun:test";
import type { DurableObjectState, DurableObjectStorage } from "../../infra/cloudflare/cf-types.ts";
import { DurableObjectSessionStorage } from "../../infra/cloudflare/do-session-storage.ts";
import { EXPIRE_AT_ENTRY, scheduleExpiry, TrajectorySessionObject } from "../../infra/cloudflare/session-object.ts";
import type { Env } from "../../infra/cloudflare/env.ts";

// A finished Durable Object session deletes its storage by alarm, store.retention.sessions after it finished.

/** A Durable Object's storage as a Map plus its one alarm. */
function fakeStorage(): DurableObjectStorage & { m: Map<string, unknown>; alarm: number | null } {
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

function object(storage: DurableObjectStorage): TrajectorySessionObject {
  const ctx: DurableObjectState = { storage, id: { toString: () => "id" }, waitUntil: () => {}, blockConcurrencyWhile: (fn) => fn() };
  // The expiry check runs before anything needs the Worker's runtime: an empty env is never read.
  return new TrajectorySessionObject(ctx, {} as Env);
}

test("scheduleExpiry stores the time and arms the alarm for it", async () => {
  const st = fakeStorage();
  expect(await scheduleExpiry(st, 1_000_000, 604_800)).toBe(1_000_000 + 604_800_000);
  expect([st.m.get(EXPIRE_AT_ENTRY), st.alarm]).toEqual([605_800_000, 605_800_000]);
});

test("the alarm of a finished session deletes every entry (trajectory and agent logs) once its time has come", async () => {
  const st = fakeStorage();
  const traj = new DurableObjectSessionStorage(st);
  await traj.append("k_0_0", 0, '{"t":0}', { input: '{"in":1}' });
  await st.put({ start: '{"key":"k_0_0"}', "a/n": 1 });
  await scheduleExpiry(st, Date.now() - 10_000, 1);
  expect(st.m.size).toBe(8);
  await object(st).alarm();
  expect([...st.m.keys()]).toEqual([]);
  expect(st.alarm).toBeNull();
});

test("an alarm before the expiry re-arms it and keeps the session", async () => {
  const st = fakeStorage();
  await st.put({ start: '{"key":"k_0_0"}', n: 3 });
  const at = await scheduleExpiry(st, Date.now(), 3600);
  st.alarm = null;
  await object(st).alarm();
  expect(st.alarm as number | null).toBe(at);
  expect(Object.fromEntries(st.m)).toEqual({ start: '{"key":"k_0_0"}', n: 3, [EXPIRE_AT_ENTRY]: at });
});
