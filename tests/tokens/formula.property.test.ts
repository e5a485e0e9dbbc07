import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { BUILTIN_MODELS } from "../../shared/models/builtin-families.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { buildPromptIds, promptFormulaFallback } from "../../shared/tokens/prompt.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { tokenMethodFallbacks } from "../../shared/tokens/token-methods.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Property (issue 19), per built-in family: prompts and observations built from
// the template's text formula (system + tools block encoded once; observations
// tokenized from their text alone) have exactly the ids of today's render path
// (a full render of the prompt; the synthetic-conversation render of the
// observation), for random contents with whitespace edges, unicode, text that
// looks like special tokens or template syntax, and empty strings; with and
// without tools; for Qwen3 also with enable_thinking false.

const toks = new Map<string, ChatTokenizer>();
beforeAll(async () => {
  for (const n of BUILTIN_MODELS) toks.set(n, await builtinTokenizer(n));
}, HANG_MS);

const tools: ToolSchema[] = [
  { type: "function", function: { name: "calc", description: "evaluate", parameters: { type: "object", properties: { expr: { type: "string" } }, required: ["expr"] } } },
  { type: "function", function: { name: "lookup", description: "look up a word", parameters: { type: "object", properties: { q: { type: "string" } } } } },
];

const fragments = [
  " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u3000", "\ufeff", "\u0085", "\u001c", "\u2028",
  "x", "hello world", "Paris", "42", "3.14", "城市", "naïve", "🙂", "e\u0301",
  "<|im_end|>", "<|im_start|>", "<|endoftext|>", "<tool_response>", "</tool_response>", "<tool_call>", "<think>", "</think>",
  "<|eot_id|>", "<|eom_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|python_tag|>",
  "<start_of_turn>", "<end_of_turn>", "<bos>",
  "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>",
  "<｜User｜>", "<｜Assistant｜>", "<｜tool▁output▁begin｜>", "<｜tool▁outputs▁end｜>", "<｜end▁of▁sentence｜>",
  '{"a": 1, "b": [true, null]}', "[1, 2]", "{{ x }}", "{% if %}", "```tool_output", "```",
  "ElMark0kRaMlE", "continuous_token_tool",
];
/** Contents: empty, or 1–6 fragments, or any printable string. */
const content = fc.oneof(
  { weight: 1, arbitrary: fc.constant("") },
  { weight: 6, arbitrary: fc.array(fc.constantFrom(...fragments), { minLength: 1, maxLength: 6 }).map((a) => a.join("")) },
  { weight: 2, arbitrary: fc.string({ unit: "grapheme", maxLength: 20 }) },
);
const toolName = fc.option(fc.oneof(fc.constantFrom("calc", "lookup", "", "a b", "<|end|>"), content), { nil: undefined });

type Setting = { family: string; tools?: ToolSchema[]; kwargs?: Record<string, unknown> };
const settings: Setting[] = BUILTIN_MODELS.flatMap((family) => [
  { family },
  { family, tools },
  ...(family === "qwen3" ? [{ family, kwargs: { enable_thinking: false } }, { family, tools, kwargs: { enable_thinking: false } }] : []),
]);
const label = (s: Setting) => `${s.family}${s.tools ? " with tools" : ""}${s.kwargs ? " enable_thinking=false" : ""}`;

/** The observation's ids, or the error message the encoder raises. */
function attempt(f: () => number[]): number[] | string {
  try {
    return f();
  } catch (e) {
    return (e as Error).message;
  }
}

describe("prompt formula equals the full render", () => {
  for (const s of settings) {
    test(label(s), () => {
      const tok = toks.get(s.family)!;
      const opts = { tools: s.tools, chatTemplateKwargs: s.kwargs };
      // The shapes use a formula (so the properties below test it, not the fallback).
      expect(promptFormulaFallback(tok, [{ role: "user", content: "q" }], opts)).toBeUndefined();
      expect(promptFormulaFallback(tok, [{ role: "system", content: "s" }, { role: "user", content: "q" }], opts)).toBeUndefined();
      let n = 0;
      fc.assert(
        fc.property(fc.option(content, { nil: undefined }), content, fc.nat(), (system, user, salt) => {
          const messages: ChatMessage[] = system === undefined ? [] : [{ role: "system", content: system }];
          // A salt keeps the whole-prompt cache from answering: the formula path runs for each case.
          messages.push({ role: "user", content: `${user}${n++}·${salt}` });
          const want = tok.renderIds(messages, { ...opts, addGenerationPrompt: true });
          const got = buildPromptIds(tok, messages, { ...opts, promptLength: 1_000_000 });
          expect(got.truncated).toBe(false);
          expect(got.promptIds).toEqual(want);
          // Left truncation keeps the rightmost ids of the same encoding.
          const cut = Math.max(want.length - 3, 1);
          const r = attempt(() => buildPromptIds(tok, [...messages.slice(0, -1), { role: "user", content: `${user}${n++}·${salt}` }], { ...opts, promptLength: cut }).promptIds);
          const full = tok.renderIds([...messages.slice(0, -1), { role: "user", content: `${user}${n - 1}·${salt}` }], { ...opts, addGenerationPrompt: true });
          if (typeof r !== "string") expect(r).toEqual(full.slice(full.length - cut));
        }),
        { numRuns: 60 },
      );
    }, HANG_MS);
  }

  test("a cached system + tools block: two rows share it, each equals its own full render", () => {
    const tok = toks.get("qwen3")!;
    const a = buildPromptIds(tok, [{ role: "system", content: "Be brief." }, { role: "user", content: "first row" }], { tools, promptLength: 100_000 });
    const b = buildPromptIds(tok, [{ role: "system", content: "Be brief." }, { role: "user", content: "second row" }], { tools, promptLength: 100_000 });
    expect(a.promptIds).toEqual(tok.renderIds([{ role: "system", content: "Be brief." }, { role: "user", content: "first row" }], { tools, addGenerationPrompt: true }));
    expect(b.promptIds).toEqual(tok.renderIds([{ role: "system", content: "Be brief." }, { role: "user", content: "second row" }], { tools, addGenerationPrompt: true }));
    // Qwen3: the prompts differ only after the last <|im_start|> (151644) before the user turn.
    const k = a.promptIds.lastIndexOf(151644, a.promptIds.length - 4);
    expect(b.promptIds.slice(0, k)).toEqual(a.promptIds.slice(0, k));
    expect(a.promptIds.slice(k, k + 3)).toEqual([151644, 872, 198]);
  });
});

