import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

/** What the fixture server saw: every tools/call's name and `_meta`. */
export interface FixtureLog {
  calls: { name: string; meta: Record<string, unknown> }[];
}

/**
 * An MCP server built with the SDK's `McpServer`, one tool per result shape
 * edgeloop maps: text, two text parts, structured content (with and without
 * text), `isError`, an image, a tool that kills the server mid-call
 * (`onCrash`), one that hangs until cancelled or 2 s (`slow`), and `flaky`
 * (annotated `idempotentHint`) that hangs on the first attempt of a call id
 * and answers the second.
 */
export function fixtureServer(log: FixtureLog, onCrash: () => void): McpServer {
  const server = new McpServer({ name: "fixture", version: "1.0.0" }, { capabilities: { logging: {} } });
  const record = (name: string, meta: Record<string, unknown> | undefined) => log.calls.push({ name, meta: { ...(meta ?? {}) } });
  const hang = (signal: AbortSignal) =>
    new Promise<void>((resolve) => {
      const t = setTimeout(resolve, 2000);
      signal.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
    });
  server.registerTool("echo", { description: "Echo the text.", inputSchema: { text: z.string() } }, ({ text }, extra) => {
    record("echo", extra._meta);
    return { content: [{ type: "text", text }] };
  });
  server.registerTool("two_parts", { description: "Two text parts." }, (extra) => {
    record("two_parts", extra._meta);
    return { content: [{ type: "text", text: "first" }, { type: "text", text: "second" }] };
  });
  server.registerTool(
    "stats",
    { description: "Count and sum.", inputSchema: { values: z.array(z.number()) }, outputSchema: { count: z.number(), sum: z.number() } },
    ({ values }, extra) => {
      record("stats", extra._meta);
      return { content: [], structuredContent: { count: values.length, sum: values.reduce((a, b) => a + b, 0) } };
    },
  );
  server.registerTool("stats_text", { description: "Structured content with a text part." }, (extra) => {
    record("stats_text", extra._meta);
    return { content: [{ type: "text", text: "count 2" }], structuredContent: { count: 2 } };
  });
  server.registerTool("fail", { description: "Always fails." }, (extra) => {
    record("fail", extra._meta);
    return { content: [{ type: "text", text: "division by zero" }], isError: true };
  });
  server.registerTool("picture", { description: "An image." }, (extra) => {
    record("picture", extra._meta);
    return { content: [{ type: "text", text: "here:" }, { type: "image", data: "iVBORw0KGgo=", mimeType: "image/png" }] };
  });
  server.registerTool("crash", { description: "Kills the server mid-call." }, async (extra) => {
    record("crash", extra._meta);
    // A log line first: over HTTP it opens the call's SSE stream (headers and one event sent), then the server dies mid-stream.
    await extra.sendNotification({ method: "notifications/message", params: { level: "info", data: "crashing" } });
    onCrash();
    await hang(extra.signal);
    return { content: [{ type: "text", text: "unreachable" }] };
  });
  server.registerTool("slow", { description: "Hangs." }, async (extra) => {
    record("slow", extra._meta);
    await hang(extra.signal);
    return { content: [{ type: "text", text: "late" }] };
  });
  server.registerTool("flaky", { description: "Hangs on a call id's first attempt.", annotations: { idempotentHint: true } }, async (extra) => {
    record("flaky", extra._meta);
    const id = extra._meta?.["edgeloop/call_id"];
    const n = log.calls.filter((c) => c.name === "flaky" && c.meta["edgeloop/call_id"] === id).length;
    if (n === 1) await hang(extra.signal);
    return { content: [{ type: "text", text: `answered attempt ${n}` }] };
  });
  return server;
}

if (import.meta.main) {
  // `bun tests/mcp/fixture-server.ts`: the fixture over stdio; `crash` exits the process.
  await fixtureServer({ calls: [] }, () => process.exit(1)).connect(new StdioServerTransport());
}
