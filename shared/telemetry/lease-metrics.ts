import type { LeaseStoreStats } from "../tools/lease-store.ts";
import type { LeaseObserver } from "../tools/sandbox-leases.ts";
import { Histogram } from "./process-metrics.ts";
import type { PromFamily } from "./prometheus.ts";

/** Upper bounds (seconds) of the sandbox create latency buckets; `+Inf` is implied. */
export const CREATE_LATENCY_BUCKETS = [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300] as const;

/** Upper bounds (seconds) of the lease age at release buckets; `+Inf` is implied. */
export const LEASE_AGE_BUCKETS = [1, 10, 30, 60, 300, 600, 1800, 3600, 7200, 21600, 86400] as const;

/**
 * The sandbox lease metrics of `/metrics` (docs/metrics.md): this process's
 * create latency and lease ages at release (as a {@link LeaseObserver}),
 * and the store-wide figures every process shares (live leases by status,
 * creates, create failures, releases and reaps by reason) from {@link LeaseStoreStats}.
 */
export class LeaseMetricsCollector implements LeaseObserver {
  private readonly createLatency = new Histogram(CREATE_LATENCY_BUCKETS);
  private readonly ages = new Map<string, Histogram>();
  private failures = 0;

  created(ms: number): void {
    this.createLatency.observe(ms / 1000);
  }

  createFailed(): void {
    this.failures++;
  }

  released(reason: string, ageMs: number): void {
    let h = this.ages.get(reason);
    if (!h) this.ages.set(reason, (h = new Histogram(LEASE_AGE_BUCKETS)));
    h.observe(ageMs / 1000);
  }

  /**
   * The families to render with `formatPrometheus`: `stats` (the store's,
   * shared by every process on it) or null when the store could not be read
   * (its gauges are then left out rather than reported as zero).
   */
  families(stats: LeaseStoreStats | null): PromFamily[] {
    const out: PromFamily[] = [
      { name: "edgeloop_sandbox_create_duration_seconds", help: "Latency of each sandbox create this process made that answered a sandbox id (the successful attempt).", type: "histogram", samples: this.createLatency.samples() },
      { name: "edgeloop_sandbox_process_create_failures_total", help: "Sandbox create attempts of this process that failed (timeout, HTTP error, bad reply); each was released by its lease id.", type: "counter", samples: [{ value: this.failures }] },
      {
        name: "edgeloop_sandbox_lease_age_seconds",
        help: "Age of each lease this process released (from its create's grant to the release claim), by release reason.",
        type: "histogram",
        samples: [...this.ages].flatMap(([reason, h]) => h.samples({ reason })),
      },
    ];
    if (!stats) return out;
    const c = stats.counters;
    const byPrefix = (prefix: string) =>
      Object.entries(c)
        .filter(([k]) => k.startsWith(prefix))
        .map(([k, v]) => ({ labels: { reason: k.slice(prefix.length) }, value: v }));
    out.push(
      {
        name: "edgeloop_sandbox_leases",
        help: "Sandbox leases that exist now in the store (every process): creating, live, releasing.",
        type: "gauge",
        samples: [
          { labels: { status: "creating" }, value: stats.creating },
          { labels: { status: "live" }, value: stats.live },
          { labels: { status: "releasing" }, value: stats.releasing },
        ],
      },
      { name: "edgeloop_sandbox_creates_total", help: "Sandbox creates answered with a sandbox id, store-wide (rate() is creations/s).", type: "counter", samples: [{ value: c.confirmed ?? 0 }] },
      { name: "edgeloop_sandbox_create_failures_total", help: "Sandbox create attempts that failed, store-wide (each released by its lease id).", type: "counter", samples: [{ value: c.create_failed ?? 0 }] },
      { name: "edgeloop_sandbox_releases_total", help: "Leases released, store-wide, by reason (finished, failed, cancelled, surplus, deadline, create_failed, reaped_*).", type: "counter", samples: byPrefix("released:") },
      { name: "edgeloop_sandbox_reaped_total", help: "Leases the reaper claimed, store-wide, by why: reaped_ttl (the owner stopped refreshing it), reaped_create (a create never finished), reaped_release (a release did not complete).", type: "counter", samples: byPrefix("reaped:") },
    );
    return out;
  }
}
