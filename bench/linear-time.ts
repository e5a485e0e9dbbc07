/**
 * Worst-case cost of every scan of model and tool text on ≥ 100,000 hostile
 * characters, as a ratio to a plain scan of the same text (a charCode loop)
 * measured in the same run (issue 26, item 2; target ≤ 20× per parser).
 * Per path: the hostile case that costs most, its ratio (median of `--reps`),
 * and the ratio on that text repeated 4 times (≈ the same for a linear path,
 * 4× for one quadratic in the number of structures). Steady state: each
 * text runs 10 times (at most 200 ms) before it is timed, and the plain scan
 * is warmed first.
 *
 *   bun bench/linear-time.ts [--reps 7]
 */
import { parseReply, splitReasoning } from "../shared/agent-gateway/conversation.ts";
import { extractFinalAnswer } from "../shared/reward/final-answer.ts";
import { defaultTokenizer, type ChatTokenizer } from "../shared/tokens/tokenizer.ts";
import { createToolCallParser, toolCallParserNames } from "../shared/tools/index.ts";
import { truncateToolResponse } from "../shared/tools/truncate.ts";
import { familyText } from "../infra/sim-engine/family-text.ts";
import { SimEngine } from "../infra/sim-engine/sim-engine.ts";
import { terminalSafe } from "../infra/cli/terminal-text.ts";
import { segments, toolCallTokens } from "../functions/viewer/client/segments.ts";
import { hostileFor, hostileTexts, plainScan, timeRatio } from "../tests/helpers/linear-time.ts";
import { arg, printTable } from "./util.ts";

const reps = Number(arg("--reps", "7"));
const warm = " x".repeat(50_000);
for (let i = 0; i < 200; i++) plainScan(warm);
const rows: string[][] = [["path", "worst hostile case", "ratio", "ms", "ratio on 4× text"]];

/**
 * Steady state before timing: `fn(text)` runs 10 times (or for 200 ms). A loop over a long text is
 * compiled by the JIT in the background while the first calls run; measured cold, a path that costs 2
 * plain scans once compiled (the DeepSeek V3 parser on 12,500 orphan `</think>`) shows 30×.
 */
function warmUp(text: string, fn: (t: string) => unknown): void {
  const t0 = performance.now();
  for (let k = 0; k < 10 && performance.now() - t0 < 200; k++) fn(text);
}

function worst(path: string, texts: Record<string, string>, fn: (t: string) => unknown): void {
  let top: { what: string; ratio: number; ms: number; text: string } | undefined;
  for (const [what, text] of Object.entries(texts)) {
    warmUp(text, fn);
    const r = timeRatio(text, fn, reps);
    if (!top || r.ratio > top.ratio) top = { what, ratio: r.ratio, ms: r.ms, text };
  }
  const long = top!.text.repeat(4);
  warmUp(long, fn);
  const r4 = timeRatio(long, fn, reps);
  rows.push([path, top!.what.replace(/\n/g, "\\n").slice(0, 48), `${top!.ratio.toFixed(1)}×`, top!.ms.toFixed(2), `${r4.ratio.toFixed(1)}×`]);
}

for (const name of toolCallParserNames()) {
  const p = createToolCallParser(name);
  worst(`parser ${name}`, hostileFor(name), (t) => p.extract(t));
}

const FAMILIES: [string, string][] = [["qwen3", "hermes"], ["llama3_1", "llama3_json"], ["deepseek_v3", "deepseek_v3"], ["gemma3", "pythonic"], ["gpt_oss", "harmony"]];
for (const [family, parserName] of FAMILIES) {
  const parser = createToolCallParser(parserName);
  let current = "";
  const tok = { decode: () => current, isStopToken: () => false, traits: { family } } as unknown as ChatTokenizer;
  const texts = { ...hostileTexts(["</think>", "<think>"]), ...hostileFor(parserName) };
  worst(`gateway split ${family}`, texts, (t) => splitReasoning(family, t));
  worst(`gateway reply ${family}`, texts, (t) => {
    current = t;
    return parseReply(tok, parser, [1], { toolChoice: "auto", session: "s", outputIndex: 0, turn: 0, stop: ["never-there"] });
  });
}

const simTexts = {
  ...hostileTexts(["<tool_call>", "</tool_call>", "<think>", "</think>", '<tool_call>{"name": "f", "arguments":']),
  "call then 320,000 spaces": `<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>${" ".repeat(320_000)}`,
};
for (const family of ["llama3_1", "deepseek_v3", "gemma3", "gpt_oss"]) {
  const tok = { traits: { family } } as unknown as ChatTokenizer;
  worst(`sim familyText ${family}`, simTexts, (t) => familyText(tok, t));
}

const qwen = await defaultTokenizer();
const engine = new SimEngine({ tokenizer: qwen });
const encoded = new Map<string, number[]>();
const idsOf = (t: string) => encoded.get(t) ?? encoded.set(t, qwen.encode(t)).get(t)!;
worst("sim stopStringAt (decode included)", { "words, stop at the end": `${"word ".repeat(20_000)}STOP`, "delimiters, stop split over tokens": `${"<tool_call>".repeat(10_000)}</tool_call>` }, (t) =>
  engine.stopStringAt(idsOf(t), ["call></tool", "STOP"]),
);

worst("reward extractFinalAnswer", { ...hostileTexts(["####", "1,", ",000", "$", "-"]), digits: "1".repeat(100_000) }, extractFinalAnswer);
worst("truncate middle", hostileTexts(["🙂", "é"]), (t) => truncateToolResponse(t, 1000, "middle"));
worst("cli terminalSafe", { ...hostileTexts(["\u001b[2J", "\u001b]0;x\u0007", "\u202e"]) }, terminalSafe);
worst("viewer segments + tool-call tokens", hostileTexts(["<tool_call>x</tool_call>", "<tool_call>", "<|im_start|>user"]), (t) => {
  const pieces: string[] = [];
  for (let i = 0; i < t.length; i += 4) pieces.push(t.slice(i, i + 4));
  const mask = pieces.map((_, i) => (Math.floor(i / 50) % 2 === 0 ? 1 : 0));
  return segments(mask, pieces).map((s) => toolCallTokens(pieces, s.start, s.end));
});
// Not a scan edgeloop owns: the tokenizer library's BPE on one long pre-token (no word break), what an
// observation costs to encode before max_tool_response_length (default 256 characters) has cut it.
worst("encode (library BPE), informational", { letters: "a".repeat(100_000), spaces: " ".repeat(100_000), cjk: "你".repeat(100_000) }, (t) => qwen.encode(t));

printTable(`Text paths on ≥ 100,000 hostile characters: cost / plain scan, same run (medians of ${reps})`, rows);
