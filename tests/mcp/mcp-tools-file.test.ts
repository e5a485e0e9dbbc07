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
    ["a timeout above setTimeout's largest delay", "mcp_servers: [{name: a, url: 'http://x/mcp', timeout_ms: 3000000000}]", "config tools file: mcp_servers[0].timeout_ms: must be <= 2147483647 (milliseconds; setTimeout's largest delay)"],
    ["a timeout of 1e12", "mcp_servers: [{name: a, command: bun, timeout_ms: 1e12}]", "config tools file: mcp_servers[0].timeout_ms: must be <= 2147483647 (milliseconds; setTimeout's largest delay)"],
    ["more than 10 retries", "mcp_servers: [{name: a, url: 'http://x/mcp', max_retries: 1000}]", "config tools file: mcp_servers[0].max_retries: must be <= 10 (retries after the first attempt)"],
    ["an ftp: url", "mcp_servers: [{name: a, url: 'ftp://x/mcp'}]", "config tools file: mcp_servers[0].url: must be an http: or https: URL"],
    ["a ws: url", "mcp_servers: [{name: a, url: 'ws://x/mcp'}]", "config tools file: mcp_servers[0].url: must be an http: or https: URL"],
    ["a url that does not parse", "mcp_servers: [{name: a, url: 'x/mcp'}]", "config tools file: mcp_servers[0].url: Invalid URL"],
    ["a header name with a space", "mcp_servers: [{name: a, url: 'http://x/mcp', headers: {'X Token': t}}]", "config tools file: mcp_servers[0].headers.X Token: header name must be an HTTP token (RFC 9110: letters, digits and !#$%&'*+-.^_`|~, no spaces or colons)"],
    ["a header name with a colon", "mcp_servers: [{name: a, url: 'http://x/mcp', headers: {'X-A:': t}}]", "config tools file: mcp_servers[0].headers.X-A:: header name must be an HTTP token (RFC 9110: letters, digits and !#$%&'*+-.^_`|~, no spaces or colons)"],
    ["an empty header name", "mcp_servers: [{name: a, url: 'http://x/mcp', headers: {'': t}}]", "config tools file: mcp_servers[0].headers.: header name must be an HTTP token (RFC 9110: letters, digits and !#$%&'*+-.^_`|~, no spaces or colons)"],
    ["a header value with CR LF", 'mcp_servers: [{name: a, url: "http://x/mcp", headers: {authorization: "Bearer t\\r\\nX-Evil: 1"}}]', "config tools file: mcp_servers[0].headers.authorization: header value must not contain CR, LF or NUL"],
    ["a header value with LF", 'mcp_servers: [{name: a, url: "http://x/mcp", headers: {x-a: "a\\nb"}}]', "config tools file: mcp_servers[0].headers.x-a: header value must not contain CR, LF or NUL"],
    ["a header value with NUL", 'mcp_servers: [{name: a, url: "http://x/mcp", headers: {x-a: "a\\0b"}}]', "config tools file: mcp_servers[0].headers.x-a: header value must not contain CR, LF or NUL"],
    ["an empty tools allow-list", "mcp_servers: [{name: a, url: 'http://x/mcp', tools: []}]", "config tools file: mcp_servers[0].tools: an empty allow-list offers no tools; remove `tools` to offer all"],
  ];
  for (const [label, text, message] of cases) {
    test(`refused: ${label}`, () => {
      expect(configError(() => parseToolsFile(text)).message).toBe(message);
    });
  }
  test("the largest allowed timeout and retries, and token header names of every tchar, parse", () => {
    const f = parseToolsFile("mcp_servers: [{name: a, url: 'https://x/mcp', timeout_ms: 2147483647, max_retries: 10, headers: {\"!#$%&'*+-.^_`|~0aZ\": 'v\tw x'}, tools: [calc]}]");
    expect(f.mcp_servers[0]).toMatchObject({ timeout_ms: 2_147_483_647, max_retries: 10, headers: { "!#$%&'*+-.^_`|~0aZ": "v\tw x" }, tools: ["calc"] });
  });
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
