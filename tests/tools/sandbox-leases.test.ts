import { afterEach, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SandboxSpec } from "../../shared/schema/index.ts";
import { MemoryLeaseStore } from "../../shared/tools/lease-store.ts";
import { LeasedToolExecutor, SandboxCreateError, SandboxLeases, SandboxLostError, type LeaseObserver } from "../../shared/tools/sandbox-leases.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { releaseReasonOf } from "../../shared/rollout/executor.ts";
import { BatchCancelledError, SurplusCancelledError, TrajectoryCarriedError } from "../../shared/rollout/batch-types.ts";
import { TrajectoryDeadlineError } from "../../shared/agent-loop/trajectory-deadline.ts";
import { startSandboxProvider, type SandboxProvider } from "../../infra/sandbox/provider.ts";
import type { SandboxFaults } from "../../infra/sandbox/sandboxes.ts";

const providers: SandboxProvider[] = [];
const managers: SandboxLeases[] = [];
afterEach(async () => {
  for (const m of managers.splice(0)) m.stop();
  for (const p of providers.splice(0)) await p.stop();
});

function provider(faults?: SandboxFaults): SandboxProvider {
  const p = startSandboxProvider(faults ? { faults } : {});
  providers.push(p);
  return p;
}

function spec(p: SandboxProvider, extra: Partial<Record<string, unknown>> = {}): SandboxSpec {
  return SandboxSpec.parse({ create_url: `${p.url}/sandboxes/create`, release_url: `${p.url}/sandboxes/release`, ttl_s: 30, create_timeout_ms: 2_000, ...extra });
}

/** A clock the test moves: the memory store's and the manager's. */
function clock(start = 1_000_000) {
  let t = start;
  return { now: () => t, advance: (ms: number) => void (t += ms) };
}

function manager(sp: SandboxSpec, store: MemoryLeaseStore, opts: { observer?: LeaseObserver; now?: () => number; deadline?: number | null } = {}): SandboxLeases {
  const m = new SandboxLeases(sp, store, { trajectoryDeadlineS: "deadline" in opts ? (opts.deadline ?? null) : 600, random: () => 0.5, backoffMinMs: 5, backoffMaxMs: 20, ...(opts.observer ? { observer: opts.observer } : {}), ...(opts.now ? { now: opts.now } : {}) });
  managers.push(m);
  return m;
}

function sandboxTools(p: SandboxProvider): WebhookToolClient {
  const text = readFileSync(join(import.meta.dir, "../../infra/sandbox/tools.example.json"), "utf8");
  return new WebhookToolClient(parseToolsFile(text, { vars: { port: p.port } }).tools, { retryMinTimeoutMs: 1 });
}

const call = (key: string, name: string, args: Record<string, unknown>, turn = 1, fresh = true) => ({ name, arguments: args, key, turn, index: 0, sandbox_fresh: fresh });

