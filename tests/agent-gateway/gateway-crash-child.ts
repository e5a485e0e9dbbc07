/**
 * The agent gateway as a process the serve test kills at a chosen point:
 * `createAgentGatewayApp` on `Bun.serve` (127.0.0.1:GW_PORT), sessions in
 * Redis (`RedisSessionStorage`, prefix GW_PREFIX), the engine over HTTP
 * (GW_ENGINE, vLLM format). With GW_EXIT_AT_STEP=N it exits (code 137, as a
 * SIGKILL would leave it) the moment its storage append of step N returns —
 * the turn is committed, its reply never sent. GW_SESSION (JSON of an
 * `AgentSessionInput`) is created at start (idempotent). Prints `listening`.
 */
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import type { SessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";

const env = process.env;
const exitAt = env.GW_EXIT_AT_STEP ? Number(env.GW_EXIT_AT_STEP) : null;
const inner = new RedisSessionStorage(new IoRedisCommander(env.REDIS_URL ?? "redis://127.0.0.1:6379"), { prefix: env.GW_PREFIX });
const storage = new Proxy(inner, {
  get(target, prop) {
    if (prop === "append") {
      return async (...a: Parameters<SessionStorage["append"]>) => {
        const r = await target.append(...a);
        if (a[1] === exitAt) process.exit(137);
        return r;
      };
    }
    const v = (target as unknown as Record<PropertyKey, unknown>)[prop];
    return typeof v === "function" ? v.bind(target) : v;
  },
}) as SessionStorage;
const tokenizer = await defaultTokenizer();
const client = createEngineClient({ url: env.GW_ENGINE!, format: "vllm" });
const gateway = new AgentGateway({ storage, tokenizer, client, maxModelLen: 4096 });
if (env.GW_SESSION) await gateway.create(JSON.parse(env.GW_SESSION));
const app = createAgentGatewayApp({ gateway });
Bun.serve({ hostname: "127.0.0.1", port: Number(env.GW_PORT), fetch: app.fetch });
console.log("listening");
