import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { setupTelemetry, type Telemetry } from "../../infra/telemetry/setup.ts";
import { SpanAttr } from "../../shared/telemetry/tracer.ts";

// The teacher's scoring call is traced like a policy call: one `inference.score` span per output,
// inside the trajectory's `agent_loop.run`, keyed by the trajectory key.
const ROW = JSON.parse(readFileSync(join(import.meta.dir, "..", "..", "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0]!);
let exporter: InMemorySpanExporter;
let telemetry: Telemetry;
let runtime: Runtime;
let dir: string;

beforeAll(async () => {
  exporter = new InMemorySpanExporter();
  telemetry = setupTelemetry({ exporter, simple: true });
  dir = mkdtempSync(join(tmpdir(), "edgeloop-teacher-span-"));
  writeFileSync(join(dir, "cfg.json"), JSON.stringify({ rollout: { teacher: { url: "sim", format: "vllm" } } }));
  runtime = await buildRuntime({ config: join(dir, "cfg.json"), n: 1, seed: 1 });
});
afterAll(async () => {
  await runtime.close();
  await telemetry.shutdown();
  rmSync(dir, { recursive: true, force: true });
});

test("inference.score: one span per scored output, child of agent_loop.run, with the key, sizes and the teacher", async () => {
  const a = runtime.service.submit({ rows: [ROW], global_steps: 1, model_version: null, validate: false });
  await a.run.run();
  const rec = a.run.records()[0]!;
  expect(rec.teacher_log_probs).toHaveLength(rec.response_ids.length);
  const spans = exporter.getFinishedSpans();
  // This record's spans: other files running in this process (--no-isolate) reach the same global tracer provider.
  const score = spans.filter((s) => s.name === "inference.score" && s.attributes[SpanAttr.key] === rec.key);
  expect(score).toHaveLength(1);
  expect(score[0]!.attributes).toEqual({
    [SpanAttr.key]: rec.key,
    "edgeloop.output_index": 0,
    [SpanAttr.promptTokens]: rec.prompt_ids.length,
    [SpanAttr.responseTokens]: rec.response_ids.length,
    "edgeloop.teacher": "vllm at http://teacher-sim.local",
  });
  const run = spans.find((s) => s.name === "agent_loop.run" && s.attributes[SpanAttr.key] === rec.key)!;
  expect(score[0]!.parentSpanContext?.spanId).toBe(run.spanContext().spanId);
});
