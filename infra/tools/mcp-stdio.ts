import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import type { McpTransportFactory } from "../../shared/tools/mcp-tool-client.ts";
import { DEFAULT_WEBHOOK_MAX_REPLY_BYTES } from "../../shared/http/outbound.ts";

/** Room for the JSON-RPC envelope around a reply of `max_reply_bytes`, bytes. */
const ENVELOPE_BYTES = 64 * 1024;

/**
 * The stdio transport of `command` MCP servers (the SDK's
 * `StdioClientTransport`): the server runs as a child process with `args`, its
 * environment the SDK's safe defaults (`HOME`, `PATH`, …) plus `env`, its
 * stderr inherited (its log lines appear in edgeloop's). A line longer than
 * `max_reply_bytes` (default 4 MiB) plus 64 KiB of envelope makes the SDK close
 * the transport, so the call reads as a lost connection. Runtimes with
 * processes only (`serve`, `worker`, `rollout`); Workers and Deno functions
 * have none.
 */
export const stdioMcpTransport: McpTransportFactory = (server) =>
  new StdioClientTransport({
    command: server.command!,
    args: server.args ?? [],
    ...(server.env ? { env: server.env } : {}),
    stderr: "inherit",
    maxBufferSize: (server.max_reply_bytes ?? DEFAULT_WEBHOOK_MAX_REPLY_BYTES) + ENVELOPE_BYTES,
  });
