import { describe, expect, test } from "bun:test";
import {
  BoundedLoadHashRouter,
  boundedLoadCap,
  createRoutingPolicy,
  rendezvousOrder,
  ReplicaPool,
  RoundRobinRouter,
  StickyRouter,
} from "../../shared/inference/index.ts";

const URLS = ["http://r0:8000", "http://r1:8000", "http://r2:8000", "http://r3:8000"];

/** Deterministic Zipf(s=1.2)-distributed keys over `n` distinct trajectories. */
function zipfKeys(count: number, n: number, seed = 7): string[] {
  const weights = Array.from({ length: n }, (_, i) => 1 / Math.pow(i + 1, 1.2));
  const total = weights.reduce((a, b) => a + b, 0);
  let x = seed;
  const rand = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) / 4294967296);
  return Array.from({ length: count }, () => {
    let r = rand() * total;
    let i = 0;
    while (r > weights[i] && i < n - 1) r -= weights[i++];
    return `traj-${i}`;
  });
}

function loads(pool: ReplicaPool): number[] {
  return pool.status().map((r) => r.inflight);
}

describe("bounded_load_hash", () => {
  test("keeps max/mean in-flight ≤ 1+ε under a skewed key set (pure rendezvous does not)", () => {
    const keys = zipfKeys(1000, 200);
    const hot = keys.filter((k) => k === "traj-0").length;
    expect(hot).toBeGreaterThan(100); // the skew: one key carries >10% of the calls
    const eps = 0.25;
    const pool = new ReplicaPool(URLS, new BoundedLoadHashRouter({ epsilon: eps }));
    for (const k of keys) pool.acquire(k);
    const l = loads(pool);
    const mean = 1000 / 4;
    expect(l.reduce((a, b) => a + b, 0)).toBe(1000);
    expect(Math.max(...l) / mean).toBeLessThanOrEqual(1 + eps);

    const unbounded = new ReplicaPool(URLS, new BoundedLoadHashRouter({ epsilon: 1000 }));
    for (const k of keys) unbounded.acquire(k);
    expect(Math.max(...loads(unbounded)) / mean).toBeGreaterThan(1 + eps);
  });

  test("every placement respects the cap, with calls finishing in between", () => {
    const eps = 0.25;
    const pool = new ReplicaPool(URLS, new BoundedLoadHashRouter({ epsilon: eps }));
    const live: string[] = [];
    let x = 3;
    for (const k of zipfKeys(3000, 50, 11)) {
      const total = loads(pool).reduce((a, b) => a + b, 0);
      const url = pool.acquire(k)!;
      live.push(url);
      expect(pool.status().find((r) => r.url === url)!.inflight).toBeLessThanOrEqual(boundedLoadCap(total + 1, 4, eps));
      x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
      if (x % 3 === 0) pool.release(live.splice(x % live.length, 1)[0]);
    }
  });

  test("without load a key always lands on its first rendezvous replica; removing a replica moves only its keys", () => {
    const router = new BoundedLoadHashRouter();
    const idle = URLS.map((url) => ({ url, inflight: 0 }));
    const keys = Array.from({ length: 400 }, (_, i) => `k${i}`);
    const before = new Map(keys.map((k) => [k, router.choose(k, idle)]));
    for (const k of keys) expect(before.get(k)).toBe(rendezvousOrder(k, idle)[0].url);
    const counts = URLS.map((u) => keys.filter((k) => before.get(k) === u).length);
    expect(Math.min(...counts)).toBeGreaterThan(60);
    const without = idle.filter((r) => r.url !== URLS[2]);
    for (const k of keys) {
      const after = router.choose(k, without);
      if (before.get(k) !== URLS[2]) expect(after).toBe(before.get(k)!);
    }
  });

  test("ε must be positive", () => {
    expect(() => new BoundedLoadHashRouter({ epsilon: 0 })).toThrow("epsilon must be a positive number");
  });
});

describe("least_inflight_sticky", () => {
  test("first call goes to the least in-flight replica (ties: insertion order), later calls stick", () => {
    const pool = new ReplicaPool(URLS.slice(0, 2), new StickyRouter());
    expect(pool.acquire("a")).toBe(URLS[0]);
    expect(pool.acquire("b")).toBe(URLS[1]);
    expect(pool.acquire("a")).toBe(URLS[0]);
    pool.release(URLS[0]);
    pool.release(URLS[0]);
    expect(pool.acquire("c")).toBe(URLS[0]);
    expect(pool.acquire("b")).toBe(URLS[1]);
  });

  test("a pinned replica that is excluded, unhealthy or removed loses the key for good", () => {
    const router = new StickyRouter();
    const pool = new ReplicaPool(URLS.slice(0, 3), router);
    const call = (key: string, exclude?: Set<string>) => {
      const url = pool.acquire(key, exclude)!;
      pool.release(url);
      return url;
    };
    expect(call("a")).toBe(URLS[0]);
    expect(call("a", new Set([URLS[0]]))).toBe(URLS[1]);
    expect(router.pinned("a")).toBe(URLS[1]);
    pool.setHealthy(URLS[1], false);
    expect(call("a")).toBe(URLS[0]);
    pool.setHealthy(URLS[1], true);
    expect(call("a")).toBe(URLS[0]);
    pool.remove(URLS[0]);
    expect(router.pinned("a")).toBeUndefined();
  });

  test("the sticky map is an LRU of maxKeys keys", () => {
    const router = new StickyRouter({ maxKeys: 2 });
    const c = URLS.slice(0, 2).map((url) => ({ url, inflight: 0 }));
    router.choose("a", c);
    router.choose("b", c);
    router.choose("a", c);
    router.choose("c", c);
    expect([router.pinned("a"), router.pinned("b"), router.size]).toEqual([URLS[0], undefined, 2]);
  });
});

