import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { exampleRows } from "../helpers/examples.ts";

// The HTTP API over a real runtime: in-process simulated engine with the example policy,
// the example tool server on loopback, the in-memory transfer queue.
const TOKEN = "test-token-123";
const rows = exampleRows();

let runtime: Runtime;
let app: ReturnType<typeof createRolloutsApp>;
const auth = { authorization: `Bearer ${TOKEN}` };

beforeAll(async () => {
  runtime = await buildRuntime({ n: 2 });
  app = createRolloutsApp({ service: runtime.service, apiToken: TOKEN, maxBodyBytes: 64 * 1024 });
});
afterAll(() => runtime.close());

const post = (path: string, body: unknown, headers: Record<string, string> = auth) =>
  app.request(path, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: typeof body === "string" ? body : JSON.stringify(body) });

async function waitDone(batchId: string): Promise<Record<string, any>> {
  for (let i = 0; i < 200; i++) {
    const s = await (await app.request(`/v1/rollouts/${batchId}`, { headers: auth })).json();
    if (s.done) return s;
    await Bun.sleep(25);
  }
  throw new Error("batch did not finish");
}

describe("auth", () => {
  test("every /v1 route needs the bearer token; health and openapi do not", async () => {
    const none = await post("/v1/rollouts", { rows: rows.slice(0, 1) }, {});
    expect(none.status).toBe(401);
    expect(await none.json()).toEqual({ error: { code: "unauthorized", message: "missing or wrong bearer token" } });
    expect(none.headers.get("www-authenticate")).toBe('Bearer realm="edgeloop"');
    expect((await post("/v1/rollouts", { rows: rows.slice(0, 1) }, { authorization: "Bearer wrong" })).status).toBe(401);
    expect((await app.request("/v1/groups")).status).toBe(401);
    expect((await app.request("/health")).status).toBe(200);
    expect((await app.request("/openapi.json")).status).toBe(200);
  });
});

