import { AgentGateway, type EnginePool } from "../../../shared/agent-gateway/agent-gateway.ts";
import { sessionLimitsOf } from "../../../shared/agent-loop/session-limits.ts";
import type { AppConfig } from "../../../shared/config/app-config.ts";
import { redactUrl } from "../../../shared/http/outbound.ts";
import { versionStampedClient, type ExecutorDeps } from "../../../shared/rollout/executor.ts";
import { MemorySessionStorage, type SessionStorage } from "../../../shared/session/session-storage.ts";
import { unsignedAgentWarning } from "./warnings.ts";

/**
 * The agent gateway (sessions of `openai_agent`, served by
 * `functions/agent-gateway.ts`), linked into `deps.agentGateway` so the loop
 * reaches it. Agent sessions live with the trajectory sessions (`storage`:
 * the store's Redis), else in this process. `pools`: the clients of
 * `engine.pools` (`buildEnginePools` in `./engine.ts`), which `agent.roles` sends roles
 * to. Adds the `agent` (and `roles`) line to `describe` and the
 * unsigned-tasks warning to `warnings`.
 * @returns the gateway and `setPublicUrl`, which sets the URL agents reach this process's API at (unless `agent.public_url` is configured).
 */
export function buildAgentGateway(
  config: AppConfig,
  deps: ExecutorDeps,
  storage: SessionStorage | null,
  describe: string[],
  warnings: string[],
  pools: Record<string, EnginePool> = {},
): { agentGateway: AgentGateway; setPublicUrl(url: string): void } {
  const { tokenizer, maxModelLen } = deps;
  // Each pool's calls pass the same pause gate and version stamping as the default engine's.
  const stamped = Object.fromEntries(Object.entries(pools).map(([name, p]) => [name, { ...p, client: versionStampedClient({ ...deps, client: p.client }, null) }]));
  const agentGateway = new AgentGateway({
    storage: storage ?? new MemorySessionStorage(),
    tokenizer,
    client: versionStampedClient(deps, null),
    maxModelLen,
    modelName: config.engine.model ?? tokenizer.name,
    retainSeconds: config.store.retention.sessions,
    limits: sessionLimitsOf(config.limits),
    pools: stamped,
    ...(config.agent.roles ? { roles: config.agent.roles } : {}),
  });
  if (config.agent.roles) describe.push(`roles      ${Object.entries(config.agent.roles).map(([r, p]) => `${r} → ${p}`).join(", ")}`);
  let publicUrl: string | null = config.agent.public_url;
  deps.agentGateway = { gateway: agentGateway, publicUrl: () => publicUrl, agent: { url: config.agent.url, timeout_ms: config.agent.timeout_ms, secret: config.agent.secret, max_reply_bytes: config.agent.max_reply_bytes, abandoned_mask: config.agent.abandoned_mask } };
  if (config.agent.url) describe.push(`agent      openai_agent tasks to ${redactUrl(config.agent.url)} (timeout ${config.agent.timeout_ms} ms${config.agent.secret ? ", signed" : ""})`);
  const agentUnsigned = unsignedAgentWarning(config);
  if (agentUnsigned) warnings.push(agentUnsigned);
  return {
    agentGateway,
    setPublicUrl(url: string) {
      publicUrl = config.agent.public_url ?? url;
    },
  };
}
