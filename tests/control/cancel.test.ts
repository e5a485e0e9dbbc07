import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { cancelCommand } from "../../infra/cli/cancel-command.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import type { BatchStats } from "../../shared/rollout/batch-run.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// DELETE /v1/rollouts/{id} with trajectories in flight (sim engine with decode latency):
// nothing runs afterwards, nothing half-written, the batch reported cancelled with exact counts.

const ROW_COUNT = 8;
const N = 2;
const LATENCY = { prefill_ms_per_token: 0, decode_ms_per_token: 3 };
const json = { "content-type": "application/json" };
let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

type App = ReturnType<typeof createRolloutsApp>;

async function waitUntil(cond: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > ms) throw new Error("timed out");
    await Bun.sleep(5);
  }
}

/** Submits the batch over HTTP; cancels once some records are stored and engine requests are in flight; checks the engine side. */
async function cancelInFlight(app: App, sim: RunningSimEngine, uidPrefix: string, stored: () => Promise<number>, graceMs: number) {
  const engine = sim.replicas[0]!.engine;
  const rows = ROWS.slice(0, ROW_COUNT).map((r, i) => ({ ...r, uid: `${uidPrefix}${i}` }));
  const res = await app.request("/v1/rollouts", { method: "POST", headers: json, body: JSON.stringify({ rows, global_steps: 3 }) });
  expect(res.status).toBe(202);
  const { batch_id, keys } = (await res.json()) as { batch_id: string; keys: string[] };
  expect(keys.length).toBe(ROW_COUNT * N);
  await waitUntil(async () => (await stored()) >= 2 && engine.stats.inflight >= 2);
  const del = await app.request(`/v1/rollouts/${batch_id}`, { method: "DELETE" });
  const cancelReturned = Date.now();
  expect(del.status).toBe(200);
  const stats = (await del.json()) as BatchStats;
  // Then: no engine request arrived after the cancel (plus `graceMs`: how long workers take to learn of it), none is still generating.
  await Bun.sleep(1000);
  expect(engine.requests.filter((l) => l.received_ms! > cancelReturned + graceMs).map((l) => [l.routing_key, l.received_ms! - cancelReturned])).toEqual([]);
  await waitUntil(() => engine.stats.inflight === 0, 5_000);
  return { batch_id, keys, stats, cancelReturned };
}

/** The batch's counts after a cancel: sessions finished before it plus stopped ones make the total; nothing pending or running. */
function expectCancelledCounts(stats: BatchStats, total: number) {
  expect(stats.done).toBe(true);
  expect(stats.cancelled).not.toBeNull();
  expect(stats.counts.total).toBe(total);
  expect(stats.counts.pending).toBe(0);
  expect(stats.counts.running).toBe(0);
  expect(stats.counts.finished + stats.cancelled!.sessions).toBe(total);
  expect(stats.counts.finished).toBeGreaterThanOrEqual(2);
  expect(stats.cancelled!.sessions).toBeGreaterThan(0);
  expect(stats.counts.records).toBe(stats.counts.finished); // one record per session (tool_agent)
  expect(stats.cancelled!.groups_withdrawn + stats.cancelled!.groups_complete).toBe(ROW_COUNT);
}

