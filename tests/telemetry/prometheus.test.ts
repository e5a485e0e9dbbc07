import { expect, test } from "bun:test";
import { formatPrometheus, formatValue, PROMETHEUS_CONTENT_TYPE } from "../../shared/telemetry/prometheus.ts";
import { RolloutMetricsCollector } from "../../shared/service/rollout-metrics.ts";
import { runFixtureBatch } from "./batch-fixture.ts";

test("text exposition format: HELP/TYPE lines, label and HELP escaping, special values", () => {
  const text = formatPrometheus([
    { name: "a_total", help: 'back\\slash and\nnewline "quoted"', type: "counter", samples: [{ value: 3 }] },
    {
      name: "b",
      help: "labels",
      type: "gauge",
      samples: [
        { labels: { path: 'C:\\x "y"\nz', k: "v" }, value: 0.25 },
        { labels: {}, value: NaN },
        { labels: { s: "inf" }, value: Infinity },
        { labels: { s: "-inf" }, value: -Infinity },
        { value: -0.5 },
        { value: 1e21 },
      ],
    },
    { name: "h_seconds", help: "h", type: "histogram", samples: [{ suffix: "_bucket", labels: { le: "+Inf" }, value: 2 }, { suffix: "_sum", value: 1.5 }, { suffix: "_count", value: 2 }] },
  ]);
  expect(text).toBe(
    [
      '# HELP a_total back\\\\slash and\\nnewline "quoted"',
      "# TYPE a_total counter",
      "a_total 3",
      "# HELP b labels",
      "# TYPE b gauge",
      'b{path="C:\\\\x \\"y\\"\\nz",k="v"} 0.25',
      "b NaN",
      'b{s="inf"} +Inf',
      'b{s="-inf"} -Inf',
      "b -0.5",
      "b 1e+21",
      "# HELP h_seconds h",
      "# TYPE h_seconds histogram",
      'h_seconds_bucket{le="+Inf"} 2',
      "h_seconds_sum 1.5",
      "h_seconds_count 2",
      "",
    ].join("\n"),
  );
  expect(formatPrometheus([])).toBe("");
  expect(formatValue(42)).toBe("42");
  expect(PROMETHEUS_CONTENT_TYPE).toBe("text/plain; version=0.0.4; charset=utf-8");
  expect(() => formatPrometheus([{ name: "bad-name", help: "", type: "gauge", samples: [] }])).toThrow("invalid metric name 'bad-name'");
  expect(() => formatPrometheus([{ name: "x", help: "", type: "gauge", samples: [{ labels: { "0bad": "v" }, value: 1 }] }])).toThrow("invalid label name '0bad'");
  expect(() => formatPrometheus([{ name: "x", help: "", type: "gauge", samples: [{ labels: { __reserved: "v" }, value: 1 }] }])).toThrow("invalid label name '__reserved'");
});

