import type { Timers } from "../../shared/agent-loop/trajectory-deadline.ts";

/**
 * {@link Timers} that fire only when the test says so, with a wall clock the
 * test moves: deadlines are tested without sleeping. `armed` lists the timers
 * set and not yet fired or cleared (delay in ms as requested).
 */
export class ManualTimers implements Timers {
  private next = 1;
  private readonly live = new Map<number, { fn: () => void; ms: number }>();
  /** Every delay ever requested, in order (ms). */
  readonly requested: number[] = [];
  /** Timers cleared so far. */
  cleared = 0;
  /** The wall clock, epoch ms. */
  now: number;

  constructor(startMs = 1_700_000_000_000) {
    this.now = startMs;
  }

  /** The wall clock as a function (`wallClockMs`). */
  readonly wall = (): number => this.now;

  set(fn: () => void, ms: number): unknown {
    const h = this.next++;
    this.live.set(h, { fn, ms });
    this.requested.push(ms);
    return h;
  }

  clear(handle: unknown): void {
    if (this.live.delete(handle as number)) this.cleared++;
  }

  /** Delays (ms) of the timers armed now. */
  get armed(): number[] {
    return [...this.live.values()].map((t) => t.ms);
  }

  /** Moves the clock by `ms` and fires every armed timer, due or not (each removed first; deadlines re-check the clock and re-arm). */
  advance(ms: number): void {
    this.now += ms;
    const due = [...this.live.entries()];
    this.live.clear();
    for (const [, t] of due) t.fn();
  }
}
