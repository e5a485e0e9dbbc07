import { afterAll, beforeAll, expect, test } from "bun:test";
import { InMemorySpanExporter } from "@opentelemetry/sdk-trace";
import { setupTelemetry, type Telemetry } from "../../infra/telemetry/setup.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { endLoopTrace } from "../../shared/rollout/executor.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession } from "../../shared/session/trajectory-session.ts";
import { SpanAttr } from "../../shared/telemetry/tracer.ts";
import { depsFor, inputFor, sessionLoopFactory } from "../session/fixtures.ts";

// The durable-session path is traced like the in-process one: one turn span per engine call,
// generate and tool.call inside it, every span ended when the session's run returns.
let exporter: InMemorySpanExporter;
let telemetry: Telemetry;
let tools: ToolServer;
beforeAll(() => {
  exporter = new InMemorySpanExporter();
  telemetry = setupTelemetry({ exporter, simple: true });
  tools = startToolServer({ port: 0 });
});
afterAll(async () => {
  await tools.stop();
  await telemetry.shutdown();
});

test("a two-turn session exports its turns, generates and tool call, all ended", async () => {
  const { deps } = await depsFor(tools.url);
  const input = inputFor(0);
  const s = (await TrajectorySession.open(input.key, { storage: new MemorySessionStorage(), createLoop: sessionLoopFactory(deps), onPause: endLoopTrace }, input))!;
  const r = await s.run();
  expect(r.status).toBe("finished");
  const spans = exporter.getFinishedSpans().filter((x) => x.attributes[SpanAttr.key] === input.key);
  const names = spans.map((x) => x.name).sort();
  expect(names).toEqual(["agent_loop.turn", "agent_loop.turn", "inference.generate", "inference.generate", "reward.compute", "tool.call"]);
  const turns = spans.filter((x) => x.name === "agent_loop.turn");
  const byId = new Map(turns.map((t) => [t.spanContext().spanId, t.attributes[SpanAttr.turn]]));
  const parentTurn = (name: string) => spans.filter((x) => x.name === name).map((x) => byId.get(x.parentSpanContext?.spanId ?? ""));
  expect(parentTurn("inference.generate").sort()).toEqual([1, 2]);
  expect(parentTurn("tool.call")).toEqual([1]);
});
