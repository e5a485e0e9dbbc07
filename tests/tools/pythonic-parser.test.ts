import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { PythonicToolCallParser } from "../../shared/tools/pythonic-parser.ts";
import { createToolCallParser } from "../../shared/tools/parser-registry.ts";
import { linearCheck } from "../helpers/linear-time.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const p = new PythonicToolCallParser();
const SHAPE = 'a tool call list must look like [tool_name(arg="value", n=1), other_tool()] with Python literal arguments.';

describe("pythonic parser", () => {
  test("a call list, two calls, content empty", () => {
    const r = createToolCallParser("pythonic").extract('[get_weather(city="Paris", days=3), get_time()]');
    expect(r).toEqual({
      content: "",
      calls: [
        { index: 0, name: "get_weather", arguments: { city: "Paris", days: 3 }, raw: 'get_weather(city="Paris", days=3)' },
        { index: 1, name: "get_time", arguments: {}, raw: "get_time()" },
      ],
      errors: [],
    });
  });

  test("Python literals: both quotes, escapes, triple quotes, raw, concatenation, numbers, True/False/None, lists, tuples, dicts", () => {
    const src =
      "[f(a='it\\'s', b=\"say \\\"hi\\\"\\n\", c=\"\"\"two\nlines\"\"\", d=r'C:\\dir\\n', e='x' \"y\", n=-1.5e3, h=0x1F, o=0o17, bi=0b101, u=1_000, t=True, fa=False, z=None, l=[1, (2, 3), []], m={'k': [False], 1: 'v', None: 0}, hx='\\x41\\u00e9\\U0001F600\\101', unk='\\q')]";
    const r = p.extract(src);
    expect(r.errors).toEqual([]);
    expect(r.calls[0]!.arguments).toEqual({
      a: "it's",
      b: 'say "hi"\n',
      c: "two\nlines",
      d: "C:\\dir\\n",
      e: "xy",
      n: -1500,
      h: 31,
      o: 15,
      bi: 5,
      u: 1000,
      t: true,
      fa: false,
      z: null,
      l: [1, [2, 3], []],
      m: { k: [false], "1": "v", null: 0 },
      hx: "Aé😀A",
      unk: "\\q",
    });
  });

  test("the format's own delimiters inside strings stay in the argument", () => {
    const r = p.extract(`[run(code="print([x(1)]) )] ]", note='a), b=(')] tail`);
    expect(r.errors).toEqual([]);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["run", { code: "print([x(1)]) )] ]", note: "a), b=(" }]]);
    expect(r.content).toBe(" tail");
  });

  test("calls inside <think> are not executed; orphan </think> hides what came before; unclosed <think> hides the rest", () => {
    expect(p.extract("<think>maybe [f(a=1)]</think>\n[g(b=2)]").calls.map((c) => [c.index, c.name])).toEqual([[0, "g"]]);
    expect(p.extract("<think>maybe [f(a=1)]</think>\n[g(b=2)]").content).toBe("<think>maybe [f(a=1)]</think>\n");
    expect(p.extract("[f(a=1)] plan</think>[g(b=2)]").calls.map((c) => c.name)).toEqual(["g"]);
    expect(p.extract("<think>[f(a=1)]").calls).toEqual([]);
    expect(p.extract("[f(a=1)]<think>[g(a=1)]").calls.map((c) => c.name)).toEqual(["f"]);
  });

  test("malformed calls are errors naming the tool, never dropped or truncated", () => {
    const cases: [string, string][] = [
      ["[f(1)]", "positional argument at offset 3 in the call to 'f'; use keyword arguments (name=value)"],
      ["[f(a=x)]", "'x' at offset 5 is not a literal (only strings, numbers, True, False, None, lists, tuples and dicts are allowed)"],
      ["[f(a=__import__('os').system('id'))]", "'__import__' at offset 5 is not a literal (only strings, numbers, True, False, None, lists, tuples and dicts are allowed)"],
      ['[f(a="unclosed)]', "a string starting at offset 5 is not closed"],
      ["[f(a=1)", "the call list is not closed with ']'"],
      ["[f(a=1", "the call to 'f' is not closed with ')'"],
      ["[f(a=1, a=2)]", "keyword argument 'a' repeated in the call to 'f'"],
      ["[f(a=007)]", "invalid number at offset 5"],
      ["[f(a=1) g(b=2)]", "expected ',' or ']' at offset 8"],
      ["[f(a={[1]: 2})]", "a dict key at offset 6 must be a string, number, bool or None"],
    ];
    for (const [src, msg] of cases) {
      const r = p.extract(src);
      expect(r.calls).toEqual([]);
      expect(r.errors).toEqual([{ index: 0, name: "f", raw: src, message: `Invalid tool call to 'f': ${msg}; ${SHAPE}` }]);
    }
  });

  test("a broken list does not hide a later good one; indexes keep the model's order", () => {
    const r = p.extract("[f(1)]\n[g(a=2)]");
    expect(r.errors.map((e) => [e.index, e.name, e.raw])).toEqual([[0, "f", "[f(1)]"]]);
    expect(r.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([[1, "g", { a: 2 }]]);
  });

  test("prose with brackets is not a call; Llama 4 python tags are dropped with the list", () => {
    expect(p.extract("see [link](x) and [1, 2] or [a, b(c)]")).toEqual({ content: "see [link](x) and [1, 2] or [a, b(c)]", calls: [], errors: [] });
    const r = p.extract("ok <|python_start|>[f(a=1)]<|python_end|>");
    expect([r.content, r.calls.map((c) => c.name)]).toEqual(["ok ", ["f"]]);
  });

  test("unicode names and values; deep nesting is an error, not a stack overflow", () => {
    expect(p.extract("[météo(ville='Zürich 🌧 東京')]").calls.map((c) => [c.name, c.arguments])).toEqual([["météo", { ville: "Zürich 🌧 東京" }]]);
    const deep = `[f(a=${"[".repeat(5000)}${"]".repeat(5000)})]`;
    expect(p.extract(deep).errors.map((e) => e.message.split(";")[0])).toEqual(["Invalid tool call to 'f': literal nested deeper than 64 levels"]);
  });

  test("a raw line break inside a quoted argument is part of the value (engines' LFM2 repair), exact characters kept", () => {
    const r = p.extract("[run_python(code='import os\nprint(os.getcwd())\n', note=\"a\r\nb\tc\")]");
    expect(r.errors).toEqual([]);
    expect(r.calls).toEqual([
      {
        index: 0,
        name: "run_python",
        arguments: { code: "import os\nprint(os.getcwd())\n", note: "a\r\nb\tc" },
        raw: "run_python(code='import os\nprint(os.getcwd())\n', note=\"a\r\nb\tc\")",
      },
    ]);
    expect(r.content).toBe("");
  });

  test("a quote that never closes is still an error, also across lines", () => {
    const src = "[f(a='x\n)]\nmore";
    expect(p.extract(src)).toEqual({
      content: src,
      calls: [],
      errors: [{ index: 0, name: "f", raw: src, message: `Invalid tool call to 'f': a string starting at offset 5 is not closed; ${SHAPE}` }],
    });
  });

  test("JSON spellings true/false/null are literals (vLLM get_parameter_value)", () => {
    const r = p.extract("[f(a=true, b=false, c=null, d=[true, {'k': null}])]");
    expect(r.errors).toEqual([]);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["f", { a: true, b: false, c: null, d: [true, { k: null }] }]]);
  });

  test("long hostile inputs on the multi-line string path stay linear", () => {
    const inputs = [`[f(a='${"x\n".repeat(200_000)}`, "[f(a='x\n".repeat(50_000), `[f(a='${"\n".repeat(100_000)}')${" ".repeat(100_000)}x]`];
    for (const s of inputs) {
      const r = p.extract(s);
      expect(r.calls).toEqual([]);
      expect(r.errors.length).toBeGreaterThan(0);
      expect(linearCheck(s, (t) => p.extract(t))).toMatchObject({ superLinear: false });
    }
  }, HANG_MS);

  test("random strings never throw (property)", () => {
    const pieces = fc.constantFrom("[", "]", "(", ")", "f", "g(", "a=", "=", ",", "'", '"', '"""', "\\", "1", "-", "0x", "True", "None", "{", "}", ":", " ", "\n", "<think>", "</think>", "é", "🙂");
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.array(pieces, { maxLength: 40 }).map((a) => a.join(""))), (s) => {
        const r = p.extract(s);
        expect(typeof r.content).toBe("string");
        for (const c of r.calls) expect(typeof c.name).toBe("string");
      }),
      { numRuns: 3000 },
    );
  });
});
