import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { VIEWER_CSS, VIEWER_HTML, VIEWER_JS } from "../../functions/viewer/assets.generated.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { ASSETS_FILE, buildViewerAssets } from "../../infra/viewer/build.ts";
import { tokenPieces } from "../../shared/telemetry/token-pieces.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { exampleRows } from "../helpers/examples.ts";

// What the viewer reads, over the real app: batch listing, one record with per-token text, /metrics.
const TOKEN = "viewer-token";
const auth = { authorization: `Bearer ${TOKEN}` };
const rows = exampleRows();
let runtime: Runtime;
let app: ReturnType<typeof createRolloutsApp>;

beforeAll(async () => {
  runtime = await buildRuntime({ n: 2, seed: 3 });
  app = createRolloutsApp({ service: runtime.service, apiToken: TOKEN });
});
afterAll(() => runtime.close());

test("the committed viewer bundle is what infra/viewer/build.ts makes from the sources", async () => {
  expect(readFileSync(ASSETS_FILE, "utf8")).toBe(await buildViewerAssets());
});

test("GET /viewer serves the page, script and stylesheet without auth", async () => {
  const page = await app.request("/viewer");
  expect(page.status).toBe(200);
  expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8");
  expect(await page.text()).toBe(VIEWER_HTML);
  const js = await app.request("/viewer/viewer.js");
  expect(js.headers.get("content-type")).toBe("text/javascript; charset=utf-8");
  expect(await js.text()).toBe(VIEWER_JS);
  expect(await (await app.request("/viewer/viewer.css")).text()).toBe(VIEWER_CSS);
});

test("GET /v1/rollouts lists batches newest first; GET /v1/trajectories/{key} returns the record, decode=1 the text of every token", async () => {
  expect(await (await app.request("/v1/rollouts", { headers: auth })).json()).toEqual({ batches: [], next_cursor: null });
  expect((await app.request("/v1/rollouts")).status).toBe(401);
  const a = runtime.service.submit({ rows: rows.slice(0, 2), global_steps: 1, model_version: null, validate: false });
  await a.run.run();
  const b = runtime.service.submit({ rows: rows.slice(2, 3), global_steps: 2, model_version: null, validate: true });
  await b.run.run();
  const { batches } = await (await app.request("/v1/rollouts", { headers: auth })).json();
  expect(batches.map((x: { batch_id: string }) => x.batch_id)).toEqual([b.batch_id, a.batch_id]);
  const sa = a.run.stats();
  expect(batches[1]).toEqual({ batch_id: a.batch_id, validate: false, done: true, counts: sa.counts, reward: sa.reward, lost: null, cancelled: null, started_at: sa.started_at, finished_at: sa.finished_at });

  const rec = a.run.records()[0]!;
  const plain = await app.request(`/v1/trajectories/${rec.key}`, { headers: auth });
  expect(plain.status).toBe(200);
  expect(await plain.json()).toEqual(JSON.parse(JSON.stringify(rec)));

  const dec = await (await app.request(`/v1/trajectories/${rec.key}?decode=1`, { headers: auth })).json();
  const tok = await defaultTokenizer();
  expect(dec.decoded.prompt.length).toBe(rec.prompt_ids.length);
  expect(dec.decoded.response.length).toBe(rec.response_ids.length);
  expect(dec.decoded.prompt.join("")).toBe(tok.decode(rec.prompt_ids));
  expect(dec.decoded.response.join("")).toBe(tok.decode(rec.response_ids));
  expect(dec.decoded.response[rec.response_ids.length - 1]).toBe("<|im_end|>");
  const { decoded: _d, ...same } = dec;
  expect(same).toEqual(JSON.parse(JSON.stringify(rec)));

  const missing = await app.request(`/v1/trajectories/nouid_0_0`, { headers: auth });
  expect(missing.status).toBe(404);
  expect(await missing.json()).toEqual({ error: { code: "not_found", message: "no trajectory 'nouid_0_0'", field: "key" } });
  const bad = await app.request(`/v1/trajectories/not-a-key`, { headers: auth });
  expect(bad.status).toBe(400);
  expect((await bad.json()).error.field).toBe("key");
});

test("GET /metrics is Prometheus text over every batch, without auth", async () => {
  const res = await app.request("/metrics");
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toBe("text/plain; version=0.0.4; charset=utf-8");
  const text = await res.text();
  const total = runtime.service.batchIds().reduce((n, id) => n + runtime.service.batch(id).stats().counts.ok, 0);
  expect(text).toContain(`edgeloop_trajectories_total{outcome="ok"} ${total}\n`);
  expect(text).toContain('edgeloop_batches{state="done"} 2\n');
  // The process's admission and event-loop lag (serve's runtime starts the lag monitor).
  expect(text).toContain(`edgeloop_sessions_max_in_flight ${runtime.config.concurrency}\n`);
  expect(text).toMatch(/^edgeloop_event_loop_lag_p99_seconds [0-9.e+-]+$/m);
  // Every non-comment line is `name{labels} value`.
  for (const l of text.trimEnd().split("\n")) expect(l).toMatch(/^(# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+|[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"]*")*\})? (-?[0-9.e+-]+|NaN|[+-]Inf))$/); // Prometheus names: [a-zA-Z_:][a-zA-Z0-9_:]*
});

test("tokenPieces gives a multi-byte character to the token that completes it", async () => {
  const tok = await defaultTokenizer();
  const text = "naïve 日本語 🚀 ok";
  const ids = tok.encode(text);
  const pieces = tokenPieces(tok, ids);
  expect(pieces.length).toBe(ids.length);
  expect(pieces.join("")).toBe(text);
  expect(pieces.some((p) => p.includes("\uFFFD"))).toBe(false);
  expect(pieces.filter((p) => p === "").length).toBeGreaterThan(0);
});
