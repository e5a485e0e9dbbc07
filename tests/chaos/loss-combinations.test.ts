import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import type { JobQueue } from "../../shared/jobs/job-queue.ts";
import { followBatch } from "../../shared/jobs/batch-follower.ts";
import { BatchRun } from "../../shared/rollout/batch-run.ts";
import type { BatchPlan } from "../../shared/rollout/batch.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { RedisLayout } from "../../shared/store/redis-layout.ts";
import { keyPart } from "../../shared/store/key-encoding.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// N2 (issue 27): whatever part of a trajectory's state the store loses — its job, its durable session
// (gone, cut back to an earlier step, or finished), its record, its group hash, its batch's hash — the batch
// ends: every key lands (with a valid record) or is reported lost within the grace; none is stored failed
// because of the loss, none waits forever. Real Redis, real processes' parts in-process: a worker that
// "dies" right after writing each record (no completion event, no ack — what SIGKILL leaves), the state cut
// to each combination, then a fresh follower (the API process's) and a live worker.
const redis = await requireRedis();
const GRACE_MS = 500;
const LEASE_MS = 600;

type Job = "pending" | "gone";
type Session = "gone" | "partial" | "done";
type Kept = "kept" | "gone";
interface Combo {
  job: Job;
  session: Session;
  record: Kept;
  group: Kept;
  batch: Kept;
}
const combos: Combo[] = [];
for (const batch of ["kept", "gone"] as const)
  for (const job of ["pending", "gone"] as const)
    for (const session of ["gone", "partial", "done"] as const)
      for (const record of ["kept", "gone"] as const) for (const group of ["kept", "gone"] as const) combos.push({ job, session, record, group, batch });
const name = (c: Combo) => `job ${c.job}, session ${c.session}, record ${c.record}, group ${c.group}, batch ${c.batch}`;

/**
 * The outcome the store's state allows: a record stored whole (with its group's accounting) lands; a record whose
 * group hash is gone can never complete its group (put-once keeps the record, the group never learns of it): lost;
 * without a record, a job whose batch can still run is run again (resumed, or sampled again) and lands; the rest is lost.
 */
function expected(c: Combo): "landed" | "lost" {
  if (c.record === "kept") return c.group === "kept" ? "landed" : "lost";
  return c.job === "pending" && c.batch === "kept" ? "landed" : "lost";
}

