import { expect, test } from "bun:test";
import { ProcessMetrics } from "../../shared/telemetry/process-metrics.ts";
import { formatPrometheus } from "../../shared/telemetry/prometheus.ts";

test("process metrics: every tool call bumps the counter and the histogram together; engine calls by outcome, their tokens and retries", () => {
  const m = new ProcessMetrics();
  m.observeToolCall(0.02, true);
  m.observeToolCall(0.3, false);
  m.observeToolCall(45, true);
  m.observeEngineCall(0.07, true, { prompt: 120, generated: 31 });
  m.observeEngineCall(400, false);
  m.observeEngineRetry();
  const lines = formatPrometheus(m.families()).split("\n").filter((l) => !l.startsWith("#"));
  expect(lines).toEqual([
    "edgeloop_tool_calls_total 3",
    "edgeloop_tool_call_errors_total 1",
    ...["0.005", "0.01"].map((le) => `edgeloop_tool_call_duration_seconds_bucket{le="${le}"} 0`),
    ...["0.025", "0.05", "0.1", "0.25"].map((le) => `edgeloop_tool_call_duration_seconds_bucket{le="${le}"} 1`),
    ...["0.5", "1", "2.5", "5", "10", "30"].map((le) => `edgeloop_tool_call_duration_seconds_bucket{le="${le}"} 2`),
    'edgeloop_tool_call_duration_seconds_bucket{le="+Inf"} 3',
    `edgeloop_tool_call_duration_seconds_sum ${0.02 + 0.3 + 45}`,
    "edgeloop_tool_call_duration_seconds_count 3",
    'edgeloop_engine_request_duration_seconds_bucket{outcome="ok",le="0.05"} 0',
    ...["0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "120", "300", "+Inf"].map((le) => `edgeloop_engine_request_duration_seconds_bucket{outcome="ok",le="${le}"} 1`),
    'edgeloop_engine_request_duration_seconds_sum{outcome="ok"} 0.07',
    'edgeloop_engine_request_duration_seconds_count{outcome="ok"} 1',
    ...["0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "30", "60", "120", "300"].map((le) => `edgeloop_engine_request_duration_seconds_bucket{outcome="error",le="${le}"} 0`),
    'edgeloop_engine_request_duration_seconds_bucket{outcome="error",le="+Inf"} 1',
    'edgeloop_engine_request_duration_seconds_sum{outcome="error"} 400',
    'edgeloop_engine_request_duration_seconds_count{outcome="error"} 1',
    "edgeloop_engine_prompt_tokens_total 120",
    "edgeloop_engine_generated_tokens_total 31",
    "edgeloop_engine_retries_total 1",
    "",
  ]);
});
