import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { MemoryRoutingState, type RoutingState } from "../../shared/inference/routing-state.ts";
import { RedisRoutingState } from "../../shared/inference/redis-routing-state.ts";
import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";

const A = "http://a:1";
const B = "http://b:2";
const C = "http://c:3";
const EPS = 0.25;
const LEASE_TTL = 3_000;

/** A settable clock shared by the states of one test. */
function clock(start = 1_000_000) {
  const c = { t: start, now: () => c.t };
  return c;
}

/** `ns` names the store's namespace: two states made with one `ns` are two instances over one store. */
type Make = (now: () => number, ns: string) => RoutingState;
interface Backend {
  name: string;
  /** A state as one gateway instance holds it; two calls give two instances over one store. */
  make: Make;
  shared: boolean;
}

const hasRedis = await requireRedis();
const backends: Backend[] = [{ name: "memory", shared: false, make: (now, _ns) => new MemoryRoutingState({ now, leaseTtlMs: LEASE_TTL, pinTtlMs: 60_000 }) }];
const commanders: RedisCommander[] = [];
let bridge: UpstashBridge | undefined;
const token = `tok-${crypto.randomUUID()}`;
const prefix = randomPrefix("routing-state");
if (hasRedis) {
  backends.push({
    name: "Redis TCP",
    shared: true,
    make: (now, ns) => {
      const c = new IoRedisCommander(REDIS_URL);
      commanders.push(c);
      return new RedisRoutingState(c, { prefix: `${prefix}tcp:${ns}:`, now, leaseTtlMs: LEASE_TTL, pinTtlMs: 60_000, instance: "i" + commanders.length });
    },
  });
  backends.push({
    name: "Upstash REST (bridge)",
    shared: true,
    make: (now, ns) => {
      const c = new UpstashCommander({ url: bridge!.url, token });
      commanders.push(c);
      return new RedisRoutingState(c, { prefix: `${prefix}up:${ns}:`, now, leaseTtlMs: LEASE_TTL, pinTtlMs: 60_000, instance: "u" + commanders.length });
    },
  });
}

beforeAll(async () => {
  if (hasRedis) bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
});
afterAll(async () => {
  for (const c of commanders) await c.close();
  await bridge?.stop();
  if (hasRedis) await deleteByPrefix(prefix);
});

