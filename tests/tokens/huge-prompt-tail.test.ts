import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { builtinTokenizer } from "../../shared/models/index.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";
import { buildPromptIds, preTokenBoundaryAtOrBefore } from "../../shared/tokens/prompt.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 26 S18 follow-up: a huge prompt is encoded from a cut near its end only where the cut is a pre-token
// boundary (right after a newline followed by a non-blank, for the GPT-4-style byte-level pre-tokenizers);
// the kept ids must always be the last prompt_length ids of the whole encoding. A cut inside a pre-token (one
// unbroken 40,001-character word, a 40,000-digit run on Llama 3.1) used to give other ids.
const PROMPT_LENGTH = 64;

/** The kept ids the whole render's encoding gives, and how many characters each encode of buildPromptIds read. */
function both(tok: ChatTokenizer, content: string): { kept: number[]; expected: number[]; encoded: number[] } {
  const msgs: ChatMessage[] = [{ role: "user", content }];
  const encoded: number[] = [];
  const original = tok.encode.bind(tok);
  (tok as { encode: (t: string) => number[] }).encode = (t: string) => (encoded.push(t.length), original(t));
  let kept: number[];
  try {
    kept = buildPromptIds(tok, msgs, { promptLength: PROMPT_LENGTH }).promptIds;
  } finally {
    delete (tok as { encode?: unknown }).encode;
  }
  const full = tok.renderIds(msgs, { addGenerationPrompt: true });
  return { kept, expected: full.slice(full.length - PROMPT_LENGTH), encoded };
}

describe("huge prompts: the tail is cut only at a pre-token boundary", async () => {
  const families = ["qwen3", "llama3_1", "gpt_oss", "deepseek_v3", "gemma3"] as const;
  const toks = new Map<string, ChatTokenizer>();
  for (const f of families) toks.set(f, await builtinTokenizer(f));

  test("which tokenizers cut at newlines: the three GPT-4-style byte-level ones; Gemma 3 and DeepSeek V3 encode whole", () => {
    expect(families.map((f) => [f, toks.get(f)!.preTokenBoundariesKnown()])).toEqual([["qwen3", true], ["llama3_1", true], ["gpt_oss", true], ["deepseek_v3", false], ["gemma3", false]]);
  });

  test("the boundary scan: after a newline before a non-blank, or a space between letters, within the window, else null", () => {
    expect(preTokenBoundaryAtOrBefore("ab\ncd\n ef", 8, 8)).toBe(3);
    expect(preTokenBoundaryAtOrBefore("ab\ncd\nef", 7, 7)).toBe(6);
    expect(preTokenBoundaryAtOrBefore("ab\ncd\nef", 5, 1)).toBeNull();
    expect(preTokenBoundaryAtOrBefore("abcdef", 5, 5)).toBeNull();
    expect(preTokenBoundaryAtOrBefore("a\n\u3000b\ncc", 6, 6)).toBe(5);
    // A space between two letters; not one after a digit, a blank or before punctuation.
    expect(preTokenBoundaryAtOrBefore("word word", 8, 8)).toBe(4);
    expect(preTokenBoundaryAtOrBefore("9 a  b.c", 7, 7)).toBeNull();
  });

  for (const f of families) {
    test(`${f}: one unbroken 40,001-character word and a 40,000-digit run keep the whole encoding's last ids`, () => {
      const tok = toks.get(f)!;
      for (const content of [`start ${"a".repeat(40_001)} end`, `n = ${"7".repeat(40_000)}`]) {
        const r = both(tok, content);
        expect(r.kept).toEqual(r.expected);
      }
    }, HANG_MS);

    test(`${f}: random long texts (words, digit runs, newlines, CRLF, CJK, emoji, combining marks) keep the whole encoding's last ids`, () => {
      const tok = toks.get(f)!;
      const need = 2 * (PROMPT_LENGTH + 64) * tok.maxTokenChars() + 1;
      const piece = fc.oneof(
        fc.constantFrom("\n", "\r\n", "\n\n", " ", "  ", "\t", ".", "!?", "数学", "🎉", "e\u0301", "'s", "----", "\n ", " \n", " word", "Ab cD", "x y", " 's"),
        fc.integer({ min: 1, max: 3000 }).map((n) => "w".repeat(n)),
        fc.integer({ min: 1, max: 3000 }).map((n) => "9".repeat(n)),
        fc.string({ minLength: 1, maxLength: 20 }),
      );
      let tails = 0;
      fc.assert(
        fc.property(fc.array(piece, { minLength: 1, maxLength: 60 }), (pieces) => {
          let content = pieces.join("");
          while (content.length < need) content += `\n${pieces.join("")}`;
          const r = both(tok, content);
          if (r.encoded.some((n) => n > 1000 && n < content.length)) tails++;
          expect(r.kept).toEqual(r.expected);
        }),
        { numRuns: 6, seed: 26 },
      );
      // The cut is taken where it can be (every text here has newlines before its last window).
      expect(tails > 0).toBe(tok.preTokenBoundariesKnown());
    }, HANG_MS);
  }
});
