import { afterAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Edge case E9 (../shared/fixtures/edge-cases.md): POST uid `reuse1`, let it complete, POST
// uid `reuse1` with another prompt → 409 naming the uid, nothing written, metrics unchanged.
// The same prompt posted again hands the stored records back without counting them again.
const redis = await requireRedis();
const ROW = { uid: "reuse1", data_source: "edge", prompt: [{ role: "user", content: "What is 2+2?" }], reward_model: { style: "rule", ground_truth: "4" } };
const OTHER = { ...ROW, prompt: [{ role: "user", content: "What is 3+3?" }] };
const CONFLICT = {
  error: { code: "conflict", message: "rows[0].uid: group reuse1 was registered with another prompt: a uid names one prompt group; use a new uid for new samples", field: "rows[0].uid" },
};
const runtimes: Runtime[] = [];
const prefixes: string[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close();
  for (const p of prefixes) await deleteByPrefix(p);
});

type App = ReturnType<typeof createRolloutsApp>;
const post = (app: App, rows: unknown[]) => app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });

/** The counters a handed-back record must not move. */
async function counters(app: App): Promise<string[]> {
  const text = await (await app.request("/metrics")).text();
  return text.split("\n").filter((l) => /^edgeloop_(sessions_total|trajectories_total|tokens_total|turns_total|trajectory_finish_reasons_total)/.test(l));
}

async function waitDone(app: App, batchId: string): Promise<Record<string, any>> {
  for (let i = 0; i < 400; i++) {
    const s = await (await app.request(`/v1/rollouts/${batchId}`)).json();
    if (s.done) return s;
    await Bun.sleep(25);
  }
  throw new Error("batch did not finish");
}

async function scenario(app: App, rt: Runtime, drain: () => Promise<void>): Promise<void> {
  const first = await post(app, [ROW]);
  expect(first.status).toBe(202);
  const { batch_id } = (await first.json()) as { batch_id: string };
  await drain();
  await waitDone(app, batch_id);
  const stored = await rt.store.get("reuse1_0_0");
  expect(stored!.error).toBeNull();
  const status = await rt.store.groupStatus("reuse1");
  const before = await counters(app);
  expect(before).toContain("edgeloop_sessions_total 1");
  expect(before).toContain('edgeloop_trajectories_total{outcome="ok"} 1');
  const batches = (await (await app.request("/v1/rollouts")).json()).batches.length;

  // Another prompt under the same uid: 409 naming it; nothing written, no batch, metrics unchanged.
  const refused = await post(app, [OTHER]);
  expect(refused.status).toBe(409);
  expect(await refused.json()).toEqual(CONFLICT);
  expect(await rt.store.groupStatus("reuse1")).toEqual(status);
  expect((await (await app.request("/v1/rollouts")).json()).batches.length).toBe(batches);
  if (rt.jobs) expect(await rt.jobs.stats()).toMatchObject({ depth: 0, in_flight: 0 });
  expect(await counters(app)).toEqual(before);

  // The same prompt (keys in another order): its stored record is handed back, not run or counted again.
  const again = await post(app, [{ reward_model: ROW.reward_model, prompt: ROW.prompt, data_source: "edge", uid: "reuse1" }]);
  expect(again.status).toBe(202);
  const body = (await again.json()) as { batch_id: string; keys: string[]; reused_uids: string[]; complete_uids: string[] };
  expect([body.keys, body.reused_uids, body.complete_uids]).toEqual([["reuse1_0_0"], ["reuse1"], ["reuse1"]]);
  if (rt.jobs) expect(await rt.jobs.stats()).toMatchObject({ depth: 0, in_flight: 0 });
  const s = await waitDone(app, body.batch_id);
  expect(s.counts).toEqual({ total: 1, pending: 0, running: 0, finished: 1, reused: 1, records: 0, ok: 0, failed: 0, truncated: 0 });
  const ndjson = await (await app.request(`/v1/rollouts/${body.batch_id}/trajectories`)).text();
  expect(ndjson.trim()).toBe(JSON.stringify(stored));
  expect(await counters(app)).toEqual(before);
  expect(await rt.store.groupStatus("reuse1")).toEqual(status);
}

/** Two POSTs of one new uid at once (a client retrying a POST it thinks was lost): each session counted once. */
async function twice(app: App, drain: () => Promise<void>): Promise<void> {
  const row = { ...ROW, uid: "dup2", prompt: [{ role: "user", content: "What is 5+5?" }], reward_model: { style: "rule", ground_truth: "10" } };
  const before = await counters(app);
  const [a, b] = await Promise.all([post(app, [row]), post(app, [row])]);
  expect([a.status, b.status]).toEqual([202, 202]);
  const ids = [((await a.json()) as { batch_id: string }).batch_id, ((await b.json()) as { batch_id: string }).batch_id];
  await drain();
  const [sa, sb] = [await waitDone(app, ids[0]!), await waitDone(app, ids[1]!)];
  // One batch stored the session; the other found it stored and counts it as handed back.
  expect([sa.counts.ok + sb.counts.ok, sa.counts.reused + sb.counts.reused, sa.counts.finished, sb.counts.finished]).toEqual([1, 1, 1, 1]);
  const after = await counters(app);
  const sessions = (l: string[]) => Number(l.find((x) => x.startsWith("edgeloop_sessions_total"))!.split(" ")[1]);
  expect(sessions(after) - sessions(before)).toBe(1);
}

describe("E9: one uid, one prompt", () => {
  test("inline mode (memory store)", async () => {
    const rt = await buildRuntime({ n: 1, seed: 7 });
    runtimes.push(rt);
    const app = createRolloutsApp({ service: rt.service });
    await scenario(app, rt, async () => {});
    await twice(app, async () => {});
  }, HANG_MS);

  test.skipIf(!redis)("queue mode (Redis): the 409 enqueues nothing; handed-back sessions get no job", async () => {
    const prefix = randomPrefix("e9-queue");
    prefixes.push(prefix);
    const rt = await buildRuntime({ n: 1, seed: 7, store: REDIS_URL, storePrefix: prefix }, { jobs: "queue" });
    const w = await buildRuntime({ n: 1, seed: 7, store: REDIS_URL, storePrefix: prefix });
    runtimes.push(rt, w);
    const drain = async () => {
      const worker = new JobWorker({ model: null, jobs: w.jobs!, store: w.batchStore, executorFor: w.executorFor, consumer: "e9", concurrency: 1, idleExitMs: 800 });
      expect(await worker.run()).toMatchObject({ completed: 1, failed: 0 });
    };
    const app = createRolloutsApp({ service: rt.service });
    await scenario(app, rt, drain);
    await twice(app, async () => {
      const worker = new JobWorker({ model: null, jobs: w.jobs!, store: w.batchStore, executorFor: w.executorFor, consumer: "e9b", concurrency: 1, idleExitMs: 800 });
      expect(await worker.run()).toMatchObject({ completed: 2, failed: 0 });
    });
  }, HANG_MS);
});
