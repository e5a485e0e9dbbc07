import type { QueueStats } from "../jobs/job-queue.ts";
import type { BatchStats } from "../rollout/batch-run.ts";
import { TOOL_LATENCY_BUCKETS } from "./batch-metrics.ts";
import type { PromFamily, PromSample } from "./prometheus.ts";

/** Where the collector reads batches from (a `RolloutService`). */
export interface BatchSource {
  batchIds(): string[];
  batch(id: string): { stats(): BatchStats };
}

/** Monotonic totals of one batch (or of all retired ones). */
interface Totals {
  /** Sessions finished by this process (handed-back ones excluded). */
  sessions: number;
  ok: number;
  failed: number;
  truncated: number;
  finish: Record<string, number>;
  tokens: Record<"prompt" | "sampled" | "observation", number>;
  turns: number;
  toolCalls: number;
  toolErrors: number;
  latencyBuckets: number[];
  latencySum: number;
  latencyCount: number;
}

function zero(): Totals {
  return {
    sessions: 0,
    ok: 0,
    failed: 0,
    truncated: 0,
    finish: { stop: 0, length: 0, abort: 0, error: 0 },
    tokens: { prompt: 0, sampled: 0, observation: 0 },
    turns: 0,
    toolCalls: 0,
    toolErrors: 0,
    latencyBuckets: new Array<number>(TOOL_LATENCY_BUCKETS.length + 1).fill(0),
    latencySum: 0,
    latencyCount: 0,
  };
}

function totalsOf(s: BatchStats): Totals {
  return {
    sessions: s.counts.finished - s.counts.reused,
    ok: s.counts.ok,
    failed: s.counts.failed,
    truncated: s.counts.truncated,
    finish: { ...s.finish_reasons },
    tokens: { ...s.tokens },
    turns: s.turns,
    toolCalls: s.tool_calls,
    toolErrors: s.tool_errors,
    latencyBuckets: s.tool_call_latency.buckets.map((b) => b.count),
    latencySum: s.tool_call_latency.sum,
    latencyCount: s.tool_call_latency.count,
  };
}

function add(a: Totals, b: Totals): void {
  a.sessions += b.sessions;
  a.ok += b.ok;
  a.failed += b.failed;
  a.truncated += b.truncated;
  for (const k of Object.keys(b.finish)) a.finish[k] = (a.finish[k] ?? 0) + b.finish[k]!;
  a.tokens.prompt += b.tokens.prompt;
  a.tokens.sampled += b.tokens.sampled;
  a.tokens.observation += b.tokens.observation;
  a.turns += b.turns;
  a.toolCalls += b.toolCalls;
  a.toolErrors += b.toolErrors;
  b.latencyBuckets.forEach((c, i) => (a.latencyBuckets[i]! += c));
  a.latencySum += b.latencySum;
  a.latencyCount += b.latencyCount;
}

/**
 * The `GET /metrics` families of a rollout service. Counters (`*_total`, the
 * tool-call latency histogram) add up every batch this process ran: a batch
 * the service forgets (it keeps the last 1000) is folded into retired totals
 * as last seen by a scrape, so counters never go down. Gauges describe the
 * batches in memory and the latest finished batch: verl's `agent_loop/*`
 * figures (`edgeloop_agent_loop_seconds{field, stat}`,
 * `edgeloop_agent_loop_num_preempted{stat}`, the slowest trajectory's token
 * counts) and its tool-call latency percentiles.
 */
export class RolloutMetricsCollector {
  private readonly retired = zero();
  private readonly lastSeen = new Map<string, Totals>();

  constructor(private readonly source: BatchSource) {}

  /** The families to render with `formatPrometheus`. */
  families(): PromFamily[] {
    const all = zero();
    const live = new Set<string>();
    let running = 0;
    let done = 0;
    let pending = 0;
    let inflight = 0;
    let latest: BatchStats | null = null;
    for (const id of this.source.batchIds()) {
      let s: BatchStats;
      try {
        s = this.source.batch(id).stats();
      } catch {
        continue;
      }
      live.add(id);
      const t = totalsOf(s);
      this.lastSeen.set(id, t);
      add(all, t);
      if (s.done) done++;
      else running++;
      pending += s.counts.pending;
      inflight += s.counts.running;
      if (s.done && (!latest || (s.finished_at ?? 0) >= (latest.finished_at ?? 0))) latest = s;
    }
    for (const [id, t] of this.lastSeen) {
      if (live.has(id)) continue;
      add(this.retired, t);
      this.lastSeen.delete(id);
    }
    add(all, this.retired);

    const fams: PromFamily[] = [
      gauge("edgeloop_batches", "Batches held in memory, by state.", [
        { labels: { state: "running" }, value: running },
        { labels: { state: "done" }, value: done },
      ]),
      gauge("edgeloop_trajectories_in_progress", "Sessions (trajectories) of the batches in memory not yet finished, by state.", [
        { labels: { state: "pending" }, value: pending },
        { labels: { state: "running" }, value: inflight },
      ]),
      counter("edgeloop_sessions_total", "Sessions (one per prompt and session_id) finished, each with 0…k records; sessions handed back from an earlier batch are not counted again.", [
        { value: all.sessions },
      ]),
      counter("edgeloop_trajectories_total", "Trajectory records stored (one per loop output), by outcome; records handed back from an earlier batch are not counted again.", [
        { labels: { outcome: "ok" }, value: all.ok },
        { labels: { outcome: "failed" }, value: all.failed },
      ]),
      counter("edgeloop_trajectories_truncated_total", "Successful trajectories that hit a length budget.", [{ value: all.truncated }]),
      counter(
        "edgeloop_trajectory_finish_reasons_total",
        "Trajectories stored, by finish reason (failed ones count as error).",
        Object.entries(all.finish).map(([reason, value]) => ({ labels: { reason }, value })),
      ),
      counter("edgeloop_tokens_total", "Tokens of successful trajectories: prompt, sampled (mask 1) and observation (mask 0).", [
        { labels: { kind: "prompt" }, value: all.tokens.prompt },
        { labels: { kind: "sampled" }, value: all.tokens.sampled },
        { labels: { kind: "observation" }, value: all.tokens.observation },
      ]),
      counter("edgeloop_turns_total", "num_turns summed over successful trajectories.", [{ value: all.turns }]),
      counter("edgeloop_tool_calls_total", "Tool calls processed.", [{ value: all.toolCalls }]),
      counter("edgeloop_tool_errors_total", "Tool calls answered with an error observation.", [{ value: all.toolErrors }]),
      {
        name: "edgeloop_tool_call_duration_seconds",
        help: "Latency of each tool call (webhook round trip, retries included).",
        type: "histogram",
        samples: [
          ...TOOL_LATENCY_BUCKETS.map((le, i) => ({ suffix: "_bucket" as const, labels: { le: String(le) }, value: all.latencyBuckets[i]! })),
          { suffix: "_bucket", labels: { le: "+Inf" }, value: all.latencyCount },
          { suffix: "_sum", value: all.latencySum },
          { suffix: "_count", value: all.latencyCount },
        ],
      },
    ];
    if (latest) fams.push(...latestBatchFamilies(latest));
    return fams;
  }
}

