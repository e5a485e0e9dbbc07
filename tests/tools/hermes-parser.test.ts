import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { HermesToolCallParser } from "../../shared/tools/hermes-parser.ts";
import { linearCheck } from "../helpers/linear-time.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const p = new HermesToolCallParser();

describe("hermes parser", () => {
  test("one call, content keeps the prose", () => {
    const r = p.extract('Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call><|im_end|>');
    expect(r.calls).toEqual([{ index: 0, name: "calc", arguments: { expression: "2+2" }, raw: '\n{"name": "calc", "arguments": {"expression": "2+2"}}\n' }]);
    expect(r.errors).toEqual([]);
    expect(r.content).toBe("Let me compute.\n<|im_end|>");
  });

  test("C9: a call drafted inside <think> is not executed; the one after </think> is", () => {
    const text = '<think>\nplan: <tool_call>{"name": "A", "arguments": {}}</tool_call>\n</think>\n\n<tool_call>\n{"name": "A", "arguments": {}}\n</tool_call>';
    const r = p.extract(text);
    expect(r.calls.length).toBe(1);
    expect(r.calls[0]!.name).toBe("A");
    expect(r.calls[0]!.arguments).toEqual({});
    expect(r.calls[0]!.raw).toBe('\n{"name": "A", "arguments": {}}\n');
    expect(r.errors).toEqual([]);
    expect(r.content).toBe('<think>\nplan: <tool_call>{"name": "A", "arguments": {}}</tool_call>\n</think>\n\n');
  });

  test("C9: an unclosed think block yields no call from inside it", () => {
    const r = p.extract('<think>\nI will call <tool_call>{"name": "A", "arguments": {}}</tool_call> maybe');
    expect(r.calls).toEqual([]);
    expect(r.errors).toEqual([]);
  });

  test("an orphan </think> (template opened the think block) hides the calls before it", () => {
    const r = p.extract('draft <tool_call>{"name": "A", "arguments": {}}</tool_call></think>\n\n<tool_call>{"name": "B", "arguments": {"q": 1}}</tool_call>');
    expect(r.calls.map((c) => [c.index, c.name])).toEqual([[0, "B"]]);
  });

  test("a call before a think block counts, with the think block skipped", () => {
    const r = p.extract('<tool_call>{"name": "A", "arguments": {}}</tool_call><think>x<tool_call>{"name": "Z", "arguments": {}}</tool_call></think><tool_call>{"name": "B", "arguments": {}}</tool_call>');
    expect(r.calls.map((c) => [c.index, c.name])).toEqual([[0, "A"], [1, "B"]]);
  });

  test("</tool_call> inside a JSON string does not end the call", () => {
    const r = p.extract('<tool_call>{"name": "echo", "arguments": {"text": "say </tool_call> and \\"<think>\\" please"}}</tool_call>');
    expect(r.errors).toEqual([]);
    expect(r.calls).toHaveLength(1);
    expect(r.calls[0]!.arguments).toEqual({ text: 'say </tool_call> and "<think>" please' });
  });

  test("several calls per turn keep their order and indexes", () => {
    const r = p.extract(
      '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"y": [1, 2]}}\n</tool_call>\n<tool_call>\n{"name": "c", "arguments": {}}\n</tool_call>',
    );
    expect(r.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([
      [0, "a", { x: 1 }],
      [1, "b", { y: [1, 2] }],
      [2, "c", {}],
    ]);
    expect(r.content).toBe("\n\n");
  });

  test("C10: bad JSON is a ParseError naming the tool", () => {
    const r = p.extract('<tool_call>\n{"name": "calc", "arguments": {"x": 1,}}\n</tool_call>');
    expect(r.calls).toEqual([]);
    expect(r.errors).toEqual([
      {
        index: 0,
        name: "calc",
        raw: '\n{"name": "calc", "arguments": {"x": 1,}}\n',
        message: `Invalid JSON in tool call for 'calc'; a tool call must be <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.`,
      },
    ]);
  });

  test("arguments given as a JSON string holding an object are parsed", () => {
    const r = p.extract('<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>');
    expect(r.calls[0]!.arguments).toEqual({ expression: "1+1" });
  });

  test("arguments string that is not an object JSON, arrays, missing name", () => {
    const r = p.extract(
      '<tool_call>{"name": "a", "arguments": "not json"}</tool_call><tool_call>{"name": "b", "arguments": [1]}</tool_call><tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "d"}</tool_call>',
    );
    expect(r.errors.map((e) => [e.index, e.name, e.message])).toEqual([
      [0, "a", "Invalid JSON in arguments for 'a': the arguments string is not a JSON object."],
      [1, "b", "Invalid arguments for 'b': arguments must be a JSON object."],
      [2, undefined, 'Invalid tool call: "name" is missing or not a non-empty string; a tool call must be <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.'],
    ]);
    expect(r.calls).toEqual([{ index: 3, name: "d", arguments: {}, raw: '{"name": "d"}' }]);
  });

  test("an unclosed call is an error (e.g. a length stop mid-call)", () => {
    const r = p.extract('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "calc", "argu');
    expect(r.calls.map((c) => c.name)).toEqual(["a"]);
    expect(r.errors.map((e) => [e.index, e.name, e.message.startsWith("The tool call to 'calc' was not closed")])).toEqual([[1, "calc", true]]);
  });

  test("a last block whose JSON object is complete but has no </tool_call> is a call (vLLM and SGLang read it)", () => {
    const r = p.extract('Checking.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n');
    expect(r).toEqual({
      content: "Checking.\n",
      calls: [{ index: 0, name: "calc", arguments: { expression: "2+2" }, raw: '\n{"name": "calc", "arguments": {"expression": "2+2"}}\n' }],
      errors: [],
    });
    const after = p.extract('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": 1}}');
    expect(after.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([
      [0, "a", {}],
      [1, "b", { x: 1 }],
    ]);
    expect(after.errors).toEqual([]);
  });

  test("an unclosed block with text after its JSON is still an error", () => {
    const r = p.extract('<tool_call>{"name": "calc", "arguments": {}} and then');
    expect(r.calls).toEqual([]);
    expect(r.errors).toEqual([
      {
        index: 0,
        name: "calc",
        raw: '{"name": "calc", "arguments": {}} and then',
        message: `The tool call to 'calc' was not closed with </tool_call>; a tool call must be <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.`,
      },
    ]);
  });

  test('"parameters" is read like "arguments" (SGLang parse_base_json); both with different values is an error', () => {
    const r = p.extract('<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</tool_call>');
    expect(r.calls).toEqual([{ index: 0, name: "get_weather", arguments: { city: "Paris" }, raw: '{"name": "get_weather", "parameters": {"city": "Paris"}}' }]);
    expect(r.errors).toEqual([]);
    const same = p.extract('<tool_call>{"name": "f", "arguments": {"a": 1}, "parameters": {"a": 1}}</tool_call>');
    expect(same.calls.map((c) => c.arguments)).toEqual([{ a: 1 }]);
    const both = p.extract('<tool_call>{"name": "f", "arguments": {"a": 1}, "parameters": {"a": 2}}</tool_call>');
    expect(both.calls).toEqual([]);
    expect(both.errors).toEqual([
      {
        index: 0,
        name: "f",
        raw: '{"name": "f", "arguments": {"a": 1}, "parameters": {"a": 2}}',
        message: `Invalid tool call to 'f': both "arguments" and "parameters" are given with different values; give the arguments once; a tool call must be <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.`,
      },
    ]);
  });

  test("long hostile inputs on the unclosed-block path stay linear", () => {
    const inputs = [`<tool_call>{"name": "f", "arguments": {"a": "${"x".repeat(400_000)}"}}`, "<tool_call>{".repeat(40_000), `<tool_call>${'{"a":'.repeat(50_000)}`];
    for (const s of inputs) {
      // Cost relative to a plain scan of the same text, measured in the same run (tests/helpers/linear-time.ts).
      expect(linearCheck(s, (t) => p.extract(t))).toMatchObject({ superLinear: false });
    }
  }, HANG_MS);

  test("a block that became an error stays in content as written; parsed blocks leave it", () => {
    const r = p.extract('A <tool_call>{"name": "a", "arguments": {}}</tool_call> B <tool_call>{"name": "b", oops}</tool_call> C');
    expect(r.calls.map((c) => c.name)).toEqual(["a"]);
    expect(r.errors.map((e) => e.name)).toEqual(["b"]);
    expect(r.content).toBe('A  B <tool_call>{"name": "b", oops}</tool_call> C');
  });

  test("unbalanced quotes fall back to the first plain end tag", () => {
    const r = p.extract('<tool_call>{"name": "a", "arguments": {"x": "oops}}</tool_call> then <tool_call>{"name": "b", "arguments": {}}</tool_call>');
    expect(r.errors.map((e) => e.index)).toEqual([0]);
    expect(r.calls.map((c) => [c.index, c.name])).toEqual([[1, "b"]]);
  });

  test("unicode: names, values and escapes survive", () => {
    const r = new HermesToolCallParser().extract('<tool_call>\n{"name": "météo", "arguments": {"ville": "Zürich 🌧 東京", "e": "\\u00e9\\ud83d\\ude00"}}\n</tool_call>');
    expect(r.errors).toEqual([]);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["météo", { ville: "Zürich 🌧 東京", e: "é😀" }]]);
  });

  test("text without calls", () => {
    expect(p.extract("The answer is 42.<|im_end|>")).toEqual({ content: "The answer is 42.<|im_end|>", calls: [], errors: [] });
  });

  test("random strings never throw (property)", () => {
    const pieces = fc.constantFrom("<tool_call>", "</tool_call>", "<think>", "</think>", "{", "}", '"', "\\", ":", ",", '"name"', '"arguments"', "[", "]", " ", "\n", "a", "1");
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.array(pieces, { maxLength: 40 }).map((a) => a.join(""))), (s) => {
        const r = p.extract(s);
        expect(Array.isArray(r.calls) && Array.isArray(r.errors) && typeof r.content === "string").toBe(true);
        for (const c of r.calls) expect(typeof c.arguments === "object" && !Array.isArray(c.arguments)).toBe(true);
      }),
      { numRuns: 2000 },
    );
  });
});
