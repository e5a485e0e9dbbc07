import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { WebStandardStreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js";
import { CallToolRequestSchema, ListToolsRequestSchema, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { listen } from "../cli/listen.ts";
import { calcToolContent } from "./calc.ts";
import { DEFAULT_FACTS, lookupFact, type FactTable } from "./lookup.ts";
import example from "./tools.example.json" with { type: "json" };

/** Options of {@link createMcpToolsServer}. */
export interface McpToolsServerOptions {
  /** The `lookup` fact table (default: `infra/tools/facts.json`). */
  facts?: FactTable;
  /** Milliseconds every call is held before it is answered (default 0), as the webhook server's `delayMs`. */
  delayMs?: number;
  /** Called for every `tools/call` with the tool's name and the request's `_meta` (tests count calls with it). */
  onCall?: (name: string, meta: Record<string, unknown> | undefined) => void;
}

/**
 * The example tools `calc` and `lookup` as an MCP server (the SDK's `Server`):
 * `tools/list` gives the schemas of `infra/tools/tools.example.json` verbatim
 * (as `inputSchema`, annotated `readOnlyHint`: both are pure functions, so
 * edgeloop may retry them), `tools/call` answers one text part with the text
 * the webhook server answers (`calcToolContent`, `lookupFact`) — so a
 * trajectory through either gives the same tokens. An unknown tool is an
 * `isError` result.
 */
export function createMcpToolsServer(opts: McpToolsServerOptions = {}): Server {
  const server = new Server({ name: "edgeloop-example-tools", version: "0.1.0" }, { capabilities: { tools: {} } });
  const facts = opts.facts ?? DEFAULT_FACTS;
  server.setRequestHandler(ListToolsRequestSchema, () => ({
    tools: example.tools.map((t) => ({
      name: t.name,
      description: t.schema.function.description,
      inputSchema: t.schema.function.parameters as unknown as { type: "object"; properties: Record<string, object>; required: string[] },
      annotations: { readOnlyHint: true },
    })),
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req): Promise<CallToolResult> => {
    opts.onCall?.(req.params.name, req.params._meta);
    if (opts.delayMs) await new Promise((r) => setTimeout(r, opts.delayMs));
    const args = req.params.arguments ?? {};
    if (req.params.name === "calc") return { content: [{ type: "text", text: calcToolContent(args) }] };
    if (req.params.name === "lookup") return { content: [{ type: "text", text: lookupFact(String(args.query ?? ""), facts) }] };
    return { content: [{ type: "text", text: `unknown tool '${req.params.name}'` }], isError: true };
  });
  return server;
}

/** A running MCP server over Streamable HTTP on loopback. */
export interface McpHttpServer {
  /** The MCP endpoint, e.g. `http://127.0.0.1:41234/mcp`. */
  url: string;
  port: number;
  /** Stops listening and drops open connections. */
  stop(): Promise<void>;
  /** Open sessions. */
  sessions(): number;
  /** Forgets every session, as a restarted server would (their next requests get `404`). */
  dropSessions(): Promise<void>;
}

/** Sessions {@link serveMcpHttp} keeps at most; the oldest is closed past it. */
export const MAX_MCP_SESSIONS = 10_000;

/**
 * Serves MCP servers over Streamable HTTP at `/mcp`, with Bun's listener;
 * `port: 0` picks a free port. Stateful, as the SDK's examples are: an
 * `initialize` without `mcp-session-id` gets a fresh server from `make` and an
 * SDK transport under a new session id; later requests go to their session
 * (an unknown id is the SDK's `404`); `DELETE` ends one. At most
 * {@link MAX_MCP_SESSIONS} are kept (the oldest closed first). `json: true`
 * answers `application/json` instead of an SSE stream.
 */
export function serveMcpHttp(make: () => Server | { connect: Server["connect"] }, opts: { port?: number; hostname?: string; json?: boolean } = {}): McpHttpServer {
  const hostname = opts.hostname ?? "127.0.0.1";
  const sessions = new Map<string, WebStandardStreamableHTTPServerTransport>();
  const server = listen({
    port: opts.port ?? 0,
    hostname,
    fetch: async (req) => {
      if (new URL(req.url).pathname !== "/mcp") return new Response("not found", { status: 404 });
      const id = req.headers.get("mcp-session-id");
      const known = id !== null ? sessions.get(id) : undefined;
      if (known) return known.handleRequest(req);
      if (id !== null) return Response.json({ jsonrpc: "2.0", id: null, error: { code: -32001, message: "Session not found" } }, { status: 404 });
      const transport: WebStandardStreamableHTTPServerTransport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: () => crypto.randomUUID(),
        enableJsonResponse: opts.json ?? false,
        onsessioninitialized: (sid) => {
          sessions.set(sid, transport);
          if (sessions.size > MAX_MCP_SESSIONS) void sessions.values().next().value?.close();
        },
        onsessionclosed: (sid) => void sessions.delete(sid),
      });
      transport.onclose = () => void (transport.sessionId && sessions.delete(transport.sessionId));
      await make().connect(transport);
      return transport.handleRequest(req);
    },
  });
  const port = server.port!;
  const drop = async () => {
    const all = [...sessions.values()];
    sessions.clear();
    await Promise.all(all.map((t) => t.close().catch(() => undefined)));
  };
  return {
    url: `http://${hostname}:${port}/mcp`,
    port,
    sessions: () => sessions.size,
    dropSessions: drop,
    stop: async () => {
      await server.stop(true);
      await drop();
    },
  };
}

if (import.meta.main) {
  // `bun infra/tools/mcp-server.ts --stdio` (a stdio server) or `--port P` (Streamable HTTP at /mcp).
  const argv = process.argv.slice(2);
  if (argv.includes("--stdio")) {
    await createMcpToolsServer().connect(new StdioServerTransport());
  } else {
    const i = argv.indexOf("--port");
    const s = serveMcpHttp(() => createMcpToolsServer(), { port: i >= 0 ? Number(argv[i + 1]) : 0 });
    console.log(`edgeloop example MCP tools listening on ${s.url}`);
  }
}
