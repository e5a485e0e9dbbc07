import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type { AppConfig } from "../../../shared/config/app-config.ts";
import { ConfigError } from "../../../shared/errors.ts";
import type { SandboxSpec, ToolsFile } from "../../../shared/schema/index.ts";
import { interactionClients, type InteractionClient } from "../../../shared/tools/interaction-client.ts";
import { parseToolsFile } from "../../../shared/tools/tools-file.ts";
import { WebhookToolClient, type ToolExecutor } from "../../../shared/tools/webhook-tool-client.ts";
import { withMcpTools } from "./mcp.ts";
import { startToolServer } from "../../tools/server.ts";
import { PACKAGE_ROOT } from "./package-paths.ts";
import { hasSignedCalls } from "./warnings.ts";

/**
 * The webhook tools, MCP servers (`withMcpTools`, builders/mcp.ts) and simulated users (`interactions`) of `tools.file`, the webhooks
 * signed with `tools.secret`; with no file, the example tool server's (its
 * `calc`, `lookup` and the `gsm8k_user` simulated user) on a free loopback port.
 * `sandbox`: the file's sandbox lifecycle, when it has one (built by builders/sandbox.ts).
 * `signedCalls`: whether `tools.file` has webhook tools or simulated users (calls signed with
 * `tools.secret`; MCP requests never are); false without a file.
 */
export async function buildTools(config: AppConfig, closers: (() => Promise<void>)[], describe: string[]): Promise<{ tools: ToolExecutor; interactions: Record<string, InteractionClient>; signedCalls: boolean; sandbox?: SandboxSpec }> {
  const secret = config.tools.secret ?? undefined;
  const users = (file: ToolsFile) => (file.interactions.length > 0 ? `; simulated users ${file.interactions.map((i) => i.name).join(", ")}` : "");
  if (config.tools.file) {
    const text = await readFile(config.tools.file, "utf8").catch((e) => {
      throw new ConfigError("tools.file", `cannot read ${config.tools.file}: ${(e as Error).message}`);
    });
    const file = parseToolsFile(text, { source: config.tools.file });
    describe.push(`tools      ${file.tools.map((t) => t.name).join(", ") || "(no webhook tools)"} from ${config.tools.file}${users(file)}`);
    return { tools: await withMcpTools(file, new WebhookToolClient(file.tools, { secret }), closers, describe), interactions: interactionClients(file.interactions, { secret }), signedCalls: hasSignedCalls(file), ...(file.sandbox ? { sandbox: file.sandbox } : {}) };
  }
  const server = startToolServer({ port: 0, secret });
  closers.push(() => server.stop());
  const text = await readFile(join(PACKAGE_ROOT, "infra", "tools", "tools.example.json"), "utf8");
  const file = parseToolsFile(text, { source: "infra/tools/tools.example.json", vars: { port: server.port } });
  describe.push(`tools      ${file.tools.map((t) => t.name).join(", ")} (example tool server on ${server.url})${users(file)}`);
  return { tools: new WebhookToolClient(file.tools, { secret }), interactions: interactionClients(file.interactions, { secret }), signedCalls: false };
}
