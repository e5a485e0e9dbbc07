import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { InMemorySpanExporter, type ReadableSpan } from "@opentelemetry/sdk-trace";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { setupTelemetry, type Telemetry } from "../../infra/telemetry/setup.ts";
import { SpanAttr } from "../../shared/telemetry/tracer.ts";

// A two-turn tool_agent trajectory (tool call, then the answer) through the real
// runtime: simulated engine in-process, the example tool server over loopback,
// the memory store. The span tree is read back from an in-memory exporter.
const ROOT = join(import.meta.dir, "..", "..");
const ROW = JSON.parse(readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0]!);

let exporter: InMemorySpanExporter;
let telemetry: Telemetry;
let runtime: Runtime;

beforeAll(async () => {
  exporter = new InMemorySpanExporter();
  telemetry = setupTelemetry({ exporter, simple: true });
  runtime = await buildRuntime({ n: 1, seed: 1 });
});

afterAll(async () => {
  await runtime.close();
  await telemetry.shutdown();
});

interface Node {
  name: string;
  attributes: Record<string, unknown>;
  children: Node[];
}

const RANK: Record<string, number> = { "agent_loop.turn": 0, "inference.generate": 1, "tool.call": 2, "reward.compute": 1000, "queue.put": 1001 };
const order = (s: ReadableSpan) => (RANK[s.name] ?? 500) + Number(s.attributes[SpanAttr.turn] ?? 0) + Number(s.attributes[SpanAttr.toolIndex] ?? 0) / 100;

function tree(spans: ReadableSpan[]): Node[] {
  const byParent = new Map<string | undefined, ReadableSpan[]>();
  const ids = new Set(spans.map((s) => s.spanContext().spanId));
  for (const s of spans) {
    const p = s.parentSpanContext?.spanId;
    const k = p && ids.has(p) ? p : undefined;
    byParent.set(k, [...(byParent.get(k) ?? []), s]);
  }
  const build = (parent: string | undefined): Node[] =>
    (byParent.get(parent) ?? [])
      // Siblings in the order the loop opens them. Start times cannot order them: the SDK
      // anchors each span's start on Date.now() (1 ms resolution), so spans opened
      // within the same millisecond may come out of order.
      .sort((a, b) => order(a) - order(b))
      .map((s) => ({ name: s.name, attributes: { ...s.attributes }, children: build(s.spanContext().spanId) }));
  return build(undefined);
}

const shape = (n: Node): unknown => (n.children.length ? { [n.name]: n.children.map(shape) } : n.name);

test("a two-turn trajectory: run → turns → generate and tool call, reward, queue.put", async () => {
  const { run, keys } = runtime.service.submit({ rows: [ROW], global_steps: 3, model_version: null, validate: false });
  await run.run();
  const [rec] = run.records();
  expect(rec!.error).toBeNull();
  expect(rec!.num_turns).toBe(4);
  const key = keys[0]!;

  // This trajectory's trace only: the suite runs files in one process (--no-isolate), and other files' spans
  // reach the same global tracer provider (a CI run saw other trajectories' turns and puts as extra roots).
  const spans = exporter.getFinishedSpans();
  const runSpan = spans.find((s) => s.name === "agent_loop.run" && s.attributes[SpanAttr.key] === key);
  expect(runSpan).toBeDefined();
  const roots = tree(spans.filter((s) => s.spanContext().traceId === runSpan!.spanContext().traceId));
  expect(roots.map(shape)).toEqual([
    {
      "agent_loop.run": [
        { "agent_loop.turn": ["inference.generate", "tool.call"] },
        { "agent_loop.turn": ["inference.generate"] },
        "reward.compute",
        "queue.put",
      ],
    },
  ]);

  const root = roots[0]!;
  const [turn1, turn2, reward, put] = root.children;
  // Every span carries the trajectory key.
  const all: Node[] = [];
  const walk = (n: Node) => (all.push(n), n.children.forEach(walk));
  walk(root);
  for (const n of all) expect(n.attributes[SpanAttr.key]).toBe(key);

  expect(root.attributes).toMatchObject({
    [SpanAttr.uid]: rec!.uid,
    [SpanAttr.sessionId]: 0,
    [SpanAttr.batchId]: run.plan.batch_id,
    [SpanAttr.agentName]: "tool_agent",
    [SpanAttr.numTurns]: 4,
    [SpanAttr.truncated]: false,
    [SpanAttr.finishReason]: "stop",
    [SpanAttr.reward]: 1,
    [SpanAttr.responseTokens]: rec!.response_ids.length,
  });
  expect(turn1!.attributes[SpanAttr.turn]).toBe(1);
  expect(turn2!.attributes[SpanAttr.turn]).toBe(2);

  const [gen1, call] = turn1!.children;
  const [gen2] = turn2!.children;
  const sampled = rec!.response_mask.filter((m) => m === 1).length;
  expect((gen1!.attributes[SpanAttr.outputTokens] as number) + (gen2!.attributes[SpanAttr.outputTokens] as number)).toBe(sampled);
  expect(gen1!.attributes).toMatchObject({ [SpanAttr.finishReason]: "stop", [SpanAttr.promptTokens]: rec!.prompt_ids.length, [SpanAttr.cachedTokens]: 0, [SpanAttr.numPreempted]: -1 });
  // Turn 2's context is turn 1's plus the observation: the replica holds turn 1's prefix.
  expect(gen2!.attributes[SpanAttr.promptTokens]).toBe(rec!.prompt_ids.length + rec!.response_ids.length - (gen2!.attributes[SpanAttr.outputTokens] as number));
  expect(gen2!.attributes[SpanAttr.cachedTokens] as number).toBeGreaterThan(rec!.prompt_ids.length);
  expect(call!.attributes).toMatchObject({ [SpanAttr.toolName]: "calc", [SpanAttr.turn]: 1, [SpanAttr.toolIndex]: 0, [SpanAttr.toolOk]: true, [SpanAttr.toolAttempts]: 1, [SpanAttr.toolCallId]: `${key}:1:0` });
  expect(reward!.attributes[SpanAttr.reward]).toBe(1);
  expect(put!.attributes).toMatchObject({ [SpanAttr.queueOp]: "put", [SpanAttr.stored]: true });

  // The batch's tool-call latency comes from the same wrapper.
  expect(run.stats().tool_call_latency.count).toBe(1);
});
