/**
 * What an MCP tool call costs against the same tool as a webhook (issue 29):
 * `bun bench/mcp.ts [--n 2000] [--delay-ms 0]` (`--delay-ms`: the HTTP servers hold each call, as a tool that works would). The example `calc` tool (`12*3-5`), sequential
 * calls over loopback, interleaved in rounds so that both see the same machine:
 *
 * Every server runs in its own process (this script with `--serve KIND`), as a tool server would.
 * 1. webhook: `WebhookToolClient` → the example tool server (`startToolServer`, unsigned);
 * 2. MCP, Streamable HTTP, SSE replies: `McpToolClient` → `serveMcpHttp(createMcpToolsServer)`
 *    (one SDK server and transport per session, as the example serves);
 * 3. MCP, Streamable HTTP, JSON replies (`enableJsonResponse`);
 * 4. MCP, stdio: `McpToolClient` → `bun infra/tools/mcp-server.ts --stdio` (a child process).
 *
 * The last column is this process's CPU (user + system) per call: edgeloop's side only.
 * Every call has its own call id (the webhook server would answer a repeated
 * id from its cache). Prints median and p99 per call in microseconds and the
 * ratio of medians to the webhook's; issue 29's target is ≤ 1.2× over loopback for HTTP.
 */
import { join } from "node:path";
import { McpServerSpec } from "../shared/schema/index.ts";
import { McpToolClient } from "../shared/tools/mcp-tool-client.ts";
import { parseToolsFile } from "../shared/tools/tools-file.ts";
import { WebhookToolClient, type ToolExecutor } from "../shared/tools/webhook-tool-client.ts";
import { createMcpToolsServer, serveMcpHttp } from "../infra/tools/mcp-server.ts";
import { stdioMcpTransport } from "../infra/tools/mcp-stdio.ts";
import { startToolServer } from "../infra/tools/server.ts";
import { arg, median, printTable } from "./util.ts";

const n = Number(arg("--n", "2000"));
const root = join(import.meta.dir, "..");
const delayMs = Number(arg("--delay-ms", "0"));
const serve = arg("--serve", "");
if (serve) {
  // A child process serving one kind: its URL on stdout, then it runs until killed.
  const url = serve === "webhook" ? startToolServer({ delayMs }).url : serveMcpHttp(() => createMcpToolsServer({ delayMs }), { json: serve === "json" }).url;
  console.log(url);
} else {
  await main();
}

/** Starts `bun bench/mcp.ts --serve kind` and reads the URL it prints. */
async function child(kind: string): Promise<{ url: string; kill: () => void }> {
  const p = Bun.spawn([process.execPath, import.meta.path, "--serve", kind, "--delay-ms", String(delayMs)], { stdout: "pipe", stderr: "inherit" });
  const reader = p.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error(`bench server ${kind} exited`);
    text += new TextDecoder().decode(value);
  }
  return { url: text.trim(), kill: () => p.kill() };
}

async function main(): Promise<void> {
const [tools, sse, json] = await Promise.all([child("webhook"), child("sse"), child("json")]);
const file = parseToolsFile(await Bun.file(join(root, "infra", "tools", "tools.example.json")).text(), { vars: { port: new URL(tools.url).port } });
const clients: [string, ToolExecutor][] = [
  ["webhook (HTTP POST, JSON)", new WebhookToolClient(file.tools)],
  ["MCP Streamable HTTP, SSE replies", await McpToolClient.connect([McpServerSpec.parse({ name: "sse", url: sse.url })])],
  ["MCP Streamable HTTP, JSON replies", await McpToolClient.connect([McpServerSpec.parse({ name: "json", url: json.url })])],
  ["MCP stdio (child process)", await McpToolClient.connect([McpServerSpec.parse({ name: "stdio", command: process.execPath, args: [join(root, "infra", "tools", "mcp-server.ts"), "--stdio"] })], { stdio: stdioMcpTransport })],
];

const times = clients.map(() => [] as number[]);
const cpu = clients.map(() => 0);
let seq = 0;
const once = async (c: ToolExecutor, record: number[] | null) => {
  const t0 = performance.now();
  const r = await c.call({ name: "calc", arguments: { expression: "12*3-5" }, key: "bench", turn: 1, index: seq++ });
  if (record) record.push((performance.now() - t0) * 1000);
  if (!r.ok || r.content !== "31") throw new Error(`unexpected result: ${JSON.stringify(r)}`);
};
for (let i = 0; i < 200; i++) for (const [, c] of clients) await once(c, null);
const round = 50;
for (let done = 0; done < n; done += round) {
  for (const [i, [, c]] of clients.entries()) {
    const u0 = process.cpuUsage();
    for (let k = 0; k < round; k++) await once(c, times[i]!);
    const u = process.cpuUsage(u0);
    cpu[i]! += u.user + u.system;
  }
}
const base = median(times[0]!);
const rows: string[][] = [["path", "median µs", "p99 µs", "× webhook (median)", "edgeloop CPU µs/call"]];
for (const [i, [name]] of clients.entries()) {
  const us = times[i]!.sort((a, b) => a - b);
  rows.push([name, median(us).toFixed(0), us[Math.floor(us.length * 0.99)]!.toFixed(0), (median(us) / base).toFixed(2), (cpu[i]! / us.length).toFixed(0)]);
}
printTable(`one calc call${delayMs ? ` (tools held ${delayMs} ms; not the stdio one)` : ""}, sequential, ${n} calls per path (interleaved rounds of ${round}), loopback`, rows);
for (const [, c] of clients) if (c instanceof McpToolClient) await c.close();
for (const c of [tools, sse, json]) c.kill();
}