function latestBatchFamilies(s: BatchStats): PromFamily[] {
  const al = s.agent_loop;
  const fams: PromFamily[] = [gauge("edgeloop_agent_loop_batch_info", "The latest finished batch, which the edgeloop_agent_loop_* gauges describe.", [{ labels: { batch_id: s.batch_id }, value: 1 }])];
  if ("agent_loop/generate_sequences/min" in al) {
    const stats = ["min", "max", "mean", "slowest"] as const;
    const at = (field: string, stat: string) => (stat === "slowest" ? al[`agent_loop/slowest/${field}`]! : al[`agent_loop/${field}/${stat}`]!);
    fams.push(
      gauge(
        "edgeloop_agent_loop_seconds",
        "verl's agent_loop/{field}/{min,max,mean} and agent_loop/slowest/{field} of the latest finished batch, seconds per trajectory.",
        ["generate_sequences", "tool_calls", "compute_score"].flatMap((field) => stats.map((stat) => ({ labels: { field, stat }, value: at(field, stat) }))),
      ),
      gauge(
        "edgeloop_agent_loop_num_preempted",
        "verl's agent_loop/num_preempted/{min,max,mean} and agent_loop/slowest/num_preempted of the latest finished batch (-1 = unknown).",
        stats.map((stat) => ({ labels: { stat }, value: at("num_preempted", stat) })),
      ),
      gauge("edgeloop_agent_loop_slowest_tokens", "verl's agent_loop/slowest/{prompt,response}_length of the latest finished batch.", [
        { labels: { kind: "prompt" }, value: al["agent_loop/slowest/prompt_length"]! },
        { labels: { kind: "response" }, value: al["agent_loop/slowest/response_length"]! },
      ]),
    );
  }
  const l = s.tool_call_latency;
  if (l.count > 0) {
    fams.push(
      gauge("edgeloop_agent_loop_tool_call_latency_seconds", "Tool-call latency percentiles (nearest rank) of the latest finished batch.", [
        { labels: { quantile: "0.5" }, value: l.p50! },
        { labels: { quantile: "0.9" }, value: l.p90! },
        { labels: { quantile: "0.99" }, value: l.p99! },
        { labels: { quantile: "1" }, value: l.max! },
      ]),
    );
  }
  return fams;
}

/**
 * The job queue's figures as `GET /metrics` gauges (queue mode; the same as `GET /v1/queue`):
 * `edgeloop_queue_jobs{state}` — `waiting` (never claimed), `stranded` (held by a worker that
 * stopped heart-beating past the lease: the next claim reclaims them) and `in_flight` (running
 * on a live worker); their sum is every job still to do, and `waiting + stranded` is what a
 * worker can claim now (`depth`). Also `edgeloop_queue_oldest_job_age_seconds` and
 * `edgeloop_queue_workers{state="known"|"busy"}`. Inline mode (no `workers`) gives the jobs only.
 */
export function queueFamilies(q: QueueStats): PromFamily[] {
  const stranded = q.stranded ?? 0;
  const fams = [
    gauge("edgeloop_queue_jobs", "Jobs still to do, by state: waiting (never claimed), stranded (held past the lease by a worker that stopped heart-beating; reclaimed by the next claim), in_flight (running on a live worker). Scale on waiting + stranded (GET /v1/queue depth), or on the sum.", [
      { labels: { state: "waiting" }, value: Math.max(0, q.depth - stranded) },
      { labels: { state: "stranded" }, value: stranded },
      { labels: { state: "in_flight" }, value: q.in_flight },
    ]),
    gauge("edgeloop_queue_oldest_job_age_seconds", "Age of the oldest job not yet acknowledged (0 when none).", [{ value: q.oldest_age_ms / 1000 }]),
  ];
  if (q.workers) {
    fams.push(
      gauge("edgeloop_queue_workers", "Workers that claimed or heart-beat within two leases (known), and those of them running jobs (busy).", [
        { labels: { state: "known" }, value: q.workers.known },
        { labels: { state: "busy" }, value: q.workers.busy },
      ]),
    );
  }
  return fams;
}

function gauge(name: string, help: string, samples: PromSample[]): PromFamily {
  return { name, help, type: "gauge", samples };
}

function counter(name: string, help: string, samples: PromSample[]): PromFamily {
  return { name, help, type: "counter", samples };
}
