import { afterAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// `serve` answers GET /v1/groups/{uid} (as the Workers entry does): the store's group status;
// a uid never registered is 200 with expected null, never a 404.
const redis = await requireRedis();
const runtimes: Runtime[] = [];
const prefixes: string[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close();
  for (const p of prefixes) await deleteByPrefix(p);
});
type App = ReturnType<typeof createRolloutsApp>;
const ROW = { uid: "gs1", data_source: "edge", prompt: [{ role: "user", content: "What is 2+2?" }], reward_model: { style: "rule", ground_truth: "4" } };

async function waitDone(app: App, batchId: string): Promise<void> {
  for (let i = 0; i < 400; i++) {
    if ((await (await app.request(`/v1/rollouts/${batchId}`)).json()).done) return;
    await Bun.sleep(25);
  }
  throw new Error("batch did not finish");
}

async function scenario(app: App): Promise<void> {
  const unknown = await app.request("/v1/groups/never-posted");
  expect(unknown.status).toBe(200);
  expect(await unknown.json()).toEqual({ uid: "never-posted", partition: "train", expected: null, finished: 0, records: 0, failed: 0, complete: false, fingerprint: null });
  const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [ROW], config: { rollout: { n: 2 } } }) });
  expect(res.status).toBe(202);
  await waitDone(app, (await res.json()).batch_id);
  const s = await (await app.request("/v1/groups/gs1")).json();
  expect({ ...s, fingerprint: typeof s.fingerprint }).toEqual({ uid: "gs1", partition: "train", expected: 2, finished: 2, records: 2, failed: 0, complete: true, fingerprint: "string" });
  expect(s.fingerprint).toMatch(/^[0-9a-f]{64}$/);
  const bad = await app.request("/v1/groups/a_b");
  expect(bad.status).toBe(400);
  expect(await bad.json()).toEqual({ error: { code: "invalid_input", message: "uid: uid may only hold letters, digits, '.' and '-' ('_' separates key parts, ':' Redis key words)", field: "uid" } });
  const doc = await (await app.request("/openapi.json")).json();
  expect(Object.keys(doc.paths)).toContain("/v1/groups/{uid}");
}

describe("GET /v1/groups/{uid}", () => {
  test("memory store", async () => {
    const rt = await buildRuntime({ n: 1, seed: 7 });
    runtimes.push(rt);
    await scenario(createRolloutsApp({ service: rt.service }));
  }, HANG_MS);
  test.skipIf(!redis)("Redis store", async () => {
    const prefix = randomPrefix("group-status");
    prefixes.push(prefix);
    const rt = await buildRuntime({ n: 1, seed: 7, store: REDIS_URL, storePrefix: prefix });
    runtimes.push(rt);
    await scenario(createRolloutsApp({ service: rt.service }));
  }, HANG_MS);
});
