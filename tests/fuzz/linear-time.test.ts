import { describe, expect, setDefaultTimeout, test } from "bun:test";
import { parseReply, splitReasoning } from "../../shared/agent-gateway/conversation.ts";
import { extractFinalAnswer, parseAnswerNumber } from "../../shared/reward/final-answer.ts";
import { ruleReward } from "../../shared/reward/rule-reward.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { createToolCallParser, toolCallParserNames } from "../../shared/tools/index.ts";
import { visibleSpans } from "../../shared/tools/reasoning-spans.ts";
import { firstJsonObject, visibleText } from "../../shared/agent-loop/openenv-agent.ts";
import { truncateToolResponse } from "../../shared/tools/truncate.ts";
import { familyText } from "../../infra/sim-engine/family-text.ts";
import { harmonyText } from "../../infra/sim-engine/harmony-text.ts";
import { lookupFact } from "../../infra/tools/lookup.ts";
import { gsm8kUserReply } from "../../infra/tools/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { terminalSafe } from "../../infra/cli/terminal-text.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { segments, toolCallTokens, visibleToken } from "../../functions/viewer/client/segments.ts";
import { hostileFor, hostileTexts, linearCheck } from "../helpers/linear-time.ts";

// Each test times many repetitions of ≥ 100,000-character inputs: minutes on a loaded 2-core machine, not seconds.
// The bounds are ratios to a plain scan in the same run, so a slow machine changes the time, not the verdict.
setDefaultTimeout(180_000);

/**
 * Issue 26 item 2 (S3): every scan of sampled or tool text is linear. Each
 * path gets long runs of blanks, newlines, repeated delimiters and
 * unterminated markers (≥ 100,000 characters) and must cost at most
 * LINEAR_BOUND plain scans of the same text, measured in the same run.
 * `bun bench/linear-time.ts` prints the measured ratios.
 */

function expectLinear(what: string, text: string, fn: (t: string) => unknown): void {
  expect(text.length).toBeGreaterThanOrEqual(100_000);
  const r = linearCheck(text, fn);
  if (process.env.LINEAR_VERBOSE) console.log(`${r.ratio.toFixed(1).padStart(8)}×  ${r.ms.toFixed(2).padStart(9)} ms  ${r.ratio4 === undefined ? "" : `(4×: ${r.ratio4.toFixed(1)}×) `}${JSON.stringify(what)}`);
  // The message names the case when it fails.
  expect({ what, ...r, superLinear: r.superLinear }).toEqual({ what, ...r, superLinear: false });
}

describe("tool-call parsers (every registered family)", () => {
  for (const name of toolCallParserNames()) {
    test(`${name}: hostile text costs a bounded number of plain scans`, () => {
      const p = createToolCallParser(name);
      for (const [what, text] of Object.entries(hostileFor(name))) expectLinear(`${name}: ${what}`, text, (t) => p.extract(t));
    });
  }

  test("reasoning spans (pythonic's visible parts)", () => {
    for (const [what, text] of Object.entries(hostileTexts(["<", "<think", "</think"]))) expectLinear(what, text, visibleSpans);
  });
});

describe("openenv_agent: a turn's action", () => {
  test("the JSON action (whole text, fenced block, balanced braces) and the visible text", () => {
    const texts = { ...hostileTexts(["{", "}", '"', "```", "```json\n", "<think>", "</think>"]), "unbalanced objects": '{"a": "'.repeat(20_000), "invalid objects": '{"a" 1} '.repeat(15_000) };
    for (const [what, text] of Object.entries(texts)) {
      expectLinear(`firstJsonObject: ${what}`, text, firstJsonObject);
      expectLinear(`visibleText: ${what}`, text, visibleText);
    }
  });
});

/** A tokenizer stand-in whose decode returns the text under test: parseReply's own scans are what is measured. */
function textTokenizer(family: string, text: () => string): ChatTokenizer {
  return { decode: () => text(), isStopToken: () => false, traits: { family } } as unknown as ChatTokenizer;
}

