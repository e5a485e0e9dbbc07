import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Miniflare } from "miniflare";
import { requireRedis } from "../helpers/redis.ts";
import { createMcpToolsServer, serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { awaitRecords, batchRows, checkRecords, comparableRecord, startServices, startWorkerd, workerBindings, type Services, type Workerd } from "./harness.ts";
import { bunReference } from "./reference.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 29 on Cloudflare Workers: the example tools from an MCP server over Streamable HTTP (EDGELOOP_TOOLS
// names only `mcp_servers`), called from Durable Object sessions in workerd; the records equal Bun's run of
// the same rows with the tools as webhooks.
const redis = await requireRedis();
let s: Services;
let w: Workerd;
let mf: Miniflare;
let mcp: McpHttpServer;
let mcpCalls = 0;

beforeAll(async () => {
  if (!redis) return;
  s = await startServices("workerd-mcp");
  mcp = serveMcpHttp(() => createMcpToolsServer({ onCall: () => void mcpCalls++ }));
  w = await startWorkerd({ ...workerBindings(s), EDGELOOP_TOOLS: JSON.stringify({ mcp_servers: [{ name: "example", url: mcp.url }] }) });
  mf = w.mf;
}, HANG_MS);
afterAll(async () => {
  await w?.stop();
  await mcp?.stop();
  await s?.stop();
});

describe.skipIf(!redis)("workerd: MCP tools over Streamable HTTP", () => {
  test("every tool call goes to the MCP server; records identical to Bun's with webhook tools", async () => {
    const rows = batchRows("wdm");
    const res = await mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    const records = await awaitRecords(s.prefix, ["wdm0", "wdm1", "wdm2", "wdm3"], 2);
    for (const r of records.values()) expect([r.key, r.extra_fields.tool_errors]).toEqual([r.key, 0]);
    expect(checkRecords(records)).toBe(10);
    expect(mcpCalls).toBe(10);
    // None went to the webhook server.
    const stats = (await (await fetch(`${s.tools.url}/stats`)).json()) as { executions: number };
    expect(stats.executions).toBe(0);
    const reference = await bunReference(s, rows);
    for (const [key, r] of records) expect(comparableRecord(r)).toEqual(comparableRecord(reference.get(key)!));
  }, HANG_MS);
});
