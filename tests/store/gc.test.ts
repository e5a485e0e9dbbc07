import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { JobQueue, type BatchSpec } from "../../shared/jobs/job-queue.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { collectGarbage, type GcAges } from "../../shared/store/gc.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { makeRecord } from "./contract.ts";

// edgeloop gc over a real Redis: what is finished, delivered, acknowledged and old goes; an incomplete
// group, an unacknowledged or unread delivery, a running session and a running batch stay.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const redis = await requireRedis();
const prefixes: string[] = [];
const closers: (() => Promise<unknown>)[] = [];
afterAll(async () => {
  for (const c of closers) await c().catch(() => {});
  for (const p of prefixes) await deleteByPrefix(p);
});

const HOUR = 3600;
const DAY = 24 * HOUR;
const ages = (s: number): GcAges => ({ records: s, groups: s, sessions: s, batches: s });

async function keysUnder(prefix: string): Promise<string[]> {
  const c = rawRedis();
  const out: string[] = [];
  let cursor = "0";
  do {
    const [next, keys] = await c.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000);
    cursor = next;
    out.push(...keys.map((k) => k.slice(prefix.length)));
  } while (cursor !== "0");
  await c.quit();
  return out.sort();
}

async function seed(prefix: string) {
  const store = createRedisTransferQueue({ url: REDIS_URL, prefix });
  const commander = new IoRedisCommander(REDIS_URL);
  closers.push(() => store.close(), () => commander.close());
  // acked: complete, delivered, acknowledged. unacked: delivered, not acknowledged. unread: complete, never read.
  for (const uid of ["acked", "unacked"]) {
    await store.expectGroup(uid, 1, "train");
    await store.put(makeRecord(uid, 0));
  }
  const got = await store.readCompleteGroups({ max: 10, consumer: "t0", partition: "train" });
  expect(got.map((g) => g.uid).sort()).toEqual(["acked", "unacked"]);
  await store.ack([got.find((g) => g.uid === "acked")!.delivery_id], "train");
  await store.expectGroup("unread", 1, "train");
  await store.put(makeRecord("unread", 0));
  // open: one of two sessions finished. withdrawn: a cancelled batch's group.
  await store.expectGroup("open", 2, "train");
  await store.put(makeRecord("open", 0));
  await store.expectGroup("withdrawn", 2, "train");
  await store.put(makeRecord("withdrawn", 0));
  await store.cancelGroups!(["withdrawn"]);
  // Sessions: finished 2 h ago (expiry = retention − 2 h), finished now, running (no expiry).
  const raw = rawRedis();
  await raw.hset(`${prefix}session:old_0_0`, "n", "1");
  await raw.expire(`${prefix}session:old_0_0`, 7 * DAY - 2 * HOUR);
  await raw.hset(`${prefix}session:new_0_0`, "n", "1");
  await raw.expire(`${prefix}session:new_0_0`, 7 * DAY);
  await raw.hset(`${prefix}session:run_0_0`, "n", "1");
  await raw.quit();
  // Batches submitted 3 h ago: one whose job was run and acknowledged, one whose job still waits.
  const jobs = new JobQueue(commander, { prefix });
  const cfg = parseAppConfig({});
  const batch = (uid: string) => {
    const p = planBatch(RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: uid }], uid }] }), cfg.rollout);
    const spec: BatchSpec = { batch_id: p.batch_id, validate: false, global_steps: -1, model_version: null, rollout: cfg.rollout, total: 1, started_at: Date.now() - 3 * HOUR * 1000 };
    return { p, spec };
  };
  const done = batch("bdone");
  await jobs.submit(done.spec, ["bdone_0_0"], done.p.trajectories);
  const [job] = await jobs.claim("w", 1);
  await jobs.completed(done.spec.batch_id, "bdone_0_0");
  await jobs.ack([job!.id]);
  const running = batch("brun");
  await jobs.submit(running.spec, ["brun_0_0"], running.p.trajectories);
  return { commander, done: done.spec.batch_id, running: running.spec.batch_id };
}

