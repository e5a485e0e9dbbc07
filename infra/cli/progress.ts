import { Presets, SingleBar } from "cli-progress";
import type { AppConfig } from "../../shared/config/app-config.ts";
import type { WaitCount } from "../../shared/telemetry/waits.ts";
import { terminalSafe } from "./terminal-text.ts";

/** Where a batch stands: sessions finished (of `total`), records streamed, failed records, sessions running. */
export interface ProgressCounts {
  finished: number;
  records: number;
  failed: number;
  running: number;
}

/** Options of {@link RolloutProgress}. */
export interface RolloutProgressOptions {
  /** Sessions in the batch. */
  total: number;
  /** Draw a bar (stderr is a terminal and `--no-progress` was not given); else plain lines. */
  tty: boolean;
  /** Writes one line (stderr). */
  log: (line: string) => void;
  /** Seconds without a finished session before a stall warning (repeated every as many seconds while stalled); 0: never. */
  stallWarnS: number;
  /** Seconds between plain progress lines (default 1, as before: logs and tests follow them). */
  lineEveryS?: number;
  /**
   * What the stall warning suggests checking (the engine and its timeout, or workers in queue mode);
   * a function is asked at each warning (what the running sessions wait on then: {@link stallHintFor}).
   */
  stallHint: string | (() => string);
  /** Monotonic milliseconds (default `performance.now()`). */
  nowMs?: () => number;
  /** The bar's output stream (default stderr). */
  stream?: NodeJS.WritableStream;
}

/**
 * The progress of `edgeloop rollout` (sessions finished of the batch, records,
 * failed, rate in sessions/s and the ETA at that rate): a cli-progress bar on
 * a terminal, else a plain `progress` line at most every `lineEveryS` seconds
 * and one (once) when the batch completes. Independently of either, while no session
 * has finished for `stallWarnS` seconds it prints a `warning` line saying so
 * (how long, how many are running, {@link RolloutProgressOptions.stallHint}),
 * once per such period. Call {@link update} on every change and {@link tick}
 * on a timer (the stall and the time-based lines need no record to arrive).
 */
export class RolloutProgress {
  private readonly bar: SingleBar | null;
  private readonly t0: number;
  private readonly now: () => number;
  private lastLine = -Infinity;
  private lastChange: number;
  private lastStallWarn = -Infinity;
  private counts: ProgressCounts = { finished: 0, records: 0, failed: 0, running: 0 };
  private stopped = false;
  private finalShown = false;

  constructor(private readonly opts: RolloutProgressOptions) {
    this.now = opts.nowMs ?? (() => performance.now());
    this.t0 = this.now();
    this.lastChange = this.t0;
    this.bar = opts.tty
      ? new SingleBar(
          {
            format: "rollout |{bar}| {value}/{total} sessions | {records} records | {failed} failed | {rate} sessions/s | ETA {eta_text}",
            stream: opts.stream ?? process.stderr,
            etaBuffer: 50,
          },
          Presets.shades_classic,
        )
      : null;
    this.bar?.start(opts.total, 0, { records: 0, failed: 0, rate: "0.0", eta_text: "-" });
  }

  /** Sessions per second since the start, and the seconds left at that rate (null while nothing finished). */
  rate(): { perS: number; etaS: number | null } {
    const s = Math.max(1e-9, (this.now() - this.t0) / 1000);
    const perS = this.counts.finished / s;
    return { perS, etaS: perS > 0 ? (this.opts.total - this.counts.finished) / perS : null };
  }

  /** New counts (a record streamed, a session finished). */
  update(c: ProgressCounts): void {
    if (this.stopped) return;
    if (c.finished !== this.counts.finished) {
      this.lastChange = this.now();
      this.lastStallWarn = -Infinity;
    }
    this.counts = c;
    this.render(c.finished === this.opts.total);
  }

  /** Called on a timer: time-based lines and the stall warning. */
  tick(): void {
    if (this.stopped) return;
    this.render(false);
    const stallMs = this.opts.stallWarnS * 1000;
    if (stallMs <= 0 || this.counts.finished >= this.opts.total) return;
    const t = this.now();
    if (t - this.lastChange >= stallMs && t - this.lastStallWarn >= stallMs) {
      this.lastStallWarn = t;
      const line = `warning    no session finished for ${formatDuration((t - this.lastChange) / 1000)}: ${this.counts.finished}/${this.opts.total} finished, ${this.counts.running} running; ${typeof this.opts.stallHint === "function" ? this.opts.stallHint() : this.opts.stallHint}`;
      if (this.bar) {
        // A line above the bar, which is redrawn below it.
        this.bar.stop();
        this.opts.log(line);
        this.bar.start(this.opts.total, this.counts.finished, this.payload());
      } else this.opts.log(line);
    }
  }

