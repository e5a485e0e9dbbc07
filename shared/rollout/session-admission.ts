import type { LoopLagMonitor } from "../telemetry/loop-lag.ts";
import type { PromFamily } from "../telemetry/prometheus.ts";

/**
 * Why a session waits to start: `in_flight` — the process runs its
 * `concurrency` sessions already; `loop_lag` — the event loop's recent lag is
 * over `limits.max_event_loop_lag_ms` (or the start ramp waits for the next lag sample) (the process is past its ceiling: more
 * sessions would only make every call later).
 */
export type HoldReason = "in_flight" | "loop_lag";

/**
 * What `/metrics` reports held sessions by: a {@link HoldReason}, or
 * `store_cap` — a queue-mode worker's claims held by the store-wide running
 * cap (`worker --max-running-total`: the workers of the prefix run that many
 * sessions already); one held session while it lasts.
 */
export type HeldMetricReason = HoldReason | "store_cap";
const HELD_REASONS = ["in_flight", "loop_lag", "store_cap"] as const;

/** Lag samples {@link SessionAdmission} reads: the largest of the newest 5 (100 ms at the default 20 ms interval). */
export const ADMISSION_LAG_SAMPLES = 5;
/** Sessions a lag-bounded admission starts between two lag samples at most: a ramp, so the lag is seen before it has grown. */
export const ADMISSION_STARTS_PER_SAMPLE = 64;

/** Options of {@link SessionAdmission}. */
export interface SessionAdmissionOptions {
  /** Most sessions running at once in this process (config `concurrency`), ≥ 1. */
  maxInFlight: number;
  /** Hold new sessions while the recent lag (the largest of the newest {@link ADMISSION_LAG_SAMPLES} samples) is above this, ms; null or absent: never by lag. */
  maxLagMs?: number | null;
  /** The process's lag monitor; without one, no hold by lag. */
  lag?: LoopLagMonitor | null;
}

/**
 * Process-wide admission of sessions (issue 32 item 4: back-pressure instead
 * of collapse): every batch of the process (and every job a worker runs)
 * takes a slot before its session starts and gives it back when the session
 * ends. A slot is free while fewer than `maxInFlight` sessions run and,
 * with a lag bound and a running monitor, the event loop's newest lag
 * samples are within `maxLagMs` and fewer than
 * {@link ADMISSION_STARTS_PER_SAMPLE} sessions started since the last
 * sample (so thousands of sessions admitted at once cannot stall the loop
 * before its lag is even measured); but one session always runs (a lagging
 * process still makes progress). Waiters start in arrival order, when a
 * session ends or at a lag sample within the bound.
 */
export class SessionAdmission {
  private running = 0;
  /** Sessions started since the last lag sample (the ramp of {@link ADMISSION_STARTS_PER_SAMPLE}). */
  private startsSinceSample = 0;
  private readonly waiters: { go: () => void; reason: HoldReason }[] = [];
  private readonly heldTotal: Record<HeldMetricReason, number> = { in_flight: 0, loop_lag: 0, store_cap: 0 };
  /** A job worker's claims are held by the store-wide running cap now ({@link setStoreCapHeld}). */
  private storeCapHeld = false;
  /** The wait of {@link lagCleared}'s callers (one at a time), or null. */
  private lagWait: Promise<void> | null = null;
  private readonly unsubscribe: (() => void) | null;

  constructor(private readonly opts: SessionAdmissionOptions) {
    if (!(Number.isInteger(opts.maxInFlight) && opts.maxInFlight >= 1)) throw new RangeError("SessionAdmission: maxInFlight must be an integer >= 1");
    this.unsubscribe =
      opts.lag && opts.maxLagMs != null
        ? opts.lag.onSample(() => {
            this.startsSinceSample = 0;
            this.pump();
          })
        : null;
  }

  /** Sessions holding a slot now. */
  get inFlight(): number {
    return this.running;
  }

  /** Sessions waiting for a slot now (and a job worker's claims held by lag or by the store-wide cap: one each). */
  get held(): number {
    return this.waiters.length + (this.lagWait ? 1 : 0) + (this.storeCapHeld ? 1 : 0);
  }

