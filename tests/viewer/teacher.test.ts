import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { VIEWER_JS } from "../../functions/viewer/assets.generated.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";

// What the viewer reads for teacher log-probs (the same API as trainers), and what a batch may ask of the teacher.
const rows = readFileSync(join(import.meta.dir, "..", "..", "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 2).map((l) => JSON.parse(l));
let dir: string;
let runtime: Runtime;
let app: ReturnType<typeof createRolloutsApp>;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-viewer-teacher-"));
  writeFileSync(join(dir, "cfg.json"), JSON.stringify({ rollout: { teacher: { url: "sim", format: "vllm" } } }));
  runtime = await buildRuntime({ config: join(dir, "cfg.json"), n: 1, seed: 3 });
  app = createRolloutsApp({ service: runtime.service });
});
afterAll(async () => {
  await runtime.close();
  rmSync(dir, { recursive: true, force: true });
});

test("GET /v1/trajectories/{key}?decode=1 carries teacher_log_probs; the viewer shows them per token beside the rollout's", async () => {
  expect(runtime.describe).toContain("teacher    vllm at http://teacher-sim.local, on_error fail, same tokenizer");
  const a = runtime.service.submit({ rows, global_steps: 1, model_version: null, validate: false });
  await a.run.run();
  const rec = a.run.records()[0]!;
  expect(rec.teacher_log_probs).toHaveLength(rec.response_ids.length);
  const got = await (await app.request(`/v1/trajectories/${rec.key}?decode=1`)).json();
  expect(got.teacher_log_probs).toEqual(rec.teacher_log_probs);
  expect(got.decoded.response).toHaveLength(rec.response_ids.length);
  // The bundled page puts each token's teacher log-prob in data-tlp and names it on hover.
  expect(VIEWER_JS).toContain('"data-tlp"');
  expect(VIEWER_JS).toContain("teacher ${");
});

test("a batch may turn the teacher off or keep on errors, not name another teacher (400 naming rollout.teacher)", async () => {
  const off = runtime.service.submit({ rows, global_steps: 1, model_version: null, validate: false, config: { rollout: { teacher: null } } });
  await off.run.run();
  expect(off.run.records().every((r) => !("teacher_log_probs" in r))).toBe(true);
  const keep = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, config: { rollout: { teacher: { on_error: "keep" } } } }) });
  expect([keep.status, keep.status === 202 ? "" : await keep.text()]).toEqual([202, ""]);
  const other = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, config: { rollout: { teacher: { url: "http://10.0.0.9:8000", urls: undefined } } } }) });
  expect(other.status).toBe(400);
  const body = await other.json();
  expect(body.error.field).toBe("rollout.teacher");
  expect(body.error.message).toBe("config rollout.teacher: a batch may turn the configured teacher off (null) or change its on_error and timeout_ms, not name another teacher: start serve/worker with that teacher (its tokenizer is checked at start)");
});
