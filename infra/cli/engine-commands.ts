import { redactUrl } from "../../shared/http/outbound.ts";
import { parseLayeredConfig } from "../../shared/config/app-config.ts";
import { ConfigError, InputError } from "../../shared/errors.ts";
import { DEFAULT_ENGINE_TIMEOUT_MS } from "../../shared/inference/engine-http.ts";
import { normaliseUrl } from "../../shared/inference/replica-pool.ts";
import { createGatewayApp, DEFAULT_SHARED_EPSILON, DEFAULT_STICKY_EPSILON, PROXIED_ROUTES } from "../../functions/gateway.ts";
import { secretFromEnv } from "./secrets.ts";
import { DEFAULT_EPSILON } from "../../shared/inference/bounded-load-hash.ts";
import { startSimEngine } from "../sim-engine/server.ts";
import type { SimWireOptions } from "../sim-engine/app.ts";
import type { SimEngineVersion } from "../sim-engine/wire.ts";
import { readSimScriptFile } from "../sim-engine/script-file.ts";
import { loadTokenizer } from "../node/model-dir.ts";
import { startUpstashBridge } from "../upstash-bridge/upstash-bridge.ts";
import { checkRedis, maskRedisUrl } from "../redis/redis-check.ts";
import { readConfigFile } from "./files.ts";
import { DEFAULT_SCRIPT } from "./builders/package-paths.ts";
import { buildPausedReader, buildRoutingState } from "./builders/store.ts";
import { gatewayOptions } from "./gateway-options.ts";
import { listen } from "./listen.ts";

/** Resolves when SIGINT or SIGTERM arrives. */
export function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    process.once("SIGINT", () => resolve());
    process.once("SIGTERM", () => resolve());
  });
}

/** `edgeloop sim-engine --port P [--replicas K] [--script FILE] [--model NAME|DIR]`: serves K simulated replicas on ports P..P+K−1. */
export async function simEngineCommand(o: {
  port: number;
  replicas: number;
  script?: string;
  host: string;
  model?: string;
  moe?: string;
  maxModelLen?: number;
  kvCacheBlocks?: number;
  prefillMsPerToken?: number;
  decodeMsPerToken?: number;
  engineVersion?: SimEngineVersion;
  apiKey?: string;
  adminApiKey?: string;
  promptTokensDetails?: boolean;
  scaleOut?: boolean;
}): Promise<void> {
  const moe = o.moe === undefined ? undefined : parseMoeFlag(o.moe);
  // Replica i listens on port + i: every one of those ports must exist (Bun.serve throws a RangeError past 65535).
  if (o.port > 0 && o.port + o.replicas - 1 > 65535) {
    throw new InputError("--port", `${o.port} with --replicas ${o.replicas} needs ports ${o.port}..${o.port + o.replicas - 1}, past 65535: use --port ${65536 - o.replicas} or lower (or --port 0 for free ports)`);
  }
  if (o.apiKey === "") throw new InputError("--api-key", "must not be empty");
  if (o.adminApiKey === "") throw new InputError("--admin-api-key", "must not be empty");
  const wire: SimWireOptions = {
    engineVersion: o.engineVersion ?? "main",
    apiKey: o.apiKey ?? process.env.EDGELOOP_SIM_API_KEY ?? null,
    adminApiKey: o.adminApiKey ?? process.env.EDGELOOP_SIM_ADMIN_API_KEY ?? null,
    promptTokensDetails: o.promptTokensDetails !== false,
    scaleOut: o.scaleOut !== false,
  };
  const path = o.script ?? DEFAULT_SCRIPT;
  let script: unknown;
  try {
    script = await readSimScriptFile(path);
  } catch (e) {
    throw new ConfigError("--script", `cannot read ${path}: ${(e as Error).message}`);
  }
  const tokenizer = await loadTokenizer(o.model);
  const latency = o.prefillMsPerToken !== undefined || o.decodeMsPerToken !== undefined ? { prefill_ms_per_token: o.prefillMsPerToken ?? 0, decode_ms_per_token: o.decodeMsPerToken ?? 0 } : undefined;
  const sim = await startSimEngine({
    port: o.port,
    replicas: o.replicas,
    hostname: o.host,
    script,
    tokenizer,
    ...(moe ? { moe } : {}),
    ...(o.maxModelLen !== undefined ? { maxModelLen: o.maxModelLen } : {}),
    ...(o.kvCacheBlocks !== undefined ? { kvCacheBlocks: o.kvCacheBlocks } : {}),
    ...(latency ? { latency } : {}),
    wire,
  });
  const m = sim.replicas[0]!.engine.moe;
  const plays = [
    `vLLM ${wire.engineVersion} /v1/completions${wire.scaleOut ? ", /inference/v1/generate" : " (scale-out off: no /inference/v1/generate)"}${wire.promptTokensDetails ? "" : ", no prompt-token details"}`,
    "SGLang main /generate",
    wire.apiKey || wire.adminApiKey ? `keys required (${[wire.apiKey ? "API" : "", wire.adminApiKey ? "admin" : ""].filter(Boolean).join(", ")})` : "no keys",
  ];
  console.log(`edgeloop sim-engine: ${sim.urls.join(" ")} (${plays.join("; ")}; script ${path}; model ${tokenizer.name}; routed experts ${m.layers} layers × top-${m.top_k} of ${m.num_experts})`);
  await untilSignal();
  await sim.stop();
}

