import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { ConfigError, InputError, StoreError } from "../../shared/errors.ts";
import { CAP_WAIT_MS, MemoryLeaseStore, type LeaseLimits, type LeaseRecord, type LeaseStore } from "../../shared/tools/lease-store.ts";
import { RedisLeaseStore } from "../../shared/tools/redis-lease-store.ts";
import type { RedisArg, RedisCommander, RedisReply } from "../../shared/store/redis-commander.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { randomPrefix, rawRedis, REDIS_URL, redisCleanup, requireRedis } from "../helpers/redis.ts";
import { waitFor } from "../helpers/wait.ts";
import { globEscape } from "../../shared/store/gc.ts";
import { keyPart } from "../../shared/store/key-encoding.ts";
import fc from "fast-check";

const LONG = 60_000;
const SHORT = 30;
/** Limits that never bind in a test: a bucket that refills 0.001 token/s (so token counts stay exact to the floor). */
const WIDE: LeaseLimits = { rate_per_s: 0.001, burst: 1000, max_live: 1000 };

/** One store as a process holds it, and how a test moves its clock. */
interface Made {
  store: LeaseStore;
  /** Returns once the store's clock is at `t` or later: memory moves its injected clock; Redis polls `now()` (TIME). */
  advanceTo(t: number): Promise<void>;
  /** The Redis key prefix (Redis backends). */
  prefix?: string;
  /** Redis round trips so far (Redis backends). */
  roundTrips?(): number;
}

interface Backend {
  name: string;
  redis: boolean;
  /** A store over namespace `ns`: two calls with one `ns` are two processes over one store (memory: the same store). */
  make(ns: string, opts?: { tombstoneS?: number; forgetScripts?: boolean }): Made;
}

/** Counts the commands a commander is asked to send (one per round trip). */
class CountingCommander implements RedisCommander {
  sent = 0;
  private readonly forgotten = new Set<string>();
  /** `forgetScripts`: the first EVALSHA of each script answers NOSCRIPT, as a server that lost its script cache does. */
  constructor(
    private readonly inner: RedisCommander,
    private readonly forgetScripts = false,
  ) {}
  exec(cmd: RedisArg[]): Promise<RedisReply> {
    this.sent++;
    if (this.forgetScripts && cmd[0] === "EVALSHA" && !this.forgotten.has(String(cmd[1]))) {
      this.forgotten.add(String(cmd[1]));
      return Promise.reject(new Error("NOSCRIPT No matching script. Please use EVAL."));
    }
    return this.inner.exec(cmd);
  }
  pipeline(cmds: RedisArg[][]): Promise<(RedisReply | Error)[]> {
    this.sent++;
    return this.inner.pipeline(cmds);
  }
  close(): Promise<void> {
    return this.inner.close();
  }
}

const hasRedis = await requireRedis();
const cleanup = redisCleanup();
const prefix = randomPrefix("lease-store");
cleanup.prefixes.push(prefix);
const token = `tok-${crypto.randomUUID()}`;
let bridge: UpstashBridge | undefined;

const memories = new Map<string, Made>();
const backends: Backend[] = [
  {
    name: "memory",
    redis: false,
    make(ns, opts) {
      const hit = memories.get(ns);
      if (hit) return hit;
      const clock = { t: 1_000_000 };
      const made: Made = {
        store: new MemoryLeaseStore({ now: () => clock.t, ...(opts?.tombstoneS === undefined ? {} : { tombstoneS: opts.tombstoneS }) }),
        async advanceTo(t) {
          clock.t = Math.max(clock.t, t);
        },
      };
      memories.set(ns, made);
      return made;
    },
  },
];

function redisMade(commander: RedisCommander, p: string, opts: { tombstoneS?: number; forgetScripts?: boolean } = {}): Made {
  const counting = new CountingCommander(commander, opts.forgetScripts);
  cleanup.closers.push(() => commander.close());
  const store = new RedisLeaseStore(counting, { prefix: p, ...(opts.tombstoneS === undefined ? {} : { tombstoneS: opts.tombstoneS }) });
  return {
    store,
    prefix: p,
    roundTrips: () => {
      expect(store.roundTrips).toBe(counting.sent);
      return counting.sent;
    },
    async advanceTo(t) {
      await waitFor(async () => (await store.now()) >= t, `store clock at ${t}`, 5_000, 5);
    },
  };
}

if (hasRedis) {
  backends.push({ name: "Redis TCP", redis: true, make: (ns, opts) => redisMade(new IoRedisCommander(REDIS_URL), `${prefix}tcp:${ns}:`, opts) });
  backends.push({ name: "Upstash REST (bridge)", redis: true, make: (ns, opts) => redisMade(new UpstashCommander({ url: bridge!.url, token, retries: 0 }), `${prefix}up:${ns}:`, opts) });
}

beforeAll(async () => {
  if (hasRedis) bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
});
afterAll(async () => {
  await bridge?.stop();
});

