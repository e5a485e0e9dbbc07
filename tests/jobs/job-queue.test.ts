import { describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { ConflictError, StoreError } from "../../shared/errors.ts";
import { JobQueue, type BatchSpec } from "../../shared/jobs/job-queue.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import type { TrajectoryExecutor } from "../../shared/rollout/batch-run.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { fakeExecutor } from "../helpers/fake-executor.ts";
import { waitFor } from "../helpers/wait.ts";
import { randomPrefix, rawRedis, redisCleanup, REDIS_URL, requireRedis } from "../helpers/redis.ts";

const redis = await requireRedis();
const { prefixes, closers } = redisCleanup();

function setup(leaseMs = 400, maxPending?: number) {
  const prefix = randomPrefix("jobs");
  prefixes.push(prefix);
  const commander = new IoRedisCommander(REDIS_URL);
  closers.push(() => commander.close());
  const jobs = new JobQueue(commander, { prefix, leaseMs, ...(maxPending ? { maxPending } : {}) });
  const store = createRedisTransferQueue({ url: REDIS_URL, prefix });
  closers.push(() => store.close());
  return { prefix, jobs, store, commander };
}

const cfg = parseAppConfig({ rollout: { n: 2 } });
function plan(rows = 2) {
  const req = RolloutRequest.parse({ rows: Array.from({ length: rows }, (_, i) => ({ prompt: [{ role: "user", content: `q${i}` }], uid: `row${i}` })) });
  const p = planBatch(req, cfg.rollout);
  const spec: BatchSpec = { batch_id: p.batch_id, validate: false, global_steps: -1, model_version: null, rollout: cfg.rollout, total: p.trajectories.length, started_at: Date.now() };
  return { p, spec };
}

/** How many of the entries `id..id` of the jobs stream (0 or 1) are pending and idle for at least `ms`, by XPENDING IDLE. */
async function pendingIdle(r: ReturnType<typeof rawRedis>, prefix: string, id: string, ms: number): Promise<number> {
  return ((await r.xpending(`${prefix}jobs`, "workers", "IDLE", ms, id, id, 1)) as unknown[]).length;
}

/** Redis's clock (TIME), epoch ms. */
async function redisNowMs(r: ReturnType<typeof rawRedis>): Promise<number> {
  const [s, us] = await r.time();
  return Number(s) * 1000 + Math.floor(Number(us) / 1000);
}

describe.skipIf(!redis)("job queue", () => {
  test("workers.known counts live workers only: a worker silent for two leases (SIGKILLed) is pruned, from the group too once its jobs are reclaimed", async () => {
    const { jobs, prefix } = setup(300);
    const { p, spec } = plan(1);
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories);
    const dead = await jobs.claim("dead", 1);
    const mine = await jobs.claim("live", 1);
    expect((await jobs.stats()).workers).toEqual({ known: 2, busy: 2 });
    const r = rawRedis();
    // "dead" never claims nor heart-beats again; "live" heart-beats its job and reclaims dead's after the lease
    // (dead's job idle past it, as Redis counts idle time).
    await waitFor(async () => {
      await jobs.heartbeat("live", mine.map((j) => j.id));
      return (await pendingIdle(r, prefix, dead[0]!.id, 300)) > 0;
    }, "dead's job idle past the lease");
    await jobs.heartbeat("live", mine.map((j) => j.id));
    const reclaimed = await jobs.claim("live", 1);
    expect(reclaimed.map((j) => [j.id, j.deliveries])).toEqual([[dead[0]!.id, 2]]);
    // Then until "dead" was last seen more than two leases ago by Redis's clock (what stats() prunes by).
    const deadSeen = Number(await r.zscore(`${prefix}jobs:workers`, "dead"));
    await waitFor(async () => {
      await jobs.heartbeat("live", [...mine, ...reclaimed].map((j) => j.id));
      return (await redisNowMs(r)) - deadSeen > 2 * 300;
    }, "dead silent for two leases");
    await jobs.heartbeat("live", [...mine, ...reclaimed].map((j) => j.id));
    expect((await jobs.stats()).workers).toEqual({ known: 1, busy: 1 });
    const consumers = (await r.xinfo("CONSUMERS", `${prefix}jobs`, "workers")) as unknown[][];
    expect(consumers.map((c) => c[1])).toEqual(["live"]);
    expect(await r.zrange(`${prefix}jobs:workers`, "0", "-1")).toEqual(["live"]);
    await jobs.ack([...mine, ...reclaimed].map((j) => j.id));
    await jobs.forgetConsumer("live");
    expect(await r.zrange(`${prefix}jobs:workers`, "0", "-1")).toEqual([]);
  });


  test("submit → claim (each job to one consumer) → heartbeat → ack; stats follow", async () => {
    const { jobs, prefix } = setup(10_000);
    const { p, spec } = plan(2);
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories);
    expect(await jobs.batch(p.batch_id)).toEqual({ spec, keys: p.trajectories.map((t) => t.key) });
    let s = await jobs.stats();
    expect([s.mode, s.depth, s.in_flight]).toEqual(["queue", 4, 0]);
    expect(s.oldest_age_ms).toBeGreaterThanOrEqual(0);

    const a = await jobs.claim("a", 3);
    const b = await jobs.claim("b", 3);
    expect(a.map((j) => j.trajectory.key)).toEqual(p.trajectories.slice(0, 3).map((t) => t.key));
    expect(b.map((j) => j.trajectory.key)).toEqual([p.trajectories[3]!.key]);
    expect(a.every((j) => j.deliveries === 1 && j.batch_id === p.batch_id)).toBe(true);
    expect(a[0]!.trajectory).toEqual(p.trajectories[0]!);
    s = await jobs.stats();
    expect([s.depth, s.in_flight, s.workers]).toEqual([0, 4, { known: 2, busy: 2 }]);

    await jobs.heartbeat("a", a.map((j) => j.id));
    expect(await jobs.ack(a.map((j) => j.id))).toBe(3);
    expect(await jobs.ack(a.map((j) => j.id))).toBe(0);
    s = await jobs.stats();
    expect([s.depth, s.in_flight]).toEqual([0, 1]);
    const r = rawRedis();
    expect(await r.xlen(`${prefix}jobs`)).toBe(1);
    await r.quit();
    await jobs.ack(b.map((j) => j.id));
    s = await jobs.stats();
    expect([s.depth, s.in_flight, s.oldest_age_ms]).toEqual([0, 0, 0]);
  });

  test("a dead consumer's job is reclaimed after the lease, with its delivery count; a heart-beaten one is not", async () => {
    const { jobs, prefix } = setup(300);
    const { p, spec } = plan(1);
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories);
    const [dead, alive] = await jobs.claim("dead", 2);
    // Until the job nobody heart-beats is idle past the lease (as Redis counts idle time); the other is beaten throughout.
    const r = rawRedis();
    await waitFor(async () => {
      await jobs.heartbeat("alive-owner", []);
      await jobs.heartbeat("dead", [alive!.id]);
      return (await pendingIdle(r, prefix, dead!.id, 300)) > 0;
    }, "the unbeaten job idle past the lease");
    await r.quit();
    const got = await jobs.claim("rescuer", 5);
    expect(got.map((j) => [j.trajectory.key, j.deliveries])).toEqual([[dead!.trajectory.key, 2]]);
    // The heart-beaten job stays with its owner.
    expect((await jobs.claim("rescuer", 5)).length).toBe(0);
  });

  test("N1 scaling signal: a dead consumer's jobs idle past the lease count as stranded, in depth (depth + in_flight = XLEN), not as a busy worker", async () => {
    const { jobs, prefix, commander } = setup(300);
    // serve's own queue object does not know the workers' --lease (default 30 s): it reads the one they claim with.
    const serveSide = new JobQueue(commander, { prefix });
    const { p, spec } = plan(2);
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories);
    const held = await jobs.claim("dead", 3);
    const alive = await jobs.claim("alive", 1);
    expect([held.length, alive.length]).toEqual([3, 1]);
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 4, stranded: 0, workers: { known: 2, busy: 2 } });
    // "dead" stops heart-beating; "alive" goes on. Waits on the store's own idle time, not a fixed sleep.
    const r = rawRedis();
    const deadline = Date.now() + 10_000;
    while ((await pendingIdle(r, prefix, held[0]!.id, 300)) === 0 && Date.now() < deadline) {
      await jobs.heartbeat("alive", [alive[0]!.id]);
      await Bun.sleep(20);
    }
    await jobs.heartbeat("alive", [alive[0]!.id]);
    const s = await jobs.stats();
    expect([s.depth, s.in_flight, s.stranded, s.workers]).toEqual([3, 1, 3, { known: 2, busy: 1 }]);
    expect(s.depth + s.in_flight).toBe(await r.xlen(`${prefix}jobs`));
    expect(await serveSide.stats()).toMatchObject({ depth: 3, in_flight: 1, stranded: 3 });
    // The worker-side view: 1 job held by another worker is still work for "alive"'s peers; its own is not counted for it.
    expect(await jobs.outstanding("alive")).toBe(3);
    expect(await jobs.outstanding("someone-else")).toBe(4);
    // Reclaimed: no longer stranded.
    expect((await jobs.claim("alive", 5)).map((j) => j.deliveries)).toEqual([2, 2, 2]);
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 4, stranded: 0 });
    await jobs.ack([...held, ...alive].map((j) => j.id));
    expect(await jobs.outstanding("alive")).toBe(0);
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 0, stranded: 0 });
    await r.quit();
  });

  test("N1 idle exit: a worker idle long before another worker dies holding jobs does not idle-exit; it waits for the lease, reclaims and runs them, then exits", async () => {
    const { jobs, store } = setup(600);
    const service = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20 });
    closers.push(async () => service.close());
    const req = RolloutRequest.parse({ rows: [0, 1, 2].map((i) => ({ prompt: [{ role: "user", content: `s${i}` }], uid: `strand${i}` })) });
    const { run } = await service.accept(req);
    // The victim claims every job and dies (never heart-beats, never acks).
    expect((await jobs.claim("victim", 10)).length).toBe(6);
    const lines: string[] = [];
    const ran: string[] = [];
    // idleExitMs (50) is far below the lease (600): before the fix this worker exits "idle" with 6 jobs stranded.
    const survivor = new JobWorker({ model: null, jobs, store, executorFor: () => fakeExecutor(async (t) => void ran.push(t.key)), consumer: "survivor", concurrency: 8, idleExitMs: 50, blockMs: 20, log: (l) => lines.push(l) });
    const summary = await survivor.run();
    expect(summary).toEqual({ claimed: 6, completed: 6, failed: 0, reclaimed: 6, abandoned: 0, cancelled: 0, surplus: 0, refused: 0, capped: 0, exit: "idle" });
    expect(ran.length).toBe(6);
    expect(lines[0]).toBe("[survivor] idle, but 6 jobs are left in the stream (waiting to be claimed or held by other workers): staying to claim them, or reclaim them if their worker stops heart-beating (lease 600 ms)");
    await run.run();
    expect(run.stats().counts).toMatchObject({ total: 6, finished: 6, ok: 6 });
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 0, stranded: 0 });
  });

  test("max pending: a batch larger than the limit is a 413 stating it; one that would overflow the waiting jobs is a 503; nothing is written", async () => {
    const { jobs, store } = setup(1000, 3);
    const service = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20 });
    closers.push(async () => service.close());
    const req = RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "a" }], uid: "full0" }, { prompt: [{ role: "user", content: "b" }], uid: "full1" }] });
    const big = await service.accept(req).catch((e) => e);
    expect(big).toBeInstanceOf(StoreError);
    expect([big.status, big.code, big.field, big.retryable]).toEqual([413, "batch_too_large", "rows", false]);
    expect(big.message).toBe("batch too large for the job queue: it has 4 trajectories to run and serve accepts at most 3 pending jobs (--max-pending 3); split the batch or raise --max-pending");
    expect((await store.groupStatus("full0")).expected).toBeNull();
    expect((await jobs.stats()).depth).toBe(0);
    const one = RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "a" }], uid: "fits0" }] });
    expect((await service.accept(one)).keys).toEqual(["fits0_0_0", "fits0_1_0"]);
    const two = RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "c" }], uid: "fits1" }] });
    const full = await service.accept(two).catch((e) => e);
    expect([full.status, full.code]).toEqual([503, "queue_full"]);
    expect(full.message).toBe("job queue full: 2 jobs pending, 2 more would exceed max pending 3");
    expect((await store.groupStatus("fits1")).expected).toBeNull();
  });

  test("N4: a worker of another model fails an over-sampled batch's jobs (the batch ends, nothing run); a spec without model (older serve) runs; records carry the worker's model", async () => {
    const { jobs, store } = setup(5_000);
    const qwen = { name: "qwen3", fingerprint: "d90f4c60ab225f77" };
    const llama = { name: "llama3_1", fingerprint: "a46dd04db0e482fa" };
    const service = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20, model: qwen });
    closers.push(async () => service.close());
    const rows = [0, 1, 2].map((i) => ({ prompt: [{ role: "user", content: `m${i}` }], uid: `mm${i}` }));
    const { batch_id, keys, run } = await service.accept(RolloutRequest.parse({ rows, target_groups: 2 }));
    expect((await jobs.batch(batch_id))!.spec.model).toEqual(qwen);
    const ran: string[] = [];
    const lines: string[] = [];
    const worker = new JobWorker({ jobs, store, executorFor: () => fakeExecutor(async (t) => void ran.push(t.key)), consumer: "wl", concurrency: 4, idleExitMs: 300, blockMs: 100, model: llama, log: (l) => lines.push(l) });
    const summary = await worker.run();
    await run.run();
    const st = run.stats();
    expect(ran).toEqual([]);
    expect(st.done).toBe(true);
    expect(st.counts.ok).toBe(0);
    // The two delivered groups' four sessions were refused; the rest were stopped as surplus or removed unclaimed at the target.
    expect(summary.refused).toBe(summary.completed);
    expect(summary.refused).toBeGreaterThanOrEqual(4);
    expect(summary.refused + summary.surplus).toBe(summary.claimed);
    expect(summary.claimed).toBeLessThanOrEqual(keys.length);
    expect(st.oversample!.delivered).toBe(2);
    expect(lines.filter((l) => l.includes("model mismatch")).length).toBe(1);
    for (const e of st.errors) expect(e.error).toStartWith(`model mismatch: batch ${batch_id} was submitted with model qwen3 (fingerprint d90f4c60ab225f77), this worker (wl) runs llama3_1 (fingerprint a46dd04db0e482fa)`);
    // A batch whose spec names no model (written by an older serve) is not checked; its records name the worker's model.
    const old = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20 });
    closers.push(async () => old.close());
    const b = await old.accept(RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "o" }], uid: "mmold" }] }));
    expect((await jobs.batch(b.batch_id))!.spec.model).toBeUndefined();
    const w2 = new JobWorker({ jobs, store, executorFor: () => fakeExecutor(), consumer: "wl2", concurrency: 4, idleExitMs: 300, blockMs: 100, model: llama });
    expect(await w2.run()).toMatchObject({ completed: 2, failed: 0, refused: 0 });
    await b.run.run();
    expect(b.run.stats().counts.ok).toBe(2);
    expect((await store.get("mmold_0_0"))!.model).toEqual(llama);
  });

  test("worker: runs every job once, writes records and completion events, acks, exits when idle; progress comes from the store", async () => {
    const { jobs, store } = setup(5_000);
    const service = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20 });
    closers.push(async () => service.close());
    const req = RolloutRequest.parse({
      rows: [{ prompt: [{ role: "user", content: "a" }], uid: "w0" }, { prompt: "not messages", uid: "w1" }, { prompt: [{ role: "user", content: "c" }], uid: "w2" }],
    });
    const { batch_id, keys, run } = await service.accept(req);
    expect(keys.length).toBe(6);
    const ran: string[] = [];
    const worker = new JobWorker({ model: null, jobs, store, executorFor: () => fakeExecutor(async (t) => void ran.push(t.key)), consumer: "w", concurrency: 3, idleExitMs: 300, blockMs: 100 });
    const summary = await worker.run();
    expect(summary).toEqual({ claimed: 4, completed: 4, failed: 0, reclaimed: 0, abandoned: 0, cancelled: 0, surplus: 0, refused: 0, capped: 0, exit: "idle" });
    expect(ran.sort()).toEqual(["w0_0_0", "w0_1_0", "w2_0_0", "w2_1_0"]);
    await run.run();
    const s = run.stats();
    expect([s.done, s.counts]).toEqual([true, { total: 6, pending: 0, running: 0, finished: 6, reused: 0, records: 6, ok: 4, failed: 2, truncated: 0 }]);
    // The invalid row fails on its own (its uid is server-chosen: a row that does not parse keeps none of its fields).
    expect(s.errors.map((e) => e.error)).toEqual(Array(2).fill("rows[1].prompt: Invalid input: expected array, received string"));
    expect((await store.get("w0_1_0"))!.response_ids).toEqual([5, 6]);
    for (const uid of ["w0", "w2", s.errors[0]!.key.split("_")[0]!]) expect(await store.groupStatus(uid)).toMatchObject({ expected: 2, finished: 2, records: 2, complete: true });
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 0 });

    // Another API process (or this one after a restart) rebuilds the batch's progress from Redis.
    const other = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20 });
    closers.push(async () => other.close());
    const rebuilt = await other.lookup(batch_id);
    await rebuilt.run();
    expect(rebuilt.stats().counts).toEqual(s.counts);
    expect(rebuilt.stats().reward).toEqual(s.reward);
    await expect(other.lookup("00000000-0000-4000-8000-000000000000")).rejects.toThrow("no batch");
  });

  test("heartbeats failing through a store outage are reported once, and once when they land again", async () => {
    const { jobs, store } = setup(300);
    const { p, spec } = plan(1);
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories.slice(0, 1));
    const realBeat = jobs.heartbeat.bind(jobs);
    let down = true;
    let failed = 0;
    jobs.heartbeat = (c, ids) => (down ? (failed++, Promise.reject(new Error("store unreachable"))) : realBeat(c, ids));
    const lines: string[] = [];
    // Several beats fail (the failure is said once), then beats land again (said once).
    const slow = fakeExecutor(async () => {
      await waitFor(() => failed >= 3, "three failed heartbeats");
      down = false;
      await waitFor(() => lines.includes("[beat] heartbeats land again"), "a heartbeat that lands");
    });
    const worker = new JobWorker({ model: null, jobs, store, executorFor: () => slow, consumer: "beat", concurrency: 1, idleExitMs: 200, blockMs: 50, log: (l) => lines.push(l) });
    expect(await worker.run()).toMatchObject({ claimed: 1, completed: 1 });
    expect(lines.filter((l) => l.includes("heartbeat"))).toEqual(["[beat] heartbeat failed: store unreachable (said once until heartbeats land again)", "[beat] heartbeats land again"]);
  });

  test("a claimed job whose batch data the store lost (rows and batch hash gone) is dropped, not failed: the follower reports it lost", async () => {
    const { jobs, store } = setup(5_000);
    const { p, spec } = plan(2);
    const raw = rawRedis();
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories);
    const lines: string[] = [];
    const ran: string[] = [];
    // The first job runs (the worker caches the batch spec); meanwhile the store loses the batch's data.
    const losing = fakeExecutor(async (t) => {
      ran.push(t.key);
      if (ran.length === 1) await raw.del(jobs.rowsKey(spec.batch_id), jobs.batchKey(spec.batch_id));
    });
    const worker = new JobWorker({ model: null, jobs, store, executorFor: () => losing, consumer: "rows", concurrency: 1, idleExitMs: 200, blockMs: 50, log: (l) => lines.push(l) });
    expect(await worker.run()).toMatchObject({ claimed: 4, completed: 1, failed: 0 });
    expect(ran).toEqual([p.trajectories[0]!.key]);
    for (const t of p.trajectories.slice(1)) expect(await store.get(t.key)).toBeNull();
    expect(lines.filter((l) => l.includes("dropped"))).toEqual(
      p.trajectories.slice(1).map((t) => `[rows] ${t.key}: its batch's data is gone from the store; dropped (reported lost by GET /v1/rollouts/${spec.batch_id})`),
    );
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 0 });
    await raw.quit();
  });

  test("a session taken over by another worker (step fence conflict) is abandoned: nothing written, not acked", async () => {
    const { jobs, store } = setup(5_000);
    const { p, spec } = plan(1);
    await jobs.submit(spec, p.trajectories.map((t) => t.key), p.trajectories.slice(0, 1));
    const conflicted: TrajectoryExecutor = { agentNameFor: () => "fake", run: () => Promise.reject(new ConflictError("session 'x': commit of step 3 refused")) };
    const worker = new JobWorker({ model: null, jobs, store, executorFor: () => conflicted, consumer: "loser", concurrency: 1, idleExitMs: 200, blockMs: 50 });
    expect(await worker.run()).toMatchObject({ claimed: 1, completed: 0, abandoned: 1 });
    expect(await store.get(p.trajectories[0]!.key)).toBeNull();
    expect(await jobs.stats()).toMatchObject({ depth: 0, in_flight: 1 });
  });
});