/**
 * `--moe layers,top_k,num_experts` of `edgeloop sim-engine` (`num_experts` optional).
 * @throws ConfigError naming `--moe` when it is not two or three integers >= 1 with num_experts >= top_k
 */
export function parseMoeFlag(text: string): { layers: number; top_k: number; num_experts?: number } {
  const parts = text.split(",").map((x) => Number(x.trim()));
  if ((parts.length !== 2 && parts.length !== 3) || parts.some((x) => !Number.isInteger(x) || x < 1) || (parts.length === 3 && parts[2]! < parts[1]!)) {
    throw new ConfigError("--moe", `expected layers,top_k[,num_experts] (integers >= 1, num_experts >= top_k), got '${text}'`);
  }
  return { layers: parts[0]!, top_k: parts[1]!, ...(parts.length === 3 ? { num_experts: parts[2]! } : {}) };
}

/**
 * `edgeloop gateway --replicas URL,URL --port P [--policy …] [--config FILE]
 * [--attempt-timeout-ms MS] [--eject-after N] [--cooldown-ms MS] [--max-attempts N]`:
 * [--store URL] [--store-prefix P] [--no-shared-state]`:
 * the sticky-routing gateway; the failure-handling settings come from the
 * config file's `gateway` section with the flags over it. With a Redis or
 * Upstash store (`--store`, or the config's `store.url`) and
 * `gateway.shared_state` (default true), routing state is shared by every
 * instance through the store (`RedisRoutingState`) and `--policy` is not used.
 * `EDGELOOP_ADMIN_TOKEN` (environment, or a file named by
 * `EDGELOOP_ADMIN_TOKEN_FILE`, so it stays out of `ps` and shell history),
 * when set, guards `/admin/*` with `Authorization: Bearer <token>`; without
 * it `/admin/*` is off (403 `admin_disabled`), as the start line says. Only
 * the engine generation routes are forwarded (`PROXIED_ROUTES`).
 * @throws ConfigError for an unreadable config file or an invalid value (named by its path)
 */