describe.skipIf(!redis)("N2: every combination of what a store loss leaves ends the batch", () => {
  const prefix = randomPrefix("loss-combos");
  const flags = { store: REDIS_URL, storePrefix: prefix, n: 1, seed: 7, maxModelLen: 4096 };
  let api: Runtime;
  let wk: Runtime;
  let victimRt: Runtime;
  const plans = new Map<Kept, BatchPlan>();
  const comboOf = new Map<string, Combo>();
  const original = new Map<string, TrajectoryRecord>();

  beforeAll(async () => {
    // The submitting API process never follows (its lost grace is far away and it stops following at once).
    api = await buildRuntime(flags, { jobs: "queue", lostGraceMs: 600_000, jobQueue: { leaseMs: LEASE_MS } });
    wk = await buildRuntime(flags, { jobQueue: { leaseMs: LEASE_MS } });
    // The worker that dies never reclaims (its lease is long): its jobs are delivered once before the loss.
    victimRt = await buildRuntime(flags, { jobQueue: { leaseMs: 600_000 } });
  }, HANG_MS);
  afterAll(async () => {
    await api?.close();
    await wk?.close();
    await victimRt?.close();
    await deleteByPrefix(prefix);
  });

  test(`${combos.length} combinations: landed or reported lost as the state allows, never failed, never stuck`, async () => {
    const r = rawRedis();
    const layout = new RedisLayout(prefix);
    const jobs = api.jobs!;
    const groupSnapshot = new Map<string, Record<string, string>>();
    for (const batch of ["kept", "gone"] as const) {
      const mine = combos.filter((c) => c.batch === batch);
      const rows = mine.map((c, i) => ({ ...ROWS[i % ROWS.length], uid: `${batch}${i}` }));
      const acc = await api.service.accept({ rows, global_steps: 1, model_version: "v1", validate: false });
      plans.set(batch, acc.run.plan);
      mine.forEach((c, i) => comboOf.set(`${batch}${i}_0_0`, c));
      for (const row of rows) groupSnapshot.set(row.uid, await r.hgetall(layout.group(row.uid)));
    }
    api.service.close();
    expect(comboOf.size).toBe(combos.length);

    // A worker that dies right after each record is stored: no completion event, no acknowledgement.
    const dead = new Proxy(victimRt.jobs!, {
      get(t, p) {
        if (p === "completed" || p === "ack") return async () => {};
        const v = Reflect.get(t, p, t);
        return typeof v === "function" ? v.bind(t) : v;
      },
    }) as JobQueue;
    const victim = new JobWorker({ jobs: dead, store: victimRt.batchStore, executorFor: victimRt.executorFor, consumer: "victim", concurrency: 8, idleExitMs: null, model: victimRt.model });
    const victimRun = victim.run();
    const allStored = async () => {
      for (const k of comboOf.keys()) if (!(await wk.store.sessionRecords(k.slice(0, k.indexOf("_")), 0))) return false;
      return true;
    };
    while (!(await allStored())) await Bun.sleep(20);
    victim.stop();
    await victimRun;
    for (const k of comboOf.keys()) original.set(k, (await wk.store.get(k))!);
    for (const rec of original.values()) expect([rec.key, rec.error]).toEqual([rec.key, null]);

    // Cut each key's state to its combination.
    const entries = (await r.xrange(`${prefix}jobs`, "-", "+")) as [string, string[]][];
    const jobId = new Map<string, string>();
    for (const [id, f] of entries) jobId.set(f[f.indexOf("key") + 1]!, id);
    for (const [key, c] of comboOf) {
      const uid = key.slice(0, key.indexOf("_"));
      if (c.job === "gone") {
        await r.xack(`${prefix}jobs`, "workers", jobId.get(key)!);
        await r.xdel(`${prefix}jobs`, jobId.get(key)!);
      }
      const sh = `${prefix}session:${keyPart(key)}`;
      if (c.session === "gone") await r.del(sh);
      else if (c.session === "partial") {
        // Back to its first committed step (the deltas are append-only: p:0 alone is that step's state).
        const h = await r.hgetall(sh);
        expect(h["p:0"]![0]).toBe("."); // one part: the first delta whole
        const first = JSON.parse(h["p:0"]!.slice(1)) as { step: number };
        const keep = Object.fromEntries(Object.entries(h).filter(([f]) => f === "in" || f.startsWith("i:") || f === "p:0"));
        await r.del(sh);
        await r.hset(sh, { ...keep, n: "1", step: String(first.step) });
      }
      if (c.record === "gone") {
        await r.del(layout.traj(key), layout.members(uid));
        await r.del(layout.group(uid));
        if (c.group === "kept") await r.hset(layout.group(uid), groupSnapshot.get(uid)!);
      }
      if (c.group === "gone") await r.del(layout.group(uid), layout.members(uid));
    }
    const gone = plans.get("gone")!.batch_id;
    await r.del(jobs.batchKey(gone), jobs.rowsKey(gone), `${jobs.batchKey(gone)}:done`);

    // The API process's follower (fresh, holding the plans) and a live worker.
    const runs = [...plans.values()].map((plan) => {
      const run = new BatchRun(plan, { executor: { agentNameFor: () => "x", run: () => Promise.reject(new Error("external")) }, store: api.store, rollout: api.config.rollout, concurrency: 1, external: true });
      const f = followBatch(run, jobs, api.store, { lostGraceMs: GRACE_MS, pollMs: 50, started: (ks) => jobs.sessionsStarted(ks) });
      return { run, f };
    });
    const live = new JobWorker({ jobs: wk.jobs!, store: wk.batchStore, executorFor: wk.executorFor, consumer: "live", concurrency: 8, idleExitMs: null, model: wk.model, log: process.env.LOSS_LOG ? (l) => console.error(l) : undefined });
    const liveRun = live.run();
    const ended = await Promise.race([Promise.all(runs.map((x) => x.run.run())).then(() => true), Bun.sleep(90_000).then(() => false)]);
    live.stop();
    await liveRun;
    for (const x of runs) x.f.stop();
    await r.quit();

    const stats = runs.map((x) => x.run.stats());
    const landed = new Map(runs.flatMap((x) => x.run.records().map((rec) => [rec.key, rec] as const)));
    const lost = new Set(stats.flatMap((s) => s.lost?.keys ?? []));
    const outcome = (k: string) => (landed.has(k) ? (lost.has(k) ? "both" : "landed") : lost.has(k) ? "lost" : "neither");
    const table = [...comboOf].map(([k, c]) => `${outcome(k).padEnd(7)} ${name(c)}${landed.get(k)?.error ? ` ERROR ${landed.get(k)!.error}` : ""}`);
    console.log(table.join("\n"));
    expect(ended).toBe(true);
    for (const s of stats) expect(s.done).toBe(true);
    // Each combination ends as its state allows; a landed record is the trajectory the policy sampled.
    for (const [k, c] of comboOf) {
      expect([name(c), outcome(k)]).toEqual([name(c), expected(c)]);
      const rec = landed.get(k);
      if (!rec) continue;
      expect([name(c), rec.error]).toEqual([name(c), null]);
      const o = original.get(k)!;
      expect([name(c), rec.prompt_ids, rec.response_ids, rec.response_mask, rec.rollout_log_probs]).toEqual([name(c), o.prompt_ids, o.response_ids, o.response_mask, o.rollout_log_probs]);
    }
  }, HANG_MS);
});
