import { expect, test } from "bun:test";
import { DurableObjectSessionStorage } from "../../infra/cloudflare/do-session-storage.ts";
import { EXPIRE_AT_ENTRY, scheduleExpiry } from "../../infra/cloudflare/session-object.ts";
import { fakeDurableObjectStorage, sessionObject } from "../helpers/durable-object.ts";

// A finished Durable Object session deletes its storage by alarm, store.retention.sessions after it finished.
// The expiry check runs before anything needs the Worker's runtime: the object's empty env is never read.

test("scheduleExpiry stores the time and arms the alarm for it", async () => {
  const st = fakeDurableObjectStorage();
  expect(await scheduleExpiry(st, 1_000_000, 604_800)).toBe(1_000_000 + 604_800_000);
  expect([st.m.get(EXPIRE_AT_ENTRY), st.alarm]).toEqual([605_800_000, 605_800_000]);
});

test("the alarm of a finished session deletes every entry (trajectory and agent logs) once its time has come", async () => {
  const st = fakeDurableObjectStorage();
  const traj = new DurableObjectSessionStorage(st);
  await traj.append("k_0_0", 0, '{"t":0}', { input: '{"in":1}' });
  await st.put({ start: '{"key":"k_0_0"}', "a/n": 1 });
  await scheduleExpiry(st, Date.now() - 10_000, 1);
  expect(st.m.size).toBe(8);
  await sessionObject(st).alarm();
  expect([...st.m.keys()]).toEqual([]);
  expect(st.alarm).toBeNull();
});

test("an alarm before the expiry re-arms it and keeps the session", async () => {
  const st = fakeDurableObjectStorage();
  await st.put({ start: '{"key":"k_0_0"}', n: 3 });
  const at = await scheduleExpiry(st, Date.now(), 3600);
  st.alarm = null;
  await sessionObject(st).alarm();
  expect(st.alarm as number | null).toBe(at);
  expect(Object.fromEntries(st.m)).toEqual({ start: '{"key":"k_0_0"}', n: 3, [EXPIRE_AT_ENTRY]: at });
});
