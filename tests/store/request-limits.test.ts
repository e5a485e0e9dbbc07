import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { StoreError } from "../../shared/errors.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// E6: store requests within the backend's limits. Pipelines are split by bytes (Upstash REST: one
// request ≤ maxRequestBytes; Redis TCP: one command ≤ it), a batch's rows are stored once (not in
// each of its n jobs), and a batch refused for size writes nothing.
const redis = await requireRedis();
const TOKEN = "limits-token";
const prefixes: string[] = [];
const raw = rawRedis();
let bridge: UpstashBridge;
const dir = mkdtempSync(join(tmpdir(), "edgeloop-limits-"));

beforeAll(async () => {
  if (!redis) return;
  bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: TOKEN });
  process.env.UPSTASH_REDIS_REST_URL = bridge.url;
  process.env.UPSTASH_REDIS_REST_TOKEN = TOKEN;
});
afterAll(async () => {
  await bridge?.stop();
  for (const p of prefixes) await deleteByPrefix(p);
  await raw.quit();
  rmSync(dir, { recursive: true, force: true });
});

const fresh = (name: string) => {
  const p = randomPrefix(name);
  prefixes.push(p);
  return p;
};
const keysUnder = async (p: string) => (await raw.keys(`${p}*`)).map((k) => k.slice(p.length)).sort();

describe.skipIf(!redis)("commanders split pipelines by bytes and refuse an oversized command", () => {
  test("Upstash REST through a bridge that takes 200 kB bodies: 10 × 40 kB SETs land (several requests); a 250 kB SET is 413 request_too_large, not sent", async () => {
    const small = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: TOKEN, maxBodyBytes: 200_000 });
    const p = fresh("limits-up");
    try {
      const c = new UpstashCommander({ url: small.url, token: TOKEN, maxRequestBytes: 150_000, retries: 0 });
      const res = await c.pipeline(Array.from({ length: 10 }, (_, i) => ["SET", `${p}k${i}`, String(i).repeat(40_000)]));
      expect(res).toEqual(Array(10).fill("OK"));
      for (let i = 0; i < 10; i++) expect(await raw.strlen(`${p}k${i}`)).toBe(40_000);
      const err = await c.exec(["SET", `${p}big`, "x".repeat(250_000)]).catch((e) => e);
      expect(err).toBeInstanceOf(StoreError);
      expect([err.status, err.code, err.retryable]).toEqual([413, "request_too_large", false]);
      const perr = await c.pipeline([["SET", `${p}a`, "1"], ["SET", `${p}big`, "x".repeat(250_000)]]).catch((e) => e);
      expect(perr.code).toBe("request_too_large");
      expect(await raw.exists(`${p}big`, `${p}a`)).toBe(0);
    } finally {
      await small.stop();
    }
  });

  test("Redis TCP with maxRequestBytes 100 kB: a 300 kB pipeline is split and lands; a 120 kB command is refused unsent", async () => {
    const p = fresh("limits-tcp");
    const c = new IoRedisCommander(REDIS_URL, { maxRequestBytes: 100_000 });
    try {
      const res = await c.pipeline(Array.from({ length: 10 }, (_, i) => ["SET", `${p}k${i}`, "y".repeat(30_000)]));
      expect(res).toEqual(Array(10).fill("OK"));
      const err = await c.exec(["SET", `${p}big`, "x".repeat(120_000)]).catch((e) => e);
      expect([err.status, err.code]).toEqual([413, "request_too_large"]);
      expect(await raw.exists(`${p}big`)).toBe(0);
    } finally {
      await c.close();
    }
  });
});

