import { describe, expect, test } from "bun:test";
import { Llama3JsonToolCallParser } from "../../shared/tools/llama3-json-parser.ts";
import { createToolCallParser } from "../../shared/tools/parser-registry.ts";
import { linearCheck } from "../helpers/linear-time.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const p = new Llama3JsonToolCallParser();

describe("llama3_json parser", () => {
  test("registered under its name", () => {
    expect(createToolCallParser("llama3_json").name).toBe("llama3_json");
  });

  test("the documented call: one JSON object with name and parameters", () => {
    expect(p.extract('{"name": "calc", "parameters": {"expression": "2+2"}}')).toEqual({
      content: "",
      calls: [{ index: 0, name: "calc", arguments: { expression: "2+2" }, raw: '{"name": "calc", "parameters": {"expression": "2+2"}}' }],
      errors: [],
    });
  });

  test("<|python_tag|> prefix, \"arguments\" key, parameters as a JSON string", () => {
    const r = p.extract('<|python_tag|>{"name": "a", "arguments": {"x": 1}}; {"name": "b", "parameters": "{\\"y\\": [2]}"}');
    expect(r.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([
      [0, "a", { x: 1 }],
      [1, "b", { y: [2] }],
    ]);
    expect(r.errors).toEqual([]);
    expect(r.content).toBe("");
  });

  test("delimiters inside strings are kept: braces, ';' and the separator pattern", () => {
    const raw = '{"name": "echo", "parameters": {"text": "a}; {\\"name\\": \\"evil\\"} ; }{"}}';
    const r = p.extract(raw);
    expect(r.calls).toEqual([{ index: 0, name: "echo", arguments: { text: 'a}; {"name": "evil"} ; }{' }, raw }]);
    expect(r.errors).toEqual([]);
  });

  test("unicode arguments survive", () => {
    const r = p.extract('{"name": "say", "parameters": {"t": "héllo 世界 🎉 \\u00e9"}}');
    expect(r.calls[0]!.arguments).toEqual({ t: "héllo 世界 🎉 é" });
  });

  test("a plain answer has no calls; a JSON answer without name/parameters is content", () => {
    expect(p.extract("The answer is 4.\n#### 4")).toEqual({ content: "The answer is 4.\n#### 4", calls: [], errors: [] });
    expect(p.extract('{"answer": 4}')).toEqual({ content: '{"answer": 4}', calls: [], errors: [] });
  });

  test("malformed calls become errors the model sees, never silently dropped", () => {
    const bad = p.extract('{"name": "calc", "parameters": {"expression": "2*7",}}');
    expect(bad.calls).toEqual([]);
    expect(bad.errors).toEqual([
      {
        index: 0,
        name: "calc",
        raw: '{"name": "calc", "parameters": {"expression": "2*7",}}',
        message: `Invalid JSON in tool call for 'calc'; a tool call must be a JSON object {"name": <tool name>, "parameters": <JSON object>}; several calls are separated by ";".`,
      },
    ]);
    const open = p.extract('{"name": "calc", "parameters": {"expression": "2');
    expect(open.errors.map((e) => [e.index, e.name, e.message.split(";")[0]])).toEqual([[0, "calc", "The tool call to 'calc' is not a complete JSON object (its braces never close)"]]);
    const noName = p.extract('{"parameters": {"x": 1}}');
    expect(noName.errors.map((e) => e.message.split(";")[0])).toEqual(['Invalid tool call: "name" is missing or not a non-empty string']);
    const badArgs = p.extract('{"name": "f", "parameters": [1]}');
    expect(badArgs.errors.map((e) => [e.name, e.message])).toEqual([["f", "Invalid parameters for 'f': parameters must be a JSON object."]]);
    const code = p.extract('<|python_tag|>brave_search.call(query="x")');
    expect(code.errors.map((e) => e.message.split(";")[0])).toEqual(["Invalid tool call after <|python_tag|>: only JSON tool calls are supported"]);
  });

  test("a good and a bad call keep the model's order", () => {
    const r = p.extract('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {oops}}; {"name": "c", "parameters": {}}');
    expect(r.calls.map((c) => [c.index, c.name])).toEqual([
      [0, "a"],
      [2, "c"],
    ]);
    expect(r.errors.map((e) => [e.index, e.name])).toEqual([[1, "b"]]);
  });

  test("calls drafted inside reasoning are never executed", () => {
    expect(p.extract('<think>maybe {"name": "rm", "parameters": {}}</think>The answer is 4.')).toEqual({
      content: '<think>maybe {"name": "rm", "parameters": {}}</think>The answer is 4.',
      calls: [],
      errors: [],
    });
    expect(p.extract('<think>{"name": "rm", "parameters": {}}').calls).toEqual([]);
    const after = p.extract('<think>plan</think>\n{"name": "calc", "parameters": {"expression": "1"}}');
    expect(after.calls.map((c) => c.name)).toEqual(["calc"]);
    expect(after.content).toBe("<think>plan</think>");
  });

  test("calls separated by a newline or by nothing are all calls (vLLM and SGLang read them)", () => {
    const r = p.extract('{"name": "a", "parameters": {"x": 1}}\n{"name": "b", "parameters": {"y": 2}}{"name": "c", "arguments": {}}');
    expect(r).toEqual({
      content: "",
      calls: [
        { index: 0, name: "a", arguments: { x: 1 }, raw: '{"name": "a", "parameters": {"x": 1}}' },
        { index: 1, name: "b", arguments: { y: 2 }, raw: '{"name": "b", "parameters": {"y": 2}}' },
        { index: 2, name: "c", arguments: {}, raw: '{"name": "c", "arguments": {}}' },
      ],
      errors: [],
    });
  });

  test("after a newline, a JSON object that is not a call stays content; a broken call there is an error", () => {
    const answer = p.extract('{"name": "a", "parameters": {}}\n{"result": 4}');
    expect([answer.calls.map((c) => c.name), answer.errors, answer.content]).toEqual([["a"], [], '{"result": 4}']);
    const broken = p.extract('{"name": "a", "parameters": {}}\n{"name": "b", "parameters": {"y": ');
    expect(broken.calls.map((c) => c.name)).toEqual(["a"]);
    expect(broken.errors.map((e) => [e.index, e.name, e.message.split(";")[0]])).toEqual([[1, "b", "The tool call to 'b' is not a complete JSON object (its braces never close)"]]);
  });

  test('"parameters" and "arguments" with different values is an error; equal values are one call', () => {
    const both = p.extract('{"name": "f", "parameters": {"a": 1}, "arguments": {"a": 2}}');
    expect(both.calls).toEqual([]);
    expect(both.errors.map((e) => [e.name, e.message.split("; a tool call")[0]])).toEqual([
      ["f", `Invalid tool call to 'f': both "arguments" and "parameters" are given with different values; give the arguments once`],
    ]);
    expect(p.extract('{"name": "f", "parameters": {"a": 1}, "arguments": {"a": 1}}').calls.map((c) => c.arguments)).toEqual([{ a: 1 }]);
  });

  test("long hostile inputs stay linear", () => {
    const inputs = ['{"name": "f", "parameters": {}}\n'.repeat(40_000), `{"name": "f", "parameters": {}}${"{".repeat(100_000)}`, `{"name": "f", "parameters": {}}\n${'{"a": "'.repeat(40_000)}`];
    for (const s of inputs) {
      // Cost relative to a plain scan of the same text, measured in the same run (tests/helpers/linear-time.ts).
      expect(linearCheck(s, (t) => p.extract(t))).toMatchObject({ superLinear: false });
    }
  }, HANG_MS);

  test("objects that became errors stay in content as written; parsed calls leave it", () => {
    const r = p.extract('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {oops}}; {"name": "c", "parameters": {}} done');
    expect([r.calls.map((c) => c.name), r.errors.map((e) => e.name)]).toEqual([["a", "c"], ["b"]]);
    expect(r.content).toBe('{"name": "b", "parameters": {oops}}\ndone');
    const open = p.extract('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1');
    expect(open.content).toBe('{"name": "b", "parameters": {"x": 1');
    expect(p.extract("<|python_tag|>brave_search.call(query=1)").content).toBe("<|python_tag|>brave_search.call(query=1)");
  });

  test("text after the last call stays content", () => {
    const r = p.extract('{"name": "a", "parameters": {}} then more');
    expect(r.calls.map((c) => c.name)).toEqual(["a"]);
    expect(r.content).toBe("then more");
  });
});