describe("POST /v1/rollouts", () => {
  test("202 with batch id and keys; progress; NDJSON stream; complete groups and ack", async () => {
    const res = await post("/v1/rollouts", { rows: rows.slice(0, 3), global_steps: 5, model_version: "v5" });
    expect(res.status).toBe(202);
    const { batch_id, keys } = await res.json();
    expect(keys.length).toBe(6);
    for (const k of keys) expect(k).toMatch(/^[0-9a-f-]{36}_[01]_0$/);

    const stats = await waitDone(batch_id);
    expect(stats.counts).toEqual({ total: 6, pending: 0, running: 0, finished: 6, reused: 0, records: 6, ok: 6, failed: 0, truncated: 0 });
    expect(stats.tokens.sampled).toBeGreaterThan(0);

    const nd = await app.request(`/v1/rollouts/${batch_id}/trajectories`, { headers: auth });
    expect(nd.headers.get("content-type")).toBe("application/x-ndjson");
    const recs: TrajectoryRecord[] = (await nd.text()).trim().split("\n").map((l) => JSON.parse(l));
    expect(recs.map((r) => r.key).sort()).toEqual([...keys].sort());
    for (const r of recs) {
      // keys come in row order, 2 sessions per row; rows 0..2 carry extra_info.index 0..2.
      const rowIndex = Math.floor(keys.indexOf(r.key) / 2);
      expect(r.extra_fields.trajectory_info).toEqual({ step: 5, sample_index: rowIndex, rollout_n: r.session_id, validate: false });
      expect(r.extra_fields.model_versions).toEqual(Array(r.extra_fields.tool_calls as number + 1).fill("v5"));
    }

    const g = await app.request("/v1/groups?max=10&consumer=t1", { headers: auth });
    const { groups } = await g.json();
    expect(groups.length).toBe(3);
    for (const grp of groups) expect(grp.records.map((r: TrajectoryRecord) => r.session_id)).toEqual([0, 1]);
    const ack = await post("/v1/groups/ack", { delivery_ids: groups.map((x: any) => x.delivery_id) });
    expect(await ack.json()).toEqual({ acked: 3 });
    const again = await (await app.request("/v1/groups?max=10&consumer=t1", { headers: auth })).json();
    expect(again.groups).toEqual([]);
  });

  test("a batch mixing good and bad rows: bad rows fail alone with a recorded reason", async () => {
    const bad = [rows[0], { prompt: "not a list" }, { ...rows[1], agent_name: "no_such_agent" }, { ...rows[2], uid: "has_underscore" }];
    const res = await post("/v1/rollouts", { rows: bad });
    expect(res.status).toBe(202);
    const { batch_id } = await res.json();
    const stats = await waitDone(batch_id);
    expect(stats.counts.ok).toBe(2);
    expect(stats.counts.failed).toBe(6);
    const errs = stats.errors.map((e: any) => e.error).sort();
    expect(errs).toEqual([
      "rows[1].prompt: Invalid input: expected array, received string",
      "rows[1].prompt: Invalid input: expected array, received string",
      "rows[2].agent_name: unknown agent loop 'no_such_agent'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent",
      "rows[2].agent_name: unknown agent loop 'no_such_agent'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent",
      `rows[3].uid: "has_underscore" refused: uid may only hold letters, digits, '.' and '-' ('_' separates key parts, ':' Redis key words); this row's record is keyed by a server-chosen uid`,
      `rows[3].uid: "has_underscore" refused: uid may only hold letters, digits, '.' and '-' ('_' separates key parts, ':' Redis key words); this row's record is keyed by a server-chosen uid`,
    ]);
  });

  test("a null uid is no uid (a Parquet column with gaps): the server picks one and the row runs", async () => {
    const res = await post("/v1/rollouts", { rows: [{ ...rows[0], uid: null }] });
    expect(res.status).toBe(202);
    const { batch_id, keys } = await res.json();
    expect(keys.length).toBe(2);
    expect(keys[0]).toMatch(/^[0-9a-f-]{36}_0_0$/);
    const stats = await waitDone(batch_id);
    expect([stats.counts.ok, stats.counts.failed]).toEqual([2, 0]);
  });

  test("validation batches use val_kwargs (n = 1) and the val partition", async () => {
    const res = await post("/v1/rollouts", { rows: rows.slice(0, 2), validate: true });
    const { batch_id, keys } = await res.json();
    expect(keys.length).toBe(2);
    await waitDone(batch_id);
    const valUids = keys.map((k: string) => k.split("_")[0]);
    const train = await (await app.request("/v1/groups?max=100&consumer=v", { headers: auth })).json();
    expect(train.groups.filter((g: any) => valUids.includes(g.uid))).toEqual([]);
    const val = await (await app.request("/v1/groups?max=10&consumer=v&partition=val", { headers: auth })).json();
    expect(val.groups.map((g: any) => g.uid).sort()).toEqual([...valUids].sort());
    expect(val.groups[0].records[0].extra_fields.trajectory_info.validate).toBe(true);
  });

  test("__rollout_n__ overrides n for its row", async () => {
    const res = await post("/v1/rollouts", { rows: [{ ...rows[0], __rollout_n__: 3 }, rows[1]] });
    const { keys } = await res.json();
    expect(keys.length).toBe(5);
  });
});

describe("bad requests are 400s naming the field", () => {
  const cases: [string, unknown, number, Record<string, unknown>][] = [
    ["malformed JSON", "{rows:", 400, { code: "invalid_input", message: "body: malformed JSON", field: "body" }],
    ["no rows", {}, 400, { code: "invalid_input", field: "rows" }],
    ["empty rows", { rows: [] }, 400, { code: "invalid_input", message: "rows: rows must hold at least one row", field: "rows" }],
    ["global_steps not an int", { rows: [rows[0]], global_steps: 1.5 }, 400, { field: "global_steps" }],
    ["config outside rollout", { rows: [rows[0]], config: { engine: { url: "http://evil" } } }, 400, { code: "invalid_config", field: "engine" }],
    ["bad rollout value", { rows: [rows[0]], config: { rollout: { n: 0 } } }, 400, { code: "invalid_config", message: "config rollout.n: rollout.n must be >= 1 (in request config)" }],
  ];
  for (const [name, body, status, err] of cases) {
    test(name, async () => {
      const res = await post("/v1/rollouts", body);
      expect(res.status).toBe(status);
      expect((await res.json()).error).toMatchObject(err);
    });
  }

  test("oversized body is a 413", async () => {
    const res = await post("/v1/rollouts", { rows: Array(2000).fill(rows[0]) });
    expect(res.status).toBe(413);
    expect(await res.json()).toEqual({ error: { code: "request_too_large", message: `body: larger than ${64 * 1024} bytes`, field: "body" } });
  });

  test("unknown batch is a 404; bad group queries and acks are 400s", async () => {
    const r = await app.request("/v1/rollouts/nope", { headers: auth });
    expect(r.status).toBe(404);
    expect((await r.json()).error.code).toBe("not_found");
    expect((await app.request("/v1/groups?max=0", { headers: auth })).status).toBe(400);
    expect((await app.request("/v1/groups?partition=test", { headers: auth })).status).toBe(400);
    const ack = await post("/v1/groups/ack", { delivery_ids: [] });
    expect(ack.status).toBe(400);
    expect((await ack.json()).error.field).toBe("delivery_ids");
  });

  test("a rejected request changes no state", async () => {
    const before = runtime.service.batchIds().length;
    await post("/v1/rollouts", { rows: [] });
    await post("/v1/rollouts", "{");
    expect(runtime.service.batchIds().length).toBe(before);
  });
});

