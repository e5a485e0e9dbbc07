/**
 * `edgeloop/functions` — the Hono apps every runtime serves (Bun's
 * `edgeloop serve`, the Deno entry, the Cloudflare Worker): the rollout API
 * (`createRolloutsApp`: batches, groups, progress, engine control, metrics),
 * durable-session callbacks (`createSessionsApp`), the agent gateway
 * (`createAgentGatewayApp`, OpenAI-compatible for external agents) and the
 * inference gateway (`createGatewayApp`: sticky routing to engine replicas).
 * Each takes its services as options; `infra/` builds them per runtime.
 */
export { createRolloutsApp, type RolloutsAppOptions } from "./rollouts.ts";
export { createSessionsApp, type SessionsAppOptions } from "./sessions.ts";
export { createAgentGatewayApp, type AgentGatewayAppOptions } from "./agent-gateway.ts";
export { createGatewayApp, type Gateway, type GatewayOptions } from "./gateway.ts";
