import type { AgentLoopMetrics, FinishReason, TrajectoryRecord } from "../schema/index.ts";

/** The `AgentLoopMetrics` fields verl aggregates, in its order. */
export const AGENT_LOOP_FIELDS = ["generate_sequences", "tool_calls", "compute_score", "num_preempted"] as const satisfies readonly (keyof AgentLoopMetrics)[];

/** Upper bounds (seconds) of the tool-call latency histogram buckets; `+Inf` is implied. */
export const TOOL_LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30] as const;

/** Upper bounds (seconds) of the per-trajectory `generate_sequences`/`tool_calls`/`compute_score` histograms; `+Inf` is implied. */
export const AGENT_LOOP_SECONDS_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600] as const;

/** Upper bounds of the per-trajectory `num_preempted` histogram (`-1`: unknown, its own bucket); `+Inf` is implied. */
export const NUM_PREEMPTED_BUCKETS = [-1, 0, 1, 2, 4, 8, 16] as const;

/** A cumulative histogram of one value over a batch's successful trajectories, as Prometheus renders it. */
export interface FieldHistogram {
  /** Cumulative counts per bound, then `+Inf` (= count). */
  buckets: { le: number | "+Inf"; count: number }[];
  sum: number;
  count: number;
}

/** Tool-call latency over a batch: seconds; percentiles by nearest rank; null while no call was made. */
export interface ToolLatencySummary {
  count: number;
  /** Sum of all latencies, seconds. */
  sum: number;
  mean: number | null;
  p50: number | null;
  p90: number | null;
  p99: number | null;
  max: number | null;
  /** Cumulative counts per {@link TOOL_LATENCY_BUCKETS} bound, then `+Inf` (= count), as a Prometheus histogram. */
  buckets: { le: number | "+Inf"; count: number }[];
}

/** Per-batch figures beyond the counts: what verl logs as `agent_loop/*`, finish reasons, tool-call latency. */
export interface BatchMetrics {
  /**
   * verl's keys over the successful trajectories: `agent_loop/{field}/{min,max,mean}`
   * for each `AgentLoopMetrics` field and `agent_loop/slowest/{field, prompt_length,
   * response_length}` of the slowest one (largest generate + tool + score
   * seconds; the first on a tie). Empty until a trajectory succeeded.
   * @see verl `AgentLoopManager._performance_metrics` (spec §13)
   */
  agent_loop: Record<string, number>;
  /** Key of the slowest trajectory, null while none succeeded. */
  slowest_key: string | null;
  finish_reasons: Record<FinishReason, number>;
  tool_call_latency: ToolLatencySummary;
  /**
   * Each `AgentLoopMetrics` field of every successful trajectory as a
   * histogram (seconds on {@link AGENT_LOOP_SECONDS_BUCKETS}; `num_preempted`
   * on {@link NUM_PREEMPTED_BUCKETS}): what `GET /metrics` sums over batches
   * into `edgeloop_agent_loop_seconds{field}` and `edgeloop_agent_loop_num_preempted`.
   */
  agent_loop_histograms: Record<(typeof AGENT_LOOP_FIELDS)[number], FieldHistogram>;
}

/** A histogram being filled: counts per bucket (not cumulative until {@link snapshot}), sum and count; `bounds` are the upper bounds, `+Inf` implied. */
export class FieldCounts {
  readonly counts: number[];
  sum = 0;
  count = 0;
  constructor(readonly bounds: readonly number[]) {
    this.counts = new Array<number>(bounds.length + 1).fill(0);
  }
  observe(v: number): void {
    let i = this.bounds.findIndex((b) => v <= b);
    if (i < 0) i = this.bounds.length;
    this.counts[i]!++;
    this.sum += v;
    this.count++;
  }
  snapshot(): FieldHistogram {
    let cum = 0;
    const buckets: FieldHistogram["buckets"] = this.bounds.map((le, i) => ({ le, count: (cum += this.counts[i]!) }));
    buckets.push({ le: "+Inf", count: this.count });
    return { buckets, sum: this.sum, count: this.count };
  }
}

interface Stat {
  min: number;
  max: number;
  sum: number;
}

/**
 * Accumulates {@link BatchMetrics} one record at a time (O(1) per record,
 * tool latencies kept for the percentiles). Failed records count only in
 * `finish_reasons`.
 */
