/**
 * Tracing overhead (issue 9): what the spans cost with and without an SDK.
 * - micro: one instrumented "trajectory" (agent_loop.run, two turns with
 *   inference.generate, one tool.call, queue.put) around in-process fakes
 *   that do no work, against the same calls unwrapped: the pure cost of the
 *   instrumentation, per trajectory;
 * - batch: the example batch (60 rows × n=4 = 240 tool_agent trajectories,
 *   simulated engine in-process, example tool server on loopback, memory
 *   store) with no tracer provider registered (the default: API no-op) and
 *   with the SDK registered (BatchSpanProcessor, an exporter that drops
 *   spans), runs interleaved.
 *
 *   bun bench/telemetry.ts [--runs 5]
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { SpanExporter } from "@opentelemetry/sdk-trace";
import { buildRuntime } from "../infra/cli/runtime.ts";
import { setupTelemetry, type Telemetry } from "../infra/telemetry/setup.ts";
import type { GenerateRequest, InferenceClient } from "../shared/inference/types.ts";
import type { TrajectoryRecord, TokenOutput } from "../shared/schema/index.ts";
import type { TransferQueue } from "../shared/store/types.ts";
import { SpanAttr, withSpan } from "../shared/telemetry/tracer.ts";
import { TrajectoryTracer } from "../shared/rollout/trajectory-tracer.ts";
import { TracingTransferQueue } from "../shared/telemetry/tracing-transfer-queue.ts";
import type { ToolExecutor, ToolResult } from "../shared/tools/webhook-tool-client.ts";
import { arg, median, printTable } from "./util.ts";

const RUNS = Number(arg("--runs", "5"));
const ROOT = join(import.meta.dir, "..");

/** Accepts and drops every span: the SDK's cost without any I/O. */
const dropping: SpanExporter = { export: (_spans, done) => done({ code: 0 }), shutdown: async () => {} };

// ---- micro ----------------------------------------------------------------
const out: TokenOutput = { token_ids: [1, 2, 3], log_probs: [-0.1, -0.2, -0.3], finish_reason: "stop", num_preempted: -1, cached_tokens: 10, extra_fields: {} };
const fakeClient: InferenceClient = { generate: async (_req: GenerateRequest) => out };
const result: ToolResult = { ok: true, content: "4", call_id: "k:1:0", attempts: 1 };
const fakeTools: ToolExecutor = { schemas: [], names: ["calc"], call: async () => result };
const fakeQueue = { put: async (r: TrajectoryRecord) => ({ key: r.key, stored: true }) } as unknown as TransferQueue;
const record = { key: "u_0_0" } as TrajectoryRecord;
const req: GenerateRequest = { request_id: "r", routing_key: "u_0_0", prompt_ids: [1, 2, 3], sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true }, max_tokens: 8 };
const call = { name: "calc", arguments: {}, key: "u_0_0", turn: 1, index: 0 };

async function rawTrajectory(): Promise<void> {
  await fakeClient.generate(req);
  await fakeTools.call(call);
  await fakeClient.generate(req);
  await fakeQueue.put(record);
}

const tracedQueue = new TracingTransferQueue(fakeQueue);
async function tracedTrajectory(): Promise<void> {
  await withSpan("agent_loop.run", { [SpanAttr.key]: "u_0_0" }, async () => {
    const t = new TrajectoryTracer("u_0_0");
    const client = t.client(fakeClient);
    const tools = t.tools(fakeTools);
    await client.generate(req);
    await tools.call(call);
    await client.generate(req);
    t.end();
    await tracedQueue.put(record);
  });
}

async function perTrajectoryUs(f: () => Promise<void>, iterations = 20_000): Promise<number> {
  const samples: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    const t0 = performance.now();
    for (let i = 0; i < iterations; i++) await f();
    samples.push(((performance.now() - t0) * 1000) / iterations);
  }
  return median(samples);
}

await perTrajectoryUs(rawTrajectory, 2000);
await perTrajectoryUs(tracedTrajectory, 2000);
const rawUs = await perTrajectoryUs(rawTrajectory);
const noopUs = await perTrajectoryUs(tracedTrajectory);
let tel: Telemetry = setupTelemetry({ exporter: dropping });
await perTrajectoryUs(tracedTrajectory, 2000);
const sdkUs = await perTrajectoryUs(tracedTrajectory);
await tel.shutdown();

printTable("instrumentation per trajectory (6 spans), in-process fakes", [
  ["mode", "µs / trajectory", "added µs"],
  ["unwrapped calls", rawUs.toFixed(2), "–"],
  ["spans, no provider (no-op)", noopUs.toFixed(2), (noopUs - rawUs).toFixed(2)],
  ["spans, SDK registered", sdkUs.toFixed(2), (sdkUs - rawUs).toFixed(2)],
]);

// ---- batch ----------------------------------------------------------------
const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l));
const runtime = await buildRuntime({ n: 4, seed: 1, concurrency: 64 });

/** Wall and CPU milliseconds of one batch (CPU time is less disturbed by other processes on the machine). */
interface Sample {
  wall: number;
  cpu: number;
}

async function batchMs(): Promise<Sample> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const { run } = runtime.service.submit({ rows, global_steps: 1, model_version: null, validate: false });
  await run.run();
  const wall = performance.now() - t0;
  const c = process.cpuUsage(c0);
  if (run.stats().counts.ok !== rows.length * 4) throw new Error("batch had failures");
  return { wall, cpu: (c.user + c.system) / 1000 };
}

await batchMs();
const off: Sample[] = [];
const on: Sample[] = [];
for (let r = 0; r < RUNS; r++) {
  off.push(await batchMs());
  tel = setupTelemetry({ exporter: dropping });
  on.push(await batchMs());
  await tel.shutdown();
}
await runtime.close();
const m = (xs: Sample[], k: keyof Sample) => median(xs.map((x) => x[k]));
const spread = (xs: Sample[], k: keyof Sample) => `${Math.min(...xs.map((x) => x[k])).toFixed(0)}–${Math.max(...xs.map((x) => x[k])).toFixed(0)}`;
const pct = (k: keyof Sample) => `${(((m(on, k) - m(off, k)) / m(off, k)) * 100).toFixed(1)}%`;
printTable(`example batch: 240 tool_agent trajectories, median of ${RUNS}`, [
  ["mode", "wall ms", "range", "CPU ms", "range"],
  ["no tracer provider (default)", m(off, "wall").toFixed(1), spread(off, "wall"), m(off, "cpu").toFixed(1), spread(off, "cpu")],
  ["SDK registered, spans dropped", m(on, "wall").toFixed(1), spread(on, "wall"), m(on, "cpu").toFixed(1), spread(on, "cpu")],
  ["overhead", pct("wall"), "", pct("cpu"), ""],
]);
const noopAdded = noopUs - rawUs;
console.log(`\nno-op instrumentation: ${noopAdded.toFixed(2)} µs per trajectory = ${(((noopAdded / 1000) * 240) / m(off, "wall")) * 100 < 0.01 ? "<0.01" : ((((noopAdded / 1000) * 240) / m(off, "wall")) * 100).toFixed(3)}% of the batch's wall time`);
