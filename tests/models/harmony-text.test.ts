import { describe, expect, test } from "bun:test";
import { harmonyText } from "../../infra/sim-engine/harmony-text.ts";
import { HarmonyToolCallParser } from "../../shared/tools/harmony-parser.ts";
import { gptOssTokenizer } from "./gpt-oss-tokenizer.ts";

const p = new HarmonyToolCallParser();

describe("sim policy turns in harmony", () => {
  test("a call turn: analysis then the call, ending with <|call|>; the harmony parser reads the call back", async () => {
    const h = harmonyText('<think>\nLet me compute 12*3-5.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "12*3-5"}}\n</tool_call>');
    expect(h).toBe('<|channel|>analysis<|message|>Let me compute 12*3-5.<|end|><|start|>assistant<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expression":"12*3-5"}<|call|>');
    expect(p.extract(h).calls.map((c) => [c.name, c.arguments])).toEqual([["calc", { expression: "12*3-5" }]]);
    const tok = await gptOssTokenizer();
    expect(tok.encode(h).at(-1)).toBe(200012);
  });

  test("a final turn ends with <|return|> and its content is the answer", () => {
    const h = harmonyText("<think>\nThe tool says 31.\n</think>\n\nThe answer is 31.\n#### 31");
    expect(h).toBe("<|channel|>analysis<|message|>The tool says 31.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 31.\n#### 31<|return|>");
    expect(p.extract(h)).toEqual({ content: "The answer is 31.\n#### 31", calls: [], errors: [] });
  });

  test("a malformed call stays malformed and becomes a parse error", () => {
    const h = harmonyText('<tool_call>\n{"name": "calc", "arguments": {"expression": }}\n</tool_call>');
    expect(h).toBe('<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expression": }<|call|>');
    expect(p.extract(h).errors.map((e) => e.name)).toEqual(["calc"]);
  });
});