describe("cancel inline (memory store)", () => {
  let sim: RunningSimEngine;
  let rt: Runtime;
  afterAll(async () => {
    await rt?.close();
    await sim?.stop();
  });

  test("DELETE aborts the running trajectories, starts no more, withdraws incomplete groups; GET reports cancelled; edgeloop cancel answers 409 after", async () => {
    sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
    rt = await buildRuntime({ engine: sim.urls[0]!, engineFormat: "vllm", n: N, seed: 7, maxModelLen: 4096, concurrency: 4 });
    const app = createRolloutsApp({ service: rt.service, apiToken: null });
    const store = rt.store;
    const counted = async () => rt.service.batchIds().reduce((n, id) => n + rt.service.batch(id).stats().counts.records, 0);
    const { batch_id, keys, stats } = await cancelInFlight(app, sim, "cin", counted, 100); // a request sent before the cancel may be logged by the replica a moment later
    expectCancelledCounts(stats, ROW_COUNT * N);

    // Exactly the counted records are stored; every other key has nothing.
    const run = rt.service.batch(batch_id);
    const recorded = new Set(run.records().map((r) => r.key));
    expect(recorded.size).toBe(stats.counts.records);
    for (const k of keys) expect((await store.get(k)) !== null).toBe(recorded.has(k));
    // Groups: complete ones delivered as they were; the rest withdrawn with exactly the records they had.
    const uids = [...new Set(keys.map((k) => k.slice(0, k.indexOf("_"))))];
    const statuses = await Promise.all(uids.map((u) => store.groupStatus(u)));
    const complete = statuses.filter((s) => s.complete).map((s) => s.uid);
    expect(complete.length).toBe(stats.cancelled!.groups_complete);
    expect(statuses.filter((s) => s.cancelled).length).toBe(stats.cancelled!.groups_withdrawn);
    for (const s of statuses) {
      expect(s.records).toBe([...recorded].filter((k) => k.startsWith(`${s.uid}_`)).length);
      expect(s.complete ? s.cancelled : s.cancelled).toBe(s.complete ? undefined : true);
    }
    const delivered = await store.readCompleteGroups({ consumer: "t", max: 100, block_ms: 0, partition: "train" });
    expect(delivered.map((g) => g.uid).sort()).toEqual(complete.sort());
    // A write to a withdrawn group is refused.
    const withdrawn = statuses.find((s) => s.cancelled)!;
    await expect(store.markFailed(`${withdrawn.uid}_1_0`, "late")).rejects.toMatchObject({ code: "group_cancelled" });

    // GET reports the same; DELETE again answers the same stats.
    const got = (await (await app.request(`/v1/rollouts/${batch_id}`)).json()) as BatchStats;
    expect(got.cancelled).toEqual(stats.cancelled);
    expect(got.counts).toEqual(stats.counts);
    expect(((await (await app.request(`/v1/rollouts/${batch_id}`, { method: "DELETE" })).json()) as BatchStats).cancelled).toEqual(stats.cancelled);
    expect((await app.request(`/v1/rollouts/00000000-0000-0000-0000-000000000000`, { method: "DELETE" })).status).toBe(404);
    const doc = (await (await app.request("/openapi.json")).json()) as { paths: Record<string, Record<string, unknown>> };
    expect(doc.paths["/v1/rollouts/{batch_id}"]!.delete).toBeDefined();
  }, HANG_MS);

  test("edgeloop cancel BATCH --url U: DELETE with the API token, prints the stats; a done batch is 409, a wrong token 401", async () => {
    const token = "secret-token";
    const app = createRolloutsApp({ service: rt.service, apiToken: token });
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
    const url = `http://127.0.0.1:${server.port}`;
    try {
      const rows = ROWS.slice(10, 14).map((r, i) => ({ ...r, uid: `ccli${i}` }));
      const res = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { ...json, authorization: `Bearer ${token}` }, body: JSON.stringify({ rows }) });
      const { batch_id } = (await res.json()) as { batch_id: string };
      const lines: string[] = [];
      const log = console.log;
      console.log = (l: string) => lines.push(l);
      try {
        await cancelCommand(batch_id, { url }, { EDGELOOP_API_TOKEN: token });
      } finally {
        console.log = log;
      }
      const printed = JSON.parse(lines[0]!) as BatchStats;
      expect(printed.batch_id).toBe(batch_id);
      expect(printed.cancelled!.sessions + printed.counts.finished).toBe(8);
      await expect(cancelCommand(batch_id, { url }, {})).rejects.toThrow(/answered 401/);
      // A batch that ran to the end cannot be cancelled.
      const done = rt.service.submit({ rows: [{ ...ROWS[20]!, uid: "cdone" }], global_steps: -1, model_version: null, validate: false });
      await done.run.run();
      await expect(cancelCommand(done.batch_id, { url }, { EDGELOOP_API_TOKEN: token })).rejects.toThrow(/answered 409: batch_done/);
      await expect(cancelCommand("no such batch", { url }, {})).rejects.toMatchObject({ field: "BATCH" });
    } finally {
      server.stop(true);
    }
  }, HANG_MS);
});

