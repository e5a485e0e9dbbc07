import { afterAll, expect, test } from "bun:test";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";

// Fresh-user findings: URLs that answer but are not MCP servers read "HTTP -1" or "could not connect (…190 lines of
// zod issues…) (3 attempts)"; a server that had answered was retried for an answer that would come again.
type Mode = "html" | "notrpc" | "badjson" | "badtools" | "dupe" | "badname";
const posts: Record<Mode, number> = { html: 0, notrpc: 0, badjson: 0, badtools: 0, dupe: 0, badname: 0 };
const obj = { type: "object", properties: {} };
const LISTS: Partial<Record<Mode, unknown[]>> = {
  badtools: [{ name: "t", inputSchema: { type: "string" } }],
  dupe: [{ name: "echo", inputSchema: obj }, { name: "echo", inputSchema: obj }],
  badname: [{ name: "ok", inputSchema: obj }, { name: 'has space</tools>"x', inputSchema: obj }],
};
const server = Bun.serve({
  port: 0,
  hostname: "127.0.0.1",
  async fetch(req) {
    const mode = new URL(req.url).pathname.slice(1) as Mode;
    posts[mode]++;
    const body = (await req.json().catch(() => null)) as { method?: string; id?: number } | null;
    if (mode === "html") return new Response("<html><body>a web page</body></html>", { headers: { "content-type": "text/html" } });
    if (mode === "notrpc") return Response.json({ hello: "world" });
    if (mode === "badjson") return new Response("{oops", { headers: { "content-type": "application/json" } });
    if (body?.method === "initialize") return Response.json({ jsonrpc: "2.0", id: body.id, result: { protocolVersion: "2025-06-18", capabilities: { tools: {} }, serverInfo: { name: "bad", version: "1" } } });
    if (body?.method === "tools/list") return Response.json({ jsonrpc: "2.0", id: body.id, result: { tools: LISTS[mode] } });
    return new Response(null, { status: 202 });
  },
});
afterAll(() => server.stop(true));

const connect = (mode: Mode, tools?: string[]) =>
  McpToolClient.connect([McpServerSpec.parse({ name: mode, url: `http://127.0.0.1:${server.port}/${mode}`, timeout_ms: 5_000, max_retries: 2, ...(tools ? { tools } : {}) })], { retryMinTimeoutMs: 1 }).catch((e: Error) => e);
const where = (mode: Mode) => `MCP server '${mode}' (http://127.0.0.1:${server.port}/${mode}): cannot list its tools: MCP server '${mode}'`;

test("an HTML page is not an MCP endpoint: said so, not retried", async () => {
  const e = (await connect("html")) as Error;
  expect(e.message).toBe(`${where("html")} is not an MCP Streamable HTTP endpoint (Unexpected content type: text/html)`);
  expect(posts.html).toBe(1);
});

test("JSON that is not JSON-RPC, and a body that is not JSON: named, not retried", async () => {
  expect(((await connect("notrpc")) as Error).message).toBe(`${where("notrpc")} answered with a message that is not valid MCP (1 problem; first at (root): Invalid input)`);
  expect(posts.notrpc).toBe(1);
  expect(((await connect("badjson")) as Error).message).toBe(`${where("badjson")} answered with something that is not JSON (JSON Parse error: Expected '}')`);
  expect(posts.badjson).toBe(1);
});

test("a tool list that breaks MCP's schema names the field, once", async () => {
  expect(((await connect("badtools")) as Error).message).toBe(`${where("badtools")} answered with a message that is not valid MCP (1 problem; first at tools.0.inputSchema.type: Invalid input: expected "object")`);
  // initialize, the initialized notification, one tools/list: nothing sent again.
  expect(posts.badtools).toBe(3);
});

test("a server listing one name twice, or a name outside MCP's rule: a ConfigError naming the server; the allow-list can leave a bad name out", async () => {
  const dupe = (await connect("dupe")) as Error;
  expect([dupe.name, dupe.message]).toEqual(["ConfigError", "config mcp_servers[0]: MCP server 'dupe' lists the tool 'echo' twice; a server's tool names must be unique"]);
  const bad = (await connect("badname")) as Error;
  expect([bad.name, bad.message]).toEqual(["ConfigError", `config mcp_servers[0]: MCP server 'badname' lists a tool named "has space</tools>\\"x", outside MCP's tool-name rule (1–128 characters of A–Z a–z 0–9 _ - .); leave it out with the server's tools allow-list`]);
  const kept = await connect("badname", ["ok"]);
  expect(kept).toBeInstanceOf(McpToolClient);
  expect((kept as McpToolClient).names).toEqual(["ok"]);
  await (kept as McpToolClient).close();
});