export async function gatewayCommand(o: {
  replicas: string;
  port: number;
  policy: "least_inflight_sticky" | "bounded_load_hash" | "round_robin";
  host: string;
  config?: string;
  attemptTimeoutMs?: number;
  ejectAfter?: number;
  cooldownMs?: number;
  maxAttempts?: number;
  healthIntervalMs?: number;
  epsilon?: number;
  maxStickyKeys?: number;
  store?: string;
  storePrefix?: string;
  sharedState?: boolean;
  /** Where `--policy` came from (commander's option value source): `cli` when given on the command line. */
  policySource?: string;
}): Promise<void> {
  const replicas = replicaUrls(o.replicas);
  const adminToken = secretFromEnv("EDGELOOP_ADMIN_TOKEN");
  const fileCfg = o.config ? await readConfigFile(o.config) : {};
  const flags = {
    gateway: { attempt_timeout_ms: o.attemptTimeoutMs, eject_after: o.ejectAfter, cooldown_ms: o.cooldownMs, max_attempts: o.maxAttempts, health_interval_ms: o.healthIntervalMs, epsilon: o.epsilon, max_sticky_keys: o.maxStickyKeys, shared_state: o.sharedState === false ? false : undefined },
    store: { url: o.store, prefix: o.storePrefix },
  };
  const cfg = parseLayeredConfig(fileCfg, flags, o.config ?? "flags");
  const g = cfg.gateway;
  checkRoutingSettings(o, cfg, (fileCfg as { gateway?: { max_sticky_keys?: unknown } }).gateway?.max_sticky_keys !== undefined);
  if (o.storePrefix !== undefined && cfg.store.url === "memory") throw new InputError("--store-prefix", "applies with --store (routing state shared in Redis/Upstash); without a store the gateway keeps its state in memory");
  const closers: (() => Promise<void>)[] = [];
  const routingState = buildRoutingState(cfg, closers);
  const enginesPaused = buildPausedReader(cfg, closers);
  const gw = createGatewayApp({
    replicas,
    policy: o.policy,
    adminToken,
    routingState,
    ...(enginesPaused ? { enginesPaused } : {}),
    ...gatewayOptions(g),
    maxReplyBytes: cfg.engine.max_reply_bytes,
  });
  const server = listen({ port: o.port, hostname: o.host, fetch: gw.fetch });
  const breaker =
    `attempt timeout ${g.attempt_timeout_ms ? `${g.attempt_timeout_ms} ms` : "none"}, eject after ${g.eject_after}, cool-down ${g.cooldown_ms} ms, ` +
    `health checks ${g.health_interval_ms > 0 ? `every ${g.health_interval_ms} ms` : "on demand"}${enginesPaused ? " (not counted while the store's pause gate is closed)" : ""}`;
  if (!g.attempt_timeout_ms) console.error(NO_ATTEMPT_TIMEOUT_WARNING);
  // The routing rule with the settings it uses (defaults as createGatewayApp applies them).
  const eps = (d: number) => `ε ${g.epsilon ?? d}`;
  const routing = routingState
    ? `routing state shared in ${maskRedisUrl(cfg.store.url)} (prefix ${cfg.store.prefix}; sticky, bounded load, ${eps(DEFAULT_SHARED_EPSILON)}, sticky ε ${g.sticky_epsilon ?? DEFAULT_STICKY_EPSILON})`
    : o.policy === "bounded_load_hash"
      ? `${o.policy}, ${eps(DEFAULT_EPSILON)}`
      : o.policy === "least_inflight_sticky"
        ? `${o.policy}, ${g.max_sticky_keys} sticky keys`
        : o.policy;
  console.log(
    `edgeloop gateway on http://${o.host}:${server.port} -> ${replicas.map(redactUrl).join(", ")} (${routing}; ${breaker}); ` +
      `forwards only ${PROXIED_ROUTES.join(", ")}; ` +
      (adminToken ? "/admin/* needs the bearer token from EDGELOOP_ADMIN_TOKEN" : "/admin/* is off (set EDGELOOP_ADMIN_TOKEN to enable it behind a bearer token)"),
  );
  await untilSignal();
  server.stop(true);
  for (const close of closers) await close().catch(() => undefined);
}

/**
 * Refuses routing settings the chosen routing would not use (nothing is
 * accepted and ignored): with a shared routing state (a Redis/Upstash store,
 * `gateway.shared_state`), an explicit `--policy` and `max_sticky_keys`
 * (the state's own rule routes: sticky pins under a bounded-load cap);
 * without one, `sticky_epsilon` (shared state only), `epsilon` unless the
 * policy is `bounded_load_hash`, and `max_sticky_keys` unless it is
 * `least_inflight_sticky`. Each error names the flag when a flag set the
 * value, else the config key.
 * @throws InputError / ConfigError (exit 2)
 */