describe("SandboxLeases", () => {
  test("a trajectory's calls run in one sandbox, made on first use and released once at its end", async () => {
    const p = provider();
    const store = new MemoryLeaseStore();
    const events: string[] = [];
    const m = manager(spec(p), store, { observer: { created: () => events.push("created"), createFailed: () => events.push("failed"), released: (r) => events.push(`released:${r}`) } });
    const tools = new LeasedToolExecutor(sandboxTools(p), m);
    const w = await tools.call(call("u1_0_0", "sbx_write", { path: "a.txt", content: "hello" }));
    expect(w.ok).toBe(true);
    const r = await tools.call(call("u1_0_0", "sbx_read", { path: "a.txt" }, 2, false));
    expect(r).toMatchObject({ ok: true, content: "hello" });
    // Another trajectory has its own sandbox: the file is not there.
    const other = await tools.call(call("u2_0_0", "sbx_read", { path: "a.txt" }));
    expect(other).toMatchObject({ ok: true, content: "Error: no file 'a.txt' in this sandbox." });
    expect(p.stats()).toMatchObject({ live: 2, created: 2, duplicate_creates: 0 });
    const lease = m.leaseOf("u1_0_0")!;
    expect(lease.lease_id).toBe("u1_0_0~1");
    expect((await store.get("u1_0_0"))).toMatchObject({ status: "live", sandbox_id: lease.sandbox_id, attempt: 1 });

    expect(await m.release("u1_0_0", "finished")).toBe(true);
    expect(await m.release("u1_0_0", "finished")).toBe(false);
    expect(await m.release("u2_0_0", "cancelled")).toBe(true);
    expect(p.stats()).toMatchObject({ live: 0, destroyed_released: 2, releases: 2, release_not_found: 0 });
    expect(await store.get("u1_0_0")).toMatchObject({ status: "released", reason: "finished" });
    expect(m.metrics).toEqual({ creates: 2, create_failures: 0, released: { finished: 1, cancelled: 1 }, release_failures: 0, lost: 0 });
    expect(events).toEqual(["created", "created", "released:finished", "released:cancelled"]);
    const snap = await m.snapshot();
    expect(snap.spec).toEqual({ create_url: `${p.url}/sandboxes/create`, create: "first_use", ttl_s: 30, lifetime_s: 630, max_creates_per_s: 10, create_burst: 1, max_live: 256 });
    expect(snap.process).toEqual(m.metrics);
    expect(snap.store.counters["released:finished"]).toBe(1);
    const st = await store.stats();
    expect(st).toMatchObject({ live: 0, creating: 0, releasing: 0 });
    expect(st.counters).toMatchObject({ granted: 2, confirmed: 2, "released:finished": 1, "released:cancelled": 1 });
  });

  test("parallel calls of one trajectory share one create; an unknown tool makes no sandbox", async () => {
    const p = provider({ create_delay_ms: 50 });
    const m = manager(spec(p), new MemoryLeaseStore());
    const tools = new LeasedToolExecutor(sandboxTools(p), m);
    const rs = await Promise.all([0, 1, 2].map((i) => tools.call({ ...call("k_0_0", "sbx_write", { path: `f${i}`, content: String(i) }), index: i })));
    expect(rs.map((r) => r.ok)).toEqual([true, true, true]);
    const unknown = await tools.call(call("k2_0_0", "nope", {}));
    expect(unknown.ok).toBe(false);
    expect(p.stats()).toMatchObject({ created: 1, duplicate_creates: 0, live: 1 });
  });

  test("a create that times out after making its sandbox is released by its lease id, then retried under a new one", async () => {
    // seed 3: the fault draws of lease u_0_0~1 hang, u_0_0~2 does not (checked below through the stats).
    const p = provider({ create_timeout_fraction: 0.5, hang_ms: 5_000, seed: 3 });
    const store = new MemoryLeaseStore();
    const m = manager(spec(p, { create_timeout_ms: 300, create_retries: 5 }), store);
    let lease;
    for (let i = 0; ; i++) {
      lease = await m.ensure(`u${i}_0_0`, {}, { fresh: true });
      if (lease.lease_id.endsWith("~1") === false) break;
      expect(i).toBeLessThan(20);
    }
    const s = p.stats();
    expect(s.create_timeouts).toBeGreaterThan(0);
    // Every hung create's sandbox was destroyed by the release of its lease id; the others are live, one each.
    expect(s.live).toBe(s.created - s.destroyed_released);
    expect(s.destroyed_released).toBe(s.create_timeouts);
    expect(m.metrics.create_failures).toBe(s.create_timeouts);
    expect((await store.stats()).counters.create_failed).toBe(s.create_timeouts);
  });

  test("every create failing: SandboxCreateError after create_retries + 1 attempts, nothing left live", async () => {
    const p = provider({ create_timeout_fraction: 1, hang_ms: 5_000 });
    const store = new MemoryLeaseStore();
    const m = manager(spec(p, { create_timeout_ms: 200, create_retries: 2 }), store);
    const err = await m.ensure("bad_0_0", {}, { fresh: true }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SandboxCreateError);
    expect((err as Error).message).toContain("sandbox create for 'bad_0_0' failed after 3 attempts");
    expect(p.stats()).toMatchObject({ created: 3, live: 0, destroyed_released: 3, create_timeouts: 3 });
    expect(await store.get("bad_0_0")).toMatchObject({ status: "released", reason: "create_failed", attempt: 3, lease_id: "bad_0_0~3" });
  });

  test("a cancel during a hung create aborts the wait and releases what the create made", async () => {
    const p = provider({ create_timeout_fraction: 1, hang_ms: 5_000 });
    const m = manager(spec(p, { create_timeout_ms: 4_000 }), new MemoryLeaseStore());
    const ctrl = new AbortController();
    const pending = m.ensure("c_0_0", {}, { fresh: true, signal: ctrl.signal }).catch((e: unknown) => e);
    // Wait until the provider holds the create's reply (its sandbox exists), then cancel.
    for (let i = 0; p.stats().create_timeouts === 0; i++) await Bun.sleep(5);
    expect(p.stats().live).toBe(1);
    ctrl.abort(new Error("batch cancelled"));
    expect(((await pending) as Error).message).toBe("batch cancelled");
    expect(p.stats()).toMatchObject({ live: 0, destroyed_released: 1 });
  });

  test("the reaper releases a dead owner's lease once its TTL passed; the owner's trajectory then finds its sandbox lost", async () => {
    const p = provider();
    const c = clock();
    const store = new MemoryLeaseStore({ now: c.now });
    const owner = manager(spec(p), store);
    const reaper = manager(spec(p), store);
    const l = await owner.ensure("d_0_0", {}, { fresh: true });
    c.advance(29_999);
    expect(await reaper.reapOnce()).toBe(0);
    c.advance(1);
    expect(await reaper.reapOnce()).toBe(1);
    expect(await reaper.reapOnce()).toBe(0);
    expect(p.stats()).toMatchObject({ live: 0, destroyed_released: 1 });
    expect(await store.get("d_0_0")).toMatchObject({ status: "released", reason: "reaped_ttl", sandbox_id: l.sandbox_id });
    expect(reaper.metrics.released).toEqual({ reaped_ttl: 1 });
    // The owner's heartbeat learns it; a call after an observed result fails the trajectory…
    await owner.heartbeatOnce();
    expect(owner.metrics.lost).toBe(1);
    const err = await owner.ensure("d_0_0", {}, { fresh: false }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(SandboxLostError);
    expect((err as Error).message).toContain("expired before it was refreshed");
    // …a fresh owner (a resume that never saw a result) gets a new sandbox under attempt 2.
    const again = await reaper.ensure("d_0_0", {}, { fresh: true });
    expect(again.lease_id).toBe("d_0_0~2");
    expect(again.sandbox_id).not.toBe(l.sandbox_id);
    // A resume that had seen results refuses the reaped lease.
    const resumed = manager(spec(p), store);
    await reaper.release("d_0_0", "finished");
    const lost = await resumed.ensure("d_0_0", {}, { fresh: false }).catch((e: unknown) => e);
    expect(lost).toBeInstanceOf(SandboxLostError);
  });

  test("heartbeats keep a live lease from the reaper", async () => {
    const p = provider();
    const c = clock();
    const store = new MemoryLeaseStore({ now: c.now });
    const owner = manager(spec(p), store);
    await owner.ensure("h_0_0", {}, { fresh: true });
    for (let i = 0; i < 5; i++) {
      c.advance(20_000);
      await owner.heartbeatOnce();
      expect(await owner.reapOnce()).toBe(0);
    }
    expect(p.stats().live).toBe(1);
    expect(await store.get("h_0_0")).toMatchObject({ status: "live", expires_ms: c.now() + 30_000 });
  });

  test("a session resumed after its owner died inside a create releases that half-made lease, then creates", async () => {
    const p = provider();
    const store = new MemoryLeaseStore();
    // The dead owner got its grant (the lease is written `creating`) and its create reached the provider.
    const g = await store.acquire("r_0_0", { rate_per_s: 10, burst: 1, max_live: 10 }, 60_000, { renew: true });
    expect(g.outcome).toBe("granted");
    await fetch(`${p.url}/sandboxes/create`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ lease_id: "r_0_0~1", key: "r_0_0", create_kwargs: {}, lifetime_s: 600 }) });
    expect(p.stats().live).toBe(1);
    const m = manager(spec(p), store);
    const l = await m.ensure("r_0_0", {}, { fresh: true });
    expect(l.lease_id).toBe("r_0_0~2");
    expect(p.stats()).toMatchObject({ live: 1, created: 2, destroyed_released: 1 });
  });

  test("a create reply's base_url is kept with the lease: a second process resuming the session gets the same URL; a bad one is refused naming base_url", async () => {
    const p = startSandboxProvider({ openenv: true });
    providers.push(p);
    const store = new MemoryLeaseStore();
    const first = manager(spec(p), store);
    const l = await first.ensure("o_0_0", {}, { fresh: true });
    expect(l).toEqual({ lease_id: "o_0_0~1", sandbox_id: l.sandbox_id, base_url: `${p.url}/envs/${l.sandbox_id}` });
    expect((await store.get("o_0_0"))!.base_url).toBe(l.base_url);
    const second = manager(spec(p), store);
    expect(await second.ensure("o_0_0", {}, { fresh: false })).toEqual(l);
    expect(p.stats().created).toBe(1);
    // Without openenv: no base_url.
    const plain = manager(spec(provider()), new MemoryLeaseStore());
    expect((await plain.ensure("n_0_0", {}, { fresh: true })).base_url).toBeNull();

    const bad = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: (req) => (new URL(req.url).pathname.endsWith("create") ? Response.json({ sandbox_id: "sb-x", base_url: "ftp://nope" }) : Response.json({ ok: true })) });
    try {
      const m = manager(SandboxSpec.parse({ create_url: `http://127.0.0.1:${bad.port}/create`, release_url: `http://127.0.0.1:${bad.port}/release`, ttl_s: 30 }), new MemoryLeaseStore());
      const e = (await m.ensure("x_0_0", {}, { fresh: true }).catch((x) => x)) as SandboxCreateError;
      expect(e).toBeInstanceOf(SandboxCreateError);
      expect(e.message).toBe(`sandbox create for 'x_0_0' failed after 1 attempt: sandbox create http://127.0.0.1:${bad.port}/create: reply has no valid base_url (must be an http(s):// URL without query or fragment (the sandbox's own endpoint))`);
    } finally {
      await bad.stop(true);
    }
  });

  test("sandboxOf: the lease held here, else the store's record (an owner resumed elsewhere), a released one too; nothing for a key without a sandbox", async () => {
    const p = provider();
    const store = new MemoryLeaseStore();
    const first = manager(spec(p), store);
    const l = await first.ensure("s_0_0", {}, { fresh: true });
    expect(await first.sandboxOf("s_0_0")).toEqual({ lease_id: "s_0_0~1", sandbox_id: l.sandbox_id });
    // Another process (the session resumed there after this owner died) never touched the sandbox: read from the store.
    const second = manager(spec(p), store);
    expect(second.leaseOf("s_0_0")).toBeUndefined();
    expect(await second.sandboxOf("s_0_0")).toEqual({ lease_id: "s_0_0~1", sandbox_id: l.sandbox_id });
    expect(await second.release("s_0_0", "finished")).toBe(true);
    expect(await second.sandboxOf("s_0_0")).toEqual({ lease_id: "s_0_0~1", sandbox_id: l.sandbox_id });
    expect(await second.sandboxOf("none_0_0")).toBeUndefined();
    // A lease granted but never confirmed (its create did not answer) names no sandbox.
    await store.acquire("c_0_0", { rate_per_s: 10, burst: 1, max_live: 10 }, 60_000, { renew: true });
    expect(await second.sandboxOf("c_0_0")).toBeUndefined();
  });

  test("releaseReasonOf: the batch's stop wins over a partial output; then deadline, finished, failed", () => {
    const stopped = (reason: unknown) => {
      const c = new AbortController();
      c.abort(reason);
      return c.signal;
    };
    const partial = { outputs: [{ extra_fields: { terminated_by: "abort" } }] };
    expect(releaseReasonOf(partial, stopped(new SurplusCancelledError("surplus")))).toBe("surplus");
    expect(releaseReasonOf(partial, stopped(new TrajectoryCarriedError("carried")))).toBe("surplus");
    expect(releaseReasonOf(partial, stopped(new BatchCancelledError("cancelled")))).toBe("cancelled");
    expect(releaseReasonOf({ error: new Error("x") }, stopped(new BatchCancelledError("cancelled")))).toBe("cancelled");
    expect(releaseReasonOf({ outputs: [{ extra_fields: { terminated_by: "deadline" } }] }, stopped(new TrajectoryDeadlineError("k", 0)))).toBe("deadline");
    expect(releaseReasonOf({ error: new Error("x") }, stopped(new TrajectoryDeadlineError("k", 0)))).toBe("deadline");
    expect(releaseReasonOf(partial)).toBe("finished");
    expect(releaseReasonOf({ outputs: [] }, new AbortController().signal)).toBe("finished");
    expect(releaseReasonOf({ error: new Error("x") }, stopped(new Error("other")))).toBe("cancelled");
    expect(releaseReasonOf({ error: new Error("x") })).toBe("failed");
  });

  test("the limiter spaces creates: 12 trajectories at 20/s with burst 1", async () => {
    const p = provider();
    const store = new MemoryLeaseStore();
    const m = manager(spec(p, { max_creates_per_s: 20 }), store);
    await Promise.all(Array.from({ length: 12 }, (_, i) => m.ensure(`l${i}_0_0`, {}, { fresh: true })));
    const s = p.stats();
    expect(s.created).toBe(12);
    expect(s.peak_creates_1s).toBeLessThanOrEqual(20);
    expect((await store.stats()).counters.granted).toBe(12);
  });

  test("the live cap holds creates until a release frees a slot", async () => {
    const p = provider();
    const m = manager(spec(p, { max_live: 2 }), new MemoryLeaseStore());
    await m.ensure("a_0_0", {}, { fresh: true });
    await m.ensure("b_0_0", {}, { fresh: true });
    let third = false;
    const pending = m.ensure("c_0_0", {}, { fresh: true }).then(() => (third = true));
    await Bun.sleep(50);
    expect(third).toBe(false);
    expect(p.stats().live).toBe(2);
    await m.release("a_0_0", "finished");
    await pending;
    expect(p.stats()).toMatchObject({ live: 2, created: 3 });
  });

  test("lifetime: default deadline + ttl; a lifetime below the deadline is refused; the start line names both", () => {
    const p = provider();
    const store = new MemoryLeaseStore();
    expect(manager(spec(p), store, { deadline: 1_800 }).lifetimeS).toBe(1_830);
    expect(manager(spec(p), store, { deadline: null }).lifetimeS).toBe(86_430);
    expect(() => manager(spec(p, { lifetime_s: 600 }), store, { deadline: 1_800 })).toThrow("sandbox.lifetime_s (600 s) is below rollout.trajectory_deadline_s (1800 s)");
    expect(manager(spec(p, { max_creates_per_s: 5, max_live: 40 }), store, { deadline: 1_800 }).describe()).toBe(
      `sandbox    create ${p.url}/sandboxes/create (first_use), lease ttl 30 s, lifetime 1830 s ≥ trajectory deadline 1800 s, ≤ 5/s (burst 1), ≤ 40 live`,
    );
  });

  test("the tools file's sandbox block: placeholders filled, bounds and unknown keys refused naming the field", () => {
    const file = parseToolsFile(JSON.stringify({ sandbox: { create_url: "http://127.0.0.1:{port}/c", release_url: "http://127.0.0.1:{port}/r" } }), { vars: { port: 9 } });
    expect(file.sandbox).toEqual({
      create_url: "http://127.0.0.1:9/c",
      release_url: "http://127.0.0.1:9/r",
      create: "first_use",
      ttl_s: 300,
      create_timeout_ms: 60_000,
      create_retries: 2,
      release_timeout_ms: 30_000,
      release_retries: 3,
      max_creates_per_s: 10,
      max_live: 256,
    });
    const bad = (sandbox: Record<string, unknown>) => () => parseToolsFile(JSON.stringify({ sandbox: { create_url: "http://h/c", release_url: "http://h/r", ...sandbox } }), { source: "t.json" });
    expect(bad({ ttl_s: 2 })).toThrow("t.json: sandbox.ttl_s");
    expect(bad({ create_url: "ftp://h/c" })).toThrow("t.json: sandbox.create_url");
    expect(bad({ max_live: 0 })).toThrow("t.json: sandbox.max_live");
    expect(bad({ create_timeout_ms: 2_147_483_648 })).toThrow("t.json: sandbox.create_timeout_ms");
    expect(bad({ create: "lazy" })).toThrow("t.json: sandbox.create");
    expect(bad({ bogus: 1 })).toThrow("t.json: sandbox");
  });
});

describe("GET /v1/sandboxes", () => {
  test("{enabled: false} without a sandbox lifecycle; the manager's snapshot with one", async () => {
    const { createRolloutsApp } = await import("../../functions/rollouts.ts");
    const p = provider();
    const m = manager(spec(p), new MemoryLeaseStore());
    await m.ensure("v_0_0", {}, { fresh: true });
    // The route reads no batch: an empty service object stands in for the rollout service here.
    const service = {} as never;
    const off = createRolloutsApp({ service });
    expect(await (await off.request("/v1/sandboxes")).json()).toEqual({ enabled: false });
    const on = createRolloutsApp({ service, sandboxes: () => m.snapshot() });
    const body = (await (await on.request("/v1/sandboxes")).json()) as { enabled: boolean; store: { live: number; counters: Record<string, number> } };
    expect(body.enabled).toBe(true);
    expect(body.store.live).toBe(1);
    expect(body.store.counters).toEqual({ granted: 1, confirmed: 1 });
  });
});
