// For tests/mcp/mcp-stdio-guards.test.ts: connects to a never-initializing stdio server (argv[2]: its pid file), and
// exits with status 2 the moment the start fails, as `edgeloop rollout` does.
import { join } from "node:path";
import { McpServerSpec } from "../../shared/schema/index.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { stdioMcpTransport } from "../../infra/tools/mcp-stdio.ts";

const spec = McpServerSpec.parse({ name: "mute", command: process.execPath, args: [join(import.meta.dir, "hostile-stdio.ts"), "noinit", process.argv[2]!], timeout_ms: 8_000, max_retries: 0 });
// Not awaited on purpose: the process exits while the SDK's own close of the child (stdin end, 2 s, SIGTERM) is pending.
McpToolClient.connect([spec], { stdio: stdioMcpTransport }).catch((e: Error) => {
  console.error(e.message);
  process.exit(2);
});