describe("openapi", () => {
  test("documents every endpoint with schemas generated from zod", async () => {
    const doc = await (await app.request("/openapi.json")).json();
    expect(doc.openapi).toBe("3.1.0");
    expect(Object.keys(doc.paths).sort()).toEqual(["/health", "/metrics", "/v1/consumed-version", "/v1/engine/pause", "/v1/engine/resume", "/v1/engine/status", "/v1/groups", "/v1/groups/ack", "/v1/groups/{uid}", "/v1/model-version", "/v1/queue", "/v1/rollouts", "/v1/rollouts/{batch_id}", "/v1/rollouts/{batch_id}/groups/{uid}", "/v1/rollouts/{batch_id}/summaries", "/v1/rollouts/{batch_id}/trajectories", "/v1/sandboxes", "/v1/sessions/{key}", "/v1/sessions/{key}/anthropic/v1/messages", "/v1/sessions/{key}/finish", "/v1/sessions/{key}/openai/v1/chat/completions", "/v1/sessions/{key}/openai/v1/models", "/v1/sessions/{key}/openai/v1/responses", "/v1/sessions/{key}/tool-results", "/v1/trajectories/{key}"]);
    // The documented status codes of a batch POST include the size limit and the full queue.
    expect(Object.keys(doc.paths["/v1/rollouts"].post.responses).sort()).toEqual(["202", "400", "401", "409", "413", "415", "503"]);
    // The tool-result callback: signed, not bearer-authenticated; its body schema comes from the zod type (ok and metrics included).
    const cb = doc.paths["/v1/sessions/{key}/tool-results"].post;
    expect([cb.security, Object.keys(cb.responses).sort()]).toEqual([[], ["200", "400", "401", "403", "404", "409", "413", "415"]]);
    expect(Object.keys(cb.requestBody.content["application/json"].schema.properties).sort()).toEqual(["call_id", "content", "metrics", "ok", "reward"]);
    const req = doc.paths["/v1/rollouts"].post.requestBody.content["application/json"].schema;
    expect(req.required).toEqual(["rows"]);
    expect(doc.components.schemas.TrajectoryRecord.properties.response_mask.type).toBe("array");
    // The viewer's paged list: its query parameters come from the zod schema that validates them.
    const list = doc.paths["/v1/rollouts/{batch_id}/summaries"].get;
    expect(list.parameters.map((p: { name: string; in: string }) => `${p.in}:${p.name}`)).toEqual(["path:batch_id", "query:limit", "query:cursor", "query:status", "query:truncated", "query:reward_min", "query:reward_max", "query:uid"]);
    expect(list.parameters[3].schema.enum).toEqual(["ok", "failed"]);
    expect(Object.keys(list.responses).sort()).toEqual(["200", "400", "401", "404"]);
    expect(doc.paths["/v1/rollouts/{batch_id}/groups/{uid}"].get.parameters.map((p: { name: string }) => p.name)).toEqual(["batch_id", "uid", "decode"]);
    // From the route's own strict schema, so a new parameter (agent_role, deliver) cannot be left out.
    expect(doc.paths["/v1/groups"].get.parameters.map((p: { name: string }) => p.name)).toEqual(["max", "block_ms", "consumer", "partition", "agent_role", "deliver", "include_filtered"]);
  });
});