describe("round_robin and the pool", () => {
  test("round robin cycles whatever the key", () => {
    const pool = new ReplicaPool(URLS.slice(0, 3), new RoundRobinRouter());
    expect([1, 2, 3, 4].map(() => pool.acquire("same"))).toEqual([URLS[0], URLS[1], URLS[2], URLS[0]]);
  });

  test("no healthy replica: try the unhealthy ones; nothing left: undefined; release never goes below 0", () => {
    const pool = new ReplicaPool(URLS.slice(0, 2), createRoutingPolicy("least_inflight_sticky"));
    pool.setHealthy(URLS[0], false);
    pool.setHealthy(URLS[1] + "/", false);
    expect(pool.acquire("k")).toBe(URLS[0]);
    expect(pool.acquire("k", new Set(URLS.slice(0, 2)))).toBeUndefined();
    pool.release(URLS[1]);
    pool.release(URLS[1], true);
    expect(pool.status()[1]).toMatchObject({ url: URLS[1], healthy: false, state: "unhealthy", inflight: 0, served: 0, failures: 1, failures_by_kind: { http_5xx: 1 } });
    expect(() => createRoutingPolicy("random" as never)).toThrow("unknown routing policy");
  });
});

describe("circuit breaker (E8)", () => {
  test("consecutive failures eject; a success in between resets the streak; keys move once, counted by reason", () => {
    let now = 0;
    const router = new StickyRouter();
    const pool = new ReplicaPool(URLS.slice(0, 2), router, { ejectAfter: 3, cooldownMs: 100, now: () => now });
    expect(pool.acquire("a")).toBe(URLS[0]);
    pool.succeed(URLS[0]);
    for (let i = 0; i < 2; i++) {
      pool.acquire("a");
      expect(pool.fail(URLS[0], "timeout")).toBe(false);
    }
    pool.acquire("a");
    pool.succeed(URLS[0]);
    expect(pool.status()[0]).toMatchObject({ state: "healthy", consecutive_failures: 0, failures: 2 });
    for (let i = 0; i < 3; i++) {
      expect(pool.acquire("a")).toBe(URLS[0]);
      expect(pool.fail(URLS[0], i === 2 ? "bad_reply" : "timeout")).toBe(i === 2);
    }
    expect(pool.status()[0]).toMatchObject({ healthy: false, state: "ejected", ejections: 1, ejected_until_ms: 100, failures_by_kind: { timeout: 4, bad_reply: 1 } });
    // The key pinned to r0 moves to r1 on its next call (counted once), and stays.
    expect(pool.acquire("a")).toBe(URLS[1]);
    pool.succeed(URLS[1]);
    expect(pool.acquire("a")).toBe(URLS[1]);
    pool.succeed(URLS[1]);
    expect(router.pinned("a")).toBe(URLS[1]);
    expect(pool.status()[0]).toMatchObject({ repins: 1, repins_by_reason: { unhealthy: 1, failover: 0, load: 0 } });
    expect(pool.repins).toBe(1);
    // A passing health check does not bring an ejected replica back; a refused connection makes a healthy one unhealthy at once.
    pool.setHealthy(URLS[0], true);
    expect(pool.status()[0]!.state).toBe("ejected");
    pool.acquire("b");
    pool.fail(URLS[1], "connect");
    expect(pool.status()[1]).toMatchObject({ state: "unhealthy", healthy: false, consecutive_failures: 1 });
    pool.setHealthy(URLS[1], true);
    expect(pool.status()[1]!.state).toBe("healthy");
  });

  test("half-open: after the cool-down the next call (any key) is the one probe; a cancel frees the slot; success restores", () => {
    let now = 0;
    const pool = new ReplicaPool(URLS.slice(0, 2), new StickyRouter(), { ejectAfter: 1, cooldownMs: 100, now: () => now });
    pool.acquire("x");
    pool.fail(URLS[0], "connect");
    expect(pool.status()[0]!.state).toBe("ejected");
    now = 99;
    expect(pool.acquire("y")).toBe(URLS[1]);
    now = 100;
    expect(pool.acquire("z")).toBe(URLS[0]);
    expect(pool.status()[0]).toMatchObject({ state: "half_open", probes: 1 });
    expect(pool.acquire("z2")).toBe(URLS[1]); // one probe at a time
    pool.release(URLS[0]); // the caller cancelled: no verdict, the next call probes again
    expect(pool.status()[0]!.state).toBe("ejected");
    expect(pool.acquire("w")).toBe(URLS[0]);
    pool.fail(URLS[0], "timeout");
    expect(pool.status()[0]).toMatchObject({ state: "ejected", probes: 2, probes_failed: 1, ejections: 2, ejected_until_ms: 200 });
    now = 200;
    expect(pool.acquire("v")).toBe(URLS[0]);
    pool.succeed(URLS[0]);
    expect(pool.status()[0]).toMatchObject({ state: "healthy", healthy: true, probes: 3, probes_ok: 1, probes_failed: 1, ejected_until_ms: null });
    expect(() => new ReplicaPool([], new StickyRouter(), { ejectAfter: 0 })).toThrow("ejectAfter must be an integer >= 1");
  });
});