describe("agent gateway: reasoning split and reply parsing", () => {
  const FAMILIES: [family: string, parser: string][] = [
    ["qwen3", "hermes"],
    ["llama3_1", "llama3_json"],
    ["deepseek_v3", "deepseek_v3"],
    ["gemma3", "pythonic"],
    ["gpt_oss", "harmony"],
  ];
  test("the audit's repro (80,000 newlines inside <think>; here 100,000) splits in one pass, exactly", () => {
    const text = `<think>\nx${"\n".repeat(100_000)}y</think>ok`;
    expect(splitReasoning("qwen3", text)).toEqual({ reasoning: `x${"\n".repeat(100_000)}y`, rest: "ok" });
    expect(splitReasoning("qwen3", `<think>\n\nr\n\n</think>\n\nanswer\n`)).toEqual({ reasoning: "r", rest: "answer\n" });
    expectLinear("audit repro", text, (t) => splitReasoning("qwen3", t));
  });

  for (const [family, parserName] of FAMILIES) {
    test(`${family}: splitReasoning and parseReply on hostile text`, () => {
      const parser = createToolCallParser(parserName);
      let current = "";
      const tok = textTokenizer(family, () => current);
      const texts = { ...hostileTexts(["</think>", "<think>"]), ...hostileFor(parserName) };
      for (const [what, text] of Object.entries(texts)) {
        expectLinear(`${family} split: ${what}`, text, (t) => splitReasoning(family, t));
        expectLinear(`${family} reply: ${what}`, text, (t) => {
          current = t;
          return parseReply(tok, parser, [1], { toolChoice: "auto", session: "s", outputIndex: 0, turn: 0, stop: ["never-there", "\u0000\u0001"] });
        });
      }
    });
  }

  test("parseReply trims as before: leading newlines, trailing white space", () => {
    const tok = textTokenizer("qwen3", () => `<think>r</think>\n\n  answer \n\t ${" ".repeat(50)}`);
    expect(parseReply(tok, createToolCallParser("hermes"), [1], { toolChoice: "none", session: "s", outputIndex: 0, turn: 0 }).message).toEqual({ role: "assistant", content: "  answer", reasoning_content: "r" });
  });
});

describe("simulated engine: family text conversions", () => {
  const fam = (family: string) => ({ traits: { family } }) as unknown as ChatTokenizer;
  const texts = () => ({
    ...hostileTexts(["<tool_call>", "</tool_call>", "<think>", "</think>", '<tool_call>{"name": "f", "arguments":', '{"name": "f", "arguments":']),
    "audit repro (S21): a call then 320,000 spaces": `<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>${" ".repeat(320_000)}`,
    "open arguments then blanks": `<tool_call>{"name": "f", "arguments":${" ".repeat(100_000)}x</tool_call>`,
  });
  for (const family of ["llama3_1", "deepseek_v3", "gemma3", "gpt_oss"]) {
    test(`${family}: familyText is linear`, () => {
      for (const [what, text] of Object.entries(texts())) expectLinear(`${family}: ${what}`, text, (t) => familyText(fam(family), t));
    });
  }
  test("harmonyText is linear", () => {
    for (const [what, text] of Object.entries(texts())) expectLinear(what, text, harmonyText);
  });
});

describe("simulated engine: stop strings", () => {
  test("the token that completes a stop string, on ≥ 100,000 characters of reply (decode cost included)", async () => {
    const tok = await defaultTokenizer();
    const engine = new SimEngine({ tokenizer: tok });
    const cases: Record<string, [text: string, stops: string[]]> = {
      "words, stop at the end": [`${"word ".repeat(20_000)}STOP`, ["never", "STOP"]],
      "newlines, stop at the end": [`${"\n".repeat(100_000)}x</stop>`, ["</stop>"]],
      "stop near the start": [`a STOP ${"word ".repeat(20_000)}`, ["STOP"]],
      "stop never there": ["word ".repeat(20_000), ["STOP", "\n\n"]],
      "repeated delimiter, stop split over tokens": [`${"<tool_call>".repeat(10_000)}</tool_call>`, ["call></tool"]],
    };
    // Ids per text, encoded on the (untimed) warm-up call, so the check's 4× text is encoded too.
    const encoded = new Map<string, number[]>();
    const idsOf = (t: string) => encoded.get(t) ?? encoded.set(t, tok.encode(t)).get(t)!;
    for (const [what, [text, stops]] of Object.entries(cases)) expectLinear(`stopStringAt: ${what}`, text, (t) => engine.stopStringAt(idsOf(t), stops));
    const ids = tok.encode(cases["words, stop at the end"]![0]);
    const hit = engine.stopStringAt(ids, ["STOP"])!;
    expect(hit.stop).toBe("STOP");
    expect(tok.decode(ids.slice(0, hit.index + 1)).endsWith("STOP")).toBe(true);
    expect(tok.decode(ids.slice(0, hit.index)).includes("STOP")).toBe(false);
  });
});