describe.skipIf(!redis)("E6: serve --store upstash (queue mode) with a 2.8 MB batch", () => {
  const question = (i: number) => `${"filler ".repeat(5715)} Question ${i}: what is 2+2?`;
  const rows = Array.from({ length: 70 }, (_, i) => ({ uid: `e6q${i}`, data_source: "edge", prompt: [{ role: "user", content: question(i) }], reward_model: { style: "rule", ground_truth: "4" } }));
  let api: Runtime | undefined;
  let worker: Runtime | undefined;
  afterAll(async () => {
    await api?.close();
    await worker?.close();
  });

  test("70 rows × 40 kB, n = 8 → 202; rows stored once (70 values, not 560); every job small; the batch completes with 560 records", async () => {
    const p = fresh("limits-e6");
    const flags = { engine: "sim", n: 8, store: "upstash", storePrefix: p, promptLength: 512, responseLength: 64, maxModelLen: 4096, concurrency: 64 };
    api = await buildRuntime(flags, { jobs: "queue" });
    const app = createRolloutsApp({ service: api.service });
    const body = JSON.stringify({ rows });
    expect(body.length).toBeGreaterThan(2_800_000);
    const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body });
    expect(res.status).toBe(202);
    const { batch_id, keys } = (await res.json()) as { batch_id: string; keys: string[] };
    expect(keys.length).toBe(560);
    // Rows once per batch: 70 fields of ~40 kB; each of the 560 job entries a few hundred bytes.
    const rowsKey = `${p}jobs:batch:${batch_id}:rows`;
    expect(await raw.hlen(rowsKey)).toBe(70);
    expect(await raw.hstrlen(rowsKey, "0")).toBe(JSON.stringify(rows[0]).length);
    const entries = (await raw.xrange(`${p}jobs`, "-", "+")) as [string, string[]][];
    expect(entries.length).toBe(560);
    expect(Math.max(...entries.map(([, f]) => f.join("").length))).toBeLessThan(1_000);

    worker = await buildRuntime(flags, { jobs: "queue" });
    const w = new JobWorker({ model: null, jobs: worker.jobs!, store: worker.batchStore, executorFor: worker.executorFor, consumer: "e6", concurrency: 64, idleExitMs: 1_500, blockMs: 100 });
    const run = await api.service.lookup(batch_id);
    await Promise.all([w.run(), Promise.race([run.run(), Bun.sleep(120_000)])]);
    const stats = (await (await app.request(`/v1/rollouts/${batch_id}`)).json()) as { done: boolean; counts: Record<string, number> };
    expect(stats.done).toBe(true);
    expect(stats.counts.total).toBe(560);
    expect(stats.counts.ok + stats.counts.failed).toBe(560);
    expect(stats.counts.failed).toBe(0);
    const rec = await api.store.get("e6q69_7_0");
    expect(rec?.prompt_ids.length).toBe(512);
    expect(rec?.extra_fields.prompt_truncated).toBe(true);
    expect(await api.store.groupStatus("e6q0")).toMatchObject({ expected: 8, complete: true });
  }, HANG_MS);

  test("a row larger than one store request (store.max_request_bytes 200 kB) → 413 naming the row; nothing written: no group, no batch hash, no jobs", async () => {
    const p = fresh("limits-e6big");
    const cfg = join(dir, "small.json");
    writeFileSync(cfg, JSON.stringify({ store: { max_request_bytes: 200_000 } }));
    const rt = await buildRuntime({ config: cfg, engine: "sim", n: 8, store: "upstash", storePrefix: p }, { jobs: "queue" });
    try {
      const app = createRolloutsApp({ service: rt.service });
      const big = [rows[0], { ...rows[1], prompt: [{ role: "user", content: "filler ".repeat(40_000) }] }];
      const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: big }) });
      expect(res.status).toBe(413);
      const err = ((await res.json()) as { error: { code: string; field: string } }).error;
      expect([err.code, err.field]).toEqual(["request_too_large", "rows[1]"]);
      const left = (await keysUnder(p)).filter((k) => k.startsWith("group") || k.startsWith("jobs"));
      expect(left).toEqual([]);
      // The same uids post fine once the row fits: nothing of the refused batch is in the way.
      const ok = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [rows[0]] }) });
      expect(ok.status).toBe(202);
    } finally {
      await rt.close();
    }
  }, HANG_MS);
});

