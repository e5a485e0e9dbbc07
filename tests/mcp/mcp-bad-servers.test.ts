import { afterAll, expect, test } from "bun:test";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";

// Fresh-user findings: URLs that answer but are not MCP servers read "HTTP -1" or "could not connect (…190 lines of
// zod issues…) (3 attempts)"; a server that had answered was retried for an answer that would come again.
type Mode = "html" | "notrpc" | "badjson" | "badtools";
const posts: Record<Mode, number> = { html: 0, notrpc: 0, badjson: 0, badtools: 0 };
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
    if (body?.method === "tools/list") return Response.json({ jsonrpc: "2.0", id: body.id, result: { tools: [{ name: "t", inputSchema: { type: "string" } }] } });
    return new Response(null, { status: 202 });
  },
});
afterAll(() => server.stop(true));

const connect = (mode: Mode) =>
  McpToolClient.connect([McpServerSpec.parse({ name: mode, url: `http://127.0.0.1:${server.port}/${mode}`, timeout_ms: 5_000, max_retries: 2 })], { retryMinTimeoutMs: 1 }).catch((e: Error) => e);
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
