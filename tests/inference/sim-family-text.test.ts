import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { familyText } from "../../infra/sim-engine/family-text.ts";
import { harmonyText } from "../../infra/sim-engine/harmony-text.ts";
import { callHead, thinkBlocks, toolCallBlocks, without } from "../../infra/sim-engine/qwen-turn.ts";

// The regexes the one-pass readers replace (S21: quadratic on long blank runs and unclosed blocks), as the reference.
const THINK_G = /<think>[\s\S]*?<\/think>\s*/g;
const CALL_G = /\s*<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g;
const HEAD = /^\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*([\s\S]*)\}$/;

function refCalls(text: string): { rest: string; bodies: string[] } {
  const bodies: string[] = [];
  const rest = text.replace(CALL_G, (_m, body: string) => {
    bodies.push(body);
    return "";
  });
  return { rest, bodies };
}

const pieces = fc.constantFrom("<think>", "</think>", "<tool_call>", "</tool_call>", "{", "}", '"name"', '"arguments"', ":", ",", '"f"', '"', "\\", "\\n", "\n", " ", "\t", "\u00a0", "\u2028", "\ufeff", "x", "1", "[]", '{"a": 1}');
const turn = fc.oneof(fc.string(), fc.array(pieces, { maxLength: 30 }).map((a) => a.join("")));
const headLike = fc.array(fc.constantFrom("{", "}", '"name"', '"arguments"', ":", ",", '"f"', '"', "\\", "\\\\", '\\"', "\n", "\r", " ", "\u3000", "x", "1"), { maxLength: 16 }).map((a) => `{${a.join("")}}`);

describe("the sim's Qwen-turn readers equal the regexes they replace (property)", () => {
  test("think blocks: all of them, and the first one", () => {
    fc.assert(
      fc.property(turn, (s) => {
        expect(without(s, thinkBlocks(s))).toBe(s.replace(THINK_G, ""));
        const m = /<think>([\s\S]*?)<\/think>\s*/.exec(s);
        const b = thinkBlocks(s, true)[0];
        expect(b ? [b.start, b.end - b.start, b.body] : null).toEqual(m ? [m.index, m[0].length, m[1]!] : null);
      }),
      { numRuns: 3000 },
    );
  });

  test("tool-call blocks: bodies and the text left", () => {
    fc.assert(
      fc.property(turn, (s) => {
        const blocks = toolCallBlocks(s);
        const ref = refCalls(s);
        expect([blocks.map((b) => b.body), without(s, blocks)]).toEqual([ref.bodies, ref.rest]);
      }),
      { numRuns: 3000 },
    );
  });

  test("call heads", () => {
    fc.assert(
      fc.property(fc.oneof(headLike, turn.map((s) => s.trim())), (body) => {
        const m = HEAD.exec(body);
        expect(callHead(body)).toEqual(m ? { name: m[1]!, args: m[2]! } : null);
      }),
      { numRuns: 5000 },
    );
    expect(callHead('{"name": "f", "arguments": {"a": 1}}')).toEqual({ name: '"f"', args: '{"a": 1}' });
    expect(callHead('{ "name" : "a\\"b" ,\n"arguments":\t}')).toEqual({ name: '"a\\"b"', args: "" });
    expect(callHead('{"name": "a\\\nb", "arguments": {}}')).toBeNull();
  });

  test("familyText and harmonyText on scripted turns (as before)", () => {
    const fam = (family: string) => ({ traits: { family } }) as unknown as ChatTokenizer;
    const t = '<think>plan</think>\n\nLet me call.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "6*7"}}\n</tool_call>\n  <tool_call>{"name": "g", "arguments": oops}</tool_call>  ';
    expect(familyText(fam("llama3_1"), t)).toBe('Let me call.\n{"name": "calc", "parameters": {"expression": "6*7"}}; {"name": "g", "parameters": oops}');
    expect(familyText(fam("gemma3"), t)).toBe("Let me call.\n[calc(expression=\"6*7\"), g(oops)]");
    expect(familyText(fam("deepseek_v3"), t)).toBe(
      'Let me call.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{"expression":"6*7"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>g\n```json\noops\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    );
    expect(harmonyText(t)).toBe(
      "<|channel|>analysis<|message|>plan<|end|><|start|>assistant<|channel|>commentary<|message|>Let me call.<|end|><|start|>assistant<|channel|>commentary to=functions.calc <|constrain|>json<|message|>" +
        '{"expression":"6*7"}<|call|><|start|>assistant<|channel|>commentary to=functions.g <|constrain|>json<|message|>oops<|call|>',
    );
    expect(familyText(fam("qwen3"), t)).toBe(t);
  });
});

describe("stopStringAt: the galloping search finds what decoding every prefix found (property)", () => {
  test("random replies and stop strings, multi-byte characters split over tokens included", async () => {
    const tok = await defaultTokenizer();
    const engine = new SimEngine({ tokenizer: tok });
    const naive = (ids: number[], stops: string[]) => {
      const found = (text: string) => stops.find((s) => s.length > 0 && text.includes(s));
      for (let k = 0; k < ids.length; k++) {
        const stop = found(tok.decode(ids.slice(0, k + 1)));
        if (stop !== undefined) return { index: k, stop };
      }
      return undefined;
    };
    const word = fc.constantFrom("I", " cannot", " help", " with", " that", ".", "\n", "  ", "é", "🙂", "你好", "<tool_call>", "</tool_call>", "<|im_end|>", "ab", "ba");
    const stop = fc.constantFrom("help", " with th", "\n", "🙂", "好", "a", "ab", "</tool_call>", "<|im_end|>", "never", "\uFFFD");
    fc.assert(
      fc.property(fc.array(word, { maxLength: 30 }), fc.array(stop, { minLength: 1, maxLength: 3 }), (words, stops) => {
        const ids = tok.encode(words.join(""));
        expect(engine.stopStringAt(ids, stops)).toEqual(naive(ids, stops));
      }),
      { numRuns: 1500 },
    );
  });
});
