import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ConfigError } from "../../shared/errors.ts";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient, sseMessages } from "../../shared/tools/mcp-tool-client.ts";
import { serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { fixtureServer, type FixtureLog } from "./fixture-server.ts";

const req = (name: string, args: unknown = {}, index = 0) => ({ name, arguments: args, key: "k", turn: 1, index });
const spec = (s: Record<string, unknown>) => McpServerSpec.parse(s);
const FAST = { retryMinTimeoutMs: 1, retryMaxTimeoutMs: 1 };

for (const json of [false, true]) {
  describe(`MCP over Streamable HTTP (${json ? "JSON replies" : "SSE replies"})`, () => {
    const log: FixtureLog = { calls: [] };
    let http: McpHttpServer;
    let client: McpToolClient;
    beforeAll(async () => {
      http = serveMcpHttp(() => fixtureServer(log, () => undefined), { json });
      client = await McpToolClient.connect([spec({ name: "fx", url: http.url, timeout_ms: 300, max_retries: 2 })], FAST);
    });
    afterAll(async () => {
      await client.close();
      await http.stop();
    });

    test("tools are listed in the server's order as OpenAI function schemas", () => {
      expect(client.names).toEqual(["echo", "two_parts", "stats", "stats_text", "fail", "picture", "crash", "slow", "flaky"]);
      expect(client.schemas[0]).toEqual({
        type: "function",
        function: {
          name: "echo",
          description: "Echo the text.",
          parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"], $schema: "http://json-schema.org/draft-07/schema#" },
        },
      });
      expect(client.serverOf("stats")).toBe("fx");
    });

    test("a text result; the call id, key and turn travel in _meta", async () => {
      const before = log.calls.length;
      expect(await client.call({ ...req("echo", { text: "hi" }, 2), create_kwargs: { seed: 3 } })).toEqual({ ok: true, call_id: "k:1:2", attempts: 1, content: "hi" });
      expect(log.calls.slice(before)).toEqual([{ name: "echo", meta: { "edgeloop/call_id": "k:1:2", "edgeloop/key": "k", "edgeloop/turn": 1, "edgeloop/create_kwargs": { seed: 3 } } }]);
    });

    test("text parts joined by newlines; structured content as JSON text; text parts win over structured content", async () => {
      expect((await client.call(req("two_parts"))).content).toBe("first\nsecond");
      expect(await client.call(req("stats", { values: [1, 2, 3] }))).toEqual({ ok: true, call_id: "k:1:0", attempts: 1, content: '{"count":3,"sum":6}' });
      expect((await client.call(req("stats_text"))).content).toBe("count 2");
    });

    test("isError is an error observation; an image is a data: URI part; unknown tools and bad arguments as for webhooks", async () => {
      expect(await client.call(req("fail"))).toEqual({ ok: false, call_id: "k:1:0", attempts: 1, content: "Error executing tool 'fail': division by zero" });
      // MCP ImageContent {type: image, data, mimeType} becomes a data: URI part beside the text, in order.
      expect(await client.call(req("picture"))).toEqual({
        ok: true,
        call_id: "k:1:0",
        attempts: 1,
        content: "here:",
        parts: [
          { type: "text", text: "here:" },
          { type: "image", image: "data:image/png;base64,iVBORw0KGgo=" },
        ],
      });
      expect(await client.call(req("nope"))).toEqual({
        ok: false,
        call_id: "",
        attempts: 0,
        content: "Unknown function 'nope'. Available tools: ['echo', 'two_parts', 'stats', 'stats_text', 'fail', 'picture', 'crash', 'slow', 'flaky']",
      });
      expect(await client.call(req("echo", {}))).toEqual({ ok: false, call_id: "", attempts: 0, content: "Invalid arguments for 'echo': missing required parameter 'text'" });
    });

    test("a JSON-RPC error of the server is an error observation, not retried", async () => {
      const r = await client.call(req("echo", { text: 5 }));
      expect(r.ok).toBe(false);
      expect(r.attempts).toBe(1);
      expect(r.content).toStartWith("Error executing tool 'echo': MCP error -32602: ");
    });

    test("a timeout of a tool not annotated idempotent is not retried", async () => {
      const before = log.calls.filter((c) => c.name === "slow").length;
      expect(await client.call(req("slow", {}, 5))).toEqual({ ok: false, call_id: "k:1:5", attempts: 1, content: "Error executing tool 'slow': timed out after 300 ms (1 attempt)" });
      expect(log.calls.filter((c) => c.name === "slow").length).toBe(before + 1);
    });

    test("a tool annotated idempotentHint is retried with the same call id", async () => {
      expect(await client.call(req("flaky", {}, 7))).toEqual({ ok: true, call_id: "k:1:7", attempts: 2, content: "answered attempt 2" });
      expect(log.calls.filter((c) => c.name === "flaky").map((c) => c.meta["edgeloop/call_id"])).toEqual(["k:1:7", "k:1:7"]);
    });

    test("select keeps the named tools, sharing the connection", async () => {
      const sub = client.select(["stats", "echo", "missing"]);
      expect(sub.names).toEqual(["echo", "stats"]);
      expect((await sub.call(req("echo", { text: "x" }))).content).toBe("x");
      expect((await sub.call(req("fail"))).content).toBe("Unknown function 'fail'. Available tools: ['echo', 'stats']");
    });
  });
}

describe("MCP over HTTP: bounds and failures", () => {
  const log: FixtureLog = { calls: [] };
  let http: McpHttpServer;
  beforeAll(() => {
    http = serveMcpHttp(() => fixtureServer(log, () => undefined));
  });
  afterAll(() => http.stop());

  test("a reply over max_reply_bytes is an error observation naming the cap", async () => {
    const c = await McpToolClient.connect([spec({ name: "fx", url: http.url, max_reply_bytes: 2000, tools: ["echo"] })], FAST);
    expect(await c.call(req("echo", { text: "y".repeat(5000) }))).toEqual({
      ok: false,
      call_id: "k:1:0",
      attempts: 1,
      content: "Error executing tool 'echo': the reply is larger than 2000 bytes (the server's max_reply_bytes)",
    });
    expect((await c.call(req("echo", { text: "small" }))).content).toBe("small");
    await c.close();
  });

  test("a server that forgot the session (404, as after a restart): a new session, and the call sent again, idempotent or not", async () => {
    const c = await McpToolClient.connect([spec({ name: "fx", url: http.url, max_retries: 1, tools: ["echo"] })], FAST);
    expect((await c.call(req("echo", { text: "one" }))).content).toBe("one");
    await http.dropSessions();
    const before = log.calls.length;
    expect(await c.call(req("echo", { text: "two" }))).toEqual({ ok: true, call_id: "k:1:0", attempts: 2, content: "two" });
    // The 404 ran nothing: the server saw the call once.
    expect(log.calls.slice(before).map((x) => x.name)).toEqual(["echo"]);
    await c.close();
  });

  test("close() ends the HTTP session (DELETE)", async () => {
    await http.dropSessions();
    const c = await McpToolClient.connect([spec({ name: "fx", url: http.url, tools: ["echo"] })], FAST);
    expect(http.sessions()).toBe(1);
    await c.close();
    expect(http.sessions()).toBe(0);
  });

  test("the allow-list: an unknown name is a ConfigError listing what the server offers", async () => {
    const e = await McpToolClient.connect([spec({ name: "fx", url: http.url, tools: ["echo", "nope"] })]).catch((e) => e);
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.message).toBe("config mcp_servers[0].tools: MCP server 'fx' lists no tool 'nope'; it lists ['echo', 'two_parts', 'stats', 'stats_text', 'fail', 'picture', 'crash', 'slow', 'flaky']");
  });

  test("a tool offered by two servers is a ConfigError naming both", async () => {
    const e = await McpToolClient.connect([spec({ name: "a", url: http.url, tools: ["echo"] }), spec({ name: "b", url: http.url, tools: ["echo", "fail"] })]).catch((e) => e);
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.message).toBe("config mcp_servers: tool 'echo' is offered by MCP server 'a' and by MCP server 'b'; tool names must be unique (use the servers' tools allow-lists)");
  });

  test("a command server without a stdio transport (Workers) is a ConfigError", async () => {
    const e = await McpToolClient.connect([spec({ name: "local", command: "bun" })]).catch((e) => e);
    expect(e).toBeInstanceOf(ConfigError);
    expect(e.message).toBe("config mcp_servers[0].command: MCP server 'local': stdio servers need a runtime that starts processes (edgeloop serve, worker, rollout); give the server a url (Streamable HTTP) here");
  });

  test("a server that dies mid-call (JSON replies: before the reply's headers): an error observation naming the tool, at once", async () => {
    let dying: McpHttpServer;
    dying = serveMcpHttp(() => fixtureServer({ calls: [] }, () => void dying.stop()), { json: true });
    const c = await McpToolClient.connect([spec({ name: "fx", url: dying.url, timeout_ms: 30_000, max_retries: 1 })], FAST);
    expect(await c.call(req("crash"))).toEqual({ ok: false, call_id: "k:1:0", attempts: 1, content: "Error executing tool 'crash': the connection to MCP server 'fx' failed before a reply (1 attempt)" });
    // echo is not annotated idempotent: one attempt, which finds the server gone.
    expect(await c.call(req("echo", { text: "x" }))).toEqual({ ok: false, call_id: "k:1:0", attempts: 1, content: "Error executing tool 'echo': the connection to MCP server 'fx' failed before a reply (1 attempt)" });
    await c.close();
  });

  test("a server that dies mid-stream (SSE: headers and a log event sent): the same, at once", async () => {
    let dying: McpHttpServer;
    // The server stops a moment after its log event went out (Bun writes a stream's headers with its first chunk).
    dying = serveMcpHttp(() => fixtureServer({ calls: [] }, () => void setTimeout(() => void dying.stop(), 50)));
    const c = await McpToolClient.connect([spec({ name: "fx", url: dying.url, timeout_ms: 30_000, max_retries: 1 })], FAST);
    const t0 = performance.now();
    expect(await c.call(req("crash"))).toEqual({ ok: false, call_id: "k:1:0", attempts: 1, content: "Error executing tool 'crash': MCP server 'fx' closed the connection before answering (1 attempt)" });
    expect(performance.now() - t0).toBeLessThan(5000);
    await c.close();
  });

  test("a server that cannot be reached at start: a ToolError naming it", async () => {
    const e = await McpToolClient.connect([spec({ name: "gone", url: "http://127.0.0.1:9/mcp", max_retries: 1 })], FAST).catch((e) => e);
    expect(e.name).toBe("ToolError");
    expect(e.message).toBe("MCP server 'gone' (http://127.0.0.1:9/mcp): cannot list its tools: the connection to MCP server 'gone' failed before a reply (2 attempts)");
  });
});

describe("sseMessages (an SSE reply read whole)", () => {
  test("message events' data in order; multi-line data joined; comments, ids, retry and other events skipped", () => {
    const body = ': priming\nid: 1\nretry: 500\n\nevent: message\ndata: {"a":1}\n\nevent: ping\ndata: x\n\ndata: {"b":\ndata: 2}\r\n\r\ndata:{"c":3}';
    expect(sseMessages(body)).toEqual(['{"a":1}', '{"b":\n2}', '{"c":3}']);
    expect(sseMessages("")).toEqual([]);
  });
});
