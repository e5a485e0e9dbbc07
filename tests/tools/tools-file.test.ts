import { describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";

const yamlText = `
tools:
  - name: calc
    url: http://127.0.0.1:{port}/tools/calc
    schema:
      type: function
      function:
        name: calc
        description: evaluate
        parameters:
          type: object
          properties:
            expression: {type: string}
          required: [expression]
  - name: lookup
    url: http://127.0.0.1:{port}/tools/lookup
    timeout_ms: 500
    max_retries: 0
    schema: {function: {name: lookup}}
`;

function configError(f: () => unknown): ConfigError {
  try {
    f();
  } catch (e) {
    if (e instanceof ConfigError) return e;
    throw e;
  }
  throw new Error("expected a ConfigError");
}

describe("parseToolsFile", () => {
  test("YAML with placeholders and defaults", () => {
    const f = parseToolsFile(yamlText, { vars: { port: 8123 } });
    expect(f.tools.map((t) => [t.name, t.url, t.timeout_ms, t.max_retries])).toEqual([
      ["calc", "http://127.0.0.1:8123/tools/calc", 30000, 2],
      ["lookup", "http://127.0.0.1:8123/tools/lookup", 500, 0],
    ]);
    expect(f.tools[1]!.schema).toEqual({ type: "function", function: { name: "lookup", description: "", parameters: { type: "object", properties: {} } } });
    expect(f.tools[0]!.schema.function.parameters).toEqual({ type: "object", properties: { expression: { type: "string" } }, required: ["expression"] });
  });

  test("the shipped example (JSON) parses", async () => {
    const text = await Bun.file(new URL("../../infra/tools/tools.example.json", import.meta.url)).text();
    const f = parseToolsFile(text, { source: "tools.example.json", vars: { port: 9000 } });
    expect(f.tools.map((t) => t.url)).toEqual(["http://127.0.0.1:9000/tools/calc", "http://127.0.0.1:9000/tools/lookup"]);
  });

  test("an unfilled placeholder, a bad field, duplicates, bad syntax: ConfigErrors naming the path", () => {
    expect(configError(() => parseToolsFile(yamlText, { source: "t.yaml" })).message).toBe("config t.yaml: tools[0].url: placeholder {port} is not filled (placeholders are filled only in the example servers' files; write the URL out)");
    expect(configError(() => parseToolsFile('{"tools": [{"name": "a", "url": "http://x/", "schema": {"function": {"name": "a"}}, "timeout_ms": -1}]}')).message).toBe(
      "config tools file: tools[0].timeout_ms: Too small: expected number to be >0",
    );
    const dup = '{"tools": [{"name": "a", "url": "http://x/", "schema": {"function": {"name": "a"}}}, {"name": "a", "url": "http://x/", "schema": {"function": {"name": "a"}}}]}';
    expect(configError(() => parseToolsFile(dup)).message).toBe("config tools file: tools: tool names must be unique");
    expect(configError(() => parseToolsFile("tools: [")).message.startsWith("config tools file: not valid YAML or JSON:")).toBe(true);
  });
});

describe("tools file strictness", () => {
  const base = { name: "calc", url: "http://127.0.0.1:1/x", schema: { type: "function", function: { name: "calculator", description: "", parameters: { type: "object", properties: {} } } } };
  test("a schema name different from the tool's name is refused", () => {
    expect(() => parseToolsFile(JSON.stringify({ tools: [base] }), { source: "t.json" })).toThrow(
      "config t.json: tools[0].schema.function.name: schema.function.name must equal the tool's name (the model calls the tool by the name its schema shows)",
    );
  });
  test("a misspelt key is refused, naming it", () => {
    const t = { ...base, schema: { ...base.schema, function: { ...base.schema.function, name: "calc" } }, timeot_ms: 5 };
    expect(() => parseToolsFile(JSON.stringify({ tools: [t] }), { source: "t.json" })).toThrow('config t.json: tools[0]: Unrecognized key: "timeot_ms"');
  });
});

describe("tools file bounds: timeouts, retries and URL schemes of webhook tools and simulated users", () => {
  const tool = (extra: Record<string, unknown>) => JSON.stringify({ tools: [{ name: "a", url: "http://x/", schema: { function: { name: "a" } }, ...extra }] });
  const user = (extra: Record<string, unknown>) => JSON.stringify({ interactions: [{ name: "u", url: "http://x/", ...extra }] });
  const cases: Array<[string, string, string]> = [
    ["a tool timeout above setTimeout's largest delay", tool({ timeout_ms: 3_000_000_000 }), "config tools file: tools[0].timeout_ms: must be <= 2147483647 (milliseconds; setTimeout's largest delay)"],
    ["a tool timeout of 1e12", tool({ timeout_ms: 1e12 }), "config tools file: tools[0].timeout_ms: must be <= 2147483647 (milliseconds; setTimeout's largest delay)"],
    ["a tool with 1000 retries", tool({ max_retries: 1000 }), "config tools file: tools[0].max_retries: must be <= 10 (retries after the first attempt)"],
    ["a tool with 11 retries", tool({ max_retries: 11 }), "config tools file: tools[0].max_retries: must be <= 10 (retries after the first attempt)"],
    ["a tool at an ftp: URL", tool({ url: "ftp://x/calc" }), "config tools file: tools[0].url: must be an http: or https: URL"],
    ["a tool at a ws: URL", tool({ url: "ws://x/calc" }), "config tools file: tools[0].url: must be an http: or https: URL"],
    ["a simulated user's timeout above setTimeout's largest delay", user({ timeout_ms: 2_147_483_648 }), "config tools file: interactions[0].timeout_ms: must be <= 2147483647 (milliseconds; setTimeout's largest delay)"],
    ["a simulated user with 1000 retries", user({ max_retries: 1000 }), "config tools file: interactions[0].max_retries: must be <= 10 (retries after the first attempt)"],
    ["a simulated user at a mailto: URL", user({ url: "mailto:x@y" }), "config tools file: interactions[0].url: must be an http: or https: URL"],
  ];
  for (const [label, text, message] of cases) {
    test(`refused: ${label}`, () => {
      expect(configError(() => parseToolsFile(text)).message).toBe(message);
    });
  }
  test("the largest allowed timeout and retries parse, over http and https", () => {
    const f = parseToolsFile(tool({ url: "https://x/calc", timeout_ms: 2_147_483_647, max_retries: 10 }));
    expect([f.tools[0]!.url, f.tools[0]!.timeout_ms, f.tools[0]!.max_retries]).toEqual(["https://x/calc", 2_147_483_647, 10]);
    const g = parseToolsFile(user({ timeout_ms: 2_147_483_647, max_retries: 10 }));
    expect([g.interactions[0]!.url, g.interactions[0]!.timeout_ms, g.interactions[0]!.max_retries]).toEqual(["http://x/", 2_147_483_647, 10]);
  });
});