describe("observation formula equals the render path", () => {
  const shape = fc.oneof(
    fc.array(fc.record({ content, name: toolName }), { minLength: 1, maxLength: 3 }).map((rs) => ({ tools: rs, user: undefined as string | undefined })),
    content.map((u) => ({ tools: [] as { content: string; name?: string }[], user: u as string | undefined })),
    fc.record({ tools: fc.array(fc.record({ content, name: toolName }), { minLength: 1, maxLength: 3 }), user: content }),
  );
  for (const s of settings) {
    test(label(s), () => {
      const tok = toks.get(s.family)!;
      const opts = { tools: s.tools, chatTemplateKwargs: s.kwargs };
      expect(new ObservationEncoder(tok, opts).formulaFallbacks()).toEqual([]);
      expect(tokenMethodFallbacks(tok, opts)).toEqual([]);
      const last = fc.constantFrom(undefined, ...tok.stopTokenIds, 1234);
      fc.assert(
        fc.property(shape, last, fc.boolean(), (sh, lastId, closeTurn) => {
          const messages: ChatMessage[] = sh.tools.map((t) => (t.name === undefined ? { role: "tool" as const, content: t.content } : { role: "tool" as const, content: t.content, name: t.name }));
          if (sh.user !== undefined) messages.push({ role: "user", content: sh.user });
          // A fresh encoder per case, as each trajectory builds its own; the formulas are shared.
          const got = attempt(() => new ObservationEncoder(tok, opts).encode(messages, lastId, { closeTurn }));
          const want = attempt(() => new ObservationEncoder(tok, { ...opts, method: "render" }).encode(messages, lastId, { closeTurn }));
          expect(got).toEqual(want);
        }),
        { numRuns: 80 },
      );
    }, HANG_MS);
  }

  test("Qwen3: a tool result's ids are the separator, then the text's ids", () => {
    const tok = toks.get("qwen3")!;
    const ids = new ObservationEncoder(tok).encode([{ role: "tool", content: "  42 <|im_end|> " }], 151645);
    expect(ids).toEqual([198, ...tok.encode("<|im_start|>user\n<tool_response>\n  42 <|im_end|> \n</tool_response><|im_end|>\n<|im_start|>assistant\n")]);
  });

  test("Llama 3.1 trims tool results as its template does (JavaScript's whitespace set, as @huggingface/jinja's trim)", () => {
    const tok = toks.get("llama3_1")!;
    const content = "\ufeff\u00a0 result \n\u0085";
    const ids = new ObservationEncoder(tok).encode([{ role: "tool", content }], tok.eosTokenId);
    expect(ids).toEqual(new ObservationEncoder(tok, { method: "render" }).encode([{ role: "tool", content }], tok.eosTokenId));
    expect(ids).toEqual(tok.encode("<|start_header_id|>ipython<|end_header_id|>\n\nresult \n\u0085<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"));
  });
});

describe("huge prompts through the formula", () => {
  test("a huge system text: only the tail is tokenized, and the kept ids equal the whole encoding's last ids", () => {
    const tok = toks.get("qwen3")!;
    const words = ["alpha", " beta", "  gamma", "\n", "数学", "x+1=2", "emoji 🎉", "----", "tab\tsep", "  "];
    let s = "";
    for (let i = 0; s.length < 1_000_000; i++) s += words[(i * 7919) % words.length] + (i % 13 === 0 ? " " : "");
    const msgs: ChatMessage[] = [{ role: "system", content: s }, { role: "user", content: "and the question" }];
    expect(promptFormulaFallback(tok, msgs, { tools })).toBeUndefined();
    const full = tok.renderIds(msgs, { tools, addGenerationPrompt: true });
    for (const promptLength of [64, 500]) {
      const { promptIds, truncated } = buildPromptIds(tok, msgs, { tools, promptLength });
      expect(truncated).toBe(true);
      expect(promptIds).toEqual(full.slice(full.length - promptLength));
    }
  }, HANG_MS);
});
