import { afterAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { stallHintFor } from "../../infra/cli/progress.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { JobQueue, type BatchSpec } from "../../shared/jobs/job-queue.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { planBatch, RolloutRequest, type PlannedTrajectory } from "../../shared/rollout/batch.ts";
import { SessionAdmission } from "../../shared/rollout/session-admission.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { LoopLagMonitor } from "../../shared/telemetry/loop-lag.ts";
import { fakeExecutor } from "../helpers/fake-executor.ts";
import { randomPrefix, redisCleanup, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { waitFor } from "../helpers/wait.ts";

// Issue 32 item 4: back-pressure instead of collapse. Every session of a process takes a slot of its
// admission (config concurrency, shared by all its batches), and while the event loop lags past
// limits.max_event_loop_lag_ms new sessions wait (one always runs); a queue-mode worker claims no
// more jobs meanwhile. The lag monitors here are started with a timer that never fires within a test
// and fed samples by the tests (record): no timing.

/** A started monitor whose own timer never fires during a test: samples come from `record`. */
const fedMonitor = (window: number) => {
  const m = new LoopLagMonitor(1_000_000, window).start();
  closers.push(async () => m.stop());
  return m;
};
const redis = await requireRedis();
const { prefixes, closers } = redisCleanup();
afterAll(async () => {
  for (const c of closers) await c();
});

/** A gate the test opens per trajectory key: the fake executor's hook waits on it; `started` lists keys in start order. */
function gated() {
  const started: string[] = [];
  const open = new Map<string, () => void>();
  let running = 0;
  let peak = 0;
  const hook = async (t: PlannedTrajectory) => {
    started.push(t.key);
    peak = Math.max(peak, ++running);
    await new Promise<void>((r) => open.set(t.key, r));
    running--;
  };
  const release = (key: string) => {
    const f = open.get(key);
    if (!f) throw new Error(`${key} is not waiting`);
    open.delete(key);
    f();
  };
  return { started, hook, release, peak: () => peak, waiting: () => [...open.keys()] };
}

const rowsOf = (tag: string, n: number) => Array.from({ length: n }, (_, i) => ({ prompt: [{ role: "user", content: `${tag}${i}` }], uid: `${tag}${i}` }));

describe("SessionAdmission", () => {
  test("slots: at most maxInFlight at once, waiters start in arrival order as slots free; a release twice frees one slot", async () => {
    const a = new SessionAdmission({ maxInFlight: 2 });
    const r1 = await a.acquire();
    const r2 = await a.acquire();
    const order: number[] = [];
    const p3 = a.acquire().then((r) => (order.push(3), r));
    const p4 = a.acquire().then((r) => (order.push(4), r));
    await Promise.resolve();
    expect([a.inFlight, a.held, a.holdReason()]).toEqual([2, 2, "in_flight"]);
    r1();
    r1();
    const r3 = await p3;
    expect([order, a.inFlight, a.held]).toEqual([[3], 2, 1]);
    r2();
    const r4 = await p4;
    expect([order, a.inFlight, a.held]).toEqual([[3, 4], 2, 0]);
    r3();
    r4();
    expect([a.inFlight, a.holdReason()]).toEqual([0, null]);
    expect(() => new SessionAdmission({ maxInFlight: 0 })).toThrow("SessionAdmission: maxInFlight must be an integer >= 1");
  });

  test("lag: over max_event_loop_lag_ms new sessions wait (one always runs); they start at the first sample that brings the p99 back", async () => {
    const lag = fedMonitor(100);
    const a = new SessionAdmission({ maxInFlight: 10, maxLagMs: 50, lag });
    lag.record(120);
    // Nothing runs: the first session starts whatever the lag (a lagging process still makes progress).
    const first = await a.acquire();
    expect(a.holdReason()).toBe("loop_lag");
    let second: (() => void) | null = null;
    const p = a.acquire().then((r) => (second = r));
    await Promise.resolve();
    expect([a.inFlight, a.held, second]).toEqual([1, 1, null]);
    const fams = Object.fromEntries(a.families().map((f) => [f.name, f.samples]));
    expect(fams.edgeloop_sessions_held).toEqual([
      { labels: { reason: "in_flight" }, value: 0 },
      { labels: { reason: "loop_lag" }, value: 1 },
      { labels: { reason: "store_cap" }, value: 0 },
    ]);
    expect(fams.edgeloop_sessions_held_total).toEqual([
      { labels: { reason: "in_flight" }, value: 0 },
      { labels: { reason: "loop_lag" }, value: 1 },
      { labels: { reason: "store_cap" }, value: 0 },
    ]);
    expect(fams.edgeloop_sessions_in_flight).toEqual([{ value: 1 }]);
    // The admission reads the largest of the newest 5 samples: four low samples leave it at 120, the fifth pushes it out.
    for (let i = 0; i < 4; i++) lag.record(1);
    await Promise.resolve();
    expect([a.held, lag.recentMaxMs(5)]).toEqual([1, 120]);
    lag.record(1);
    await p;
    expect([a.inFlight, a.held, lag.recentMaxMs(5)]).toEqual([2, 0, 1]);
    first();
    second!();
    a.close();
  });

  test("the start ramp: with a lag bound, at most 64 sessions start between two lag samples; the next sample lets the next 64 in", async () => {
    const lag = fedMonitor(10);
    const a = new SessionAdmission({ maxInFlight: 1000, maxLagMs: 50, lag });
    const releases: (() => void)[] = [];
    const all = Array.from({ length: 150 }, () => a.acquire().then((r) => void releases.push(r)));
    await Promise.resolve();
    expect([a.inFlight, a.held, a.holdReason()]).toEqual([64, 86, "loop_lag"]);
    lag.record(0);
    await Promise.resolve();
    expect([a.inFlight, a.held]).toEqual([128, 22]);
    lag.record(0);
    await Promise.all(all);
    expect([a.inFlight, a.held]).toEqual([150, 0]);
    for (const r of releases) r();
    // Without a running monitor (tests, or a process that never started it) there is no ramp: slots alone bound.
    const b = new SessionAdmission({ maxInFlight: 1000, maxLagMs: 50, lag: new LoopLagMonitor(20, 10) });
    await Promise.all(Array.from({ length: 150 }, () => b.acquire()));
    expect(b.inFlight).toBe(150);
    a.close();
    b.close();
  });

  test("lagCleared: resolves at once without lag; under lag one shared wait, counted as one held claim, ends at the calming sample", async () => {
    const lag = fedMonitor(10);
    const a = new SessionAdmission({ maxInFlight: 4, maxLagMs: 30, lag });
    const slot = a.track();
    await a.lagCleared();
    lag.record(80);
    const w1 = a.lagCleared();
    const w2 = a.lagCleared();
    expect(w1).toBe(w2);
    expect(a.held).toBe(1);
    let done = false;
    void w1.then(() => (done = true));
    for (let i = 0; i < 4; i++) lag.record(5);
    await Promise.resolve();
    expect(done).toBe(false);
    lag.record(5);
    await w1;
    expect([a.held, a.holdReason()]).toEqual([0, null]);
    slot();
  });
});

describe("the process's concurrency is shared by its batches", () => {
  test("two batches of concurrency 2 run 2 sessions at once between them, not 4; held sessions show on /metrics", async () => {
    const g = gated();
    const config = parseAppConfig({ rollout: { n: 1 }, concurrency: 2 });
    const service = new RolloutService({ config, store: new MemoryTransferQueue(), executorFor: () => fakeExecutor(g.hook) });
    closers.push(async () => service.close());
    const app = createRolloutsApp({ service });
    const a = service.submit(RolloutRequest.parse({ rows: rowsOf("ba", 3) }));
    const b = service.submit(RolloutRequest.parse({ rows: rowsOf("bb", 3) }));
    await waitFor(() => g.started.length === 2, "two sessions started");
    // Both slots taken (by whichever batch came first); each batch's two workers hold its next session: two wait.
    expect(service.admission.inFlight).toBe(2);
    expect(service.admission.held).toBe(2);
    const metrics = await (await app.request("/metrics")).text();
    expect(metrics).toContain("edgeloop_sessions_in_flight 2\n");
    expect(metrics).toContain("edgeloop_sessions_max_in_flight 2\n");
    expect(metrics).toContain('edgeloop_sessions_held{reason="in_flight"} 2\n');
    expect(metrics).toContain('edgeloop_sessions_held{reason="loop_lag"} 0\n');
    // Release each started session in turn: exactly one more starts each time, until all six ran.
    for (let done = 0; done < 6; done++) {
      const key = g.waiting()[0]!;
      g.release(key);
      await waitFor(() => g.started.length === Math.min(6, done + 3) && g.waiting().length === Math.min(2, 5 - done), `session ${done + 3} started`);
    }
    await Promise.all([a.run.run(), b.run.run()]);
    expect(g.peak()).toBe(2);
    expect([a.run.stats().counts.ok, b.run.stats().counts.ok]).toEqual([3, 3]);
    expect(service.admission.inFlight).toBe(0);
    expect(await (await app.request("/metrics")).text()).toContain('edgeloop_sessions_held_total{reason="in_flight"} 4\n');
  });

  test("under lag a batch runs one session at a time, and all of them once the lag falls back", async () => {
    const g = gated();
    const lag = fedMonitor(10);
    const config = parseAppConfig({ rollout: { n: 1 }, concurrency: 8 });
    const admission = new SessionAdmission({ maxInFlight: 8, maxLagMs: 40, lag });
    const service = new RolloutService({ config, store: new MemoryTransferQueue(), executorFor: () => fakeExecutor(g.hook), admission });
    closers.push(async () => service.close());
    lag.record(200);
    const { run } = service.submit(RolloutRequest.parse({ rows: rowsOf("lag", 4) }));
    await waitFor(() => g.started.length === 1, "the first session started");
    expect(admission.held).toBe(3);
    expect(admission.holdReason()).toBe("loop_lag");
    // The one session ends: the next starts (one always runs), still one at a time.
    g.release(g.started[0]!);
    await waitFor(() => g.started.length === 2 && g.waiting().length === 1, "the second session started");
    expect(admission.held).toBe(2);
    // The lag falls back (five low samples): both held sessions start at that sample.
    for (let i = 0; i < 5; i++) lag.record(1);
    await waitFor(() => g.started.length === 4 && g.waiting().length === 3, "every session started");
    for (const k of g.waiting()) g.release(k);
    await run.run();
    expect(run.stats().counts.ok).toBe(4);
    expect(g.peak()).toBe(3);
  });

  test("the stall warning names what holds the sessions", () => {
    const config = parseAppConfig({});
    expect(stallHintFor([], config, "idle", { count: 5, reason: "loop_lag", lagMs: 312.4, maxLagMs: 250, concurrency: 256 })).toBe(
      "5 sessions wait to start: the event-loop lag is 312 ms, over limits.max_event_loop_lag_ms (250 ms) — this process is past its orchestration ceiling (lower concurrency, or run workers in queue mode)",
    );
    expect(stallHintFor([{ kind: "engine", count: 2 }], config, "idle", { count: 1, reason: "in_flight", lagMs: 0, maxLagMs: 250, concurrency: 2 })).toBe(
      `waiting on the engine (2 calls): is it hung? A request waits up to engine.timeout_ms (${config.engine.timeout_ms} ms) and is retried ${config.engine.max_retries} times before its trajectory fails; 1 session wait for one of the process's concurrency (2) slots`,
    );
    expect(stallHintFor([], config, "idle", { count: 0, reason: null, lagMs: 0, maxLagMs: 250, concurrency: 2 })).toBe("idle");
  });
});

describe.skipIf(!redis)("queue mode: a lagging worker claims no more jobs", () => {
  test("with the lag over its bound the worker runs one job at a time and leaves the rest in the stream; at the calming sample it claims them", async () => {
    const prefix = randomPrefix("admit-worker");
    prefixes.push(prefix);
    const commander = new IoRedisCommander(REDIS_URL);
    closers.push(() => commander.close());
    const jobs = new JobQueue(commander, { prefix, leaseMs: 5_000 });
    const store = createRedisTransferQueue({ url: REDIS_URL, prefix });
    closers.push(() => store.close());
    const cfg = parseAppConfig({ rollout: { n: 1 } });
    const p = planBatch(RolloutRequest.parse({ rows: rowsOf("wq", 4) }), cfg.rollout);
    const spec: BatchSpec = { batch_id: p.batch_id, validate: false, global_steps: -1, model_version: null, rollout: cfg.rollout, total: p.trajectories.length, started_at: Date.now() };
    for (const t of p.trajectories) await store.expectGroup(t.uid, 1, "train");
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories);
    const g = gated();
    const lag = fedMonitor(10);
    const admission = new SessionAdmission({ maxInFlight: 4, maxLagMs: 40, lag });
    lag.record(150);
    const worker = new JobWorker({ model: null, jobs, store, executorFor: () => fakeExecutor(g.hook), consumer: "lagging", concurrency: 4, idleExitMs: 200, blockMs: 20, admission });
    const done = worker.run();
    await waitFor(() => g.started.length === 1, "the first job started");
    // Held by lag: the worker claimed one job only; three wait in the stream for any worker.
    await waitFor(async () => (await jobs.stats()).depth === 3, "three jobs left unclaimed");
    expect([(await jobs.stats()).in_flight, worker.running, admission.held, admission.inFlight]).toEqual([1, 1, 1, 1]);
    for (let i = 0; i < 5; i++) lag.record(1);
    await waitFor(() => g.started.length === 4, "the other three claimed and started");
    for (const k of g.waiting()) g.release(k);
    const summary = await done;
    expect([summary.claimed, summary.completed]).toEqual([4, 4]);
    expect(admission.inFlight).toBe(0);
    expect(Object.fromEntries(admission.families().map((f) => [f.name, f.samples])).edgeloop_sessions_held_total).toEqual([
      { labels: { reason: "in_flight" }, value: 0 },
      { labels: { reason: "loop_lag" }, value: 1 },
      { labels: { reason: "store_cap" }, value: 0 },
    ]);
  }, 60_000);
});