  /**
   * A job worker says its claims are held by the store-wide running cap
   * (`on` true: a spell begins, counted once in
   * `edgeloop_sessions_held_total{reason="store_cap"}`; false: it ended).
   * Counts one held session while on.
   */
  setStoreCapHeld(on: boolean): void {
    if (on && !this.storeCapHeld) this.heldTotal.store_cap++;
    this.storeCapHeld = on;
  }

  /**
   * Why a session asking now would wait, or null when it would start at once:
   * `in_flight` when every slot is taken; `loop_lag` (with a lag bound, while
   * something runs) when the newest lag samples are over the bound, or when
   * {@link ADMISSION_STARTS_PER_SAMPLE} sessions started since the last
   * sample (the next sample says whether they made the loop lag).
   */
  holdReason(): HoldReason | null {
    if (this.running >= this.opts.maxInFlight) return "in_flight";
    if (this.running > 0 && this.bounded() && (this.startsSinceSample >= ADMISSION_STARTS_PER_SAMPLE || this.lagging())) return "loop_lag";
    return null;
  }

  /** Whether the lag of the newest {@link ADMISSION_LAG_SAMPLES} samples is over `maxLagMs` (whatever runs): a job worker then claims one job at most. */
  lagging(): boolean {
    const { lag, maxLagMs } = this.opts;
    return lag != null && maxLagMs != null && lag.recentMaxMs(ADMISSION_LAG_SAMPLES) > maxLagMs;
  }

  private bounded(): boolean {
    return this.opts.lag != null && this.opts.maxLagMs != null && this.opts.lag.running;
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
    } else {
      this.running++;
      this.startsSinceSample++;
    }
    return this.releaser();
  }

  /**
   * Takes a slot without waiting (a caller that bounds its own concurrency:
   * the job worker claims at most `concurrency` jobs). Returns the release.
   */
  track(): () => void {
    this.running++;
    return this.releaser();
  }

  /** The release of one slot held now: frees it once (later calls do nothing) and starts the next waiters. */
  private releaser(): () => void {
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
    const heldBy = (r: HeldMetricReason) => (r === reason ? this.waiters.length : 0) + (r === "loop_lag" && this.lagWait ? 1 : 0) + (r === "store_cap" && this.storeCapHeld ? 1 : 0);
    const fams: PromFamily[] = [
      { name: "edgeloop_sessions_in_flight", help: "Sessions of this process holding an admission slot (running), of at most edgeloop_sessions_max_in_flight.", type: "gauge", samples: [{ value: this.running }] },
      { name: "edgeloop_sessions_max_in_flight", help: "Most sessions this process runs at once (config concurrency).", type: "gauge", samples: [{ value: this.opts.maxInFlight }] },
      {
        name: "edgeloop_sessions_held",
        help: "Sessions waiting for an admission slot now, by what holds them (in_flight: the process runs concurrency sessions; loop_lag: recent event-loop lag over limits.max_event_loop_lag_ms, or the start ramp waiting for the next lag sample; store_cap: a worker's claims held by the store-wide running cap, --max-running-total).",
        type: "gauge",
        samples: HELD_REASONS.map((r) => ({ labels: { reason: r }, value: heldBy(r) })),
      },
      {
        name: "edgeloop_sessions_held_total",
        help: "Sessions that had to wait for an admission slot, by what held them when they began waiting.",
        type: "counter",
        samples: HELD_REASONS.map((r) => ({ labels: { reason: r }, value: this.heldTotal[r] })),
      },
    ];
    return fams;
  }

  private pump(): void {
    while (this.waiters.length && this.holdReason() === null) {
      this.running++;
      this.startsSinceSample++;
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
    { name: "edgeloop_event_loop_lag_p99_seconds", help: `Event-loop lag of this process (${how}): p99 over its last samples.`, type: "gauge", samples: [{ value: lag.p99Ms() / 1000 }] },
    { name: "edgeloop_event_loop_lag_max_seconds", help: "The largest event-loop lag sample of this process since it started.", type: "gauge", samples: [{ value: lag.maxMs() / 1000 }] },
  ];
}