describe("unknown keys are errors, not silently ignored", () => {
  test("a typo in the body or in a config key names the key", async () => {
    const body = await post("/v1/rollouts", { rows: [rows[0]], validte: true });
    expect(body.status).toBe(400);
    expect((await body.json()).error).toEqual({ code: "invalid_input", message: 'validte: Unrecognized key: "validte"', field: "validte" });
    const cfg = await post("/v1/rollouts", { rows: [rows[0]], config: { rollout: { respone_length: 8 } } });
    expect(cfg.status).toBe(400);
    expect((await cfg.json()).error.message).toBe('config rollout: Unrecognized key: "respone_length" (in request config)');
  });
  test("a rollout setting or a config section at the top of the body says where it belongs", async () => {
    const fields = "rows, config, global_steps, model_version, validate, target_groups";
    const n = await post("/v1/rollouts", { rows: [rows[0]], n: 4 });
    expect(n.status).toBe(400);
    expect((await n.json()).error).toEqual({
      code: "invalid_input",
      field: "n",
      message: `n: not a field of the batch body; it belongs under config as config.rollout.n: {"config": {"rollout": {"n": …}}} (the body's fields are ${fields})`,
    });
    const engine = await post("/v1/rollouts", { rows: [rows[0]], engine: {} });
    expect((await engine.json()).error.message).toBe(`engine: not a field of the batch body; it belongs under config as config.engine: {"config": {"engine": …}} (the body's fields are ${fields})`);
    // Own keys only: an inherited name is an ordinary unknown key.
    const proto = await post("/v1/rollouts", { rows: [rows[0]], toString: 1 });
    expect((await proto.json()).error.message).toBe('toString: Unrecognized key: "toString"');
  });
});

describe("batch size", () => {
  test("rows x n over max_batch_trajectories is a 400 before anything is planned", async () => {
    const before = runtime.service.batchIds().length;
    const res = await post("/v1/rollouts", { rows: [rows[0], rows[1], rows[2]], config: { rollout: { n: 1_000_000 } } });
    expect(res.status).toBe(400);
    expect((await res.json()).error).toEqual({
      code: "invalid_input",
      message: "rows: 3 rows x n make 3000000 trajectories; a batch may hold at most 100000 (config max_batch_trajectories): split the batch or lower n",
      field: "rows",
    });
    expect(runtime.service.batchIds().length).toBe(before);
  });
});

describe("per-batch max_model_len", () => {
  test("a batch's smaller context cuts its trajectories instead of failing them", async () => {
    const res = await post("/v1/rollouts", { rows: rows.slice(0, 2), config: { rollout: { n: 1, prompt_length: 300, response_length: 60, max_model_len: 340 } } });
    const { batch_id } = await res.json();
    const stats = await waitDone(batch_id);
    expect(stats.counts.failed).toBe(0);
    expect(stats.counts.ok).toBe(2);
    const recs: TrajectoryRecord[] = (await (await app.request(`/v1/rollouts/${batch_id}/trajectories`, { headers: auth })).text()).trim().split("\n").map((l) => JSON.parse(l));
    for (const r of recs) {
      expect(r.prompt_ids.length + r.response_ids.length).toBeLessThanOrEqual(340);
      expect(r.response_ids.length).toBeLessThanOrEqual(60);
    }
    expect(recs.some((r) => r.truncated)).toBe(true);
  });
});

describe("content type and delivery ids", () => {
  test("a body that is not application/json is a 415; a malformed delivery id a 400", async () => {
    const form = await app.request("/v1/rollouts", { method: "POST", headers: { ...auth, "content-type": "text/plain" }, body: JSON.stringify({ rows: [rows[0]] }) });
    expect(form.status).toBe(415);
    expect((await form.json()).error).toEqual({ code: "invalid_input", message: "content-type: expected application/json, got 'text/plain'", field: "content-type" });
    const none = await app.request("/v1/rollouts", { method: "POST", headers: auth, body: JSON.stringify({ rows: [rows[0]] }) });
    expect(none.status).toBe(415);
    const withCharset = await post("/v1/rollouts", { rows: [rows[0]] }, { ...auth, "content-type": "application/json; charset=utf-8" });
    expect(withCharset.status).toBe(202);
    const ack = await post("/v1/groups/ack", { delivery_ids: ["abc"] });
    expect(ack.status).toBe(400);
    expect((await ack.json()).error.field).toBe("delivery_ids[0]");
  });
});

describe("reused uids", () => {
  test("the 202 body lists uids whose group already existed", async () => {
    const row = { ...rows[4], uid: `reuse-${crypto.randomUUID()}` };
    const first = await (await post("/v1/rollouts", { rows: [row] })).json();
    expect([first.reused_uids, first.complete_uids]).toEqual([[], []]);
    await waitDone(first.batch_id);
    const again = await (await post("/v1/rollouts", { rows: [row] })).json();
    expect(again.reused_uids).toEqual([row.uid]);
    expect(again.complete_uids).toEqual([row.uid]);
  });
});
