import type { LoopLagMonitor } from "../telemetry/loop-lag.ts";
import type { PromFamily } from "../telemetry/prometheus.ts";

/**
 * Why a session waits to start: `in_flight` — the process runs its
 * `concurrency` sessions already; `loop_lag` — the event loop's lag p99 is
 * over `limits.max_event_loop_lag_ms` (the process is past its ceiling: more
 * sessions would only make every call later).
 */
export type HoldReason = "in_flight" | "loop_lag";

/** Options of {@link SessionAdmission}. */
export interface SessionAdmissionOptions {
  /** Most sessions running at once in this process (config `concurrency`), ≥ 1. */
  maxInFlight: number;
  /** Hold new sessions while the lag p99 is above this, ms; null or absent: never by lag. */
  maxLagMs?: number | null;
  /** The process's lag monitor; without one, no hold by lag. */
  lag?: LoopLagMonitor | null;
}

/**
 * Process-wide admission of sessions (issue 32 item 4: back-pressure instead
 * of collapse): every batch of the process (and every job a worker runs)
 * takes a slot before its session starts and gives it back when the session
 * ends. A slot is free while fewer than `maxInFlight` sessions run and the
 * event loop's lag p99 is within `maxLagMs`; but one session always runs
 * (a lagging process still makes progress). Waiters start in arrival order,
 * when a session ends or a lag sample falls back within the bound.
 */
export class SessionAdmission {
  private running = 0;
  private readonly waiters: { go: () => void; reason: HoldReason }[] = [];
  private readonly heldTotal: Record<HoldReason, number> = { in_flight: 0, loop_lag: 0 };
  /** The wait of {@link lagCleared}'s callers (one at a time), or null. */
  private lagWait: Promise<void> | null = null;
  private readonly unsubscribe: (() => void) | null;

  constructor(private readonly opts: SessionAdmissionOptions) {
    if (!(Number.isInteger(opts.maxInFlight) && opts.maxInFlight >= 1)) throw new RangeError("SessionAdmission: maxInFlight must be an integer >= 1");
    this.unsubscribe = opts.lag && opts.maxLagMs != null ? opts.lag.onSample(() => this.pump()) : null;
  }

  /** Sessions holding a slot now. */
  get inFlight(): number {
    return this.running;
  }

  /** Sessions waiting for a slot now (and job workers' claims held by lag). */
  get held(): number {
    return this.waiters.length + (this.lagWait ? 1 : 0);
  }

  /** Why a session asking now would wait, or null when it would start at once. */
  holdReason(): HoldReason | null {
    if (this.running >= this.opts.maxInFlight) return "in_flight";
    if (this.running > 0 && this.lagging()) return "loop_lag";
    return null;
  }

  /** Whether the lag p99 is over `maxLagMs` now (whatever runs): a job worker then claims one job at most. */
  lagging(): boolean {
    const { lag, maxLagMs } = this.opts;
    return lag != null && maxLagMs != null && lag.p99Ms() > maxLagMs;
  }

  /**
   * Takes a slot: resolves at once when one is free, else once one frees up
   * (arrival order). The returned function gives the slot back (calling it
   * again does nothing).
   */
  async acquire(): Promise<() => void> {
    const reason = this.waiters.length ? (this.holdReason() ?? "in_flight") : this.holdReason();
    if (reason !== null) {
      this.heldTotal[reason]++;
      await new Promise<void>((go) => this.waiters.push({ go, reason }));
    } else this.running++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.running--;
      this.pump();
    };
  }

  /**
   * Takes a slot without waiting (a caller that bounds its own concurrency:
   * the job worker claims at most `concurrency` jobs). Returns the release.
   */
  track(): () => void {
    this.running++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.running--;
      this.pump();
    };
  }

  /**
   * Resolves once the lag no longer holds new sessions (at once when it does
   * not now). A job worker awaits it before claiming more jobs, so the jobs
   * stay in the stream for other workers; it counts as a held session
   * (reason `loop_lag`) while it waits.
   */
  lagCleared(): Promise<void> {
    if (this.holdReason() !== "loop_lag" || !this.opts.lag) return Promise.resolve();
    if (this.lagWait) return this.lagWait;
    this.heldTotal.loop_lag++;
    const lag = this.opts.lag;
    this.lagWait = new Promise<void>((resolve) => {
      const off = lag.onSample(() => {
        if (this.holdReason() === "loop_lag") return;
        off();
        this.lagWait = null;
        resolve();
      });
    });
    return this.lagWait;
  }

  /** Stops following the lag monitor (the admission keeps working on slots alone). */
  close(): void {
    this.unsubscribe?.();
  }

  /** The admission's Prometheus families (docs/metrics.md). */
  families(): PromFamily[] {
    const reason = this.waiters.length ? (this.holdReason() ?? "in_flight") : null;
    const heldBy = (r: HoldReason) => (r === reason ? this.waiters.length : 0) + (r === "loop_lag" && this.lagWait ? 1 : 0);
    const fams: PromFamily[] = [
      { name: "edgeloop_sessions_in_flight", help: "Sessions of this process holding an admission slot (running), of at most edgeloop_sessions_max_in_flight.", type: "gauge", samples: [{ value: this.running }] },
      { name: "edgeloop_sessions_max_in_flight", help: "Most sessions this process runs at once (config concurrency).", type: "gauge", samples: [{ value: this.opts.maxInFlight }] },
      {
        name: "edgeloop_sessions_held",
        help: "Sessions waiting for an admission slot now, by what holds them (in_flight: the process runs concurrency sessions; loop_lag: event-loop lag p99 over limits.max_event_loop_lag_ms).",
        type: "gauge",
        samples: (["in_flight", "loop_lag"] as const).map((r) => ({ labels: { reason: r }, value: heldBy(r) })),
      },
      {
        name: "edgeloop_sessions_held_total",
        help: "Sessions that had to wait for an admission slot, by what held them when they began waiting.",
        type: "counter",
        samples: (["in_flight", "loop_lag"] as const).map((r) => ({ labels: { reason: r }, value: this.heldTotal[r] })),
      },
    ];
    return fams;
  }

  private pump(): void {
    while (this.waiters.length && this.holdReason() === null) {
      this.running++;
      this.waiters.shift()!.go();
    }
  }
}

/**
 * The event-loop lag families for `/metrics`: `edgeloop_event_loop_lag_seconds`
 * (the newest sample), `edgeloop_event_loop_lag_p99_seconds` (p99 over the
 * monitor's window) and `edgeloop_event_loop_lag_max_seconds` (the largest
 * since start).
 */
export function loopLagFamilies(lag: LoopLagMonitor): PromFamily[] {
  const how = `how late a ${lag.intervalMs} ms timer fires`;
  return [
    { name: "edgeloop_event_loop_lag_seconds", help: `Event-loop lag of this process (${how}): the newest sample.`, type: "gauge", samples: [{ value: lag.lastMs() / 1000 }] },
    { name: "edgeloop_event_loop_lag_p99_seconds", help: `Event-loop lag of this process (${how}): p99 over its last samples (what limits.max_event_loop_lag_ms holds new sessions on).`, type: "gauge", samples: [{ value: lag.p99Ms() / 1000 }] },
    { name: "edgeloop_event_loop_lag_max_seconds", help: "The largest event-loop lag sample of this process since it started.", type: "gauge", samples: [{ value: lag.maxMs() / 1000 }] },
  ];
}