test.skipIf(!redis)("gc: dry-run changes nothing; then exactly the finished, acknowledged, old data goes; a withdrawn group ages from its first sighting", async () => {
  const prefix = randomPrefix("gc");
  prefixes.push(prefix);
  const { commander, done, running } = await seed(prefix);
  const before = await keysUnder(prefix);
  // `jobs:workers` (the workers seen lately, pruned by GET /v1/queue) is live state: gc leaves it.
  expect(before).toEqual(
    [
      "group:acked", "group:acked:keys", "group:open", "group:open:keys", "group:unacked", "group:unacked:keys", "group:unread", "group:unread:keys",
      "group:withdrawn", "group:withdrawn:keys", "groups:train", "jobs", `jobs:batch:${done}`, `jobs:batch:${done}:done`, `jobs:batch:${done}:rows`,
      `jobs:batch:${running}`, `jobs:batch:${running}:rows`, "jobs:batches", "jobs:lease", "jobs:workers", "session:new_0_0", "session:old_0_0", "session:run_0_0",
      "traj:acked_0_0", "traj:open_0_0", "traj:unacked_0_0", "traj:unread_0_0", "traj:withdrawn_0_0",
    ].sort(),
  );
  const later = Date.now() + 2 * HOUR * 1000;
  const opts = { prefix, ages: ages(HOUR), sessionTtlSeconds: 7 * DAY, nowMs: () => later };

  const dry = await collectGarbage(commander, { ...opts, dryRun: true });
  expect(dry).toEqual({
    dry_run: true,
    deleted: { records: 1, groups: 1, sessions: 1, batches: 1, keys: 1 + 2 + 1 + 3 },
    kept: { incomplete_groups: 1, undelivered_groups: 2, recent_groups: 0, first_seen_groups: 1, running_sessions: 1, running_batches: 1 },
    scanned: { groups: 5, sessions: 3, batches: 2 },
  });
  expect(await keysUnder(prefix)).toEqual(before);

  const real = await collectGarbage(commander, opts);
  expect(real).toEqual({ ...dry, dry_run: false });
  const gone = ["group:acked", "group:acked:keys", "traj:acked_0_0", "session:old_0_0", `jobs:batch:${done}`, `jobs:batch:${done}:done`, `jobs:batch:${done}:rows`];
  expect(await keysUnder(prefix)).toEqual(before.filter((k) => !gone.includes(k)));
  const raw = rawRedis();
  closers.push(() => raw.quit());
  // The acked group's stream entry is gone, the others stay; the index lists only the running batch.
  expect((await raw.xrange(`${prefix}groups:train`, "-", "+")).map(([, f]) => f[1])).toEqual(["unacked", "unread"]);
  expect((await raw.zrange(`${prefix}jobs:batches`, "0", "-1")).map((m) => m.slice(16))).toEqual([running]);
  // The withdrawn group's clock started at that pass (never enqueued: no delivery time).
  expect(await raw.hget(`${prefix}group:withdrawn`, "gc_seen")).toBe(String(later));

  const again = await collectGarbage(commander, { ...opts, nowMs: () => later + 2 * HOUR * 1000 });
  expect([again.deleted, again.kept]).toEqual([
    { records: 1, groups: 1, sessions: 0, batches: 0, keys: 3 },
    { incomplete_groups: 1, undelivered_groups: 2, recent_groups: 0, first_seen_groups: 0, running_sessions: 1, running_batches: 1 },
  ]);
  expect(await raw.exists(`${prefix}group:withdrawn`, `${prefix}traj:withdrawn_0_0`, `${prefix}group:open`, `${prefix}traj:open_0_0`)).toBe(2);
  // Every scanned group is accounted for: deleted, or kept for one stated reason (records and groups share one age here).
  for (const r of [dry, real, again]) {
    const k = r.kept;
    expect(r.deleted.groups + k.incomplete_groups + k.undelivered_groups + k.recent_groups + k.first_seen_groups).toBe(r.scanned.groups);
  }
});

