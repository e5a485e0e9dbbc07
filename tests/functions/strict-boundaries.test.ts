import { beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { createSimEngineApp } from "../../infra/sim-engine/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { EngineControl, MemoryEngineGate } from "../../shared/inference/engine-control.ts";
import type { TrajectoryExecutor } from "../../shared/rollout/batch-run.ts";
import type { BatchStats } from "../../shared/rollout/batch-run.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import type { ToolResultDelivery } from "../../shared/session/trajectory-session.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { signatureHeader } from "../../shared/tools/signature.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";

// The API's boundaries are strict: an unknown query parameter, an unknown body key or a body that is
// not application/json is refused with the error naming it, never silently ignored.

/** An executor whose trajectories run until the batch is cancelled (so a cancel never races the batch's end). */
const hanging: TrajectoryExecutor = {
  run: (_t, _p, signal) => new Promise((_, reject) => signal?.addEventListener("abort", () => reject(signal.reason))),
  agentNameFor: () => "tool_agent",
};

const TOKEN = "strict-token";
const auth = { authorization: `Bearer ${TOKEN}` };
const jsonAuth = { ...auth, "content-type": "application/json" };
let app: ReturnType<typeof createRolloutsApp>;
let sim: SimEngine;

beforeAll(async () => {
  sim = new SimEngine({ tokenizer: await defaultTokenizer() });
  const simApp = createSimEngineApp(sim);
  const engine = new EngineControl({ gate: new MemoryEngineGate(), format: "vllm", replicas: () => [{ url: "http://sim.local", fetch: async (i, init) => simApp.fetch(new Request(i, init)) }] });
  const service = new RolloutService({ config: parseAppConfig({}, "test"), store: new MemoryTransferQueue(), executorFor: () => hanging });
  app = createRolloutsApp({ service, engine, apiToken: TOKEN });
});

const get = async (path: string) => {
  const res = await app.request(path, { headers: auth });
  return [res.status, await res.json()];
};
const invalid = (field: string, message: string) => ({ error: { code: "invalid_input", message: `${field}: ${message}`, field } });

/** Posts a two-row batch (n = 2) whose trajectories hang until cancelled. */
async function postBatch(uidPrefix: string): Promise<string> {
  const rows = [0, 1].map((i) => ({ uid: `${uidPrefix}${i}`, prompt: [{ role: "user", content: `question ${i}` }] }));
  const res = await app.request("/v1/rollouts", { method: "POST", headers: jsonAuth, body: JSON.stringify({ rows, config: { rollout: { n: 2 } } }) });
  expect(res.status).toBe(202);
  return ((await res.json()) as { batch_id: string }).batch_id;
}

describe("query parameters are strict on every route with a query schema", () => {
  test("an unknown parameter (a typo such as stauts) is a 400 naming it, listing the known ones", async () => {
    const batch = await postBatch(`q-${crypto.randomUUID().slice(0, 8)}-`);
    expect(await get("/v1/rollouts?foo=bar")).toEqual([400, invalid("foo", "unknown query parameter; expected one of limit, cursor")]);
    const summaryParams = "limit, cursor, status, truncated, reward_min, reward_max, uid";
    expect(await get(`/v1/rollouts/${batch}/summaries?bogus=1`)).toEqual([400, invalid("bogus", `unknown query parameter; expected one of ${summaryParams}`)]);
    // The typo is named even beside a valid filter, instead of answering every record unfiltered.
    expect(await get(`/v1/rollouts/${batch}/summaries?stauts=ok&limit=5`)).toEqual([400, invalid("stauts", `unknown query parameter; expected one of ${summaryParams}`)]);
    expect(await get(`/v1/rollouts/${batch}/groups/q0?decod=1`)).toEqual([400, invalid("decod", "unknown query parameter; expected one of decode")]);
    expect(await get("/v1/trajectories/u_0_0?decode=1&x=2")).toEqual([400, invalid("x", "unknown query parameter; expected one of decode")]);
    expect(await get("/v1/groups?consumr=t")).toEqual([400, invalid("consumr", "unknown query parameter; expected one of max, block_ms, consumer, partition, agent_role, deliver, include_filtered")]);
    // The known parameters still work.
    expect(await get("/v1/rollouts?limit=1")).toEqual([200, { batches: [expect.objectContaining({ batch_id: batch, cancelled: null })], next_cursor: null }]);
    expect(await get(`/v1/rollouts/${batch}/summaries?status=ok&limit=5`)).toEqual([200, { summaries: [], next_cursor: null, total: 0, matched: 0, done: false }]);
    expect(await get("/v1/groups?consumer=t&max=1")).toEqual([200, { groups: [] }]);
    await app.request(`/v1/rollouts/${batch}`, { method: "DELETE", headers: auth });
  });

  test("a parameter given twice is a 400 naming it, not read as its first value (fresh-user trial: deliver=tree&deliver=leaves)", async () => {
    const twice = "given more than once; give each query parameter once";
    expect(await get("/v1/groups?deliver=tree&deliver=leaves")).toEqual([400, invalid("deliver", twice)]);
    expect(await get("/v1/groups?partition=train&max=1&partition=val")).toEqual([400, invalid("partition", twice)]);
    expect(await get("/v1/rollouts?limit=1&limit=2")).toEqual([400, invalid("limit", twice)]);
  });

  test("a route that takes no query refuses any parameter, naming it (never ignored: pause?x=1 does not pause)", async () => {
    const batch = await postBatch(`nq-${crypto.randomUUID().slice(0, 8)}-`);
    const none = (name: string) => invalid(name, "unknown query parameter; this route takes none");
    for (const path of [`/v1/rollouts/${batch}`, `/v1/rollouts/${batch}/trajectories`, "/v1/groups/nq0", "/v1/model-version", "/v1/consumed-version", "/v1/queue", "/v1/engine/status"]) {
      expect([path, ...(await get(`${path}?x=1`))]).toEqual([path, 400, none("x")]);
    }
    const pause = await app.request("/v1/engine/pause?mode=abort", { method: "POST", headers: jsonAuth, body: JSON.stringify({ mode: "keep" }) });
    expect([pause.status, await pause.json()]).toEqual([400, none("mode")]);
    expect(sim.paused).toBe(false);
    const del = await app.request(`/v1/rollouts/${batch}?force=1`, { method: "DELETE", headers: auth });
    expect([del.status, await del.json()]).toEqual([400, none("force")]);
    // Without the parameter each answers as before.
    expect((await get(`/v1/rollouts/${batch}`))[0]).toBe(200);
    expect((await app.request(`/v1/rollouts/${batch}`, { method: "DELETE", headers: auth })).status).toBe(200);
  });

  test("decode other than 0/1/true/false is a 400 naming decode on both the trajectory and the group route", async () => {
    const batch = await postBatch(`d-${crypto.randomUUID().slice(0, 8)}-`);
    const decodeErr = invalid("decode", 'Invalid option: expected one of "0"|"1"|"true"|"false"');
    expect(await get("/v1/trajectories/u_0_0?decode=maybe")).toEqual([400, decodeErr]);
    expect(await get(`/v1/rollouts/${batch}/groups/x?decode=maybe`)).toEqual([400, decodeErr]);
    // A valid decode goes on to the lookup: no such trajectory.
    expect(await get("/v1/trajectories/u_0_0?decode=0")).toEqual([404, { error: { code: "not_found", message: "no trajectory 'u_0_0'", field: "key" } }]);
    await app.request(`/v1/rollouts/${batch}`, { method: "DELETE", headers: auth });
  });

  test("reward_min above reward_max is a 400 naming reward_min; equal bounds are fine", async () => {
    const batch = await postBatch(`r-${crypto.randomUUID().slice(0, 8)}-`);
    expect(await get(`/v1/rollouts/${batch}/summaries?reward_min=2&reward_max=1`)).toEqual([400, invalid("reward_min", "must be <= reward_max")]);
    expect(await get(`/v1/rollouts/${batch}/summaries?reward_min=1&reward_max=1`)).toEqual([200, { summaries: [], next_cursor: null, total: 0, matched: 0, done: false }]);
    await app.request(`/v1/rollouts/${batch}`, { method: "DELETE", headers: auth });
  });
});

describe("POST /v1/groups/ack is strict", () => {
  test("a misspelt partition is a 400 naming it, not an ack of the train partition", async () => {
    const res = await app.request("/v1/groups/ack", { method: "POST", headers: jsonAuth, body: JSON.stringify({ delivery_ids: ["1796002889517-0"], partiton: "val" }) });
    expect([res.status, await res.json()]).toEqual([400, invalid("partiton", 'Unrecognized key: "partiton"')]);
    const ok = await app.request("/v1/groups/ack", { method: "POST", headers: jsonAuth, body: JSON.stringify({ delivery_ids: ["1796002889517-0"], partition: "val" }) });
    expect([ok.status, await ok.json()]).toEqual([200, { acked: 0 }]);
  });
});

describe("GET /v1/rollouts shows a cancelled batch as cancelled", () => {
  test("each BatchSummary carries the detail's cancelled (null when never cancelled)", async () => {
    const prefix = `c-${crypto.randomUUID().slice(0, 8)}-`;
    const running = await postBatch(`${prefix}run-`);
    const cancelled = await postBatch(`${prefix}stop-`);
    const del = await app.request(`/v1/rollouts/${cancelled}`, { method: "DELETE", headers: auth });
    expect(del.status).toBe(200);
    const stats = (await del.json()) as BatchStats;
    // Four sessions, none started a record; both groups incomplete, so withdrawn.
    expect(stats.cancelled).toEqual({ at: expect.any(Number), sessions: 4, groups_withdrawn: 2, groups_complete: 0 });
    const { batches } = (await (await app.request("/v1/rollouts?limit=2", { headers: auth })).json()) as { batches: { batch_id: string; done: boolean; cancelled: unknown }[] };
    // Both batches may start in the same millisecond (their order is then by id): compare by batch id.
    const byId = Object.fromEntries(batches.map((b) => [b.batch_id, [b.done, b.cancelled]]));
    expect(byId).toEqual({ [cancelled]: [true, stats.cancelled], [running]: [false, null] });
    const detail = await (await app.request(`/v1/rollouts/${cancelled}`, { headers: auth })).json();
    expect(detail.cancelled).toEqual(stats.cancelled);
    await app.request(`/v1/rollouts/${running}`, { method: "DELETE", headers: auth });
  });
});

describe("POST /v1/engine/resume takes no body or {}", () => {
  test("an unknown key is a 400 (as pause's), a non-JSON body a 415; no body and {} resume", async () => {
    const x = await app.request("/v1/engine/resume", { method: "POST", headers: jsonAuth, body: JSON.stringify({ x: 1 }) });
    expect([x.status, await x.json()]).toEqual([400, invalid("x", 'Unrecognized key: "x"')]);
    const text = await app.request("/v1/engine/resume", { method: "POST", headers: { ...auth, "content-type": "text/plain" }, body: "{}" });
    expect([text.status, await text.json()]).toEqual([415, invalid("content-type", "expected application/json, got 'text/plain'")]);
    const broken = await app.request("/v1/engine/resume", { method: "POST", headers: jsonAuth, body: "{" });
    expect([broken.status, await broken.json()]).toEqual([400, invalid("body", "malformed JSON")]);
    expect(sim.paused).toBe(false);
    const pause = await app.request("/v1/engine/pause", { method: "POST", headers: jsonAuth, body: "{}" });
    expect(pause.status).toBe(200);
    // The refused resumes above changed nothing; a refused one now leaves the engines paused.
    expect((await app.request("/v1/engine/resume", { method: "POST", headers: jsonAuth, body: '{"x":1}' })).status).toBe(400);
    expect(sim.paused).toBe(true);
    const bare = await app.request("/v1/engine/resume", { method: "POST", headers: auth });
    expect([bare.status, ((await bare.json()) as { paused: boolean }).paused]).toEqual([200, false]);
    expect(sim.paused).toBe(false);
    const empty = await app.request("/v1/engine/resume", { method: "POST", headers: jsonAuth, body: "{}" });
    expect([empty.status, ((await empty.json()) as { paused: boolean }).paused]).toEqual([200, false]);
  });
});

describe("POST /v1/sessions/{key}/tool-results is as strict as the README says", () => {
  const SECRET = "cb-secret";
  const delivered: ToolResultDelivery[] = [];
  const sessions = createSessionsApp({ secret: SECRET, backend: { deliver: async (_k, r) => void delivered.push(r) } });
  const send = async (body: string, headers: Record<string, string>, secret = SECRET) => {
    const res = await sessions.request("/v1/sessions/k_0_0/tool-results", {
      method: "POST",
      headers: { ...headers, "x-edgeloop-signature": await signatureHeader(secret, body, Date.now() / 1000) },
      body,
    });
    return [res.status, await res.json()];
  };

  test("an unknown key is a 400; text/plain or no content type a 415; nothing is delivered", async () => {
    const json = { "content-type": "application/json" };
    expect(await send(JSON.stringify({ call_id: "k_0_0:1:0", content: "4", bogus: 1 }), json)).toEqual([400, invalid("bogus", 'Unrecognized key: "bogus"')]);
    const body = JSON.stringify({ call_id: "k_0_0:1:0", content: "4" });
    expect(await send(body, { "content-type": "text/plain" })).toEqual([415, invalid("content-type", "expected application/json, got 'text/plain'")]);
    expect(await send(body, {})).toEqual([415, invalid("content-type", "expected application/json, got none")]);
    // The signature is judged first: a bad one is a 401 whatever the content type.
    expect(await send(body, { "content-type": "text/plain" }, "wrong")).toEqual([401, { error: { code: "unauthorized", message: "missing, bad or stale x-edgeloop-signature" } }]);
    expect(delivered).toEqual([]);
    // The README's fields, ok and metrics included, are accepted (charset parameter too).
    const full = JSON.stringify({ call_id: "k_0_0:1:0", content: "boom", reward: 0.5, ok: false, metrics: { ms: 3 } });
    expect(await send(full, { "content-type": "application/json; charset=utf-8" })).toEqual([200, { ok: true, key: "k_0_0", call_id: "k_0_0:1:0" }]);
    expect(delivered).toEqual([{ call_id: "k_0_0:1:0", content: "boom", reward: 0.5, ok: false, metrics: { ms: 3 } }]);
  });
});