export function checkRoutingSettings(
  o: { policy: string; policySource?: string; epsilon?: number; maxStickyKeys?: number; config?: string },
  cfg: { store: { url: string }; gateway: { shared_state: boolean; epsilon: number | null; sticky_epsilon: number | null; max_sticky_keys: number } },
  stickyKeysInFile: boolean,
): void {
  const shared = cfg.store.url !== "memory" && cfg.gateway.shared_state;
  const refuse = (flag: string | null, key: string, why: string): never => {
    if (flag) throw new InputError(flag, why);
    throw new ConfigError(key, `${why} (in ${o.config ?? "config"})`);
  };
  const stickyKeysSet = o.maxStickyKeys !== undefined || stickyKeysInFile;
  const stickyKeysFlag = o.maxStickyKeys !== undefined ? "--max-sticky-keys" : null;
  const epsFlag = o.epsilon !== undefined ? "--epsilon" : null;
  if (shared) {
    if (o.policySource === "cli") refuse("--policy", "gateway.policy", `is not used with routing state shared in the store (sticky pins under a bounded-load cap); add --no-shared-state to route with --policy ${o.policy}, or drop --policy`);
    if (stickyKeysSet) refuse(stickyKeysFlag, "gateway.max_sticky_keys", "applies to a per-process least_inflight_sticky gateway; with routing state shared in the store, pins expire after gateway.pin_ttl_ms instead");
    return;
  }
  if (cfg.gateway.sticky_epsilon !== null) refuse(null, "gateway.sticky_epsilon", "applies only with routing state shared in the store (a Redis/Upstash store and gateway.shared_state)");
  if (cfg.gateway.epsilon !== null && o.policy !== "bounded_load_hash") refuse(epsFlag, "gateway.epsilon", `applies to --policy bounded_load_hash or to routing state shared in the store, not to ${o.policy}`);
  if (stickyKeysSet && o.policy !== "least_inflight_sticky") refuse(stickyKeysFlag, "gateway.max_sticky_keys", `applies to --policy least_inflight_sticky, not to ${o.policy}`);
}

/** Printed at start when the gateway has no per-attempt deadline (its default). */
export const NO_ATTEMPT_TIMEOUT_WARNING =
  `edgeloop gateway: warning: no attempt timeout (--attempt-timeout-ms, config gateway.attempt_timeout_ms): ` +
  `a hung replica holds each call until the client's own deadline (engine.timeout_ms, ${DEFAULT_ENGINE_TIMEOUT_MS} ms by default) ` +
  `instead of moving it to another replica; set it below engine.timeout_ms`;

/**
 * The replica URLs of `--replicas` (comma-separated), refused when there is
 * none, one is not an http(s) URL, or one is listed twice (trailing slashes ignored).
 * @throws InputError naming `--replicas`
 */
export function replicaUrls(flag: string): string[] {
  const urls = flag.split(",").map((s) => s.trim()).filter(Boolean);
  if (urls.length === 0) throw new InputError("--replicas", "needs at least one replica base URL (comma-separated, e.g. http://127.0.0.1:8000,http://127.0.0.1:8001)");
  const seen = new Set<string>();
  for (const u of urls) {
    let ok = false;
    try {
      ok = /^https?:$/.test(new URL(u).protocol);
    } catch {
      ok = false;
    }
    if (!ok) throw new InputError("--replicas", `'${u.slice(0, 200)}' is not an http(s) URL`);
    const key = normaliseUrl(u);
    if (seen.has(key)) throw new InputError("--replicas", `${key} is listed twice`);
    seen.add(key);
  }
  return urls;
}

/**
 * `edgeloop upstash-bridge --port P --redis URL [--token T]`: the Upstash REST
 * protocol over local Redis. The token comes from `--token`, else from
 * `UPSTASH_REDIS_REST_TOKEN` (or `UPSTASH_REDIS_REST_TOKEN_FILE`), the
 * variable the store clients read it from, so it can stay out of `ps`.
 * @throws InputError (field `--token`) when neither gives a non-blank token
 * @throws StoreError naming the (masked) URL when Redis does not answer within a few seconds.
 */
export async function upstashBridgeCommand(o: { port: number; redis: string; token?: string; host: string }): Promise<void> {
  const token = o.token ?? secretFromEnv("UPSTASH_REDIS_REST_TOKEN");
  if (token === null) throw new InputError("--token", "required (or env UPSTASH_REDIS_REST_TOKEN / UPSTASH_REDIS_REST_TOKEN_FILE): clients send it as `Authorization: Bearer <token>`");
  // An empty or blank token would start a bridge that answers 401 to every client (none can send it).
  if (!/\S/.test(token)) throw new InputError("--token", "must not be empty: clients send it as `Authorization: Bearer <token>`");
  await checkRedis(o.redis, { what: "--redis" });
  const bridge = await startUpstashBridge({ port: o.port, hostname: o.host, redisUrl: o.redis, token });
  console.log(`edgeloop upstash-bridge on ${bridge.url} -> ${maskRedisUrl(o.redis)}`);
  await untilSignal();
  await bridge.stop();
}
