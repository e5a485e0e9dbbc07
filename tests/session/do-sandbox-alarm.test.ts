import { expect, test } from "bun:test";
import { heartbeatMs, REAPER_ENTRY, reaperPass, reapMs, waitingAlarmAt, wakeReaper } from "../../infra/cloudflare/sandbox-alarm.ts";
import { startSandboxProvider } from "../../infra/sandbox/provider.ts";
import type { SandboxSpec } from "../../shared/schema/tool.ts";
import { MemoryLeaseStore } from "../../shared/tools/lease-store.ts";
import { SandboxLeases } from "../../shared/tools/sandbox-leases.ts";
import { fakeDurableObjectStorage } from "../helpers/durable-object.ts";

// The alarm arithmetic of sandbox leases on Workers: a waiting session's alarm is its heartbeat while it holds a
// lease; the reaper object's alarm passes while the store has leases and goes idle when it has none.

function spec(url: string, ttl_s: number): SandboxSpec {
  return { create_url: `${url}/sandboxes/create`, release_url: `${url}/sandboxes/release`, create: "first_use", ttl_s, create_timeout_ms: 5_000, create_retries: 0, release_timeout_ms: 5_000, release_retries: 0, max_creates_per_s: 10, create_burst: 1, max_live: 8 } as SandboxSpec;
}

test("heartbeat every ttl_s / 3, reaper every min(5 s, ttl_s / 4)", () => {
  const s = spec("http://x", 30);
  expect([heartbeatMs(s), reapMs(s)]).toEqual([10_000, 5_000]);
  const t = spec("http://x", 3);
  expect([heartbeatMs(t), reapMs(t)]).toEqual([1_000, 750]);
});

test("a waiting session's alarm: the earlier of its own deadline and its next heartbeat while it holds a lease", () => {
  const s = spec("http://x", 30);
  expect(waitingAlarmAt(1_050_000, true, s, 1_000_000)).toBe(1_010_000);
  expect(waitingAlarmAt(1_005_000, true, s, 1_000_000)).toBe(1_005_000);
  expect(waitingAlarmAt(null, true, s, 1_000_000)).toBe(1_010_000);
  expect(waitingAlarmAt(1_050_000, false, s, 1_000_000)).toBe(1_050_000);
  expect(waitingAlarmAt(null, false, s, 1_000_000)).toBeNull();
  expect(waitingAlarmAt(1_050_000, true, null, 1_000_000)).toBe(1_050_000);
});

test("the reaper object: woken, it passes while a lease lives, releases the expired one (reaped_ttl) and goes idle", async () => {
  const provider = startSandboxProvider({ port: 0 });
  try {
    let now = 1_000_000;
    const store = new MemoryLeaseStore({ now: () => now });
    const sp = spec(provider.url, 3);
    const owner = new SandboxLeases(sp, store, { trajectoryDeadlineS: 60 });
    const lease = await owner.ensure("k_0_0", {}, { fresh: true });
    expect(lease.lease_id).toBe("k_0_0~1");
    owner.detach("k_0_0"); // the owner vanishes: nothing refreshes the lease any more

    const st = fakeDurableObjectStorage();
    await wakeReaper(st, sp, now);
    expect([st.m.get(REAPER_ENTRY), st.alarm]).toEqual([1, now + 750]);
    await wakeReaper(st, sp, now + 10);
    // A second wake counts, and leaves the armed alarm where it was.
    expect([st.m.get(REAPER_ENTRY), st.alarm]).toEqual([2, now + 750]);

    const reaper = new SandboxLeases(sp, store, { trajectoryDeadlineS: 60 });
    now += 750;
    st.alarm = null;
    expect(await reaperPass(st, reaper, () => now)).toBe(0);
    // The lease is live (TTL 3 s not passed): re-armed.
    expect([st.m.get(REAPER_ENTRY), st.alarm]).toEqual([2, now + 750]);

    now += 3_000;
    st.alarm = null;
    expect(await reaperPass(st, reaper, () => now)).toBe(1);
    expect((await store.get("k_0_0"))?.reason).toBe("reaped_ttl");
    expect([provider.stats().created, provider.stats().releases]).toEqual([1, 1]);
    // The store's live set is empty after that release: the reaper goes idle in the same pass (until a grant wakes it).
    const after = await store.stats();
    expect([after.live, after.creating, after.releasing]).toEqual([0, 0, 0]);
    expect([st.m.has(REAPER_ENTRY), st.alarm]).toEqual([false, null]);
  } finally {
    await provider.stop();
  }
});
