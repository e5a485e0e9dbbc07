/**
 * Linear-time checks for scans of model and tool text (issue 26, item 2):
 * the time of a text path on a long hostile input, as a ratio to a plain
 * scan of the same text measured in the same run (so a loaded or slow
 * machine moves both).
 */

/** The floor every text path pays: one pass reading each UTF-16 code unit (returns a checksum so the loop is not elided). */
export function plainScan(text: string): number {
  let h = 0;
  for (let i = 0; i < text.length; i++) h = (h * 31 + text.charCodeAt(i)) | 0;
  return h;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Result of {@link timeRatio}: medians in ms, and their ratio. */
export interface TimeRatio {
  ms: number;
  plainMs: number;
  ratio: number;
}

/**
 * Times `fn(text)` against {@link plainScan}`(text)`: one warm-up each, then
 * `reps` alternating runs; returns the medians (ms) and `ms / plainMs`.
 * The plain scan is repeated 8 times per sample (and divided) so its time is
 * well above the timer's resolution.
 */
export function timeRatio(text: string, fn: (text: string) => unknown, reps = 5): TimeRatio {
  let sink = plainScan(text);
  fn(text);
  const plain: number[] = [];
  const run: number[] = [];
  for (let r = 0; r < reps; r++) {
    const a = performance.now();
    for (let k = 0; k < 8; k++) sink ^= plainScan(text);
    const b = performance.now();
    fn(text);
    const c = performance.now();
    plain.push((b - a) / 8);
    run.push(c - b);
  }
  if (sink === 0.5) console.log(sink);
  const plainMs = Math.max(median(plain), 1e-3);
  const ms = median(run);
  return { ms, plainMs, ratio: ms / plainMs };
}

/**
 * The bound the tests assert: a text path on ≥ 100,000 hostile characters
 * costs at most this many plain scans of the same text. Linear paths measure
 * 1–200× here (see `bun bench/linear-time.ts`, target ≤ 20× for the worst
 * case of each parser); a quadratic one costs 10⁴–10⁶× at that length, so the
 * loose bound holds on a loaded 2-core machine and still fails for O(n²).
 */
export const LINEAR_BOUND = 2000;

/** The hostile texts every text path is fed: long runs of whitespace, newlines, repeated delimiters and unterminated markers, each ≥ `n` characters. */
export function hostileTexts(delimiters: readonly string[], n = 100_000): Record<string, string> {
  const fill = (unit: string) => unit.repeat(Math.ceil(n / unit.length));
  const out: Record<string, string> = {
    spaces: fill(" ") + "x",
    newlines: fill("\n") + "x",
    "mixed blanks": fill(" \n\t\r"),
    "blank run then text": `a${fill(" ")}b${fill("\n")}c`,
    "think unterminated": fill("<think>"),
    "think close repeated": fill("</think>"),
    "think blank body": `<think>${fill("\n")}x</think>${fill(" ")}y`,
  };
  for (const d of delimiters) {
    out[`${d} repeated`] = fill(d);
    out[`${d} + blanks`] = fill(`${d} \n`);
    out[`${d} then blanks`] = d + fill(" ") + "x";
    out[`blanks then ${d}`] = fill(" ") + d;
  }
  return out;
}