describe.skipIf(!redis)("a batch's rows are stored once", () => {
  test("a 1 MB prompt with n = 64 stores ~1 MB of rows (one value), 64 small jobs; claimed jobs carry the row", async () => {
    const { JobQueue } = await import("../../shared/jobs/job-queue.ts");
    const { planBatch, RolloutRequest } = await import("../../shared/rollout/batch.ts");
    const { RolloutConfig } = await import("../../shared/schema/index.ts");
    const p = fresh("limits-rows");
    const c = new IoRedisCommander(REDIS_URL);
    try {
      const jobs = new JobQueue(c, { prefix: p });
      const row = { uid: "big1", prompt: [{ role: "user", content: "z".repeat(1_000_000) }] };
      const rollout = RolloutConfig.parse({ n: 64 });
      const plan = planBatch(RolloutRequest.parse({ rows: [row] }), rollout);
      const spec = { batch_id: plan.batch_id, validate: false, global_steps: -1, model_version: null, rollout, total: 64, started_at: Date.now() };
      await jobs.submit(spec, plan.trajectories.map((t) => t.key), plan.trajectories);
      const rowsBytes = await raw.hstrlen(jobs.rowsKey(plan.batch_id), "0");
      const entries = (await raw.xrange(`${p}jobs`, "-", "+")) as [string, string[]][];
      const jobBytes = entries.reduce((n, [, f]) => n + f.join("").length, 0);
      expect(rowsBytes).toBe(JSON.stringify(plan.trajectories[0]!.row).length);
      expect(rowsBytes).toBeGreaterThan(1_000_000);
      expect(entries.length).toBe(64);
      expect(jobBytes).toBeLessThan(64 * 600);
      const claimed = await jobs.claim("c1", 64);
      expect(claimed.length).toBe(64);
      for (const j of claimed) expect(j.trajectory.row).toEqual(plan.trajectories[0]!.row);
      expect(claimed.map((j) => j.trajectory.key)).toEqual(plan.trajectories.map((t) => t.key));
      // Rows gone (the batch expired): the job fails on its own, naming the key.
      await raw.del(jobs.rowsKey(plan.batch_id));
      await raw.xadd(`${p}jobs`, "*", "batch", plan.batch_id, "key", "big1_64_0", "r", "1", "t", JSON.stringify({ ...plan.trajectories[0]!, key: "big1_64_0", row: null }));
      const [orphan] = await jobs.claim("c1", 1);
      expect(orphan!.trajectory.row).toBeNull();
      expect(orphan!.trajectory.row_error).toBe(`row 0 of batch ${plan.batch_id} is gone from ${jobs.rowsKey(plan.batch_id)} (expired?)`);
      expect((await jobs.batch(plan.batch_id))!.keys.length).toBe(64);
    } finally {
      await c.close();
    }
  });
});

describe.skipIf(!redis)("rows are read back in requests of bounded size", () => {
  test("3 distinct 1 MB rows, n = 2, a 2.5 MB request limit: claim reads them in 3 pipelines (never 3 MB in one reply) and every job gets its own row", async () => {
    const { JobQueue } = await import("../../shared/jobs/job-queue.ts");
    const { planBatch, RolloutRequest } = await import("../../shared/rollout/batch.ts");
    const { RolloutConfig } = await import("../../shared/schema/index.ts");
    const p = fresh("limits-rowread");
    const c = new IoRedisCommander(REDIS_URL, { maxRequestBytes: 2_500_000 });
    const rowReads: number[] = [];
    const counting = {
      exec: (cmd: Parameters<typeof c.exec>[0]) => c.exec(cmd),
      pipeline: (cmds: Parameters<typeof c.pipeline>[0]) => {
        if (cmds[0]?.[0] === "HGET") rowReads.push(cmds.length);
        return c.pipeline(cmds);
      },
      close: () => c.close(),
      maxRequestBytes: c.maxRequestBytes,
    };
    try {
      const jobs = new JobQueue(counting, { prefix: p });
      const rows = ["a", "b", "c"].map((ch) => ({ uid: `rr${ch}`, prompt: [{ role: "user", content: ch.repeat(1_000_000) }] }));
      const rollout = RolloutConfig.parse({ n: 2 });
      const plan = planBatch(RolloutRequest.parse({ rows }), rollout);
      const spec = { batch_id: plan.batch_id, validate: false, global_steps: -1, model_version: null, rollout, total: 6, started_at: Date.now() };
      await jobs.submit(spec, plan.trajectories.map((t) => t.key), plan.trajectories);
      const claimed = await jobs.claim("c1", 6);
      expect(rowReads).toEqual([1, 1, 1]);
      expect(claimed.map((j) => [j.trajectory.key, (j.trajectory.row!.prompt[0] as { content: string }).content[0]])).toEqual([
        ["rra_0_0", "a"], ["rra_1_0", "a"], ["rrb_0_0", "b"], ["rrb_1_0", "b"], ["rrc_0_0", "c"], ["rrc_1_0", "c"],
      ]);
    } finally {
      await c.close();
    }
  });
});
