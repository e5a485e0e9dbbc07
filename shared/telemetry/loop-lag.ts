/**
 * Event-loop lag of this process, sampled: a timer armed every `intervalMs`
 * measures how late it fires (ms past its due time). A lag that grows means
 * the process has more ready work than one core runs in time — every engine
 * reply, tool reply and HTTP request waits behind it (issue 32: the
 * orchestration ceiling). Runtime-free: `setTimeout` and `performance.now`
 * only; the timer is unref'd where the runtime allows, so it never keeps a
 * process alive.
 */
export class LoopLagMonitor {
  private readonly samples: Float64Array;
  private next = 0;
  private filled = 0;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private due = 0;
  private readonly listeners = new Set<() => void>();
  private worst = 0;

  /**
   * @param intervalMs time between samples (default 20 ms).
   * @param window samples kept for the percentiles (default 100: the last ~2 s at 20 ms).
   */
  constructor(
    readonly intervalMs = 20,
    window = 100,
  ) {
    if (!(intervalMs >= 1)) throw new RangeError("LoopLagMonitor: intervalMs must be >= 1");
    this.samples = new Float64Array(Math.max(1, Math.floor(window)));
  }

  /** Starts sampling (again: a no-op while running). */
  start(): this {
    if (this.timer) return this;
    this.arm();
    return this;
  }

  /** Stops sampling; the samples so far are kept. */
  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  /** Whether it is sampling. */
  get running(): boolean {
    return this.timer !== null;
  }

  /** Records one lag sample, ms (the timer does; tests feed it directly). Listeners are called after it. */
  record(lagMs: number): void {
    const v = Math.max(0, lagMs);
    this.samples[this.next] = v;
    this.next = (this.next + 1) % this.samples.length;
    this.filled = Math.min(this.filled + 1, this.samples.length);
    if (v > this.worst) this.worst = v;
    for (const f of [...this.listeners]) f();
  }

  /** The `p`-th percentile (0–100) of the samples in the window, ms; 0 before any sample. */
  percentileMs(p: number): number {
    if (this.filled === 0) return 0;
    const s = this.samples.slice(0, this.filled).sort();
    return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
  }

  /** p99 of the window, ms. */
  p99Ms(): number {
    return this.percentileMs(99);
  }

  /** The newest sample, ms (0 before any). */
  lastMs(): number {
    return this.filled === 0 ? 0 : this.samples[(this.next - 1 + this.samples.length) % this.samples.length]!;
  }

  /** The largest of the newest `n` samples, ms (0 before any): the lag of the last `n × intervalMs`. */
  recentMaxMs(n: number): number {
    let m = 0;
    const k = Math.min(n, this.filled);
    for (let i = 1; i <= k; i++) m = Math.max(m, this.samples[(this.next - i + this.samples.length) % this.samples.length]!);
    return m;
  }

  /** The largest sample since the monitor was made, ms. */
  maxMs(): number {
    return this.worst;
  }

  /** Calls `f` after every sample; the returned function unsubscribes. */
  onSample(f: () => void): () => void {
    this.listeners.add(f);
    return () => this.listeners.delete(f);
  }

  private arm(): void {
    this.due = performance.now() + this.intervalMs;
    const t = setTimeout(() => {
      this.record(performance.now() - this.due);
      if (this.timer) this.arm();
    }, this.intervalMs);
    (t as { unref?: () => void }).unref?.();
    this.timer = t;
  }
}

/**
 * This process's lag monitor: started by the long-running commands (`serve`,
 * `rollout`, `worker`), read by their admission ({@link SessionAdmission})
 * and `/metrics`. Until started it holds no samples (lag 0).
 */
export const processLoopLag = new LoopLagMonitor();
