import { describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { DatasetRow } from "../../shared/schema/index.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";

// Input a user writes by hand: placeholders left in a tools file's URLs, a row's sandbox_kwargs that is not an object.

describe("tools file and rows", () => {
  const file = (sandbox: Record<string, unknown>, tools: unknown[] = []) => JSON.stringify({ tools, sandbox: { create_url: "http://h/c", release_url: "http://h/r", ...sandbox } });
  const configError = (f: () => unknown): string => {
    try {
      f();
    } catch (e) {
      expect(e).toBeInstanceOf(ConfigError);
      return (e as Error).message;
    }
    throw new Error("no error");
  };

  test("a placeholder left unfilled is refused naming its field, in the authority or in the path", () => {
    expect(configError(() => parseToolsFile(file({ create_url: "http://127.0.0.1:{port}/c" }), { source: "t.json" }))).toBe(
      "config t.json: sandbox.create_url: placeholder {port} is not filled (placeholders are filled only in the example servers' files; write the URL out)",
    );
    // A path placeholder is a valid URL: without the check every create would 404 at run time.
    expect(configError(() => parseToolsFile(file({ heartbeat_url: "http://h/{port}/hb" }), { source: "t.json" }))).toStartWith("config t.json: sandbox.heartbeat_url: placeholder {port} is not filled");
    expect(configError(() => parseToolsFile(file({ release_url: "http://h/{id}" }), { source: "t.json", vars: { port: 1 } }))).toStartWith("config t.json: sandbox.release_url: placeholder {id} is not filled");
    const tool = { name: "a", url: "http://h/tools/{tool}", schema: { type: "function", function: { name: "a" } } };
    expect(configError(() => parseToolsFile(file({}, [tool]), { source: "t.json" }))).toStartWith("config t.json: tools[0].url: placeholder {tool} is not filled");
    expect(configError(() => parseToolsFile(JSON.stringify({ mcp_servers: [{ name: "m", url: "http://h:{port}/mcp" }] }), { source: "t.json" }))).toStartWith("config t.json: mcp_servers[0].url: placeholder {port} is not filled");
    // Filled ones pass.
    expect(parseToolsFile(file({ create_url: "http://127.0.0.1:{port}/c" }), { vars: { port: 9 } }).sandbox?.create_url).toBe("http://127.0.0.1:9/c");
  });

  test("extra_info.sandbox_kwargs must be an object (or absent/null)", () => {
    const row = (sandbox_kwargs: unknown) => DatasetRow.safeParse({ prompt: [{ role: "user", content: "hi" }], extra_info: { sandbox_kwargs } });
    for (const bad of ["image:1", [1, 2], 5, true]) {
      const r = row(bad);
      expect(r.success).toBe(false);
      expect(r.error!.issues[0]!.path).toEqual(["extra_info", "sandbox_kwargs"]);
    }
    for (const ok of [{ image: "x" }, {}, null, undefined]) expect(row(ok).success).toBe(true);
  });
});
