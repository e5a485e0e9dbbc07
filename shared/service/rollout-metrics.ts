import type { QueueStats } from "../jobs/job-queue.ts";
import type { BatchStats } from "../rollout/batch-run.ts";
import { AGENT_LOOP_SECONDS_BUCKETS, NUM_PREEMPTED_BUCKETS, type FieldHistogram } from "../telemetry/batch-metrics.ts";
import type { PromFamily, PromSample } from "../telemetry/prometheus.ts";

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
  toolErrors: number;
  /** Cumulative histograms of the successful trajectories' `AgentLoopMetrics` fields. */
  fields: Record<HistField, FieldHistogram>;
}

const SECONDS_FIELDS = ["generate_sequences", "tool_calls", "compute_score"] as const;
type HistField = (typeof SECONDS_FIELDS)[number] | "num_preempted";

function emptyHist(bounds: readonly number[]): FieldHistogram {
  return { buckets: [...bounds.map((le) => ({ le, count: 0 })), { le: "+Inf" as const, count: 0 }], sum: 0, count: 0 };
}

function addHist(a: FieldHistogram, b: FieldHistogram): void {
  b.buckets.forEach((x, i) => (a.buckets[i]!.count += x.count));
  a.sum += b.sum;
  a.count += b.count;
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
    toolErrors: 0,
    fields: {
      generate_sequences: emptyHist(AGENT_LOOP_SECONDS_BUCKETS),
      tool_calls: emptyHist(AGENT_LOOP_SECONDS_BUCKETS),
      compute_score: emptyHist(AGENT_LOOP_SECONDS_BUCKETS),
      num_preempted: emptyHist(NUM_PREEMPTED_BUCKETS),
    },
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
    toolErrors: s.tool_errors,
    fields: structuredClone(s.agent_loop_histograms),
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
  a.toolErrors += b.toolErrors;
  for (const f of Object.keys(a.fields) as HistField[]) addHist(a.fields[f], b.fields[f]);
}

/**
 * The `GET /metrics` families of a rollout service's batches (records as
 * stored or followed from the store: in queue mode, what the workers wrote).
 * Counters and histograms add up every batch this process ran or followed:
 * a batch the service forgets (it keeps the last 1000) is folded into
 * retired totals as last seen by a scrape, so they never go down.
 * `edgeloop_agent_loop_seconds{field}` (histogram) and
 * `edgeloop_agent_loop_num_preempted` (histogram, `le="-1"` = unknown) are
 * verl's per-trajectory `AgentLoopMetrics` of every successful trajectory.
 * Gauges describe the batches in memory and the latest finished batch's
 * slowest trajectory (verl's `agent_loop/slowest/*`). Tool and engine calls
 * are the process's own (`processMetrics`, process-metrics.ts).
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
      counter("edgeloop_tool_errors_total", "Error observations of tool calls in stored successful trajectories (extra_fields.tool_errors): calls answered with an error, and calls edgeloop refused itself (unknown tool, malformed arguments).", [{ value: all.toolErrors }]),
      {
        name: "edgeloop_agent_loop_seconds",
        help: "verl's AgentLoopMetrics of each successful trajectory, seconds accumulated over its turns, by field (generate_sequences, tool_calls, compute_score).",
        type: "histogram",
        samples: SECONDS_FIELDS.flatMap((field) => histSamples(all.fields[field], { field })),
      },
      {
        name: "edgeloop_agent_loop_num_preempted",
        help: "verl's num_preempted of each successful trajectory (its bucket le -1 counts the unknown ones, num_preempted -1).",
        type: "histogram",
        samples: histSamples(all.fields.num_preempted, {}),
      },
    ];
    if (latest) fams.push(...latestBatchFamilies(latest));
    return fams;
  }
}

function histSamples(h: FieldHistogram, labels: Record<string, string>): PromSample[] {
  return [
    ...h.buckets.map((b) => ({ suffix: "_bucket" as const, labels: { ...labels, le: String(b.le) }, value: b.count })),
    { suffix: "_sum", labels, value: h.sum },
    { suffix: "_count", labels, value: h.count },
  ];
}

function latestBatchFamilies(s: BatchStats): PromFamily[] {
  const al = s.agent_loop;
  const fams: PromFamily[] = [gauge("edgeloop_agent_loop_batch_info", "The latest finished batch, which the edgeloop_agent_loop_slowest_* gauges describe.", [{ labels: { batch_id: s.batch_id }, value: 1 }])];
  if ("agent_loop/slowest/generate_sequences" in al) {
    fams.push(
      gauge(
        "edgeloop_agent_loop_slowest_seconds",
        "verl's agent_loop/slowest/{field} of the latest finished batch: the slowest trajectory's seconds, by field.",
        SECONDS_FIELDS.map((field) => ({ labels: { field }, value: al[`agent_loop/slowest/${field}`]! })),
      ),
      gauge("edgeloop_agent_loop_slowest_num_preempted", "verl's agent_loop/slowest/num_preempted of the latest finished batch (-1 = unknown).", [{ value: al["agent_loop/slowest/num_preempted"]! }]),
      gauge("edgeloop_agent_loop_slowest_tokens", "verl's agent_loop/slowest/{prompt,response}_length of the latest finished batch.", [
        { labels: { kind: "prompt" }, value: al["agent_loop/slowest/prompt_length"]! },
        { labels: { kind: "response" }, value: al["agent_loop/slowest/response_length"]! },
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
