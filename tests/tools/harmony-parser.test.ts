import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { HarmonyToolCallParser, splitHarmonyMessages } from "../../shared/tools/harmony-parser.ts";
import { createToolCallParser } from "../../shared/tools/parser-registry.ts";
import { linearCheck } from "../helpers/linear-time.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const p = new HarmonyToolCallParser();
const SHAPE = "call a function with a message on the commentary channel addressed to functions.NAME whose content is a JSON object of its arguments.";

describe("harmony parser", () => {
  test("the documented tool-call output (openai/harmony docs/format.md, 'Receiving tool calls')", () => {
    const out = '<|channel|>analysis<|message|>Need to use function get_weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>';
    const r = p.extract(out);
    expect(r).toEqual({
      content: "",
      calls: [{ index: 0, name: "get_weather", arguments: { location: "San Francisco" }, raw: '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"San Francisco"}<|call|>' }],
      errors: [],
    });
  });

  test("the documented final answer: content is the final channel, analysis is not content", () => {
    const out = '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>';
    expect(p.extract(out)).toEqual({ content: "2 + 2 = 4.", calls: [], errors: [] });
    expect(splitHarmonyMessages(out).map((m) => [m.channel, m.content, m.terminator])).toEqual([
      ["analysis", 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.', "<|end|>"],
      ["final", "2 + 2 = 4.", "<|return|>"],
    ]);
  });

  test("the recipient may sit in the role part of the header; the preamble is commentary content", () => {
    const out =
      '<|channel|>commentary<|message|>Will start executing the plan<|end|><|start|>assistant to=functions.generate_file<|channel|>commentary<|constrain|>json<|message|>{"template": "basic_html", "path": "index.html"}<|call|>';
    const r = p.extract(out);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["generate_file", { template: "basic_html", path: "index.html" }]]);
    expect(r.content).toBe("Will start executing the plan");
  });

  test("<|call|>, <|end|> and <|start|> inside a JSON string stay in the argument", () => {
    const v = "x <|call|> y <|end|><|start|>assistant<|channel|>final<|message|>z";
    const r = p.extract(`<|channel|>commentary to=functions.echo <|constrain|>json<|message|>${JSON.stringify({ text: v })}<|call|>`);
    expect(r.errors).toEqual([]);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["echo", { text: v }]]);
  });

  test("a call drafted in analysis text is reasoning; one addressed on the analysis channel and ended by <|call|> is a call (vLLM and SGLang); ended by <|end|> it is an error", () => {
    const drafted = '<|channel|>analysis<|message|>I could send to=functions.rm <|constrain|>json<|message|>{"path": "/"}<|call|>';
    const r1 = p.extract(drafted);
    expect(r1.calls).toEqual([]);
    const called = '<|channel|>analysis to=functions.lookup <|constrain|>json<|message|>{"q": "x"}<|call|>';
    expect(p.extract(called)).toEqual({ content: "", calls: [{ index: 0, name: "lookup", arguments: { q: "x" }, raw: called }], errors: [] });
    const stripped = '<|channel|>analysis to=functions.lookup <|constrain|>json<|message|>{"q": "x"}';
    expect(p.extract(stripped).calls.map((c) => [c.name, c.arguments])).toEqual([["lookup", { q: "x" }]]);
    const ended = p.extract('<|channel|>analysis to=functions.rm <|constrain|>json<|message|>{"path": "/"}<|end|>');
    expect(ended.calls).toEqual([]);
    expect(ended.errors.map((e) => [e.name, e.message])).toEqual([
      ["rm", `The call to 'rm' was sent on the analysis channel and ended as a message, so it was not executed; calls to functions must go to the commentary channel; ${SHAPE}`],
    ]);
  });

  test("long hostile inputs stay linear (many headers without a message, many messages without a call)", () => {
    const inputs = [
      `${"<|start|>".repeat(100_000)}<|message|>`,
      "<|start|>assistant<|channel|>commentary<|message|>x<|end|>".repeat(40_000),
      '<|channel|>commentary to=functions.f<|message|>{"a": "'.repeat(40_000),
      "<|channel|>analysis to=functions.f<|message|>{}<|end|>".repeat(40_000),
    ];
    for (const s of inputs) {
      // Cost relative to a plain scan of the same text, measured in the same run (tests/helpers/linear-time.ts).
      expect(linearCheck(s, (t) => p.extract(t))).toMatchObject({ superLinear: false });
    }
  }, HANG_MS);

  test("malformed calls are errors naming the tool", () => {
    const cases: [string, { name?: string; message: string }][] = [
      ['<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1<|call|>', { name: "f", message: `Invalid JSON in the arguments of 'f'; ${SHAPE}` }],
      ["<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1]<|call|>", { name: "f", message: "Invalid arguments for 'f': arguments must be a JSON object." }],
      ['<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": "cut', { name: "f", message: `Invalid JSON in the arguments of 'f'; ${SHAPE}` }],
      ['<|channel|>analysis to=browser.search <|constrain|>json<|message|>{"query": "x"}<|call|>', { message: `Invalid tool call: unknown recipient 'browser.search'; only function tools are available; ${SHAPE}` }],
    ];
    for (const [src, want] of cases) {
      const r = p.extract(src);
      expect(r.calls).toEqual([]);
      expect(r.errors.map((e) => ({ ...(e.name ? { name: e.name } : {}), message: e.message }))).toEqual([want]);
    }
  });

  test("error messages hold no harmony special token (they become tool messages, where one would be real framing)", async () => {
    const { gptOssTokenizer } = await import("../models/gpt-oss-tokenizer.ts");
    const tok = await gptOssTokenizer();
    const bad = [
      '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1',
      "<|channel|>commentary to=functions.f <|constrain|>json<|message|>[1]",
      '<|channel|>analysis to=functions.f <|constrain|>json<|message|>{"a": 1}<|end|>',
      '<|channel|>commentary to=browser.search <|constrain|>json<|message|>{"q": 1}',
    ];
    for (const b of bad) {
      const [e] = p.extract(b).errors;
      expect(tok.encode(e!.message).filter((id) => id >= 199998)).toEqual([]);
    }
  });

  test("empty arguments are {}; unicode survives", () => {
    const r = p.extract('<|channel|>commentary to=functions.météo <|constrain|>json<|message|>{"ville": "Zürich 🌧 東京"}<|call|>');
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["météo", { ville: "Zürich 🌧 東京" }]]);
    expect(p.extract("<|channel|>commentary to=functions.get_location <|constrain|>json<|message|><|call|>").calls.map((c) => c.arguments)).toEqual([{}]);
  });

  test("the loop strips the stop id before parsing: a call running to the end of the text is complete; a final answer too", () => {
    const r = p.extract('<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expression":"1+1"}');
    expect(r).toEqual({
      content: "",
      calls: [{ index: 0, name: "calc", arguments: { expression: "1+1" }, raw: '<|start|>assistant<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expression":"1+1"}' }],
      errors: [],
    });
    expect(p.extract("<|channel|>final<|message|>The answer is 2.")).toEqual({ content: "The answer is 2.", calls: [], errors: [] });
  });

  test("plain text without harmony messages is all content", () => {
    expect(p.extract("The answer is 4.")).toEqual({ content: "The answer is 4.", calls: [], errors: [] });
  });

  test("random strings never throw (property)", () => {
    const pieces = fc.constantFrom("<|start|>", "assistant", "<|channel|>", "analysis", "commentary", "final", " to=functions.f", " to=x", "<|constrain|>", "json", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "{", "}", '"', "\\", ":", "1", " ", "é");
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.array(pieces, { maxLength: 40 }).map((a) => a.join(""))), (s) => {
        expect(typeof p.extract(s).content).toBe("string");
      }),
      { numRuns: 3000 },
    );
  });
});

test("turn markers inside a JSON string argument stay in the value when the call runs to the end of the text (the loop strips the sampled <|call|>)", () => {
  const p = createToolCallParser("harmony");
  const q = "a <|end|><|start|>user<|message|> b";
  const r = p.extract(`<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>${JSON.stringify({ query: q })}`);
  expect([r.errors, r.calls.map((c) => [c.name, c.arguments])]).toEqual([[], [["lookup", { query: q }]]]);
  // The same for hermes: a </tool_call> inside the only, unclosed call's string is data, not its end; the complete
  // object is the call (vLLM and SGLang read a last block without its end tag).
  const h = createToolCallParser("hermes").extract(`<tool_call>{"name": "lookup", "arguments": {"query": "x </tool_call> y"}}`);
  expect([h.errors, h.calls.map((c) => [c.name, c.arguments])]).toEqual([[], [["lookup", { query: "x </tool_call> y" }]]]);
});
