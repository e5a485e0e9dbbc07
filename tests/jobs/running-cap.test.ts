/**
 * The store-wide running cap (issue 32 item 4) over real Redis: the script's
 * grants and the exact hash it keeps, and two JobWorkers of one prefix that
 * together never run more sessions than the cap, one of them held by it.
 */
import { describe, expect, test } from "bun:test";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { JobQueue } from "../../shared/jobs/job-queue.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { StoreRunningCap } from "../../shared/jobs/running-cap.ts";
import { SessionAdmission } from "../../shared/rollout/session-admission.ts";
import { RolloutRequest } from "../../shared/rollout/batch.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { fakeExecutor } from "../helpers/fake-executor.ts";
import { randomPrefix, rawRedis, redisCleanup, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { waitFor } from "../helpers/wait.ts";

const redis = await requireRedis();
const { prefixes, closers } = redisCleanup();

/** A job queue and a transfer queue on a fresh prefix of the test Redis (closed and deleted after the file). */
function queueOn(name: string, leaseMs: number) {
  const prefix = randomPrefix(name);
  prefixes.push(prefix);
  const commander = new IoRedisCommander(REDIS_URL);
  closers.push(() => commander.close());
  const store = createRedisTransferQueue({ url: REDIS_URL, prefix });
  closers.push(() => store.close());
  return { prefix, jobs: new JobQueue(commander, { prefix, leaseMs }), store };
}

describe.skipIf(!redis)("store-wide running cap", () => {
  test("grants at most cap − others − held, keeps `{held}:{expiry}` per worker, drops an expired worker's entry, and frees a leaving one's at once", async () => {
    const prefix = randomPrefix("runcap");
    prefixes.push(prefix);
    const commander = new IoRedisCommander(REDIS_URL);
    closers.push(() => commander.close());
    const raw = rawRedis();
    closers.push(async () => void (await raw.quit()));
    let now = 1_800_000_000_000;
    const cap = new StoreRunningCap(commander, { prefix, cap: 8, ttlMs: 1_000, now: () => now });
    const key = `${prefix}jobs:running`;
    expect(cap.key).toBe(key);
    expect(await cap.reserve("a", 0, 5)).toEqual({ granted: 5, others: 0, cap: 8 });
    expect(await cap.reserve("b", 0, 5)).toEqual({ granted: 3, others: 5, cap: 8 });
    expect(await cap.reserve("b", 3, 1)).toEqual({ granted: 0, others: 5, cap: 8 });
    expect(await raw.hgetall(key)).toEqual({ a: `5:${now + 1_000}:8`, b: `3:${now + 1_000}:8` });
    // a's jobs end (held 2): b gets the three freed slots, no more.
    now += 10;
    expect(await cap.reserve("a", 2, 0)).toEqual({ granted: 0, others: 3, cap: 8 });
    expect(await cap.reserve("b", 3, 10)).toEqual({ granted: 3, others: 2, cap: 8 });
    expect(await raw.hget(key, "b")).toBe(`6:${now + 1_000}:8`);
    // a stops renewing (a SIGKILLed worker): once its entry's expiry is past, b's next ask drops it and may take its slots.
    now += 1_000;
    expect(await cap.reserve("b", 6, 10)).toEqual({ granted: 2, others: 0, cap: 8 });
    expect(await raw.hgetall(key)).toEqual({ b: `8:${now + 1_000}:8` });
    // Malformed entries are dropped rather than counted: not a count, no cap, a cap of 0.
    await raw.hset(key, "junk", "not-a-count", "old", `1:${now + 5_000}`, "zero", `1:${now + 5_000}:0`);
    expect(await cap.reserve("c", 0, 1)).toEqual({ granted: 0, others: 8, cap: 8 });
    expect(await raw.hkeys(key)).toEqual(["b", "c"]);
    await cap.leave("b");
    expect(await cap.reserve("c", 0, 3)).toEqual({ granted: 3, others: 0, cap: 8 });
    // A worker given a smaller cap: both obey the smallest (c, holding 3, is granted nothing more under d's cap of 2).
    const small = new StoreRunningCap(commander, { prefix, cap: 2, ttlMs: 1_000, now: () => now });
    expect(await small.reserve("d", 0, 2)).toEqual({ granted: 0, others: 3, cap: 2 });
    expect(await cap.reserve("c", 3, 1)).toEqual({ granted: 0, others: 0, cap: 2 });
    await cap.leave("c");
    expect(await small.reserve("d", 0, 5)).toEqual({ granted: 2, others: 0, cap: 2 });
    expect(await cap.reserve("c", 0, 5)).toEqual({ granted: 0, others: 2, cap: 2 });
    await small.leave("d");
    // The key expires on its own with no worker left renewing it (twice the entry TTL).
    const pttl = await raw.pttl(key);
    expect(pttl > 1_000 && pttl <= 2_000).toBe(true);
    expect(() => new StoreRunningCap(commander, { cap: 0, ttlMs: 1 })).toThrow(/cap must be an integer >= 1/);
  });

  test("without an injected clock, expiries are on the store's clock (Redis TIME), not the worker's", async () => {
    const prefix = randomPrefix("runcap-t");
    prefixes.push(prefix);
    const commander = new IoRedisCommander(REDIS_URL);
    closers.push(() => commander.close());
    const raw = rawRedis();
    closers.push(async () => void (await raw.quit()));
    const storeMs = async () => {
      const [s, us] = await raw.time();
      return Number(s) * 1000 + Math.floor(Number(us) / 1000);
    };
    const cap = new StoreRunningCap(commander, { prefix, cap: 3, ttlMs: 60_000 });
    const before = await storeMs();
    expect(await cap.reserve("w", 0, 2)).toEqual({ granted: 2, others: 0, cap: 3 });
    const after = await storeMs();
    const entry = await raw.hget(`${prefix}jobs:running`, "w");
    expect(entry).toMatch(/^2:\d+:3$/);
    const expiry = Number(entry!.split(":")[1]);
    expect(expiry).toBeGreaterThanOrEqual(before + 60_000);
    expect(expiry).toBeLessThanOrEqual(after + 60_000);
  });

  test("two workers (concurrency 6 each) with cap 4: never more than 4 sessions running in all, every job done once, the held worker says why", async () => {
    const { prefix, jobs, store } = queueOn("runcap-w", 5_000);
    const cfg = parseAppConfig({ rollout: { n: 2 } });
    const service = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20 });
    closers.push(async () => service.close());
    const req = RolloutRequest.parse({ rows: Array.from({ length: 8 }, (_, i) => ({ prompt: [{ role: "user", content: `q${i}` }], uid: `cap${i}` })) });
    const { keys, run } = await service.accept(req);
    expect(keys.length).toBe(16);

    // Each session waits until released by the test; the running count is read at every start.
    let running = 0;
    let peak = 0;
    const ran: string[] = [];
    const waiting: (() => void)[] = [];
    const exec = () =>
      fakeExecutor(async (t) => {
        running++;
        peak = Math.max(peak, running);
        ran.push(t.key);
        await new Promise<void>((r) => waiting.push(r));
        running--;
      });
    const logs: string[] = [];
    const admissions = { w1: new SessionAdmission({ maxInFlight: 6 }), w2: new SessionAdmission({ maxInFlight: 6 }) };
    const heldGauge = (a: SessionAdmission, name: string) => Object.fromEntries(a.families().map((f) => [f.name, f.samples]))[name]!.find((x) => x.labels?.reason === "store_cap")!.value;
    const worker = (consumer: "w1" | "w2") =>
      new JobWorker({ model: null, jobs, store, executorFor: exec, consumer, concurrency: 6, idleExitMs: 400, blockMs: 100, capPollMs: 20, runningCap: jobs.runningCap(4), admission: admissions[consumer], log: (l) => logs.push(`${consumer}: ${l}`) });
    const w1 = worker("w1");
    const w2 = worker("w2");
    const done = Promise.all([w1.run(), w2.run()]);
    // Four start; then both workers ask and are refused (the cap is full) until one ends.
    await waitFor(() => running === 4 && logs.filter((l) => l.includes("held by the store-wide cap")).length >= 1, "four running and a worker held");
    expect(logs.find((l) => l.includes("held by the store-wide cap"))).toMatch(/held by the store-wide cap: 4 sessions at once across workers \(\d held by other workers, \d running here\); claiming again when a slot frees/);
    // /metrics names the cause: the held worker's admission reports one held session, reason store_cap.
    const heldNow = heldGauge(admissions.w1, "edgeloop_sessions_held") + heldGauge(admissions.w2, "edgeloop_sessions_held");
    expect(heldNow).toBeGreaterThanOrEqual(1);
    expect(admissions.w1.held + admissions.w2.held).toBe(heldNow);
    // Release sessions one at a time: each end lets exactly one more start (the count never passes 4).
    for (;;) {
      await waitFor(() => waiting.length > 0 || (ran.length === 16 && running === 0), "a session waiting, or all done");
      if (waiting.length === 0) break;
      const before = ran.length - running;
      waiting.shift()!();
      // One more finished; as many run as the cap allows of what is left.
      await waitFor(() => ran.length - running === before + 1 && running === Math.min(4, 16 - (before + 1)), "the freed slot taken");
    }
    const [s1, s2] = await done;
    expect(peak).toBe(4);
    expect(ran.sort()).toEqual([...keys].sort());
    expect(s1.completed + s2.completed).toBe(16);
    expect(s1.capped + s2.capped).toBeGreaterThanOrEqual(1);
    // Each spell the summary counted is one in the held counter; none is held once both left.
    expect(heldGauge(admissions.w1, "edgeloop_sessions_held_total") + heldGauge(admissions.w2, "edgeloop_sessions_held_total")).toBe(s1.capped + s2.capped);
    expect(heldGauge(admissions.w1, "edgeloop_sessions_held") + heldGauge(admissions.w2, "edgeloop_sessions_held")).toBe(0);
    await run.run();
    expect(run.stats().counts.ok).toBe(16);
    // Both left: nothing held in the store.
    const raw = rawRedis();
    closers.push(async () => void (await raw.quit()));
    expect(await raw.hgetall(`${prefix}jobs:running`)).toEqual({});
  });
  test("idle workers started before the batch, a lease shorter than a blocking read: still never more than the cap; held workers idle-exit; a smaller cap elsewhere is obeyed and said", async () => {
    // A 400 ms lease: shorter than the 1 s blocking read an uncapped idle worker waits in.
    const { prefix, jobs, store } = queueOn("runcap-idle", 400);
    let running = 0;
    let peak = 0;
    let ran = 0;
    const waiting: (() => void)[] = [];
    const exec = () =>
      fakeExecutor(async () => {
        running++;
        ran++;
        peak = Math.max(peak, running);
        await new Promise<void>((r) => waiting.push(r));
        running--;
      });
    const logs: string[] = [];
    const worker = (consumer: string, n: number) =>
      new JobWorker({ model: null, jobs, store, executorFor: exec, consumer, concurrency: 1, idleExitMs: 300, blockMs: 1000, capPollMs: 20, runningCap: jobs.runningCap(n), log: (l) => logs.push(`${consumer}: ${l}`) });
    // Three workers idle before any job exists; the third was given a smaller cap than the others (1 vs 2).
    const runs = [worker("i1", 2).run(), worker("i2", 2).run(), worker("i3", 1).run()];
    const cfg = parseAppConfig({ rollout: { n: 2 } });
    const service = new RolloutService({ config: cfg, store, executorFor: () => fakeExecutor(), jobs, followPollMs: 20 });
    closers.push(async () => service.close());
    const { keys, run } = await service.accept(RolloutRequest.parse({ rows: Array.from({ length: 3 }, (_, i) => ({ prompt: [{ role: "user", content: `q${i}` }], uid: `idle${i}` })) }));
    expect(keys.length).toBe(6);
    // One session at a time (the smallest cap, 1), released one by one.
    for (let done = 0; done < 6; done++) {
      await waitFor(() => waiting.length === 1 && running === 1, `session ${done + 1} running alone`);
      waiting.shift()!();
    }
    const summaries = await Promise.all(runs);
    expect(peak).toBe(1);
    expect(ran).toBe(6);
    expect(summaries.reduce((a, x) => a + x.completed, 0)).toBe(6);
    // Nothing left: every worker left idle (a held worker does not count as busy), and none holds a slot.
    expect(summaries.map((x) => x.exit)).toEqual(["idle", "idle", "idle"]);
    const raw = rawRedis();
    closers.push(async () => void (await raw.quit()));
    expect(await raw.hgetall(`${prefix}jobs:running`)).toEqual({});
    // The workers given 2 said, once each at most, that a smaller cap holds.
    const said = logs.filter((l) => l.includes("smaller store-wide cap"));
    expect(said.length).toBeGreaterThanOrEqual(1);
    expect(said.every((l) => /^(i[12]): \[\1\] another worker of this store prefix was given a smaller store-wide cap \(1; this one 2\): every worker obeys the smallest, 1; give all of them the same --max-running-total$/.test(l))).toBe(true);
    expect(new Set(said.map((l) => l.slice(0, 2))).size).toBe(said.length);
    await run.run();
    expect(run.stats().counts.ok).toBe(6);
  });
});