for (const be of backends) {
  describe(`RoutingState contract: ${be.name}`, () => {
    test("a key is pinned where its order points, kept on its next call, and its lease counts until released", async () => {
      const c = clock();
      const ns = crypto.randomUUID().slice(0, 6);
      const s = be.make(c.now, ns);
      const r1 = await s.route({ key: "k", order: [B, A, C], epsilon: EPS });
      expect([r1.url, r1.probe, r1.previous, r1.ejected]).toEqual([B, false, null, {}]);
      expect(await s.pinned("k")).toBe(B);
      expect(await s.inflight([A, B, C])).toEqual({ [A]: 0, [B]: 1, [C]: 0 });
      await s.release(B, r1.lease);
      await s.release(B, r1.lease);
      expect(await s.inflight([A, B, C])).toEqual({ [A]: 0, [B]: 0, [C]: 0 });
      // The next turn stays, whatever order it brings.
      const r2 = await s.route({ key: "k", order: [C, A, B], epsilon: EPS });
      expect([r2.url, r2.previous]).toEqual([B, B]);
      await s.release(B, r2.lease);
      await s.close();
    });

    test("a pin moves only when its replica is over the bounded-load cap; a call without a key goes least-loaded", async () => {
      const c = clock();
      const ns = crypto.randomUUID().slice(0, 6);
      const s = be.make(c.now, ns);
      const k = await s.route({ key: "k", order: [A, B], epsilon: EPS });
      await s.release(A, k.lease);
      // Load A with 2 and B with 1 (keys y1, y2 pinned by their own order, z least-loaded).
      const y1 = await s.route({ key: "y1", order: [A, B], epsilon: EPS }); // t=1: cap max(1,0)=1, A(0) → A
      const y2 = await s.route({ key: "y2", order: [A, B], epsilon: EPS }); // t=2: cap 1, A(1) full → B
      const z = await s.route({ order: [A, B], epsilon: EPS, ordered: false }); // least-loaded: A1 B1 → A (first)
      expect([y1.url, y2.url, z.url]).toEqual([A, B, A]);
      expect(await s.pinned("y1")).toBe(A);
      // k is pinned to A: t=4 → cap max(2, ⌊1.25·4/2⌋=2) = 2, A holds 2 → the pin moves to B (first of order under the cap).
      const k2 = await s.route({ key: "k", order: [A, B], epsilon: EPS });
      expect([k2.url, k2.previous]).toEqual([B, A]);
      expect(await s.pinned("k")).toBe(B);
      expect(await s.inflight([A, B])).toEqual({ [A]: 2, [B]: 2 });
      // Back under the cap, it stays at B (a pin does not move back).
      await s.release(A, y1.lease);
      await s.release(A, z.lease);
      await s.release(B, k2.lease);
      await s.release(B, y2.lease);
      const k3 = await s.route({ key: "k", order: [A, B], epsilon: EPS });
      expect([k3.url, k3.previous]).toEqual([B, B]);
      await s.close();
    });

    test("stickyEpsilon and stickyMinLoad keep a pin through load that would move it under ε", async () => {
      const c = clock();
      const ns = crypto.randomUUID().slice(0, 6);
      const s = be.make(c.now, ns);
      const k = await s.route({ key: "k", order: [A, B], epsilon: EPS });
      await s.release(A, k.lease);
      const a1 = await s.route({ key: "a1", order: [B, A], epsilon: EPS, stickyEpsilon: 1 });
      expect(a1.url).toBe(B); // t=1: B
      const a2 = await s.route({ key: "a2", order: [A, B], epsilon: EPS }); // t=2: cap 1 → A
      const a3 = await s.route({ key: "a3", order: [A, B], epsilon: EPS }); // t=3: cap max(2, 1) = 2 → A
      expect([a2.url, a3.url]).toEqual([A, A]);
      // k pinned to A, which holds 2 of 3: under ε = 0.25 (cap 2 at t=4) it would move ...
      // ... under stickyEpsilon 1 the cap is max(2, ⌊2·4/2⌋) = 4: it stays.
      const k2 = await s.route({ key: "k", order: [A, B], epsilon: EPS, stickyEpsilon: 1 });
      expect([k2.url, k2.previous]).toEqual([A, A]);
      // A now holds 3 of 4: cap under stickyEpsilon 0.5 at t=5 is max(3, ⌊1.5·5/2⌋=3) = 3: it moves, unless stickyMinLoad 4 holds it.
      await s.release(A, k2.lease);
      await s.route({ key: "a4", order: [A, B], epsilon: 1 }); // t=4: cap max(2, 4) = 4 → A (3 of 4)
      const k3 = await s.route({ key: "k", order: [A, B], epsilon: EPS, stickyEpsilon: 0.5, stickyMinLoad: 4 });
      expect([k3.url, k3.previous]).toEqual([A, A]);
      await s.release(A, k3.lease);
      const k4 = await s.route({ key: "k", order: [A, B], epsilon: EPS, stickyEpsilon: 0.5 });
      expect([k4.url, k4.previous]).toEqual([B, A]);
      await s.close();
    });

    test("leases expire after the lease TTL; pins after the pin TTL", async () => {
      const c = clock();
      const ns = crypto.randomUUID().slice(0, 6);
      const s = be.make(c.now, ns);
      await s.route({ key: "dead", order: [A], epsilon: EPS });
      await s.close(); // the instance stops renewing (dies)
      c.t += LEASE_TTL - 1;
      expect(await s.inflight([A])).toEqual({ [A]: 1 });
      c.t += 1;
      expect(await s.inflight([A])).toEqual({ [A]: 0 });
      // Redis expires pins by its own clock (PX, checked in the bytes test below).
      if (!be.shared) {
        c.t += 60_000 - LEASE_TTL;
        expect(await s.pinned("dead")).toBeNull();
      }
    });

    test("an ejected replica is avoided, its probe goes to one caller once the cool-down passed, and a restore brings it back", async () => {
      const c = clock();
      const ns = crypto.randomUUID().slice(0, 6);
      const s = be.make(c.now, ns);
      const t = be.shared ? be.make(c.now, ns) : s;
      await s.eject(A, c.t + 5_000);
      const r1 = await t.route({ key: "p", order: [A, B], epsilon: EPS });
      expect([r1.url, r1.probe, r1.ejected]).toEqual([B, false, { [A]: c.t + 5_000 }]);
      await t.release(B, r1.lease);
      c.t += 5_000;
      const probe = await t.route({ key: "q", order: [B, A], epsilon: EPS });
      expect([probe.url, probe.probe]).toEqual([A, true]);
      // The probe slot is taken: the other instance routes elsewhere.
      const r2 = await s.route({ key: "q2", order: [A, B], epsilon: EPS });
      expect([r2.url, r2.probe]).toEqual([B, false]);
      // A probe ended without a verdict frees the slot: the next call probes again.
      await t.endProbe(A);
      const again = await s.route({ order: [B, A], epsilon: EPS });
      expect([again.url, again.probe]).toEqual([A, true]);
      await t.release(A, probe.lease);
      await s.release(B, r2.lease);
      await s.release(A, again.lease);
      await s.restore(A);
      const r3 = await t.route({ key: "fresh", order: [A, B], epsilon: EPS });
      expect([r3.url, r3.probe, r3.ejected]).toEqual([A, false, {}]);
      // Every replica ejected: the call still goes somewhere (the first of its order under the cap).
      await s.eject(A, c.t + 9_000);
      await s.eject(B, c.t + 9_000);
      const r4 = await t.route({ key: "all-down", order: [B, A], epsilon: EPS });
      expect([r4.url, r4.probe]).toEqual([B, false]);
      await s.close();
      await t.close();
    });

    if (be.shared) {
      test("two instances agree on a key's replica and see each other's leases", async () => {
        const c = clock();
        const ns = crypto.randomUUID().slice(0, 6);
        const s = be.make(c.now, ns);
        const t = be.make(c.now, ns);
        const r1 = await s.route({ key: "shared", order: [C, A, B], epsilon: EPS });
        const r2 = await t.route({ key: "other", order: [C, A, B], epsilon: EPS }); // t=2, n=3: cap 1, C full → A
        expect([r1.url, r2.url]).toEqual([C, A]);
        expect(await t.inflight([A, B, C])).toEqual({ [A]: 1, [B]: 0, [C]: 1 });
        await s.release(C, r1.lease);
        const r3 = await t.route({ key: "shared", order: [B, A, C], epsilon: EPS });
        expect([r3.url, r3.previous]).toEqual([C, C]);
        await s.close();
        await t.close();
      });
    }
  });
}