test.skipIf(!redis)("edgeloop gc --older-than 1h --dry-run then for real, through the CLI", async () => {
  const prefix = randomPrefix("gc-cli");
  prefixes.push(prefix);
  await seed(prefix);
  const run = async (...args: string[]) => {
    const p = Bun.spawn([process.execPath, MAIN, "gc", "--store", REDIS_URL, "--store-prefix", prefix, ...args], { stdout: "pipe", stderr: "pipe" });
    const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    return { out, err, code };
  };
  // Delivery times are now: only the session finished 2 h ago and the batch submitted 3 h ago are older than 1 h.
  const dry = await run("--older-than", "1h", "--dry-run");
  expect(dry).toEqual({
    out:
      "would delete             0 records, 0 groups, 1 sessions, 1 batches (4 keys)\n" +
      "kept                     1 incomplete groups, 0 delivered groups not yet acknowledged by trainers, 3 groups younger than their age, " +
      "1 filtered/withdrawn groups first seen now (their age starts here), 1 running sessions, 1 running batches\n" +
      "scanned                  5 groups, 3 sessions, 2 batches\n",
    err: "",
    code: 0,
  });
  expect(await rawRedis().exists(`${prefix}session:old_0_0`)).toBe(1);
  const real = await run("--older-than", "1h", "--json");
  expect(real.code).toBe(0);
  expect(JSON.parse(real.out).deleted).toEqual({ records: 0, groups: 0, sessions: 1, batches: 1, keys: 4 });
  const bad = await run("--older-than", "soon");
  expect([bad.code, bad.err]).toEqual([2, "edgeloop: --older-than must be a duration such as 90s, 30m, 12h, 7d or 2w (or seconds), got 'soon' (see edgeloop gc --help)\n"]);
  const mem = Bun.spawn([process.execPath, MAIN, "gc", "--store", "memory"], { stdout: "pipe", stderr: "pipe" });
  expect([await mem.exited, await new Response(mem.stderr).text()]).toEqual([2, "edgeloop: config store.url: edgeloop gc needs a Redis or Upstash store (--store redis://host:port or upstash): the memory store lives and dies with its process\n"]);
}, 30_000);

test.skipIf(!redis)("a prefix holding glob characters (*, ?, [ ]) scans only its own keys, never another prefix's", async () => {
  const base = randomPrefix("gcglob");
  // `${base}x*` as a glob would match `${base}xy:…`; `${base}[q]:` as a glob would match `${base}q:…` and not itself.
  const star = `${base}x*`;
  const other = `${base}xy:`;
  const bracket = `${base}[q]:`;
  const lookalike = `${base}q:`;
  prefixes.push(star, other, bracket, lookalike);
  const raw = rawRedis();
  closers.push(() => raw.quit());
  for (const p of [star, other, bracket, lookalike]) {
    // A session that finished 2 h ago (expiry = retention − 2 h) under each prefix.
    await raw.hset(`${p}session:old_0_0`, "n", "1");
    await raw.expire(`${p}session:old_0_0`, 7 * DAY - 2 * HOUR);
  }
  const commander = new IoRedisCommander(REDIS_URL);
  closers.push(() => commander.close());
  const opts = { ages: ages(HOUR), sessionTtlSeconds: 7 * DAY };
  const a = await collectGarbage(commander, { ...opts, prefix: star });
  expect([a.scanned.sessions, a.deleted.sessions]).toEqual([1, 1]);
  const b = await collectGarbage(commander, { ...opts, prefix: bracket });
  expect([b.scanned.sessions, b.deleted.sessions]).toEqual([1, 1]);
  // The look-alike prefixes' sessions are untouched.
  expect(await raw.exists(`${other}session:old_0_0`, `${lookalike}session:old_0_0`, `${star}session:old_0_0`, `${bracket}session:old_0_0`)).toBe(2);
});