  /** Ends the bar (the summary follows). */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.bar?.stop();
  }

  private payload(): Record<string, string | number> {
    const { perS, etaS } = this.rate();
    return { records: this.counts.records, failed: this.counts.failed, rate: perS.toFixed(1), eta_text: etaS === null ? "-" : formatDuration(etaS) };
  }

  private render(final: boolean): void {
    if (this.bar) {
      this.bar.update(this.counts.finished, this.payload());
      return;
    }
    const t = this.now();
    const every = (this.opts.lineEveryS ?? 1) * 1000;
    if (final ? this.finalShown : t - this.lastLine < every) return;
    if (final) this.finalShown = true;
    if (!final && this.counts.finished === 0 && this.counts.records === 0) return;
    this.lastLine = t;
    const { perS, etaS } = this.rate();
    const c = this.counts;
    this.opts.log(`progress   ${c.finished}/${this.opts.total} sessions, ${c.records} records (${c.failed} failed), ${perS.toFixed(1)} sessions/s${final ? "" : `, ETA ${etaS === null ? "-" : formatDuration(etaS)}`}`);
  }
}

/** Seconds as `42s`, `3m05s`, `2h10m`. */
export function formatDuration(s: number): string {
  const t = Math.max(0, Math.round(s));
  if (t < 60) return `${t}s`;
  if (t < 3600) return `${Math.floor(t / 60)}m${String(t % 60).padStart(2, "0")}s`;
  return `${Math.floor(t / 3600)}h${String(Math.floor((t % 3600) / 60)).padStart(2, "0")}m`;
}

/**
 * The stall warning's hint from what the running sessions wait on now (N5;
 * {@link WaitCount}s from `sessionWaits.snapshot()`, most first): each wait
 * named — the engine (with `engine.timeout_ms` and retries), a tool by name
 * (its `timeout_ms` per attempt and `max_retries` in the tools file), the
 * agent by URL (`agent.timeout_ms`), the reward webhook (`reward.*`) — as
 * `waiting on …; …`. With none open, `idle` (queue mode: the workers hint;
 * inline: sessions between calls, e.g. held by the admission gate).
 * Tool names come from model output: shown escaped and cut to 64 characters.
 */
export function stallHintFor(waits: readonly WaitCount[], config: Pick<AppConfig, "engine" | "agent" | "reward">, idle: string, held?: AdmissionHeld): string {
  const n = (c: number, what: string) => `${c} ${what}${c === 1 ? "" : "s"}`;
  const heldText = held && held.count > 0 ? heldHint(held, n) : null;
  if (waits.length === 0) return heldText ?? idle;
  const parts = waits.map((w) => {
    switch (w.kind) {
      case "engine":
        return `the engine (${n(w.count, "call")}): is it hung? A request waits up to engine.timeout_ms (${config.engine.timeout_ms} ms) and is retried ${config.engine.max_retries} times before its trajectory fails`;
      case "tool":
        return `tool \`${terminalSafe((w.name ?? "?").slice(0, 64), { newlines: false })}\` (${n(w.count, "call")}): a call waits up to the tool's timeout_ms per attempt and is retried max_retries times (tools file) before it becomes an error observation`;
      case "agent":
        return `the agent at ${terminalSafe(w.name ?? "agent.url", { newlines: false })} (${n(w.count, "session")}): it has agent.timeout_ms (${config.agent.timeout_ms} ms) to call the model and finish`;
      case "reward":
        return `the reward (${n(w.count, "call")}): a webhook call waits up to reward.timeout_ms (${config.reward.timeout_ms} ms) and is retried ${config.reward.max_retries} times`;
    }
  });
  return `waiting on ${parts.join("; ")}${heldText ? `; ${heldText}` : ""}`;
}

/** Sessions the process's admission holds at a stall warning (`SessionAdmission`): how many, why, and the figures behind it. */
export interface AdmissionHeld {
  count: number;
  reason: "in_flight" | "loop_lag" | null;
  /** Recent event-loop lag (what the admission reads), ms. */
  lagMs: number;
  /** `limits.max_event_loop_lag_ms`. */
  maxLagMs: number | null;
  /** `concurrency`. */
  concurrency: number;
}

function heldHint(h: AdmissionHeld, n: (c: number, what: string) => string): string {
  if (h.reason === "loop_lag") {
    return `${n(h.count, "session")} wait to start: the event-loop lag is ${Math.round(h.lagMs)} ms, over limits.max_event_loop_lag_ms (${h.maxLagMs} ms) — this process is past its orchestration ceiling (lower concurrency, or run workers in queue mode)`;
  }
  return `${n(h.count, "session")} wait for one of the process's concurrency (${h.concurrency}) slots`;
}