/** The exact scrape of the fixture batch (figures hand-computed in batch-metrics.test.ts). */
function expectedScrape(batchId: string): string {
  return `# HELP edgeloop_batches Batches held in memory, by state.
# TYPE edgeloop_batches gauge
edgeloop_batches{state="running"} 0
edgeloop_batches{state="done"} 1
# HELP edgeloop_trajectories_in_progress Sessions (trajectories) of the batches in memory not yet finished, by state.
# TYPE edgeloop_trajectories_in_progress gauge
edgeloop_trajectories_in_progress{state="pending"} 0
edgeloop_trajectories_in_progress{state="running"} 0
# HELP edgeloop_sessions_total Sessions (one per prompt and session_id) finished, each with 0…k records; sessions handed back from an earlier batch are not counted again.
# TYPE edgeloop_sessions_total counter
edgeloop_sessions_total 4
# HELP edgeloop_trajectories_total Trajectory records stored (one per loop output), by outcome; records handed back from an earlier batch are not counted again.
# TYPE edgeloop_trajectories_total counter
edgeloop_trajectories_total{outcome="ok"} 3
edgeloop_trajectories_total{outcome="failed"} 1
# HELP edgeloop_trajectories_truncated_total Successful trajectories that hit a length budget.
# TYPE edgeloop_trajectories_truncated_total counter
edgeloop_trajectories_truncated_total 1
# HELP edgeloop_trajectory_finish_reasons_total Trajectories stored, by finish reason (failed ones count as error).
# TYPE edgeloop_trajectory_finish_reasons_total counter
edgeloop_trajectory_finish_reasons_total{reason="stop"} 2
edgeloop_trajectory_finish_reasons_total{reason="length"} 1
edgeloop_trajectory_finish_reasons_total{reason="abort"} 0
edgeloop_trajectory_finish_reasons_total{reason="error"} 1
# HELP edgeloop_tokens_total Tokens of successful trajectories: prompt, sampled (mask 1) and observation (mask 0).
# TYPE edgeloop_tokens_total counter
edgeloop_tokens_total{kind="prompt"} 6
edgeloop_tokens_total{kind="sampled"} 7
edgeloop_tokens_total{kind="observation"} 3
# HELP edgeloop_turns_total num_turns summed over successful trajectories.
# TYPE edgeloop_turns_total counter
edgeloop_turns_total 9
# HELP edgeloop_tool_errors_total Error observations of tool calls in stored successful trajectories (extra_fields.tool_errors): calls answered with an error, and calls edgeloop refused itself (unknown tool, malformed arguments).
# TYPE edgeloop_tool_errors_total counter
edgeloop_tool_errors_total 1
# HELP edgeloop_agent_loop_seconds verl's AgentLoopMetrics of each successful trajectory, seconds accumulated over its turns, by field (generate_sequences, tool_calls, compute_score).
# TYPE edgeloop_agent_loop_seconds histogram
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="0.01"} 0
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="0.05"} 0
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="0.1"} 0
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="0.25"} 0
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="0.5"} 1
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="1"} 1
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="2.5"} 2
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="5"} 3
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="10"} 3
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="30"} 3
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="60"} 3
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="120"} 3
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="300"} 3
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="600"} 3
edgeloop_agent_loop_seconds_bucket{field="generate_sequences",le="+Inf"} 3
edgeloop_agent_loop_seconds_sum{field="generate_sequences"} 5
edgeloop_agent_loop_seconds_count{field="generate_sequences"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="0.01"} 1
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="0.05"} 1
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="0.1"} 1
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="0.25"} 1
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="0.5"} 2
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="1"} 2
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="2.5"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="5"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="10"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="30"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="60"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="120"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="300"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="600"} 3
edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="+Inf"} 3
edgeloop_agent_loop_seconds_sum{field="tool_calls"} 2.5
edgeloop_agent_loop_seconds_count{field="tool_calls"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="0.01"} 1
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="0.05"} 1
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="0.1"} 2
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="0.25"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="0.5"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="1"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="2.5"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="5"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="10"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="30"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="60"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="120"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="300"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="600"} 3
edgeloop_agent_loop_seconds_bucket{field="compute_score",le="+Inf"} 3
edgeloop_agent_loop_seconds_sum{field="compute_score"} ${0.1 + 0.2 + 0}
edgeloop_agent_loop_seconds_count{field="compute_score"} 3
# HELP edgeloop_agent_loop_num_preempted verl's num_preempted of each successful trajectory (its bucket le -1 counts the unknown ones, num_preempted -1).
# TYPE edgeloop_agent_loop_num_preempted histogram
edgeloop_agent_loop_num_preempted_bucket{le="-1"} 1
edgeloop_agent_loop_num_preempted_bucket{le="0"} 2
edgeloop_agent_loop_num_preempted_bucket{le="1"} 2
edgeloop_agent_loop_num_preempted_bucket{le="2"} 3
edgeloop_agent_loop_num_preempted_bucket{le="4"} 3
edgeloop_agent_loop_num_preempted_bucket{le="8"} 3
edgeloop_agent_loop_num_preempted_bucket{le="16"} 3
edgeloop_agent_loop_num_preempted_bucket{le="+Inf"} 3
edgeloop_agent_loop_num_preempted_sum 1
edgeloop_agent_loop_num_preempted_count 3
# HELP edgeloop_agent_loop_batch_info The latest finished batch, which the edgeloop_agent_loop_slowest_* gauges describe.
# TYPE edgeloop_agent_loop_batch_info gauge
edgeloop_agent_loop_batch_info{batch_id="${batchId}"} 1
# HELP edgeloop_agent_loop_slowest_seconds verl's agent_loop/slowest/{field} of the latest finished batch: the slowest trajectory's seconds, by field.
# TYPE edgeloop_agent_loop_slowest_seconds gauge
edgeloop_agent_loop_slowest_seconds{field="generate_sequences"} 3
edgeloop_agent_loop_slowest_seconds{field="tool_calls"} 0
edgeloop_agent_loop_slowest_seconds{field="compute_score"} 0.2
# HELP edgeloop_agent_loop_slowest_num_preempted verl's agent_loop/slowest/num_preempted of the latest finished batch (-1 = unknown).
# TYPE edgeloop_agent_loop_slowest_num_preempted gauge
edgeloop_agent_loop_slowest_num_preempted 2
# HELP edgeloop_agent_loop_slowest_tokens verl's agent_loop/slowest/{prompt,response}_length of the latest finished batch.
# TYPE edgeloop_agent_loop_slowest_tokens gauge
edgeloop_agent_loop_slowest_tokens{kind="prompt"} 2
edgeloop_agent_loop_slowest_tokens{kind="response"} 3
`;
}

test("the scrape of a finished batch, exactly", async () => {
  const run = await runFixtureBatch();
  const c = new RolloutMetricsCollector({ batchIds: () => [run.plan.batch_id], batch: () => run });
  expect(formatPrometheus(c.families())).toBe(expectedScrape(run.plan.batch_id));
});

test("counters survive the service forgetting a batch; per-batch gauges go with it", async () => {
  const run = await runFixtureBatch();
  let ids = [run.plan.batch_id];
  const c = new RolloutMetricsCollector({ batchIds: () => ids, batch: () => run });
  const first = formatPrometheus(c.families());
  ids = [];
  const after = formatPrometheus(c.families());
  const line = (t: string, prefix: string) => t.split("\n").find((l) => l.startsWith(prefix));
  for (const p of ['edgeloop_trajectories_total{outcome="ok"}', 'edgeloop_tokens_total{kind="sampled"}', 'edgeloop_agent_loop_seconds_count{field="tool_calls"}', 'edgeloop_agent_loop_seconds_bucket{field="tool_calls",le="0.5"}', 'edgeloop_agent_loop_num_preempted_bucket{le="-1"}']) {
    expect(line(after, p)).toBe(line(first, p)!);
  }
  expect(line(after, 'edgeloop_batches{state="done"}')).toBe('edgeloop_batches{state="done"} 0');
  expect(after).not.toContain("edgeloop_agent_loop_slowest");
  expect(after).not.toContain("edgeloop_agent_loop_batch_info");
  expect(formatPrometheus(c.families())).toBe(after);
});
