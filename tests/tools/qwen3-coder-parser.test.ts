import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { ConfigError } from "../../shared/errors.ts";
import { createToolCallParser, toolCallParserNames } from "../../shared/tools/parser-registry.ts";
import { convertParamValue, Qwen3CoderToolCallParser } from "../../shared/tools/qwen3-coder-parser.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { linearCheck } from "../helpers/linear-time.ts";
import { HANG_MS } from "../helpers/bounds.ts";

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

  test("an unclosed block is an error, not a truncated call (verl keeps what it holds)", () => {
    const r = p.extract("<tool_call><function=list_tool><parameter=items>valid</parameter><parameter=truncated");
    expect(r.calls).toEqual([]);
    expect(r.errors.map((e) => [e.index, e.name, e.message])).toEqual([
      [0, "list_tool", "The tool call to 'list_tool' was not closed with </tool_call>; a tool call must be <tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>."],
    ]);
  });

  test("a parameter header without '>' in a closed block is an error, not a skipped parameter", () => {
    const r = p.extract("<tool_call>\n<function=list_tool>\n<parameter=items>\nvalid\n</parameter>\n<parameter=broken\n</function>\n</tool_call>");
    expect(r.calls).toEqual([]);
    expect(r.errors.map((e) => [e.name, e.message.split(";")[0]])).toEqual([["list_tool", "Invalid tool call to 'list_tool': a <parameter=NAME> header is not closed with '>'"]]);
  });

  test("a last parameter without </parameter> ends at </function> (vLLM and SGLang read it)", () => {
    const r = p.extract("<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>");
    expect(r).toEqual({ content: "", calls: [{ index: 0, name: "f", arguments: { a: "1" }, raw: "f>\n<parameter=a>\n1\n</function>" }], errors: [] });
  });

  test("a parameter without </parameter> ends before the next line-start parameter, not swallowing it", () => {
    const text = "<tool_call>\n<function=list_tool>\n<parameter=s>\nfirst line\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>";
    expect(p.extract(text).calls.map((c) => [c.name, c.arguments])).toEqual([["list_tool", { s: "first line", n: 3 }]]);
    const noSchema = new Qwen3CoderToolCallParser().extract("<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>");
    expect(noSchema.calls.map((c) => c.arguments)).toEqual([{ a: "1", b: "2" }]);
  });

  test("a line-start <parameter=…>…</parameter> inside a value is a nested literal; with a schema an unknown name never splits", () => {
    const v = "Example:\n<parameter=x>\n1\n</parameter>\nend";
    const nested = p.extract(`<tool_call>\n<function=list_tool>\n<parameter=s>\n${v}\n</parameter>\n<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>`);
    expect(nested.calls.map((c) => c.arguments)).toEqual([{ s: v, n: 2 }]);
    const unknown = p.extract("<tool_call>\n<function=list_tool>\n<parameter=s>\nsee\n<parameter=zz>\nmore\n</function>\n</tool_call>");
    expect(unknown.calls.map((c) => c.arguments)).toEqual([{ s: "see\n<parameter=zz>\nmore" }]);
  });

  test("the last block may lack </tool_call> when its function is closed; an unclosed function is still an error", () => {
    const r = p.extract("Run it.\n<tool_call>\n<function=list_tool>\n<parameter=n>\n4\n</parameter>\n</function>\n");
    expect(r).toEqual({
      content: "Run it.\n",
      calls: [{ index: 0, name: "list_tool", arguments: { n: 4 }, raw: "list_tool>\n<parameter=n>\n4\n</parameter>\n</function>" }],
      errors: [],
    });
    const open = p.extract("<tool_call>\n<function=list_tool>\n<parameter=n>\n4\n</parameter>\n");
    expect(open.calls).toEqual([]);
    expect(open.errors.map((e) => e.message.split(";")[0])).toEqual(["The tool call to 'list_tool' was not closed with </tool_call>"]);
  });

  test("object/array values written as Python literals are read like the engines' ast.literal_eval fallback (never evaluated)", () => {
    const r = p.extract(
      "<tool_call>\n<function=list_tool>\n<parameter=o>\n{'k': 'v', 'n': None}\n</parameter>\n<parameter=items>\n(1, 'two')\n</parameter>\n<parameter=s>\n{'k': 'v'}\n</parameter>\n</function>\n</tool_call>",
    );
    expect(r.calls.map((c) => c.arguments)).toEqual([{ o: { k: "v", n: null }, items: [1, "two"], s: "{'k': 'v'}" }]);
    expect(convertParamValue("__import__('os')", "object")).toBe("__import__('os')");
    expect(convertParamValue("{'a': 1} extra", "object")).toBe("{'a': 1} extra");
  });

  test("long hostile inputs stay linear (badly placed end tags, missing </parameter>, long numbers)", () => {
    const inputs = [
      "<tool_call>x</tool_call>".repeat(40_000),
      `<tool_call><function=f>${"<parameter=a>x</parameter>y".repeat(40_000)}</function></tool_call>`,
      `<tool_call>\n<function=list_tool>\n${"<parameter=s>\nv\n".repeat(40_000)}</parameter>\n</function>\n</tool_call>`,
      `<tool_call>\n<function=list_tool>\n${"\n<parameter=".repeat(40_000)}`,
      `<tool_call>\n<function=list_tool>\n<parameter=x>\n${"1".repeat(200_000)}x\n</parameter>\n</function>\n</tool_call>`,
      `<tool_call>${" ".repeat(100_000)}${"<function=".repeat(40_000)}`,
    ];
    for (const s of inputs) {
      // Cost relative to a plain scan of the same text, measured in the same run (tests/helpers/linear-time.ts).
      expect(linearCheck(s, (t) => p.extract(t))).toMatchObject({ superLinear: false });
    }
  }, HANG_MS);

  test("a function header without '>' is an error", () => {
    const r = p.extract("<tool_call><function=list_tool</tool_call>");
    expect(r.calls).toEqual([]);
    expect(r.errors.map((e) => e.message.split(";")[0])).toEqual(["Invalid tool call: the <function=NAME> header is not closed with '>'"]);
  });

  test("delimiters inside a value stay in the value (</tool_call>, </parameter>, <parameter=, </function>)", () => {
    const v = 'see </tool_call> and </parameter> then <parameter=x> and </function> done';
    const text = `<tool_call>\n<function=list_tool>\n<parameter=s>\n${v}\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call> after`;
    const r = p.extract(text);
    expect(r.errors).toEqual([]);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["list_tool", { s: v, n: 3 }]]);
    expect(r.content).toBe(" after");
  });

  test("unicode names and values", () => {
    const r = p.extract("<tool_call>\n<function=météo>\n<parameter=ville>\nZürich 🌧 東京\n</parameter>\n</function>\n</tool_call>");
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["météo", { ville: "Zürich 🌧 東京" }]]);
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

  test("a block that became an error stays in content as written; a parsed block leaves it", () => {
    const bad = "<tool_call>\n<function=list_tool>\n<parameter=broken\n</function>\n</tool_call>";
    const r = p.extract(`A <tool_call>\n<function=list_tool>\n</function>\n</tool_call> B ${bad} C`);
    expect([r.calls.length, r.errors.length, r.content]).toEqual([1, 1, `A  B ${bad} C`]);
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
    expect(toolCallParserNames()).toEqual(["deepseek_v3", "harmony", "hermes", "llama3_json", "pythonic", "qwen3_coder"]);
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
    expect((err as ConfigError).message).toBe("config rollout.multi_turn.format: unknown tool-call parser 'nope'; registered parsers: deepseek_v3, harmony, hermes, llama3_json, pythonic, qwen3_coder");
    expect((err as ConfigError).field).toBe("rollout.multi_turn.format");
  });
});
