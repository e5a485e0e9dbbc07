import { InvalidArgumentError } from "commander";

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

/** A number of seconds, > 0 (or >= 0 with `allowZero`): `--lease`, `--store-timeout`, `--idle-exit`, ... */
export function secondsFlag(flag: string, opts: { allowZero?: boolean } = {}): (v: string) => number {
  return (v) => {
    const s = v.trim();
    const n = Number(s);
    if (!NUM.test(s) || !Number.isFinite(n) || n < 0 || (n === 0 && !opts.allowZero)) {
      throw new InvalidArgumentError(`${flag} must be ${opts.allowZero ? "a number of seconds >= 0" : "a positive number of seconds"}, got '${v}'`);
    }
    return n;
  };
}

/** A TCP port, 0..65535 (0: any free port). */
export const portFlag = intFlag("--port", 0, 65535);

/** Milliseconds per token, >= 0 (a fraction allowed): the simulator's latency model flags. */
export function msPerTokenFlag(flag: string): (v: string) => number {
  return (v) => {
    const s = v.trim();
    const n = Number(s);
    if (!NUM.test(s) || !Number.isFinite(n) || n < 0) throw new InvalidArgumentError(`${flag} must be a number of milliseconds >= 0, got '${v}'`);
    return n;
  };
}