export class BatchMetricsAccumulator {
  private readonly stats = new Map<string, Stat>();
  private n = 0;
  private slowest: { key: string; total: number; metrics: AgentLoopMetrics; prompt: number; response: number } | null = null;
  private readonly finish: Record<FinishReason, number> = { stop: 0, length: 0, abort: 0, error: 0 };
  private readonly latencies: number[] = [];
  private sorted = true;
  private latencySum = 0;
  private readonly bucketCounts = new Array<number>(TOOL_LATENCY_BUCKETS.length + 1).fill(0);
  private readonly fieldCounts = {
    generate_sequences: new FieldCounts(AGENT_LOOP_SECONDS_BUCKETS),
    tool_calls: new FieldCounts(AGENT_LOOP_SECONDS_BUCKETS),
    compute_score: new FieldCounts(AGENT_LOOP_SECONDS_BUCKETS),
    num_preempted: new FieldCounts(NUM_PREEMPTED_BUCKETS),
  };

  /** Adds one stored record. */
  addRecord(r: TrajectoryRecord): void {
    this.finish[r.error !== null ? "error" : r.finish_reason]++;
    if (r.error !== null) return;
    this.n++;
    for (const f of AGENT_LOOP_FIELDS) {
      const v = r.metrics[f];
      this.fieldCounts[f].observe(v);
      const s = this.stats.get(f);
      if (!s) this.stats.set(f, { min: v, max: v, sum: v });
      else {
        s.min = Math.min(s.min, v);
        s.max = Math.max(s.max, v);
        s.sum += v;
      }
    }
    const total = r.metrics.generate_sequences + r.metrics.tool_calls + r.metrics.compute_score;
    if (!this.slowest || total > this.slowest.total) {
      this.slowest = { key: r.key, total, metrics: { ...r.metrics }, prompt: r.prompt_ids.length, response: r.response_ids.length };
    }
  }

  /** Adds tool-call latencies, seconds. */
  addToolLatencies(seconds: readonly number[]): void {
    for (const s of seconds) {
      this.latencies.push(s);
      this.latencySum += s;
      let i = TOOL_LATENCY_BUCKETS.findIndex((b) => s <= b);
      if (i < 0) i = TOOL_LATENCY_BUCKETS.length;
      this.bucketCounts[i]!++;
    }
    if (seconds.length) this.sorted = false;
  }

  /** The figures so far. */
  snapshot(): BatchMetrics {
    const agent_loop: Record<string, number> = {};
    if (this.n > 0) {
      for (const f of AGENT_LOOP_FIELDS) {
        const s = this.stats.get(f)!;
        agent_loop[`agent_loop/${f}/min`] = s.min;
        agent_loop[`agent_loop/${f}/max`] = s.max;
        agent_loop[`agent_loop/${f}/mean`] = s.sum / this.n;
      }
      const sl = this.slowest!;
      for (const f of AGENT_LOOP_FIELDS) agent_loop[`agent_loop/slowest/${f}`] = sl.metrics[f];
      agent_loop["agent_loop/slowest/prompt_length"] = sl.prompt;
      agent_loop["agent_loop/slowest/response_length"] = sl.response;
    }
    const fc = this.fieldCounts;
    const agent_loop_histograms = { generate_sequences: fc.generate_sequences.snapshot(), tool_calls: fc.tool_calls.snapshot(), compute_score: fc.compute_score.snapshot(), num_preempted: fc.num_preempted.snapshot() };
    return { agent_loop, slowest_key: this.slowest?.key ?? null, finish_reasons: { ...this.finish }, tool_call_latency: this.latencySummary(), agent_loop_histograms };
  }

  private latencySummary(): ToolLatencySummary {
    if (!this.sorted) {
      this.latencies.sort((a, b) => a - b);
      this.sorted = true;
    }
    const xs = this.latencies;
    const n = xs.length;
    let cum = 0;
    const buckets: ToolLatencySummary["buckets"] = TOOL_LATENCY_BUCKETS.map((le, i) => ({ le, count: (cum += this.bucketCounts[i]!) }));
    buckets.push({ le: "+Inf", count: n });
    return {
      count: n,
      sum: this.latencySum,
      mean: n ? this.latencySum / n : null,
      p50: percentile(xs, 50),
      p90: percentile(xs, 90),
      p99: percentile(xs, 99),
      max: n ? xs[n - 1]! : null,
      buckets,
    };
  }
}

/** The p-th percentile of ascending `sorted` by nearest rank (`sorted[ceil(p/100·n) − 1]`); null when empty. */
export function percentile(sorted: readonly number[], p: number): number | null {
  if (sorted.length === 0) return null;
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(rank, sorted.length) - 1]!;
}