describe("rewards on model answers", () => {
  const texts = () => ({
    ...hostileTexts(["####", "#### ", "####\n", "1,", ",000", "$", "-", ".", "1", "-$.", "</think>"]),
    digits: "1".repeat(100_000),
    "grouped digits": "1,000".repeat(20_000),
  });
  test("extractFinalAnswer, parseAnswerNumber and the rule reward", () => {
    for (const [what, text] of Object.entries(texts())) {
      expectLinear(`extract: ${what}`, text, extractFinalAnswer);
      expectLinear(`number: ${what}`, text, parseAnswerNumber);
      expectLinear(`rule: ${what}`, text, (t) => ruleReward(t, "42"));
      // The example interaction (simulated user) reads the answer after #### too.
      expectLinear(`gsm8k user: ${what}`, text, (t) =>
        gsm8kUserReply({ messages: [{ role: "assistant", content: t }], interaction_kwargs: { ground_truth: "42" }, turn: 1 } as unknown as Parameters<typeof gsm8kUserReply>[0]),
      );
    }
  });
});

describe("tool text", () => {
  test("truncation (every side) and the example lookup tool", () => {
    for (const [what, text] of Object.entries(hostileTexts(["🙂", "é", "\ud83d"]))) {
      for (const side of ["left", "right", "middle"] as const) expectLinear(`truncate ${side}: ${what}`, text, (t) => truncateToolResponse(t, 1000, side));
      expectLinear(`lookup: ${what}`, text, lookupFact);
    }
  });
});

describe("CLI output of model/tool text (S14)", () => {
  test("terminalSafe on control-heavy and plain text", () => {
    for (const [what, text] of Object.entries(hostileTexts(["\u001b[2J", "\u001b]0;x\u0007", "\u202e", "\u009b", "\r"]))) {
      expectLinear(`keep newlines: ${what}`, text, (t) => terminalSafe(t));
      expectLinear(`one line: ${what}`, text, (t) => terminalSafe(t, { newlines: false }));
    }
  });
});

describe("viewer client: token segmentation (runs in the browser on stored text)", () => {
  test("segments, tool-call tokens and token cells on long hostile responses", () => {
    const piecesOf = (text: string) => {
      // One piece per 4 characters, as tokens split text; alternating mask runs of 50 tokens.
      const pieces: string[] = [];
      for (let i = 0; i < text.length; i += 4) pieces.push(text.slice(i, i + 4));
      return { pieces, mask: pieces.map((_, i) => (Math.floor(i / 50) % 2 === 0 ? 1 : 0)) };
    };
    for (const [what, text] of Object.entries(hostileTexts(["<tool_call>", "</tool_call>", "<tool_call>x</tool_call>", "<|im_start|>user", "<tool_response>"]))) {
      expectLinear(`segments: ${what}`, text, (t) => {
        const { pieces, mask } = piecesOf(t);
        return segments(mask, pieces);
      });
      expectLinear(`tool-call tokens, one run: ${what}`, text, (t) => {
        const { pieces } = piecesOf(t);
        return toolCallTokens(pieces, 0, pieces.length);
      });
      expectLinear(`tool-call tokens, per run: ${what}`, text, (t) => {
        const { pieces, mask } = piecesOf(t);
        return segments(mask, pieces).map((s) => toolCallTokens(pieces, s.start, s.end));
      });
      expectLinear(`cells: ${what}`, text, (t) => piecesOf(t).pieces.map(visibleToken));
    }
  });
});
