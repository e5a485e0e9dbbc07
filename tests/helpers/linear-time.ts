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

/** When a path costs more than this many plain scans, {@link linearCheck} also times it on the text repeated 4 times. */
export const GROWTH_CHECK_FROM = 50;

/** Result of {@link linearCheck}: the ratio at the given length, and at 4× that length when it was measured. */
export interface LinearCheck {
  ratio: number;
  ms: number;
  /** The ratio on `text.repeat(4)`; undefined when {@link GROWTH_CHECK_FROM} was not reached. */
  ratio4?: number;
  /** True when the path looks super-linear: over {@link LINEAR_BOUND}, or its ratio grew more than 2.5× on 4× the text. */
  superLinear: boolean;
}

/**
 * The linear-time check of one text path on one text: its cost in plain
 * scans must stay under {@link LINEAR_BOUND}, and when it is high (over
 * {@link GROWTH_CHECK_FROM}) it must not grow with the length — the text
 * repeated 4 times costs about the same number of plain scans for a linear
 * path and 4× as many for one quadratic in the number of structures (blocks,
 * matches × tokens), whose ratio at 100,000 characters can stay under the
 * bound. Quadratic rescans of one long run cost 10⁴× and more and fail the
 * bound itself.
 */
export function linearCheck(text: string, fn: (text: string) => unknown, reps = 3): LinearCheck {
  const once = (n: number): LinearCheck => {
    const r = timeRatio(text, fn, n);
    if (r.ratio <= GROWTH_CHECK_FROM) return { ratio: r.ratio, ms: r.ms, superLinear: false };
    const r4 = timeRatio(text.repeat(4), fn, n);
    return { ratio: r.ratio, ms: r.ms, ratio4: r4.ratio, superLinear: r.ratio > LINEAR_BOUND || r4.ratio > 2.5 * r.ratio };
  };
  const first = once(reps);
  // A loaded machine can stall one sample set: a verdict of super-linear must hold on a second, longer measurement.
  return first.superLinear ? once(2 * reps + 1) : first;
}

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

/** Delimiters of each parser's call syntax (a new parser without an entry still gets the generic texts). */
export const PARSER_DELIMITERS: Record<string, string[]> = {
  hermes: ["<tool_call>", "</tool_call>", '<tool_call>{"name": "f", "arguments": {', '{"a": "', "{"],
  qwen3_coder: ["<tool_call>", "</tool_call>", "<function=", "<function=f>", "<parameter=a>", "</parameter>", "</function>", "\n<parameter="],
  deepseek_v3: ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "```json\n", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"],
  harmony: ["<|start|>", "<|channel|>", "<|message|>", "<|call|>", "<|end|>", "<|channel|>commentary to=functions.f", "<|constrain|>", ' to=functions.f<|message|>{"a": "'],
  llama3_json: ["{", '{"name": "f", "parameters": {}}', '{"name": "f", "parameters": {}}\n', '{"a": "', '"', "; ", "<|python_tag|>"],
  pythonic: ["[", "[f(", "[f(a='", "a='x\n", "(", ",", "'''", '"""', "\\"],
};

/** A well-formed call per parser: prefixed to hostile tails, it sends the text down the paths that run after a parsed call. */
const VALID_CALL: Record<string, string> = {
  hermes: '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
  qwen3_coder: "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>",
  deepseek_v3: "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>",
  harmony: "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
  llama3_json: '{"name": "f", "parameters": {}}',
  pythonic: "[f(a=1)]",
};

/** The marker that closes a parser's calls (a regex like `\s*END` rescans blank runs before it). */
const END_MARKER: Record<string, string> = { hermes: "</tool_call>", qwen3_coder: "</tool_call>", deepseek_v3: "<｜tool▁calls▁end｜>", harmony: "<|call|>", llama3_json: "}", pythonic: "]" };

/** {@link hostileTexts} for one parser: its delimiters, and a well-formed call followed by long runs or repeated. */
export function hostileFor(name: string): Record<string, string> {
  const base = hostileTexts(PARSER_DELIMITERS[name] ?? []);
  const call = VALID_CALL[name];
  if (call) {
    base["call then blanks"] = `${call}${" ".repeat(100_000)}x`;
    base["call then newlines"] = `${call}${"\n".repeat(100_000)}x`;
    base["calls repeated"] = `${call} `.repeat(Math.ceil(100_000 / (call.length + 1)));
    base["call, blanks, then an end marker"] = `${call}${" ".repeat(100_000)}x${END_MARKER[name] ?? ""}`;
  }
  return base;
}

