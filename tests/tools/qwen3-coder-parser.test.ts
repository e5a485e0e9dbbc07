import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { ConfigError } from "../../shared/errors.ts";
import { createToolCallParser, toolCallParserNames } from "../../shared/tools/parser-registry.ts";
import { convertParamValue, Qwen3CoderToolCallParser } from "../../shared/tools/qwen3-coder-parser.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";

const tools: ToolSchema[] = [
  {
    type: "function",
    function: {
      name: "list_tool",
      description: "",
      parameters: { type: "object", properties: { items: { type: "array" }, n: { type: "integer" }, x: { type: "number" }, flag: { type: "boolean" }, s: { type: "string" }, o: { type: "object" } } },
    },
  },
];

describe("qwen3_coder parser", () => {
  const p = new Qwen3CoderToolCallParser({ tools });

  test("the template's format, values converted by schema type", () => {
    const text =
      "I'll call it.\n<tool_call>\n<function=list_tool>\n<parameter=items>\n[1, 2, 3]\n</parameter>\n<parameter=n>\n7\n</parameter>\n<parameter=x>\n2.0\n</parameter>\n<parameter=flag>\nTrue\n</parameter>\n<parameter=s>\n42\n</parameter>\n<parameter=o>\n{\"a\": 1}\n</parameter>\n<parameter=extra>\n5\n</parameter>\n</function>\n</tool_call>";
    const r = p.extract(text);
    expect(r.errors).toEqual([]);
    expect(r.calls.length).toBe(1);
    expect(r.calls[0]!.name).toBe("list_tool");
    expect(r.calls[0]!.arguments).toEqual({ items: [1, 2, 3], n: 7, x: 2, flag: true, s: "42", o: { a: 1 }, extra: "5" });
    expect(r.content).toBe("I'll call it.\n");
  });

  test("a code-injection payload stays a string and is not executed", () => {
    const payload = "__import__('os').system('echo pwned')";
    const r = p.extract(`<tool_call>\n<function=list_tool>\n<parameter=items>\n${payload}\n</parameter>\n</function>\n</tool_call>`);
    expect(r.calls[0]!.arguments).toEqual({ items: payload });
  });

  test("a truncated parameter without '>' is skipped (verl test)", () => {
    const r = p.extract("<tool_call><function=list_tool><parameter=items>valid</parameter><parameter=truncated");
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["list_tool", { items: "valid" }]]);
  });

  test("a function header without '>' is an error", () => {
    const r = p.extract("<tool_call><function=list_tool");
    expect(r.calls).toEqual([]);
    expect(r.errors.map((e) => e.message)).toEqual(["Invalid tool call: the <function=NAME> header is not closed with '>'."]);
  });

  test("calls inside <think> do not count; several calls", () => {
    const r = p.extract(
      "<think><tool_call>\n<function=a>\n</function>\n</tool_call></think>\n<tool_call>\n<function=b>\n<parameter=q>\nhi\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=c>\n</function>\n</tool_call>",
    );
    expect(r.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([
      [0, "b", { q: "hi" }],
      [1, "c", {}],
    ]);
  });

  test("no tools given: every value is text", () => {
    const r = new Qwen3CoderToolCallParser().extract("<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n</function>\n</tool_call>");
    expect(r.calls[0]!.arguments).toEqual({ n: "1" });
  });

  test("type conversion table", () => {
    expect(convertParamValue("NULL", "string")).toBe(null);
    expect(convertParamValue("3.5", "integer")).toBe("3.5");
    expect(convertParamValue("-12", "int64")).toBe(-12);
    expect(convertParamValue("1e3", "number")).toBe(1000);
    expect(convertParamValue("abc", "float")).toBe("abc");
    expect(convertParamValue("false", "bool")).toBe(false);
    expect(convertParamValue("{bad", "object")).toBe("{bad");
    expect(convertParamValue("[1,", "array")).toBe("[1,");
  });

  test("random strings never throw (property)", () => {
    const pieces = fc.constantFrom("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>", ">", "\n", "a", "1", "<think>", "</think>");
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.array(pieces, { maxLength: 30 }).map((a) => a.join(""))), (s) => {
        const r = p.extract(s);
        expect(typeof r.content).toBe("string");
      }),
      { numRuns: 2000 },
    );
  });
});

describe("parser registry", () => {
  test("known names", () => {
    expect(toolCallParserNames()).toEqual(["hermes", "llama3_json", "qwen3_coder"]);
    expect(createToolCallParser("hermes").name).toBe("hermes");
    expect(createToolCallParser("qwen3_coder", { tools }).name).toBe("qwen3_coder");
  });
  test("unknown name is a ConfigError listing the names", () => {
    let err: unknown;
    try {
      createToolCallParser("nope");
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(ConfigError);
    expect((err as ConfigError).message).toBe("config rollout.multi_turn.format: unknown tool-call parser 'nope'; registered parsers: hermes, llama3_json, qwen3_coder");
    expect((err as ConfigError).field).toBe("rollout.multi_turn.format");
  });
});
