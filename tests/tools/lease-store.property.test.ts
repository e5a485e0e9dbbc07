import { expect, test } from "bun:test";
import fc from "fast-check";
import { LEASE_REASONS, MemoryLeaseStore, type LeaseReason, type LeaseRecord } from "../../shared/tools/lease-store.ts";

// Random sequences of lease operations on MemoryLeaseStore, on a clock the sequence moves: whatever the
// order, a lease is released (claimRelease won, finishRelease true) at most once, the live set the store
// reports is the number of records not released and never exceeds max_live, and the counters add up.

const KEYS = ["a_0_0", "b_0_0", "c:1 ü_0_0", "d_0_0", "e_0_0"];
const MAX_LIVE = 3;
const LIMITS = { rate_per_s: 4, burst: 2, max_live: MAX_LIVE };
const CLAIMABLE: LeaseReason[] = LEASE_REASONS.filter((r) => !r.startsWith("reaped_"));

type Op =
  | { op: "acquire"; key: number; renew: boolean; hold: number }
  | { op: "confirm"; key: number; stale: boolean; ttl: number }
  | { op: "heartbeat"; keys: number[]; ttl: number }
  | { op: "claimRelease"; key: number; stale: boolean; reason: LeaseReason; hold: number }
  | { op: "finishRelease"; key: number; stale: boolean }
  | { op: "claimDue"; limit: number; hold: number }
  | { op: "advance"; ms: number };

const key = fc.integer({ min: 0, max: KEYS.length - 1 });
const ms = fc.integer({ min: 1, max: 2_000 });
const opArb: fc.Arbitrary<Op> = fc.oneof(
  fc.record({ op: fc.constant("acquire" as const), key, renew: fc.boolean(), hold: ms }),
  fc.record({ op: fc.constant("confirm" as const), key, stale: fc.boolean(), ttl: ms }),
  fc.record({ op: fc.constant("heartbeat" as const), keys: fc.array(key, { maxLength: 4 }), ttl: ms }),
  fc.record({ op: fc.constant("claimRelease" as const), key, stale: fc.boolean(), reason: fc.constantFrom(...CLAIMABLE), hold: ms }),
  fc.record({ op: fc.constant("finishRelease" as const), key, stale: fc.boolean() }),
  fc.record({ op: fc.constant("claimDue" as const), limit: fc.integer({ min: 1, max: 4 }), hold: ms }),
  fc.record({ op: fc.constant("advance" as const), ms: fc.integer({ min: 0, max: 3_000 }) }),
);

