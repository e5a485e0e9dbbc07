import { expect, test } from "bun:test";
import { BatchMetricsAccumulator, percentile } from "../../shared/telemetry/batch-metrics.ts";
import { runFixtureBatch } from "./batch-fixture.ts";

test("BatchStats: verl's agent_loop/* figures, tokens, counts, finish reasons, latency percentiles (hand-computed)", async () => {
  const s = (await runFixtureBatch()).stats();
  expect(s.counts).toEqual({ total: 4, pending: 0, running: 0, finished: 4, reused: 0, records: 4, ok: 3, failed: 1, truncated: 1 });
  expect(s.tokens).toEqual({ prompt: 6, sampled: 7, observation: 3 });
  expect(s.turns).toBe(9);
  expect(s.tool_calls).toBe(5);
  expect(s.tool_errors).toBe(1);
  expect(s.reward).toEqual({ count: 2, mean: 0.5, min: 0, max: 1, errors: 0 });
  expect(s.errors).toEqual([{ key: "row2_0_0", error: "engine down" }]);
  expect(s.finish_reasons).toEqual({ stop: 2, length: 1, abort: 0, error: 1 });
  // Successful rows in completion order: 0, 1, 3.
  expect(s.agent_loop).toEqual({
    "agent_loop/generate_sequences/min": 0.5,
    "agent_loop/generate_sequences/max": 3,
    "agent_loop/generate_sequences/mean": (1.5 + 3 + 0.5) / 3,
    "agent_loop/tool_calls/min": 0,
    "agent_loop/tool_calls/max": 2,
    "agent_loop/tool_calls/mean": (0.5 + 0 + 2) / 3,
    "agent_loop/compute_score/min": 0,
    "agent_loop/compute_score/max": 0.2,
    "agent_loop/compute_score/mean": (0.1 + 0.2 + 0) / 3,
    "agent_loop/num_preempted/min": -1,
    "agent_loop/num_preempted/max": 2,
    "agent_loop/num_preempted/mean": 1 / 3,
    // Slowest = largest generate + tool + score: row 1 (3.2 s) over row 3 (2.5 s) and row 0 (2.1 s).
    "agent_loop/slowest/generate_sequences": 3,
    "agent_loop/slowest/tool_calls": 0,
    "agent_loop/slowest/compute_score": 0.2,
    "agent_loop/slowest/num_preempted": 2,
    "agent_loop/slowest/prompt_length": 2,
    "agent_loop/slowest/response_length": 3,
  });
  expect(s.slowest_key).toBe("row1_0_0");
  // Latencies 0.1, 0.3, 0.05, 2, 0.02 s → sorted 0.02 0.05 0.1 0.3 2; nearest rank.
  expect(s.tool_call_latency).toEqual({
    count: 5,
    sum: 0.1 + 0.3 + 0.05 + 2 + 0.02,
    mean: (0.1 + 0.3 + 0.05 + 2 + 0.02) / 5,
    p50: 0.1,
    p90: 2,
    p99: 2,
    max: 2,
    buckets: [
      { le: 0.005, count: 0 },
      { le: 0.01, count: 0 },
      { le: 0.025, count: 1 },
      { le: 0.05, count: 2 },
      { le: 0.1, count: 3 },
      { le: 0.25, count: 3 },
      { le: 0.5, count: 4 },
      { le: 1, count: 4 },
      { le: 2.5, count: 5 },
      { le: 5, count: 5 },
      { le: 10, count: 5 },
      { le: 30, count: 5 },
      { le: "+Inf", count: 5 },
    ],
  });
  expect(s.started_at).toBe(1000);
  expect(s.finished_at).toBe(5000);
});

test("an empty accumulator reports no agent_loop figures and null percentiles", () => {
  const m = new BatchMetricsAccumulator().snapshot();
  expect(m.agent_loop).toEqual({});
  expect(m.slowest_key).toBeNull();
  expect(m.tool_call_latency).toMatchObject({ count: 0, sum: 0, mean: null, p50: null, p90: null, p99: null, max: null });
});

test("percentile by nearest rank", () => {
  const xs = Array.from({ length: 100 }, (_, i) => i + 1);
  expect([percentile(xs, 50), percentile(xs, 90), percentile(xs, 99), percentile(xs, 100), percentile(xs, 0)]).toEqual([50, 90, 99, 100, 1]);
  expect(percentile([7], 99)).toBe(7);
  expect(percentile([], 50)).toBeNull();
});
