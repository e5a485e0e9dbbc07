import type { ToolsFile } from "../../../shared/schema/index.ts";
import type { ToolExecutor, WebhookToolClient } from "../../../shared/tools/webhook-tool-client.ts";
import { redactUrl } from "../../../shared/http/outbound.ts";

/**
 * The tools of a process (`serve`, `worker`, `rollout`): the tools file's
 * webhook tools, plus the tools of its `mcp_servers` when it names any —
 * connected (stdio servers started as child processes), listed, and closed by
 * a closer pushed on `closers`; one `mcp` line per server on `describe`.
 * Without `mcp_servers`, `webhook` itself is returned, and the MCP SDK is
 * not even loaded (it is imported on first use).
 * @throws ConfigError for a tool name offered twice (naming both owners) or a bad allow-list;
 *   ToolError naming a server that cannot be reached or listed
 */
export async function withMcpTools(file: ToolsFile, webhook: WebhookToolClient, closers: (() => Promise<void>)[], describe: string[]): Promise<ToolExecutor> {
  if (file.mcp_servers.length === 0) return webhook;
  const [{ McpToolClient }, { webhookAndMcpTools }, { stdioMcpTransport }] = await Promise.all([
    import("../../../shared/tools/mcp-tool-client.ts"),
    import("../../../shared/tools/composite-tool-executor.ts"),
    import("../../tools/mcp-stdio.ts"),
  ]);
  const mcp = await McpToolClient.connect(file.mcp_servers, { stdio: stdioMcpTransport });
  closers.push(() => mcp.close());
  for (const s of file.mcp_servers) {
    const names = mcp.names.filter((n) => mcp.serverOf(n) === s.name);
    describe.push(`mcp        ${s.name}: ${names.join(", ") || "(no tools)"} (${s.url !== undefined ? `Streamable HTTP ${redactUrl(s.url)}` : `stdio ${s.command}`})`);
  }
  try {
    return webhookAndMcpTools(webhook, mcp);
  } catch (e) {
    await mcp.close();
    throw e;
  }
}