test("random operation sequences keep the lease invariants", async () => {
  const seen = new Set<string>(); // what the runs exercised, checked at the end so the property is not vacuous
  await fc.assert(
    fc.asyncProperty(fc.array(opArb, { minLength: 30, maxLength: 150, size: "max" }), fc.boolean(), async (ops, shortTombstone) => {
      const clock = { t: 5_000_000 };
      const store = new MemoryLeaseStore({ now: () => clock.t, tombstoneS: shortTombstone ? 2 : 604_800 });
      const claimedOnce = new Set<string>(); // lease ids whose claimRelease was won (by the owner, not the reaper)
      const finished = new Set<string>(); // lease ids finishRelease answered true for
      const lastAttempt = new Map<string, number>();
      const count = { granted: 0, confirmed: 0, create_failed: 0, released: 0, reaped: 0 };
      const idOf = async (k: string, stale: boolean) => {
        const r = await store.get(k);
        return r === null ? `${k}~1` : stale ? `${k}~${r.attempt + 1}` : r.lease_id;
      };
      for (const o of ops) {
        switch (o.op) {
          case "acquire": {
            const k = KEYS[o.key]!;
            const before = await store.get(k);
            const r = await store.acquire(k, LIMITS, o.hold, { renew: o.renew });
            seen.add(r.outcome === "wait" ? `wait:${r.cause}` : r.outcome);
            if (r.outcome === "granted") {
              if (before) seen.add("renewed");
              count.granted++;
              // A grant replaces only a released lease (renew) or none, and bumps the attempt past the tombstone's.
              expect(before === null || (before.status === "released" && o.renew)).toBe(true);
              expect(r.lease.attempt).toBe(before ? before.attempt + 1 : 1);
              expect(r.lease.lease_id).toBe(`${k}~${r.lease.attempt}`);
              if (before) expect(r.lease.attempt).toBeGreaterThan(lastAttempt.get(k) ?? 0);
              lastAttempt.set(k, r.lease.attempt);
              // A lease id is used again only once its tombstone lapsed (attempts restart at 1 with no record left).
              if (finished.has(r.lease.lease_id)) {
                expect([before, r.lease.attempt]).toEqual([null, 1]);
                seen.add("reused after tombstone");
                finished.delete(r.lease.lease_id);
                claimedOnce.delete(r.lease.lease_id);
              }
            } else if (r.outcome === "exists") {
              expect(r.lease).toEqual(before!);
            } else {
              expect(r.wait_ms).toBeGreaterThan(0);
              expect(await store.get(k)).toEqual(before);
            }
            break;
          }
          case "confirm": {
            const k = KEYS[o.key]!;
            const before = await store.get(k);
            const id = await idOf(k, o.stale);
            const r = await store.confirm(k, id, `sb-${id}`, o.ttl);
            expect(r !== null).toBe(before?.status === "creating" && before.lease_id === id);
            if (r) count.confirmed++;
            if (r) seen.add("confirmed");
            break;
          }
          case "heartbeat": {
            const entries = await Promise.all(o.keys.map(async (i) => ({ key: KEYS[i]!, leaseId: await idOf(KEYS[i]!, false) })));
            const before = await Promise.all(entries.map((e) => store.get(e.key)));
            const out = await store.heartbeat(entries, o.ttl);
            expect(out).toEqual(before.map((b, i) => b?.status === "live" && b.lease_id === entries[i]!.leaseId));
            if (out.includes(true)) seen.add("heartbeat");
            break;
          }
          case "claimRelease": {
            const k = KEYS[o.key]!;
            const id = await idOf(k, o.stale);
            const r = await store.claimRelease(k, id, o.reason, o.hold);
            if (r) {
              expect(claimedOnce.has(id)).toBe(false);
              claimedOnce.add(id);
              seen.add("claimRelease");
              if (o.reason === "create_failed") count.create_failed++;
            }
            break;
          }
          case "finishRelease": {
            const k = KEYS[o.key]!;
            const id = await idOf(k, o.stale);
            if (await store.finishRelease(k, id)) {
              expect(finished.has(id)).toBe(false);
              finished.add(id);
              seen.add("finishRelease");
              count.released++;
            }
            break;
          }
          case "claimDue": {
            const got = await store.claimDue(o.limit, o.hold);
            expect(got.length).toBeLessThanOrEqual(o.limit);
            for (const r of got) expect(finished.has(r.lease_id)).toBe(false);
            count.reaped += got.length;
            for (const r of got) seen.add(r.reason!);
            break;
          }
          case "advance":
            clock.t += o.ms;
            break;
        }
        const records = (await Promise.all(KEYS.map((k) => store.get(k)))).filter((r): r is LeaseRecord => r !== null);
        const notReleased = records.filter((r) => r.status !== "released");
        const st = await store.stats();
        expect(st.creating + st.live + st.releasing).toBe(notReleased.length);
        expect(notReleased.length).toBeLessThanOrEqual(MAX_LIVE);
        expect([st.creating, st.live, st.releasing]).toEqual((["creating", "live", "releasing"] as const).map((s) => records.filter((r) => r.status === s).length));
        // A released record's lease id was finished exactly once; a non-released one never.
        for (const r of records) expect(finished.has(r.lease_id)).toBe(r.status === "released");
        const sum = (p: string) => Object.entries(st.counters).reduce((n, [c, v]) => (c.startsWith(p) ? n + v : n), 0);
        expect([st.counters.granted ?? 0, st.counters.confirmed ?? 0, st.counters.create_failed ?? 0, sum("released:"), sum("reaped:")]).toEqual([
          count.granted,
          count.confirmed,
          count.create_failed,
          count.released,
          count.reaped,
        ]);
        expect(st.tokens === null || (st.tokens >= 0 && st.tokens <= LIMITS.burst)).toBe(true);
      }
    }),
    { numRuns: 300, seed: 29 },
  );
  expect([...seen].sort()).toEqual(
    ["claimRelease", "confirmed", "exists", "finishRelease", "granted", "heartbeat", "reaped_create", "reaped_release", "reaped_ttl", "renewed", "reused after tombstone", "wait:cap", "wait:rate"].sort(),
  );
});
