import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TrajectoryRecord, type TrajectoryRecord as Rec } from "../../shared/schema/index.ts";
import { createMcpToolsServer, serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";

// The same rows through `edgeloop rollout` with the example tools as webhooks, as an MCP server over
// Streamable HTTP, and as an MCP server over stdio: the token streams must be identical.
const ROOT = join(import.meta.dir, "..", "..");
const BIN = join(ROOT, "bin", "edgeloop.mjs");
let dir: string;
let webhookServer: ToolServer;
let mcpServer: McpHttpServer;

async function rollout(toolsFile: object, out: string): Promise<{ code: number; stdout: string; stderr: string; records: Rec[] }> {
  const file = join(dir, `${out}.tools.json`);
  writeFileSync(file, JSON.stringify(toolsFile));
  // Async spawn: this test process serves the webhook and HTTP MCP servers meanwhile.
  const p = Bun.spawn(["node", BIN, "rollout", "--data", "rows.jsonl", "--n", "2", "--seed", "7", "--tools", file, "--out", `${out}.jsonl`, "--no-progress"], {
    cwd: dir,
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, NO_COLOR: "1" },
  });
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  const lines = code === 0 ? readFileSync(join(dir, `${out}.jsonl`), "utf8").trim().split("\n") : [];
  return { code, stdout, stderr, records: lines.map((l) => TrajectoryRecord.parse(JSON.parse(l))) };
}

/** What must be equal across the three runs: the token streams and everything the loop derived from the observations. */
function streams(r: Rec) {
  const info = r.extra_fields.trajectory_info as { sample_index: number };
  return {
    at: [info.sample_index, r.session_id],
    prompt_ids: r.prompt_ids,
    response_ids: r.response_ids,
    response_mask: r.response_mask,
    rollout_log_probs: r.rollout_log_probs,
    reward_score: r.reward_score,
    num_turns: r.num_turns,
    tool_errors: r.extra_fields.tool_errors,
    finish_reason: r.finish_reason,
  };
}
const ordered = (rs: Rec[]) => rs.map(streams).sort((a, b) => a.at[0]! - b.at[0]! || a.at[1]! - b.at[1]!);

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-mcp-"));
  const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 8);
  writeFileSync(join(dir, "rows.jsonl"), rows.join("\n") + "\n");
  webhookServer = startToolServer();
  mcpServer = serveMcpHttp(() => createMcpToolsServer());
});
afterAll(async () => {
  await webhookServer.stop();
  await mcpServer.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe("webhook tools and MCP tools give the same trajectories", () => {
  test("edgeloop rollout: webhooks, MCP over Streamable HTTP, MCP over stdio", async () => {
    const example = JSON.parse(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8")) as { tools: { url: string }[] };
    const webhookTools = { tools: example.tools.map((t) => ({ ...t, url: t.url.replace("{port}", String(webhookServer.port)) })) };
    const [viaWebhook, viaHttp, viaStdio] = await Promise.all([
      rollout(webhookTools, "webhook"),
      rollout({ mcp_servers: [{ name: "example", url: mcpServer.url }] }, "mcp-http"),
      rollout({ mcp_servers: [{ name: "example", command: process.execPath, args: [join(ROOT, "infra", "tools", "mcp-server.ts"), "--stdio"] }] }, "mcp-stdio"),
    ]);
    for (const r of [viaWebhook, viaHttp, viaStdio]) {
      expect(r.stderr).toContain("wrote 16 records");
      expect(r.code).toBe(0);
    }
    expect(viaHttp.stdout + viaHttp.stderr).toContain("tools      (no webhook tools) from ");
    expect(viaHttp.stdout + viaHttp.stderr).toContain(`mcp        example: calc, lookup (Streamable HTTP ${mcpServer.url})`);
    expect(viaStdio.stdout + viaStdio.stderr).toContain(`mcp        example: calc, lookup (stdio ${process.execPath})`);
    const expected = ordered(viaWebhook.records);
    // The rows do call tools: observation tokens (mask 0) follow a sampled turn.
    expect(viaWebhook.records.some((r) => r.num_turns > 2 && r.response_mask.includes(0))).toBe(true);
    expect(ordered(viaHttp.records)).toEqual(expected);
    expect(ordered(viaStdio.records)).toEqual(expected);
  });
});