describe("cancel in queue mode (Redis, a worker)", () => {
  let ok = false;
  const prefix = randomPrefix("cancel");
  let sim: RunningSimEngine | undefined;
  let rt: Runtime | undefined;
  let workerRt: Runtime | undefined;
  beforeAll(async () => {
    ok = await requireRedis();
  });
  afterAll(async () => {
    await rt?.close();
    await workerRt?.close();
    await sim?.stop();
    if (ok) await deleteByPrefix(prefix);
  });

  test("the worker learns of the cancel from Redis and aborts; no job, session or record is left beyond the counted ones", async () => {
    if (!ok) return;
    sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, tokenizer: tok, latency: LATENCY });
    const flags = { engine: sim.urls[0]!, engineFormat: "vllm" as const, n: N, seed: 7, maxModelLen: 4096, concurrency: 4, store: REDIS_URL, storePrefix: prefix };
    rt = await buildRuntime(flags, { jobs: "queue" });
    workerRt = await buildRuntime(flags, { jobs: "queue" });
    const worker = new JobWorker({ model: null, jobs: workerRt.jobs!, store: workerRt.batchStore, executorFor: workerRt.executorFor, consumer: "w1", concurrency: 4, blockMs: 100, cancelPollMs: 100 });
    const working = worker.run();
    const app = createRolloutsApp({ service: rt.service });
    const redis = rawRedis();
    try {
      const countTraj = async () => (await redis.keys(`${prefix}traj:*`)).length;
      const { batch_id, keys, stats } = await cancelInFlight(app, sim, "cq", countTraj, 300); // a worker learns of it within its poll (100 ms)
      expectCancelledCounts(stats, ROW_COUNT * N);
      await waitUntil(() => worker.running === 0, 5_000);

      // Records: exactly the counted ones (the follower's records, read from Redis).
      const trajKeys = (await redis.keys(`${prefix}traj:*`)).map((k) => k.slice(`${prefix}traj:`.length)).sort();
      const run = await rt.service.lookup(batch_id);
      expect(trajKeys).toEqual(run.records().map((r) => r.key).sort());
      expect(trajKeys.length).toBe(stats.counts.records);
      // No job of the batch in the stream; no durable session left for the stopped keys.
      const entries = await redis.xrange(`${prefix}jobs`, "-", "+");
      expect(entries.filter(([, f]) => f[f.indexOf("batch") + 1] === batch_id)).toEqual([]);
      const stopped = keys.filter((k) => !trajKeys.includes(k));
      expect(stopped.length).toBe(stats.cancelled!.sessions);
      for (const k of stopped) expect(await redis.exists(`${prefix}session:${k}`)).toBe(0);
      // Groups: withdrawn ones flagged in their hash, never in the trainers' stream; complete ones there.
      const uids = [...new Set(keys.map((k) => k.slice(0, k.indexOf("_"))))];
      const flagged: string[] = [];
      for (const u of uids) if ((await redis.hget(`${prefix}group:${u}`, "cancelled")) === "1") flagged.push(u);
      expect(flagged.length).toBe(stats.cancelled!.groups_withdrawn);
      const streamed = (await redis.xrange(`${prefix}groups:train`, "-", "+")).map(([, f]) => f[f.indexOf("uid") + 1]);
      expect(streamed.length).toBe(stats.cancelled!.groups_complete);
      expect(streamed.some((u) => flagged.includes(u!))).toBe(false);
      expect(await redis.hexists(`${prefix}jobs:batch:${batch_id}`, "cancelled")).toBe(1);
      // Another API process (a fresh runtime) reads the batch as cancelled too.
      const other = await rt.service.lookup(batch_id);
      expect(other.stats().cancelled).toEqual(stats.cancelled);
      worker.stop();
      const summary = await working;
      // Every job the worker claimed was either completed (its record counted) or dropped as cancelled.
      expect(summary.claimed).toBe(summary.completed + summary.cancelled);
      expect(summary.completed).toBeLessThanOrEqual(stats.counts.finished);
    } finally {
      worker.stop();
      await redis.quit();
    }
  }, HANG_MS);
});
