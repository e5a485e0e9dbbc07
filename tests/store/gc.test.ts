import { expect, test } from "bun:test";
import { join } from "node:path";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { JobQueue, type BatchSpec } from "../../shared/jobs/job-queue.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { collectGarbage, type GcAges } from "../../shared/store/gc.ts";
import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { startUpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { randomPrefix, rawRedis, redisCleanup, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { makeRecord } from "./contract.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// edgeloop gc over a real Redis: what is finished, delivered, acknowledged and old goes; an incomplete
// group, an unacknowledged or unread delivery, a running session and a running batch stay.
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
const redis = await requireRedis();
const { prefixes, closers } = redisCleanup();

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
      "kept                     1 incomplete groups, 0 delivered groups not yet acknowledged by every consumer group, 3 groups younger than their age, " +
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
}, HANG_MS);

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

/**
 * Two consumer groups of one stream at different positions (the operator trial's N8): `trainers` read and
 * acknowledged all three groups, `ppo-trainer` acknowledged g1, holds g2 pending and never read g3. gc may
 * remove only g1; once `ppo-trainer` catches up, the rest. Run through `commander` (Redis over TCP or Upstash REST).
 */
async function twoConsumerGroups(commander: RedisCommander, prefix: string) {
  const trainers = createRedisTransferQueue({ url: REDIS_URL, prefix });
  const ppo = createRedisTransferQueue({ url: REDIS_URL, prefix, group: "ppo-trainer" });
  closers.push(() => trainers.close(), () => ppo.close());
  for (const uid of ["g1", "g2", "g3"]) {
    await trainers.expectGroup(uid, 1, "train");
    await trainers.put(makeRecord(uid, 0));
  }
  const all = await trainers.readCompleteGroups({ max: 10, consumer: "t0", partition: "train" });
  expect(all.map((g) => g.uid)).toEqual(["g1", "g2", "g3"]);
  expect(await trainers.ack(all.map((g) => g.delivery_id), "train")).toBe(3);
  const two = await ppo.readCompleteGroups({ max: 2, consumer: "p0", partition: "train" });
  expect(two.map((g) => g.uid)).toEqual(["g1", "g2"]);
  expect(await ppo.ack([two[0]!.delivery_id], "train")).toBe(1);

  const raw = rawRedis();
  closers.push(() => raw.quit());
  const stream = async () => (await raw.xrange(`${prefix}groups:train`, "-", "+")).map(([id, f]) => [id, f[f.indexOf("uid") + 1]]);
  const entries = await stream();
  expect(entries.map(([, uid]) => uid)).toEqual(["g1", "g2", "g3"]);
  const later = Date.now() + 2 * HOUR * 1000;
  const opts = { prefix, ages: ages(HOUR), sessionTtlSeconds: 7 * DAY, nowMs: () => later };

  const dry = await collectGarbage(commander, { ...opts, dryRun: true });
  expect([dry.deleted, dry.kept.undelivered_groups]).toEqual([{ records: 1, groups: 1, sessions: 0, batches: 0, keys: 3 }, 2]);
  const first = await collectGarbage(commander, opts);
  expect([first.deleted, first.kept.undelivered_groups]).toEqual([{ records: 1, groups: 1, sessions: 0, batches: 0, keys: 3 }, 2]);
  expect(await stream()).toEqual(entries.slice(1));
  expect(await keysUnder(prefix)).toEqual(["group:g2", "group:g2:keys", "group:g3", "group:g3:keys", "groups:train", "traj:g2_0_0", "traj:g3_0_0"]);
  // Both consumer groups are left as they were.
  expect((await raw.xinfo("GROUPS", `${prefix}groups:train`) as unknown[][]).map((g) => [g[1], g[5]])).toEqual([["ppo-trainer", 1], ["trainers", 0]]);

  // ppo-trainer acknowledges g2, reads and acknowledges g3: now every group has, and both go.
  const rest = await ppo.readCompleteGroups({ max: 10, consumer: "p0", partition: "train" });
  expect(rest.map((g) => g.uid)).toEqual(["g3"]);
  expect(await ppo.ack([two[1]!.delivery_id, rest[0]!.delivery_id], "train")).toBe(2);
  const second = await collectGarbage(commander, opts);
  expect([second.deleted, second.kept.undelivered_groups]).toEqual([{ records: 2, groups: 2, sessions: 0, batches: 0, keys: 6 }, 0]);
  expect(await stream()).toEqual([]);
  expect(await keysUnder(prefix)).toEqual(["groups:train"]);
}

test.skipIf(!redis)("gc keeps what any consumer group of the stream has not read or acknowledged, not only `trainers`'", async () => {
  const prefix = randomPrefix("gc2g");
  prefixes.push(prefix);
  const commander = new IoRedisCommander(REDIS_URL);
  closers.push(() => commander.close());
  await twoConsumerGroups(commander, prefix);
});

test.skipIf(!redis)("gc through Upstash REST keeps what any consumer group has not acknowledged (the same passes)", async () => {
  const prefix = randomPrefix("gc2gu");
  prefixes.push(prefix);
  const bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: "gc-token" });
  closers.push(() => bridge.stop());
  const commander = new UpstashCommander({ url: bridge.url, token: "gc-token" });
  closers.push(() => commander.close());
  await twoConsumerGroups(commander, prefix);
});

test.skipIf(!redis)("a stream read only by a custom consumer group is collected once that group acknowledged it; a stream nobody reads is kept", async () => {
  const prefix = randomPrefix("gcppo");
  prefixes.push(prefix);
  const commander = new IoRedisCommander(REDIS_URL);
  const ppo = createRedisTransferQueue({ url: REDIS_URL, prefix, group: "ppo-trainer" });
  closers.push(() => commander.close(), () => ppo.close());
  for (const uid of ["a", "b"]) {
    await ppo.expectGroup(uid, 1, "train");
    await ppo.put(makeRecord(uid, 0));
  }
  const later = Date.now() + 2 * HOUR * 1000;
  const opts = { prefix, ages: ages(HOUR), sessionTtlSeconds: 7 * DAY, nowMs: () => later };
  const raw = rawRedis();
  closers.push(() => raw.quit());
  const groups = (await raw.xinfo("GROUPS", `${prefix}groups:train`)) as unknown[][];
  // No consumer group at all: nobody has read anything, nothing delivered goes.
  if (groups.length) for (const g of groups) await raw.xgroup("DESTROY", `${prefix}groups:train`, String(g[1]));
  expect((await collectGarbage(commander, opts)).kept.undelivered_groups).toBe(2);
  const got = await ppo.readCompleteGroups({ max: 10, consumer: "p0", partition: "train" });
  expect(got.map((g) => g.uid)).toEqual(["a", "b"]);
  expect(await ppo.ack(got.map((g) => g.delivery_id), "train")).toBe(2);
  expect((await raw.xinfo("GROUPS", `${prefix}groups:train`) as unknown[][]).map((g) => g[1])).toEqual(["ppo-trainer"]);
  const r = await collectGarbage(commander, opts);
  expect([r.deleted.groups, r.kept.undelivered_groups]).toEqual([2, 0]);
  expect(await raw.xlen(`${prefix}groups:train`)).toBe(0);
});
