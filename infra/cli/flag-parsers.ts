import { InvalidArgumentError } from "commander";
import { MAX_TIMER_MS, MAX_TIMER_SECONDS } from "../../shared/schema/config.ts";

/**
 * Parsers of numeric CLI flags for commander: each refuses a value that is
 * not a number in its range with one line naming the flag (commander then
 * fails the parse; main.ts turns that into exit code 2). A flag is never
 * silently ignored or replaced by its default.
 */

const INT = /^[+-]?\d+$/;
const NUM = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;

/** An integer flag in `[min, max]` (`max` optional): `--n`, `--concurrency`, `--eject-after`, ... */
export function intFlag(flag: string, min: number, max?: number): (v: string) => number {
  return (v) => {
    const s = v.trim();
    const n = Number(s);
    const range = max === undefined ? `>= ${min}` : `${min}..${max}`;
    if (!INT.test(s) || !Number.isSafeInteger(n) || n < min || (max !== undefined && n > max)) {
      throw new InvalidArgumentError(`${flag} must be an integer ${range}, got '${v}'`);
    }
    return n;
  };
}

/** The largest seconds flag: {@link MAX_TIMER_MS} in whole seconds (2147483 s, about 24.8 days), as each becomes a timer in ms. */
export { MAX_TIMER_SECONDS };

/**
 * A number of seconds, > 0 (or >= 0 with `allowZero`), at most
 * {@link MAX_TIMER_SECONDS} (the value becomes a timer in milliseconds):
 * `--lease`, `--store-timeout`, `--idle-exit`, ...
 */
export function secondsFlag(flag: string, opts: { allowZero?: boolean; min?: { seconds: number; why: string } } = {}): (v: string) => number {
  return (v) => {
    const s = v.trim();
    const n = Number(s);
    if (!NUM.test(s) || !Number.isFinite(n) || n < 0 || (n === 0 && !opts.allowZero)) {
      throw new InvalidArgumentError(`${flag} must be ${opts.allowZero ? "a number of seconds >= 0" : "a positive number of seconds"}, got '${v}'`);
    }
    if (opts.min && n < opts.min.seconds) throw new InvalidArgumentError(`${flag} must be at least ${opts.min.seconds} seconds (${opts.min.why}), got '${v}'`);
    if (n > MAX_TIMER_SECONDS) throw new InvalidArgumentError(`${flag} must be at most ${MAX_TIMER_SECONDS} seconds (setTimeout's largest delay), got '${v}'`);
    return n;
  };
}

/** A millisecond flag that ends in a timer: an integer in `[min, MAX_TIMER_MS]` (`--agent-timeout-ms`, `--attempt-timeout-ms`, ...). */
export function msFlag(flag: string, min: number): (v: string) => number {
  const int = intFlag(flag, min);
  return (v) => {
    const n = int(v);
    if (n > MAX_TIMER_MS) throw new InvalidArgumentError(`${flag} must be at most ${MAX_TIMER_MS} milliseconds (setTimeout's largest delay), got '${v}'`);
    return n;
  };
}

/** A TCP port, 0..65535 (0: any free port). */
export const portFlag = intFlag("--port", 0, 65535);

const UNIT_S: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86_400, w: 604_800 };

/**
 * Parses a duration flag (`--older-than`): a number with a unit `s`, `m`,
 * `h`, `d` or `w` (`36h`, `7d`, `1.5d`), or plain seconds (`3600`); 0 is
 * allowed (everything finished, whatever its age). Returns seconds.
 * @throws InvalidArgumentError naming the flag (exit 2).
 */
export function durationFlag(flag: string): (v: string) => number {
  return (v) => {
    const m = /^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$/.exec(v);
    if (!m) throw new InvalidArgumentError(`${flag} must be a duration such as 90s, 30m, 12h, 7d or 2w (or seconds), got '${v}'`);
    return Number(m[1]) * UNIT_S[m[2] || "s"]!;
  };
}

/** Milliseconds per token, >= 0 (a fraction allowed): the simulator's latency model flags. */
export function msPerTokenFlag(flag: string): (v: string) => number {
  return (v) => {
    const s = v.trim();
    const n = Number(s);
    if (!NUM.test(s) || !Number.isFinite(n) || n < 0) throw new InvalidArgumentError(`${flag} must be a number of milliseconds >= 0, got '${v}'`);
    return n;
  };
}

/** A positive number (a fraction allowed): `--epsilon`. */
export function positiveNumberFlag(flag: string): (v: string) => number {
  return (v) => {
    const s = v.trim();
    const n = Number(s);
    if (!NUM.test(s) || !Number.isFinite(n) || n <= 0) throw new InvalidArgumentError(`${flag} must be a number > 0, got '${v}'`);
    return n;
  };
}

/** A policy version (`--model-version`): 1–200 characters, not blank (the API's rule, `PolicyVersionValue`). */
export function versionFlag(flag: string): (v: string) => string {
  return (v) => {
    if (!/\S/.test(v) || v.length > 200) throw new InvalidArgumentError(`${flag} must be 1 to 200 characters and not blank, got '${v.slice(0, 50)}'`);
    if (v.trim() !== v || /[\u0000-\u001f\u007f]/.test(v)) throw new InvalidArgumentError(`${flag} must not start or end with whitespace or hold control characters, got ${JSON.stringify(v.slice(0, 50))}`);
    return v;
  };
}