describe.skipIf(!hasRedis)("RedisRoutingState: the bytes in Redis", () => {
  test("pin, lease ZSET and health hash", async () => {
    const p = randomPrefix("routing-bytes");
    const cmd = new IoRedisCommander(REDIS_URL);
    const raw = rawRedis();
    const now = 1_700_000_000_000;
    const s = new RedisRoutingState(cmd, { prefix: p, now: () => now, leaseTtlMs: 30_000, pinTtlMs: 3_600_000, instance: "gw1" });
    try {
      // The first route may load the script (EVALSHA, then EVAL on NOSCRIPT): count from the second.
      await s.release(B, (await s.route({ key: "warm", order: [B], epsilon: EPS })).lease);
      s.roundTrips = 0;
      const r = await s.route({ key: "u1_0_0", order: [A, B], epsilon: EPS });
      expect([r.lease, s.roundTrips]).toEqual(["gw1:2", 1]);
      expect(await raw.get(`${p}routing:pin:u1_0_0`)).toBe(A);
      const ttl = await raw.pttl(`${p}routing:pin:u1_0_0`);
      expect(ttl > 3_590_000 && ttl <= 3_600_000).toBe(true);
      expect(await raw.zrange(`${p}routing:leases:${A}`, "0", "-1", "WITHSCORES")).toEqual(["gw1:2", String(now + 30_000)]);
      await s.eject(B, now + 10_000);
      expect(await raw.hgetall(`${p}routing:health`)).toEqual({ [B]: String(now + 10_000) });
      await s.release(A, r.lease);
      expect(await raw.exists(`${p}routing:leases:${A}`)).toBe(0);
      await s.restore(B);
      expect(await raw.exists(`${p}routing:health`)).toBe(0);
      expect(s.roundTrips).toBe(4);
      expect(await raw.exists(`${p}routing:leases:${B}`)).toBe(0);
    } finally {
      await s.close();
      await cmd.close();
      await raw.quit();
      await deleteByPrefix(p);
    }
  });

  test("one round trip per engine call: a release rides on the next route's script (its ZREM first, so the load it counts is right), else goes alone after releaseFoldMs", async () => {
    const p = randomPrefix("routing-fold");
    const cmd = new IoRedisCommander(REDIS_URL);
    const raw = rawRedis();
    const now = 1_700_000_000_000;
    const s = new RedisRoutingState(cmd, { prefix: p, now: () => now, leaseTtlMs: 30_000, pinTtlMs: 3_600_000, instance: "gw2", releaseFoldMs: 60_000 });
    try {
      const warm = await s.route({ key: "warm", order: [B], epsilon: EPS });
      // The warm-up's release waits (fold 60 s): the next route carries it (awaiting it here would wait the 60 s).
      const warmReleased = s.release(B, warm.lease);
      s.roundTrips = 0;
      let prev = await s.route({ key: "k0", order: [A, B], epsilon: EPS });
      await warmReleased;
      const released: Promise<void>[] = [];
      for (let i = 1; i <= 20; i++) {
        released.push(s.release(prev.url, prev.lease));
        prev = await s.route({ key: `k${i}`, order: [A, B], epsilon: EPS });
      }
      await Promise.all(released);
      expect(s.roundTrips).toBe(21);
      // Every released lease is gone; only the last call's is held. Keys ordered → each call saw A's load 0 and took A.
      expect(await raw.zrange(`${p}routing:leases:${A}`, "0", "-1")).toEqual([prev.lease]);
      expect(await raw.exists(`${p}routing:leases:${B}`)).toBe(0);
      // With no route to carry it, a release goes on its own at close (or after releaseFoldMs).
      await Promise.all([s.release(prev.url, prev.lease), s.close()]);
      expect(s.roundTrips).toBe(22);
      expect(await raw.exists(`${p}routing:leases:${A}`)).toBe(0);
    } finally {
      await s.close();
      await cmd.close();
      await raw.quit();
      await deleteByPrefix(p);
    }
  });
});