const ns = () => crypto.randomUUID().slice(0, 8);

async function granted(s: LeaseStore, key: string, hold = LONG, limits = WIDE, renew = false): Promise<LeaseRecord> {
  const r = await s.acquire(key, limits, hold, { renew });
  if (r.outcome !== "granted") throw new Error(`expected a grant of ${key}, got ${JSON.stringify(r)}`);
  return r.lease;
}

/** stats() with tokens floored to an integer (the bucket refills a little while a test runs on a real clock). */
async function stats(s: LeaseStore) {
  const st = await s.stats();
  return { ...st, tokens: st.tokens === null ? null : Math.floor(st.tokens) };
}

/** The store's clock before and after `f`: a store-clock value `f` wrote lies in [before, after]. */
async function bracket<T>(s: LeaseStore, f: () => Promise<T>): Promise<{ out: T; before: number; after: number }> {
  const before = await s.now();
  const out = await f();
  return { out, before, after: await s.now() };
}

for (const be of backends) {
  describe(`LeaseStore contract: ${be.name}`, () => {
    test("a grant is a creating lease, attempt 1, lease id {key}~1, expiring after its hold; a second acquire answers exists", async () => {
      const { store } = be.make(ns());
      const { out: r, before, after } = await bracket(store, () => store.acquire("u1_0_0", WIDE, LONG, { renew: false }));
      expect(r.outcome).toBe("granted");
      const lease = (r as { lease: LeaseRecord }).lease;
      expect({ ...lease, created_ms: 0, expires_ms: 0 }).toEqual({ key: "u1_0_0", lease_id: "u1_0_0~1", attempt: 1, status: "creating", sandbox_id: null, base_url: null, created_ms: 0, expires_ms: 0, reason: null });
      expect(lease.created_ms).toBeGreaterThanOrEqual(before);
      expect(lease.created_ms).toBeLessThanOrEqual(after);
      expect(lease.expires_ms).toBe(lease.created_ms + LONG);
      expect(await store.get("u1_0_0")).toEqual(lease);
      expect(await store.acquire("u1_0_0", WIDE, LONG, { renew: false })).toEqual({ outcome: "exists", lease });
      expect(await store.acquire("u1_0_0", WIDE, LONG, { renew: true })).toEqual({ outcome: "exists", lease });
      expect(await store.get("nope_0_0")).toBeNull();
      expect(await stats(store)).toEqual({ live: 0, creating: 1, releasing: 0, tokens: 999, counters: { granted: 1 } });
    });

    test("confirm with a base_url: kept in the record (read back by get and claimRelease); a renewed attempt starts without it", async () => {
      const { store, prefix } = be.make(ns());
      const l = await granted(store, "b_0_0");
      const live = await store.confirm("b_0_0", l.lease_id, "sb-b", LONG, "http://10.0.0.7:8000/envs/sb-b");
      expect({ ...live!, expires_ms: 0 }).toEqual({ ...l, status: "live", sandbox_id: "sb-b", base_url: "http://10.0.0.7:8000/envs/sb-b", expires_ms: 0 });
      expect(await store.get("b_0_0")).toEqual(live);
      if (prefix) {
        const raw = rawRedis();
        expect(await raw.hget(`${prefix}sbx:l:b_0_0`, "base_url")).toBe("http://10.0.0.7:8000/envs/sb-b");
        await raw.quit();
      }
      const claimed = await store.claimRelease("b_0_0", l.lease_id, "finished", LONG);
      expect(claimed!.base_url).toBe("http://10.0.0.7:8000/envs/sb-b");
      expect(await store.finishRelease("b_0_0", l.lease_id)).toBe(true);
      const l2 = await granted(store, "b_0_0", LONG, WIDE, true);
      expect(l2.base_url).toBeNull();
      expect((await store.confirm("b_0_0", l2.lease_id, "sb-b2", LONG))!.base_url).toBeNull();
      if (prefix) {
        const raw = rawRedis();
        expect(await raw.hexists(`${prefix}sbx:l:b_0_0`, "base_url")).toBe(0);
        await raw.quit();
      }
      const e = (await store.confirm("b2_0_0", "b2_0_0~1", "sb", LONG, "").catch((x) => x)) as ConfigError;
      expect([e.name, e.field]).toEqual(["ConfigError", "baseUrl"]);
    });

    test("confirm: creating(lease id) → live with the sandbox id and now+ttl; refused from the wrong lease id or status", async () => {
      const { store } = be.make(ns());
      const l = await granted(store, "k_0_0");
      expect(await store.confirm("k_0_0", "k_0_0~2", "sb-1", LONG)).toBeNull();
      expect(await store.confirm("other_0_0", "other_0_0~1", "sb-1", LONG)).toBeNull();
      const { out: live, before, after } = await bracket(store, () => store.confirm("k_0_0", l.lease_id, "sb-1", 5_000));
      expect({ ...live!, expires_ms: 0 }).toEqual({ ...l, status: "live", sandbox_id: "sb-1", expires_ms: 0 });
      expect(live!.expires_ms - 5_000).toBeGreaterThanOrEqual(before);
      expect(live!.expires_ms - 5_000).toBeLessThanOrEqual(after);
      expect(await store.get("k_0_0")).toEqual(live);
      // Live already: a second confirm (a retried create answer) changes nothing.
      expect(await store.confirm("k_0_0", l.lease_id, "sb-2", LONG)).toBeNull();
      expect((await store.get("k_0_0"))!.sandbox_id).toBe("sb-1");
      expect(await stats(store)).toEqual({ live: 1, creating: 0, releasing: 0, tokens: 999, counters: { granted: 1, confirmed: 1 } });
    });

    test("heartbeat renews live leases of the right lease id only, in order, in one call", async () => {
      const m = be.make(ns());
      const { store } = m;
      const a = await granted(store, "a_0_0");
      const b = await granted(store, "b_0_0");
      await granted(store, "c_0_0");
      await store.confirm("a_0_0", a.lease_id, "sb-a", 1_000);
      await store.confirm("b_0_0", b.lease_id, "sb-b", 1_000);
      expect(await store.heartbeat([], LONG)).toEqual([]);
      const { out, before, after } = await bracket(store, () =>
        store.heartbeat(
          [
            { key: "a_0_0", leaseId: "a_0_0~1" },
            { key: "b_0_0", leaseId: "b_0_0~7" },
            { key: "c_0_0", leaseId: "c_0_0~1" },
            { key: "zz_0_0", leaseId: "zz_0_0~1" },
          ],
          LONG,
        ),
      );
      expect(out).toEqual([true, false, false, false]);
      const ga = (await store.get("a_0_0"))!;
      expect(ga.expires_ms - LONG).toBeGreaterThanOrEqual(before);
      expect(ga.expires_ms - LONG).toBeLessThanOrEqual(after);
      expect((await store.get("b_0_0"))!.expires_ms).toBeLessThan(before + 1_000 + 1);
      // A releasing lease is not heartbeaten.
      await store.claimRelease("a_0_0", "a_0_0~1", "finished", LONG);
      expect(await store.heartbeat([{ key: "a_0_0", leaseId: "a_0_0~1" }], LONG)).toEqual([false]);
    });

    test("claimRelease → releasing for one winner; finishRelease → released tombstone; renew gives attempt 2", async () => {
      const m = be.make(ns(), { tombstoneS: 60 });
      const { store } = m;
      const l = await granted(store, "r_0_0");
      await store.confirm("r_0_0", l.lease_id, "sb-r", LONG);
      expect(await store.claimRelease("r_0_0", "r_0_0~2", "finished", LONG)).toBeNull();
      expect(await store.finishRelease("r_0_0", l.lease_id)).toBe(false);
      const { out: claimed, before, after } = await bracket(store, () => store.claimRelease("r_0_0", l.lease_id, "finished", 2_000));
      expect({ ...claimed!, expires_ms: 0 }).toEqual({ ...l, status: "releasing", sandbox_id: "sb-r", reason: "finished", expires_ms: 0 });
      expect(claimed!.expires_ms - 2_000).toBeGreaterThanOrEqual(before);
      expect(claimed!.expires_ms - 2_000).toBeLessThanOrEqual(after);
      // Exactly one winner: a second claim (another releaser), a confirm or a heartbeat of it change nothing.
      expect(await store.claimRelease("r_0_0", l.lease_id, "failed", LONG)).toBeNull();
      expect(await store.confirm("r_0_0", l.lease_id, "sb-x", LONG)).toBeNull();
      expect(await store.heartbeat([{ key: "r_0_0", leaseId: l.lease_id }], LONG)).toEqual([false]);
      expect(await store.stats()).toMatchObject({ live: 0, creating: 0, releasing: 1 });
      expect(await store.finishRelease("r_0_0", "r_0_0~9")).toBe(false);
      const t0 = await store.now();
      expect(await store.finishRelease("r_0_0", l.lease_id)).toBe(true);
      const t1 = await store.now();
      expect(await store.finishRelease("r_0_0", l.lease_id)).toBe(false);
      const released = (await store.get("r_0_0"))!;
      expect({ ...released, expires_ms: 0 }).toEqual({ ...claimed!, status: "released", expires_ms: 0 });
      expect(released.expires_ms).toBeGreaterThanOrEqual(t0 + 60_000);
      expect(released.expires_ms).toBeLessThanOrEqual(t1 + 60_000);
      expect(await store.claimRelease("r_0_0", l.lease_id, "finished", LONG)).toBeNull();
      if (m.prefix) {
        const raw = rawRedis();
        const pttl = await raw.pttl(`${m.prefix}sbx:l:r_0_0`);
        expect(pttl).toBeGreaterThan(59_000);
        expect(pttl).toBeLessThanOrEqual(60_000);
        expect(await raw.zcard(`${m.prefix}sbx:due`)).toBe(0);
        await raw.quit();
      }
      // renew=false: the released lease is what exists; renew=true: attempt 2, a fresh record.
      expect(await store.acquire("r_0_0", WIDE, LONG, { renew: false })).toEqual({ outcome: "exists", lease: released });
      const l2 = await granted(store, "r_0_0", LONG, WIDE, true);
      expect({ ...l2, created_ms: 0, expires_ms: 0 }).toEqual({ key: "r_0_0", lease_id: "r_0_0~2", attempt: 2, status: "creating", sandbox_id: null, base_url: null, created_ms: 0, expires_ms: 0, reason: null });
      expect(l2.expires_ms).toBe(l2.created_ms + LONG);
      expect(await store.confirm("r_0_0", l.lease_id, "sb-old", LONG)).toBeNull();
      if (m.prefix) {
        const raw = rawRedis();
        expect(await raw.pttl(`${m.prefix}sbx:l:r_0_0`)).toBe(-1);
        await raw.quit();
      }
    });

    test("a creating lease is released by lease id too (create failed), and counters count each step exactly", async () => {
      const { store } = be.make(ns());
      const l = await granted(store, "f_0_0");
      expect((await store.claimRelease("f_0_0", l.lease_id, "create_failed", LONG))!.status).toBe("releasing");
      expect(await store.finishRelease("f_0_0", l.lease_id)).toBe(true);
      const l2 = await granted(store, "f_0_0", LONG, WIDE, true);
      expect(l2.lease_id).toBe("f_0_0~2");
      await store.confirm("f_0_0", l2.lease_id, "sb", LONG);
      await store.claimRelease("f_0_0", l2.lease_id, "finished", LONG);
      await store.finishRelease("f_0_0", l2.lease_id);
      const g = await granted(store, "g_0_0");
      await store.claimRelease("g_0_0", g.lease_id, "cancelled", LONG);
      expect(await stats(store)).toEqual({
        live: 0,
        creating: 0,
        releasing: 1,
        tokens: 997,
        counters: { granted: 3, confirmed: 1, create_failed: 1, "released:create_failed": 1, "released:finished": 1 },
      });
    });

    test("claimDue claims lapsed leases with their reason, earliest first, bounded by limit, once", async () => {
      const m = be.make(ns());
      const { store } = m;
      const c = await granted(store, "c_0_0", SHORT); // creating, create hold lapses
      const l = await granted(store, "l_0_0");
      await store.confirm("l_0_0", l.lease_id, "sb-l", SHORT + 5); // live, ttl lapses
      const r = await granted(store, "r_0_0");
      await store.claimRelease("r_0_0", r.lease_id, "finished", SHORT + 10); // releasing, its releaser "died"
      const keep = await granted(store, "keep_0_0"); // not due
      const late = Math.max(...(await Promise.all(["c_0_0", "l_0_0", "r_0_0"].map(async (k) => (await store.get(k))!.expires_ms))));
      if (!be.redis) expect(await store.claimDue(10, LONG)).toEqual([]);
      await m.advanceTo(late);
      const { out: claimed, before, after } = await bracket(store, () => store.claimDue(2, LONG));
      const rest = await store.claimDue(10, LONG);
      expect([...claimed, ...rest].map((x) => [x.key, x.status, x.reason, x.sandbox_id])).toEqual([
        ["c_0_0", "releasing", "reaped_create", null],
        ["l_0_0", "releasing", "reaped_ttl", "sb-l"],
        ["r_0_0", "releasing", "reaped_release", null],
      ]);
      expect(claimed.length).toBe(2);
      for (const x of claimed) {
        expect(x.expires_ms - LONG).toBeGreaterThanOrEqual(before);
        expect(x.expires_ms - LONG).toBeLessThanOrEqual(after);
        expect(await store.get(x.key)).toEqual(x);
      }
      expect(await store.claimDue(10, LONG)).toEqual([]);
      expect(await store.get("keep_0_0")).toEqual(keep);
      // The claim is a release claim like claimRelease's: the owner's own claim and confirm lose; the reaper finishes.
      expect(await store.claimRelease("c_0_0", c.lease_id, "create_failed", LONG)).toBeNull();
      expect(await store.confirm("c_0_0", c.lease_id, "sb-late", LONG)).toBeNull();
      expect(await store.finishRelease("l_0_0", l.lease_id)).toBe(true);
      expect(await stats(store)).toEqual({
        live: 0,
        creating: 1,
        releasing: 2,
        tokens: 996,
        counters: { granted: 4, confirmed: 1, "reaped:reaped_create": 1, "reaped:reaped_ttl": 1, "reaped:reaped_release": 1, "released:reaped_ttl": 1 },
      });
    });

    test("token bucket: rate 5/s burst 5 grants 5, then waits for the rate, then grants once a token refilled", async () => {
      const m = be.make(ns());
      const { store } = m;
      const limits = { rate_per_s: 5, burst: 5, max_live: 100 };
      // Six at once (one pipelined burst of requests, well inside the 200 ms one token takes to refill).
      const out = await Promise.all(Array.from({ length: 6 }, (_, i) => store.acquire(`b${i}_0_0`, limits, LONG, { renew: false })));
      expect(out.map((r) => r.outcome).sort()).toEqual(["granted", "granted", "granted", "granted", "granted", "wait"]);
      const w = out.find((r) => r.outcome === "wait")!;
      expect(w.outcome === "wait" && w.cause).toBe("rate");
      const waitMs = (w as { wait_ms: number }).wait_ms;
      expect(waitMs).toBeGreaterThan(0);
      expect(waitMs).toBeLessThanOrEqual(200);
      if (!be.redis) expect([out.indexOf(w), waitMs]).toEqual([5, 200]);
      const waited = `b${out.indexOf(w)}_0_0`;
      expect(await store.get(waited)).toBeNull();
      const st = await store.stats();
      expect(st.tokens).toBeGreaterThanOrEqual(0);
      if (!be.redis) expect(st.tokens).toBe(0);
      expect(st.counters).toEqual({ granted: 5 });
      await m.advanceTo((await store.now()) + waitMs);
      expect((await store.acquire(waited, limits, LONG, { renew: false })).outcome).toBe("granted");
      if (!be.redis) {
        // Fractional tokens: half a token after 100 ms, one after 200 ms.
        await m.advanceTo((await store.now()) + 100);
        expect(await store.acquire("b6_0_0", limits, LONG, { renew: false })).toEqual({ outcome: "wait", cause: "rate", wait_ms: 100 });
        expect((await store.stats()).tokens).toBe(0.5);
      }
    });

    test("live cap: max_live 3 → the 4th waits with cause cap; releasing still counts; a finished release frees the slot", async () => {
      const { store } = be.make(ns());
      const limits = { rate_per_s: 1000, burst: 100, max_live: 3 };
      const ls = [];
      for (let i = 0; i < 3; i++) ls.push(await granted(store, `m${i}_0_0`, LONG, limits));
      expect(await store.acquire("m3_0_0", limits, LONG, { renew: false })).toEqual({ outcome: "wait", cause: "cap", wait_ms: CAP_WAIT_MS });
      // exists is answered before the cap.
      expect((await store.acquire("m0_0_0", limits, LONG, { renew: false })).outcome).toBe("exists");
      await store.claimRelease("m0_0_0", ls[0]!.lease_id, "finished", LONG);
      expect(await store.acquire("m3_0_0", limits, LONG, { renew: false })).toEqual({ outcome: "wait", cause: "cap", wait_ms: CAP_WAIT_MS });
      await store.finishRelease("m0_0_0", ls[0]!.lease_id);
      expect((await store.acquire("m3_0_0", limits, LONG, { renew: false })).outcome).toBe("granted");
      expect(await store.stats()).toMatchObject({ creating: 3, counters: { granted: 4, "released:finished": 1 } });
    });

    test("bad limits, durations, ids and keys are refused naming the field, before anything is written", async () => {
      const m = be.make(ns());
      const { store } = m;
      const cases: [LeaseLimits, string][] = [
        [{ rate_per_s: 0, burst: 5, max_live: 3 }, "limits.rate_per_s"],
        [{ rate_per_s: -1, burst: 5, max_live: 3 }, "limits.rate_per_s"],
        [{ rate_per_s: Number.NaN, burst: 5, max_live: 3 }, "limits.rate_per_s"],
        [{ rate_per_s: 1, burst: 0.5, max_live: 3 }, "limits.burst"],
        [{ rate_per_s: 1, burst: 5, max_live: 0 }, "limits.max_live"],
        [{ rate_per_s: 1, burst: 5, max_live: 1.5 }, "limits.max_live"],
        [{ rate_per_s: 1, burst: 5 } as LeaseLimits, "limits.max_live"],
      ];
      for (const [limits, field] of cases) {
        const e = await store.acquire("v_0_0", limits, LONG, { renew: false }).catch((x) => x);
        expect([e instanceof ConfigError, e.field]).toEqual([true, field]);
      }
      const fields = async (p: Promise<unknown>) => {
        const e = (await p.catch((x) => x)) as { name?: string; field?: string };
        return [e?.name, e?.field];
      };
      expect(await fields(store.acquire("v_0_0", WIDE, 0, { renew: false }))).toEqual(["ConfigError", "holdMs"]);
      expect(await fields(store.acquire("", WIDE, LONG, { renew: false }))).toEqual(["InputError", "key"]);
      expect(await fields(store.confirm("v_0_0", "v_0_0~1", "", LONG))).toEqual(["ConfigError", "sandboxId"]);
      expect(await fields(store.confirm("v_0_0", "v_0_0~1", "sb", 1.5))).toEqual(["ConfigError", "ttlMs"]);
      expect(await fields(store.heartbeat([{ key: "v_0_0", leaseId: "" }], LONG))).toEqual(["ConfigError", "leaseId"]);
      expect(await fields(store.claimRelease("v_0_0", "v_0_0~1", "bored" as never, LONG))).toEqual(["ConfigError", "reason"]);
      expect(await fields(store.claimDue(0, LONG))).toEqual(["ConfigError", "limit"]);
      expect(await fields(store.claimDue(10, -5))).toEqual(["ConfigError", "holdMs"]);
      expect(await fields(store.get("\ud800"))).toEqual(["InputError", "key"]);
      expect(await store.get("").catch((x) => x)).toBeInstanceOf(InputError);
      expect(await stats(store)).toEqual({ live: 0, creating: 0, releasing: 0, tokens: null, counters: {} });
      if (m.prefix) {
        const raw = rawRedis();
        expect(await raw.keys(`${m.prefix}*`)).toEqual([]);
        await raw.quit();
      }
    });

    test("50 concurrent acquires of 50 keys with burst 10 grant exactly 10 (two processes)", async () => {
      const n = ns();
      const p1 = be.make(n).store;
      const p2 = be.make(n).store;
      const limits = { rate_per_s: 0.001, burst: 10, max_live: 1000 };
      const out = await Promise.all(Array.from({ length: 50 }, (_, i) => (i % 2 ? p1 : p2).acquire(`c${i}_0_0`, limits, LONG, { renew: false })));
      expect(out.filter((r) => r.outcome === "granted").length).toBe(10);
      expect(out.filter((r) => r.outcome === "wait" && r.cause === "rate").length).toBe(40);
      const st = await p1.stats();
      expect([st.creating, st.counters]).toEqual([10, { granted: 10 }]);
    });

    test("50 concurrent acquires of one key grant it once; the rest answer exists with that lease", async () => {
      const n = ns();
      const p1 = be.make(n).store;
      const p2 = be.make(n).store;
      const out = await Promise.all(Array.from({ length: 50 }, (_, i) => (i % 2 ? p1 : p2).acquire("one_0_0", WIDE, LONG, { renew: true })));
      const g = out.filter((r) => r.outcome === "granted");
      expect(g.length).toBe(1);
      const lease = (g[0] as { lease: LeaseRecord }).lease;
      expect(out.filter((r) => r.outcome === "exists").map((r) => (r as { lease: LeaseRecord }).lease)).toEqual(Array(49).fill(lease));
    });

    test("two concurrent claimDue calls (two reapers) claim disjoint sets that cover every due lease", async () => {
      const n = ns();
      const a = be.make(n);
      const b = be.make(n).store;
      const keys = Array.from({ length: 20 }, (_, i) => `d${i}_0_0`);
      for (const k of keys) await granted(a.store, k, SHORT);
      await a.advanceTo((await a.store.get(keys[19]!))!.expires_ms);
      const [x, y] = await Promise.all([a.store.claimDue(15, LONG), b.claimDue(15, LONG)]);
      const got = [...x, ...y].map((r) => r.key);
      expect(new Set(got).size).toBe(got.length);
      expect(got.sort()).toEqual([...keys].sort());
      expect((await a.store.stats()).counters["reaped:reaped_create"]).toBe(20);
    });

    test("concurrent claimRelease of one lease has exactly one winner", async () => {
      const n = ns();
      const a = be.make(n).store;
      const b = be.make(n).store;
      const l = await granted(a, "w_0_0");
      const out = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? a : b).claimRelease("w_0_0", l.lease_id, "finished", LONG)));
      expect(out.filter((r) => r !== null).length).toBe(1);
      const fin = await Promise.all(Array.from({ length: 20 }, (_, i) => (i % 2 ? a : b).finishRelease("w_0_0", l.lease_id)));
      expect(fin.filter(Boolean).length).toBe(1);
      expect((await a.stats()).counters["released:finished"]).toBe(1);
    });

    test("keys with ':', spaces and unicode are encoded in key names and round-trip through every operation", async () => {
      const m = be.make(ns());
      const { store } = m;
      const key = "a:b c/ü*{x}_0_1";
      const l = await granted(store, key, SHORT);
      expect(l.lease_id).toBe(`${key}~1`);
      expect(await store.get(key)).toEqual(l);
      await m.advanceTo(l.expires_ms);
      const [claimed] = await store.claimDue(10, LONG);
      expect([claimed!.key, claimed!.lease_id, claimed!.reason]).toEqual([key, `${key}~1`, "reaped_create"]);
      if (m.prefix) {
        const raw = rawRedis();
        const names = (await raw.keys(`${globEscape(m.prefix)}*`)).map((k) => k.slice(m.prefix!.length)).sort();
        expect(names).toEqual(["sbx:bucket", "sbx:due", "sbx:l:a%3Ab%20c%2F%C3%BC%2A%7Bx%7D_0_1", "sbx:stats"]);
        expect(await raw.zrange(`${m.prefix}sbx:due`, "0", "-1")).toEqual([key]);
        expect(await raw.hget(`${m.prefix}sbx:l:a%3Ab%20c%2F%C3%BC%2A%7Bx%7D_0_1`, "key")).toBe(key);
        await raw.quit();
      }
      expect(await store.finishRelease(key, l.lease_id)).toBe(true);
      expect((await store.get(key))!.status).toBe("released");
    });

    if (be.redis) {
      test("every operation is one round trip (once its script is cached)", async () => {
        const run = async (m: Made) => {
          const { store } = m;
          const counts: Record<string, number> = {};
          const one = async (name: string, f: () => Promise<unknown>) => {
            const before = m.roundTrips!();
            await f();
            counts[name] = m.roundTrips!() - before;
          };
          const key = `rt${crypto.randomUUID().slice(0, 6)}_0_0`;
          await one("acquire", () => store.acquire(key, WIDE, LONG, { renew: false }));
          await one("get", () => store.get(key));
          await one("confirm", () => store.confirm(key, `${key}~1`, "sb", LONG));
          await one("heartbeat", () => store.heartbeat([{ key, leaseId: `${key}~1` }, { key: "x_0_0", leaseId: "x_0_0~1" }], LONG));
          await one("claimRelease", () => store.claimRelease(key, `${key}~1`, "finished", LONG));
          await one("finishRelease", () => store.finishRelease(key, `${key}~1`));
          await one("claimDue", () => store.claimDue(10, LONG));
          await one("stats", () => store.stats());
          await one("now", () => store.now());
          return counts;
        };
        const m = be.make(ns());
        await run(m); // loads the scripts where the server lacks them (EVALSHA → NOSCRIPT → EVAL: 2 round trips, once)
        const ones = { acquire: 1, get: 1, confirm: 1, heartbeat: 1, claimRelease: 1, finishRelease: 1, claimDue: 1, stats: 1, now: 1 };
        expect(await run(m)).toEqual(ones);
        // Another process (a fresh instance) on a server that holds the scripts: one round trip from its first call.
        expect(await run(be.make(ns()))).toEqual(ones);
        // A server that lost its scripts (restart, SCRIPT FLUSH; answered here by a commander that says NOSCRIPT to
        // each script's first EVALSHA, not to flush the shared Redis): two round trips, then one again.
        const third = be.make(ns(), { forgetScripts: true });
        expect(await run(third)).toEqual({ ...ones, acquire: 2, confirm: 2, heartbeat: 2, claimRelease: 2, finishRelease: 2, claimDue: 2, stats: 2 });
        expect(await run(third)).toEqual(ones);
      });

      test("a released record's tombstone expires after tombstoneS; renew then starts again at attempt 1", async () => {
        const m = be.make(ns(), { tombstoneS: 1 });
        const { store } = m;
        const l = await granted(store, "t_0_0");
        await store.claimRelease("t_0_0", l.lease_id, "finished", LONG);
        await store.finishRelease("t_0_0", l.lease_id);
        await m.advanceTo((await store.get("t_0_0"))!.expires_ms);
        await waitFor(async () => (await store.get("t_0_0")) === null, "the tombstone to expire", 5_000, 20);
        expect((await granted(store, "t_0_0", LONG, WIDE, true)).lease_id).toBe("t_0_0~1");
      });

      test("the reaper script encodes keys as keyPart does (300 random unicode keys are all found and claimed)", async () => {
        const m = be.make(ns());
        const { store } = m;
        const keys = [
          ...new Set([
            ...fc.sample(fc.string({ unit: "binary", minLength: 1, maxLength: 10 }), { numRuns: 150, seed: 7 }),
            ...fc.sample(fc.string({ unit: "grapheme", minLength: 1, maxLength: 6 }), { numRuns: 100, seed: 8 }),
            ...fc.sample(fc.string({ unit: fc.constantFrom(..."%:{}*?[] \t\n~._-!'()aZ9/"), minLength: 1, maxLength: 8 }), { numRuns: 50, seed: 9 }),
          ]),
        ];
        let last = 0;
        for (const k of keys) last = Math.max(last, (await granted(store, k, 1)).expires_ms);
        const raw = rawRedis();
        const names = new Set((await raw.keys(`${globEscape(m.prefix!)}sbx:l:*`)).map((k) => k.slice(`${m.prefix}sbx:l:`.length)));
        await raw.quit();
        expect(names).toEqual(new Set(keys.map((k) => keyPart(k))));
        await m.advanceTo(last);
        const got = await store.claimDue(1000, LONG);
        expect(got.map((r) => r.key).sort()).toEqual([...keys].sort());
        expect((await stats(store)).counters).toEqual({ granted: keys.length, "reaped:reaped_create": keys.length });
      });

      test("a due entry whose record was deleted (evicted) is dropped by claimDue and counted as orphaned", async () => {
        const m = be.make(ns());
        const { store } = m;
        const l = await granted(store, "gone_0_0", 1);
        await granted(store, "kept_0_0", 1);
        const raw = rawRedis();
        await raw.del(`${m.prefix}sbx:l:gone_0_0`);
        await m.advanceTo(l.expires_ms + 1);
        expect((await store.claimDue(10, LONG)).map((r) => r.key)).toEqual(["kept_0_0"]);
        expect(await raw.zrange(`${m.prefix}sbx:due`, "0", "-1")).toEqual(["kept_0_0"]);
        await raw.quit();
        expect((await store.stats()).counters).toEqual({ granted: 2, "reaped:reaped_create": 1, orphaned: 1 });
      });

      test("a malformed record or reply is a StoreError naming what was wrong", async () => {
        const m = be.make(ns());
        const { store } = m;
        const raw = rawRedis();
        await raw.hset(`${m.prefix}sbx:l:bad_0_0`, { key: "bad_0_0", lease_id: "bad_0_0~1", attempt: "one", status: "live", created_ms: "1", expires_ms: "2" });
        const e = await store.get("bad_0_0").catch((x) => x);
        expect([e instanceof StoreError, e.message]).toEqual([true, "lease store get: malformed record, field attempt: expected a decimal integer"]);
        await raw.hset(`${m.prefix}sbx:l:bad_0_0`, { attempt: "1", status: "gone" });
        expect((await store.acquire("bad_0_0", WIDE, LONG, { renew: false }).catch((x) => x)).message).toStartWith("lease store acquire: malformed record, field status:");
        await raw.hset(`${m.prefix}sbx:l:bad_0_0`, { status: "live", lease_id: "bad_0_0~2" });
        expect((await store.get("bad_0_0").catch((x) => x)).message).toBe('lease store get: malformed record, field lease_id: "bad_0_0~2" is not {key}~{attempt}');
        await raw.set(`${m.prefix}sbx:bucket`, "not a hash");
        const e2 = await store.acquire("new_0_0", WIDE, LONG, { renew: false }).catch((x) => x);
        expect([e2 instanceof StoreError, e2.message]).toEqual([true, expect.stringContaining("WRONGTYPE")]);
        await raw.quit();
      });
    }
  });
}

