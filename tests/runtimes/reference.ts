import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import type { Services } from "./harness.ts";

/**
 * The same batch run in this Bun process (memory store, plain executor): the records every runtime must match.
 * With `agent`, `openai_agent` rows POST their tasks to `agent.url` (signed with `agent.secret`) and the
 * agent gateway is served on a loopback port (as `rollout --agent URL` does).
 */
export async function bunReference(s: Services, rows: Record<string, unknown>[], agent?: { url: string; secret?: string; timeoutMs?: number }): Promise<Map<string, TrajectoryRecord>> {
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-ref-"));
  const toolsFile = join(dir, "tools.json");
  writeFileSync(toolsFile, s.toolsJson);
  const agentFlags = agent ? { agent: agent.url, agentTimeoutMs: agent.timeoutMs ?? 30_000, ...(agent.secret ? { agentSecret: agent.secret } : {}) } : {};
  const rt = await buildRuntime({ engine: s.engine.urls[0], tools: toolsFile, toolsSecret: "runtime-secret", n: 2, seed: 7, maxModelLen: 4096, promptLength: 512, responseLength: 512, ...agentFlags });
  const gw = agent ? Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createAgentGatewayApp({ gateway: rt.agentGateway }).fetch }) : null;
  if (gw) rt.setPublicUrl(`http://127.0.0.1:${gw.port}`);
  try {
    const { run } = rt.service.submit({ rows, global_steps: -1, model_version: null, validate: false });
    await run.run();
    return new Map(run.records().map((r) => [r.key, r]));
  } finally {
    gw?.stop(true);
    await rt.close();
    rmSync(dir, { recursive: true, force: true });
  }
}
