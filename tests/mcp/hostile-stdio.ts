// Misbehaving stdio MCP servers for tests/mcp/mcp-stdio-guards.test.ts, chosen by argv[2]:
//   flood        — prints lines that are not JSON-RPC to stdout forever (like `yes` as the command).
//   noinit PIDF  — writes its pid to PIDF, never answers initialize, ignores stdin's end and keeps a timer alive.
//   big          — a real MCP server whose `big` tool answers 2 MiB of text and whose `wait` tool never answers (and `echo` answers ok).
import { writeFileSync } from "node:fs";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

const mode = process.argv[2];
if (mode === "flood") {
  const chunk = "not json-rpc\n".repeat(4096);
  const write = (): void => void process.stdout.write(chunk, write);
  write();
} else if (mode === "noinit") {
  writeFileSync(process.argv[3]!, String(process.pid));
  process.stdin.on("data", () => {});
  process.stdin.on("end", () => {});
  setInterval(() => {}, 1000);
} else if (mode === "big") {
  const server = new McpServer({ name: "big", version: "1.0.0" });
  server.registerTool("big", { description: "2 MiB of text." }, () => ({ content: [{ type: "text", text: "x".repeat(2 * 1024 * 1024) }] }));
  server.registerTool("echo", { description: "Answers ok." }, () => ({ content: [{ type: "text", text: "ok" }] }));
  server.registerTool("wait", { description: "Never answers." }, (extra) => new Promise((_, reject) => extra.signal.addEventListener("abort", () => reject(new Error("aborted")))));
  await server.connect(new StdioServerTransport());
}
