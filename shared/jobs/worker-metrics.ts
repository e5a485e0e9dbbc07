import type { WorkerSummary } from "./job-worker.ts";
import type { PromFamily } from "../telemetry/prometheus.ts";

/** The job events a worker counts, in {@link WorkerSummary}'s order. */
const EVENTS = ["claimed", "completed", "failed", "reclaimed", "abandoned", "cancelled", "surplus", "refused", "capped"] as const;

/**
 * A worker's own job counts as `GET /metrics` families (`edgeloop worker --metrics-port`):
 * `edgeloop_worker_jobs_total{event}` — the worker's running summary (`claimed`; `completed`, of
 * which `failed` and `refused` are subsets; `reclaimed` of `claimed`; `abandoned`, `cancelled`,
 * `surplus`; `capped`: spells held by the store-wide running cap), counters since the process started — and the gauges `edgeloop_worker_jobs_running`
 * and `edgeloop_worker_concurrency` (jobs at once, `--concurrency`).
 */
export function workerFamilies(summary: WorkerSummary, running: number, concurrency: number): PromFamily[] {
  return [
    {
      name: "edgeloop_worker_jobs_total",
      help: "Jobs this worker handled, by event (the fields of its exit summary): claimed; completed (failed and refused are subsets of it); reclaimed (of claimed: taken over from a dead worker); abandoned, cancelled, surplus; capped (spells held by the store-wide running cap, --max-running-total).",
      type: "counter",
      samples: EVENTS.map((event) => ({ labels: { event }, value: summary[event] })),
    },
    { name: "edgeloop_worker_jobs_running", help: "Jobs this worker is running now.", type: "gauge", samples: [{ value: running }] },
    { name: "edgeloop_worker_concurrency", help: "Jobs this worker runs at once (--concurrency).", type: "gauge", samples: [{ value: concurrency }] },
  ];
}
