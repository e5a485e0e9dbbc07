import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { stdioMcpTransport } from "../../infra/tools/mcp-stdio.ts";

const FIXTURE = join(import.meta.dir, "fixture-server.ts");
const req = (name: string, args: unknown = {}, index = 0) => ({ name, arguments: args, key: "k", turn: 2, index });

describe("MCP over stdio (the fixture as a child process)", () => {
  let client: McpToolClient;
  beforeAll(async () => {
    const spec = McpServerSpec.parse({ name: "local", command: process.execPath, args: [FIXTURE], timeout_ms: 10_000, tools: ["echo", "stats", "fail", "picture", "crash"] });
    client = await McpToolClient.connect([spec], { stdio: stdioMcpTransport, retryMinTimeoutMs: 1 });
  });
  afterAll(() => client.close());

  test("listed tools and results mapped as over HTTP", async () => {
    expect(client.names).toEqual(["echo", "stats", "fail", "picture", "crash"]);
    expect(await client.call(req("echo", { text: "over stdio" }))).toEqual({ ok: true, call_id: "k:2:0", attempts: 1, content: "over stdio" });
    expect((await client.call(req("stats", { values: [4, 5] }))).content).toBe('{"count":2,"sum":9}');
    expect(await client.call(req("fail"))).toEqual({ ok: false, call_id: "k:2:0", attempts: 1, content: "Error executing tool 'fail': division by zero" });
    expect((await client.call(req("picture"))).parts).toEqual([
      { type: "text", text: "here:" },
      { type: "image", image: "data:image/png;base64,iVBORw0KGgo=" },
    ]);
  });

  test("a server process that exits mid-call: an error observation at once; the next call starts it again", async () => {
    expect(await client.call(req("crash", {}, 1))).toEqual({ ok: false, call_id: "k:2:1", attempts: 1, content: "Error executing tool 'crash': MCP server 'local' closed the connection before answering (1 attempt)" });
    expect(await client.call(req("echo", { text: "back" }, 2))).toEqual({ ok: true, call_id: "k:2:2", attempts: 1, content: "back" });
  });

  test("a command that does not start is a ToolError naming the server", async () => {
    const spec = McpServerSpec.parse({ name: "missing", command: "/nonexistent/mcp-server", max_retries: 0 });
    const e = await McpToolClient.connect([spec], { stdio: stdioMcpTransport }).catch((e) => e);
    expect(e.name).toBe("ToolError");
    expect(e.message).toStartWith("MCP server 'missing' (/nonexistent/mcp-server): cannot list its tools: could not connect to MCP server 'missing' (");
  });
});
