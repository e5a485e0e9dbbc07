import { readFile } from "node:fs/promises";
import { ConfigError } from "../../shared/errors.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import { startSimEngine } from "../sim-engine/server.ts";
import { startUpstashBridge } from "../upstash-bridge/upstash-bridge.ts";
import { checkRedis, maskRedisUrl } from "../redis/redis-check.ts";
import { DEFAULT_SCRIPT } from "./runtime.ts";

/** Resolves when SIGINT or SIGTERM arrives. */
export function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    process.once("SIGINT", () => resolve());
    process.once("SIGTERM", () => resolve());
  });
}

/** `edgeloop sim-engine --port P [--replicas K] [--script FILE]`: serves K simulated replicas on ports P..P+K−1. */
export async function simEngineCommand(o: { port: number; replicas: number; script?: string; host: string }): Promise<void> {
  const path = o.script ?? DEFAULT_SCRIPT;
  let script: unknown;
  try {
    script = JSON.parse(await readFile(path, "utf8"));
  } catch (e) {
    throw new ConfigError("--script", `cannot read ${path}: ${(e as Error).message}`);
  }
  const sim = await startSimEngine({ port: o.port, replicas: o.replicas, hostname: o.host, script });
  console.log(`edgeloop sim-engine: ${sim.urls.join(" ")} (vLLM /v1/completions, /inference/v1/generate; SGLang /generate; script ${path})`);
  await untilSignal();
  await sim.stop();
}

/**
 * `edgeloop gateway --replicas URL,URL --port P [--policy …]`: the sticky-routing gateway.
 * `EDGELOOP_ADMIN_TOKEN` (environment, so it stays out of `ps` and shell
 * history), when set, guards `/admin/*` with `Authorization: Bearer <token>`.
 */
export async function gatewayCommand(o: { replicas: string; port: number; policy: "least_inflight_sticky" | "bounded_load_hash" | "round_robin"; host: string }): Promise<void> {
  const replicas = o.replicas.split(",").map((s) => s.trim()).filter(Boolean);
  const adminToken = process.env.EDGELOOP_ADMIN_TOKEN || null;
  const gw = createGatewayApp({ replicas, policy: o.policy, adminToken });
  const server = Bun.serve({ port: o.port, hostname: o.host, fetch: gw.fetch, idleTimeout: 0 });
  console.log(
    `edgeloop gateway on http://${o.host}:${server.port} -> ${replicas.join(", ")} (${o.policy}); ` +
      (adminToken ? "/admin/* needs the bearer token from EDGELOOP_ADMIN_TOKEN" : "/admin/* is open (set EDGELOOP_ADMIN_TOKEN to require a bearer token)"),
  );
  await untilSignal();
  server.stop(true);
}

/**
 * `edgeloop upstash-bridge --port P --redis URL --token T`: the Upstash REST protocol over local Redis.
 * @throws StoreError naming the (masked) URL when Redis does not answer within a few seconds.
 */
export async function upstashBridgeCommand(o: { port: number; redis: string; token: string; host: string }): Promise<void> {
  await checkRedis(o.redis, { what: "--redis" });
  const bridge = await startUpstashBridge({ port: o.port, hostname: o.host, redisUrl: o.redis, token: o.token });
  console.log(`edgeloop upstash-bridge on ${bridge.url} -> ${maskRedisUrl(o.redis)}`);
  await untilSignal();
  await bridge.stop();
}