describe("RedisLeaseStore reply checks", () => {
  /** A commander that answers every command with `reply`. */
  const answering = (reply: RedisReply): RedisCommander => ({
    exec: async () => reply,
    pipeline: async (cmds) => cmds.map(() => reply),
    close: async () => {},
  });
  test("a reply of the wrong shape is a StoreError naming the operation and the path", async () => {
    const msg = async (reply: RedisReply, f: (s: RedisLeaseStore) => Promise<unknown>) => {
      const e = (await f(new RedisLeaseStore(answering(reply))).catch((x) => x)) as Error;
      expect(e).toBeInstanceOf(StoreError);
      return e.message;
    };
    const W = WIDE;
    expect(await msg(["granted", ["key"]], (s) => s.acquire("k_0_0", W, LONG, { renew: false }))).toBe('lease store acquire: malformed reply at 1: expected field/value pairs (got ["granted",["key"]])');
    expect(await msg(["wait", "rate", "0"], (s) => s.acquire("k_0_0", W, LONG, { renew: false }))).toBe('lease store acquire: malformed reply at 2: expected wait ms >= 1 (got ["wait","rate","0"])');
    expect(await msg([1, 1], (s) => s.heartbeat([{ key: "k_0_0", leaseId: "k_0_0~1" }], LONG))).toBe("lease store heartbeat: malformed reply at (root): Too big: expected array to have exactly 1 items (got [1,1])");
    expect(await msg(2, (s) => s.finishRelease("k_0_0", "k_0_0~1"))).toBe("lease store finishRelease: malformed reply at (root): expected 0 or 1 (got 2)");
    expect(await msg(["1700000000"], (s) => s.now())).toBe('lease store now: malformed reply at (root): Too small: expected array to have >=2 items (got ["1700000000"])');
    expect(await msg("x", (s) => s.get("k_0_0"))).toBe('lease store get: malformed reply: expected a hash, got "x"');
    expect(await msg([["key", "k_0_0"]], (s) => s.claimDue(5, LONG))).toBe("lease store claimDue: malformed record, field lease_id: Invalid input: expected string, received undefined");
    expect(await msg(["5", ["n:live", "x"]], (s) => s.stats())).toBe('lease store stats field n:live: malformed reply at (root): Invalid input (got "x")');
    expect(await msg(["abc", []], (s) => s.stats())).toBe('lease store stats: malformed reply at 0: Invalid input (got ["abc",[]])');
    expect(await new RedisLeaseStore(answering(["2.5", ["granted", "3", "n:live", "2", "n:creating", "0"]])).stats()).toEqual({ live: 2, creating: 0, releasing: 0, tokens: 2.5, counters: { granted: 3 } });
  });
});
