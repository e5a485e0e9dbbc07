import { describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";

function configError(f: () => unknown): ConfigError {
  try {
    f();
  } catch (e) {
    if (e instanceof ConfigError) return e;
    throw e;
  }
  throw new Error("expected a ConfigError");
}

describe("tools file: mcp_servers", () => {
  test("HTTP and stdio servers with defaults; placeholders filled; tools optional", () => {
    const f = parseToolsFile(
      `
mcp_servers:
  - name: math
    url: http://127.0.0.1:{port}/mcp
    headers: {authorization: Bearer t}
    tools: [calc]
  - name: local
    command: bun
    args: [infra/tools/mcp-server.ts, --stdio]
    env: {A: "1"}
    timeout_ms: 500
    max_retries: 0
`,
      { vars: { port: 9000 } },
    );
    expect(f.tools).toEqual([]);
    expect(f.mcp_servers).toEqual([
      { name: "math", url: "http://127.0.0.1:9000/mcp", headers: { authorization: "Bearer t" }, tools: ["calc"], timeout_ms: 30000, max_retries: 2 },
      { name: "local", command: "bun", args: ["infra/tools/mcp-server.ts", "--stdio"], env: { A: "1" }, timeout_ms: 500, max_retries: 0 },
    ]);
  });

  const cases: Array<[string, string, string]> = [
    ["neither url nor command", "mcp_servers: [{name: a}]", "config tools file: mcp_servers[0]: set exactly one of url (Streamable HTTP) or command (stdio)"],
    ["both url and command", "mcp_servers: [{name: a, url: 'http://x/mcp', command: bun}]", "config tools file: mcp_servers[0]: set exactly one of url (Streamable HTTP) or command (stdio)"],
    ["args with a url", "mcp_servers: [{name: a, url: 'http://x/mcp', args: [x]}]", "config tools file: mcp_servers[0].args: args is for stdio servers (command); this server has a url"],
    ["headers with a command", "mcp_servers: [{name: a, command: bun, headers: {a: b}}]", "config tools file: mcp_servers[0].headers: headers are for HTTP servers (url); this server has a command"],
    ["an unknown key", "mcp_servers: [{name: a, command: bun, timeout: 5}]", "config tools file: mcp_servers[0]: Unrecognized key: \"timeout\""],
    ["duplicate server names", "mcp_servers: [{name: a, command: bun}, {name: a, command: node}]", "config tools file: mcp_servers: MCP server names must be unique"],
    ["a bad timeout", "mcp_servers: [{name: a, command: bun, timeout_ms: 0}]", "config tools file: mcp_servers[0].timeout_ms: Too small: expected number to be >0"],
  ];
  for (const [label, text, message] of cases) {
    test(`refused: ${label}`, () => {
      expect(configError(() => parseToolsFile(text)).message).toBe(message);
    });
  }
});

test("the example in docs/tool-webhooks.md §6 parses", async () => {
  const doc = await Bun.file(new URL("../../docs/tool-webhooks.md", import.meta.url)).text();
  const yaml = /## 6\. MCP servers[\s\S]*?```yaml\n([\s\S]*?)```/.exec(doc)![1]!;
  expect(parseToolsFile(yaml).mcp_servers.map((s) => [s.name, s.url ?? s.command, s.tools ?? null])).toEqual([
    ["search", "https://mcp.example.com/mcp", ["web_search"]],
    ["local", "bun", null],
  ]);
});

test("the example in the README parses", async () => {
  const readme = await Bun.file(new URL("../../README.md", import.meta.url)).text();
  const yaml = /- \*\*MCP servers\*\*[\s\S]*?```yaml\n([\s\S]*?)```/.exec(readme)![1]!;
  expect(parseToolsFile(yaml.replace(/^ {2}/gm, "")).mcp_servers.map((s) => s.name)).toEqual(["example"]);
});
