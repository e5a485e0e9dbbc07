import type { AppConfig } from "../../../shared/config/app-config.ts";
import { ConfigError } from "../../../shared/errors.ts";
import { redactUrl } from "../../../shared/http/outbound.ts";
import { createEngineClient } from "../../../shared/inference/create-engine-client.ts";
import type { EngineReplicaTarget } from "../../../shared/inference/engine-control.ts";
import { DEADLINE_HEADER } from "../../../shared/inference/engine-http.ts";
import type { InferenceClient } from "../../../shared/inference/types.ts";
import type { TeacherClientFactory } from "../../../shared/rollout/teacher-scoring.ts";
import type { ChatTokenizer } from "../../../shared/tokens/tokenizer.ts";
import { createGatewayApp } from "../../../functions/gateway.ts";
import { createSimEngineApp } from "../../sim-engine/app.ts";
import { readSimScriptFile } from "../../sim-engine/script-file.ts";
import { SimEngine } from "../../sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../sim-engine/sim-engine-client.ts";
import { startSimEngine } from "../../sim-engine/server.ts";
import { gatewayOptions } from "../gateway-options.ts";
import { routedExpertsEngineShape } from "../routed-experts-config.ts";
import { checkConfiguredTeacher, teacherClientsFor } from "../teacher.ts";
import { DEFAULT_SCRIPT } from "./package-paths.ts";
import { buildRoutingState } from "./store.ts";

// Builders of the engines a process calls: the policy engine (a URL engine or the embedded simulator) with
// its start-up probe and context size, and the teacher.

/**
 * Probes the policy engine at start: its context size (`maxModelLen` of the
 * client, when it reports one) and, for a URL engine, whether it answers at
 * all (a warning line into `warnings` if not: it may come up later). Adds
 * the `context` line to `describe`.
 * @returns max_model_len in tokens: `rollout.max_model_len`, else the engine's, else prompt_length + response_length.
 */
export async function probePolicyEngine(config: AppConfig, client: InferenceClient, checkTimeoutMs: number, describe: string[], warnings: string[]): Promise<number> {
  const [probed, unreachable] = await Promise.all([
    client.maxModelLen?.().catch(() => undefined),
    config.engine.url === "sim" ? Promise.resolve(null) : probeEngine(config.engine.url, checkTimeoutMs),
  ]);
  if (unreachable) warnings.push(`warning    engine ${redactUrl(config.engine.url)} does not answer (${unreachable}); trajectories fail until it is up`);
  const maxModelLen = config.rollout.max_model_len ?? probed ?? config.rollout.prompt_length + config.rollout.response_length;
  describe.push(`context    max_model_len ${maxModelLen}`);
  return maxModelLen;
}

/**
 * The process's teacher clients ({@link teacherClientsFor}); with
 * `rollout.teacher` configured, checks it at start (a warning line into
 * `warnings` when it does not answer or tokenizes differently) and adds the
 * `teacher` line to `describe`.
 */
export async function buildTeacher(config: AppConfig, tokenizer: ChatTokenizer, checkTimeoutMs: number, describe: string[], warnings: string[]): Promise<TeacherClientFactory> {
  const teacher = teacherClientsFor(config, tokenizer);
  const teacherCfg = config.rollout.teacher;
  if (teacherCfg) {
    const warning = await checkConfiguredTeacher(config, tokenizer, teacher, checkTimeoutMs);
    if (warning) warnings.push(warning);
    describe.push(`teacher    ${teacher(teacherCfg).describe}${teacherCfg.urls ? ` (${teacherCfg.urls.length} replicas behind the gateway)` : ""}, on_error ${teacherCfg.on_error}${warning ? "" : ", same tokenizer"}`);
  }
  return teacher;
}

/**
 * Whether an engine URL answers at all: GET /v1/models, then /health; any
 * HTTP status counts as an answer. Returns null when it answers, else the
 * reason (e.g. `Unable to connect`).
 */
async function probeEngine(url: string, timeoutMs: number): Promise<string | null> {
  let reason = "";
  for (const path of ["/v1/models", "/health"]) {
    try {
      // The deadline is declared so that a gateway counts a replica that stays silent through it.
      const res = await fetch(url.replace(/\/+$/, "") + path, { headers: { [DEADLINE_HEADER]: String(timeoutMs) }, signal: AbortSignal.timeout(timeoutMs), redirect: "manual" });
      await res.body?.cancel();
      return null;
    } catch (e) {
      reason ||= `GET ${redactUrl(url.replace(/\/+$/, "") + path)}: ${(e as Error).message}`;
    }
  }
  return reason;
}

/**
 * Builds the engine client and fills `targets` with the replicas the pause
 * control reaches: `engine.admin_urls` (else `engine.url`) for a URL engine;
 * the embedded replicas for the sim (in-process through its app's fetch
 * when there is one replica, else its loopback URLs).
 */
export async function buildEngine(
  config: AppConfig,
  tokenizer: ChatTokenizer,
  closers: (() => Promise<void>)[],
  describe: string[],
  targets: EngineReplicaTarget[],
  enginesPaused: () => Promise<boolean>,
): Promise<InferenceClient> {
  const e = config.engine;
  const moe = routedExpertsEngineShape(config);
  if (e.url !== "sim") {
    const controlKey = e.admin_api_key ?? e.api_key;
    targets.push(...(e.admin_urls ?? [e.url]).map((url) => ({ url, ...(controlKey ? { apiKey: controlKey } : {}) })));
    describe.push(`engine     ${redactUrl(e.url)} (${e.format}${e.api_key ? ", API key set" : ""}${e.admin_api_key ? ", admin key set" : ""})`);
    return createEngineClient({ url: e.url, format: e.format, model: e.model ?? undefined, timeoutMs: e.timeout_ms, maxReplyBytes: e.max_reply_bytes, retry: { retries: e.max_retries }, apiKey: e.api_key, ...(moe ? { moe } : {}) });
  }
  const scriptPath = e.script ?? DEFAULT_SCRIPT;
  let script: Record<string, unknown>;
  try {
    script = await readSimScriptFile(scriptPath);
  } catch (err) {
    throw new ConfigError("engine.script", `cannot read the scripted policy ${scriptPath}: ${(err as Error).message}`);
  }
  if (config.rollout.seed !== undefined) script = { ...script, seed: config.rollout.seed };
  if (e.replicas === 1) {
    const engine = new SimEngine({ tokenizer, script, maxModelLen: config.rollout.max_model_len ?? undefined, latency: simLatency(e), ...(e.moe ? { moe: e.moe } : {}), ...(e.sim_kv_cache_blocks ? { kvCacheBlocks: e.sim_kv_cache_blocks } : {}) });
    const app = createSimEngineApp(engine, { engineVersion: e.sim_engine_version ?? "main" });
    const simFetch = async (input: RequestInfo | URL, init?: RequestInit) => app.fetch(new Request(input, init));
    targets.push({ url: "http://sim.local", fetch: simFetch });
    if (e.format === "vllm") {
      // The default: the engine called directly (vLLM's semantics, no JSON in between).
      describe.push(`engine     simulated, in-process (script ${scriptPath})`);
      return new SimEngineClient(engine);
    }
    // Another wire format named: every call goes through that format's client and the sim's HTTP app
    // (in-process, no socket), so the run exercises what it would send to a real engine of that kind.
    describe.push(`engine     simulated, in-process over the ${e.format} wire format (script ${scriptPath})`);
    return createEngineClient({ url: "http://sim.local", format: e.format, timeoutMs: e.timeout_ms, retry: { retries: e.max_retries }, fetch: simFetch, moe: { layers: engine.moe.layers, top_k: engine.moe.top_k } });
  }
  const sim = await startSimEngine({ replicas: e.replicas, script, tokenizer, wire: { engineVersion: e.sim_engine_version ?? "main" }, maxModelLen: config.rollout.max_model_len ?? undefined, latency: simLatency(e), ...(e.moe ? { moe: e.moe } : {}), ...(e.sim_kv_cache_blocks ? { kvCacheBlocks: e.sim_kv_cache_blocks } : {}) });
  closers.push(() => sim.stop());
  targets.push(...sim.urls.map((url) => ({ url })));
  const g = config.gateway;
  const routingState = buildRoutingState(config, closers);
  const gateway = createGatewayApp({
    replicas: sim.urls,
    policy: "least_inflight_sticky",
    routingState,
    enginesPaused,
    ...gatewayOptions(g),
  });
  describe.push(`engine     simulated, ${e.replicas} replicas on loopback behind the gateway (script ${scriptPath}${routingState ? "; routing state shared in the store" : ""})`);
  const simMoe = sim.replicas[0]!.engine.moe;
  return createEngineClient({
    url: "http://gateway.local",
    format: e.format,
    timeoutMs: e.timeout_ms,
    retry: { retries: e.max_retries },
    fetch: (input, init) => gateway.fetch(new Request(input, init)),
    moe: { layers: simMoe.layers, top_k: simMoe.top_k },
  });
}

/**
 * The clients of `engine.pools` (the engines config `agent.roles` sends agent
 * roles to), each built as {@link buildEngine} builds the `engine` section
 * (the embedded simulator or a URL engine; its replicas added to `targets`,
 * so a pause reaches them too), with the model name its records carry
 * (`model`, else the pool's name). Adds one `pool` line per pool to `describe`.
 * Empty without pools.
 */
export async function buildEnginePools(
  config: AppConfig,
  tokenizer: ChatTokenizer,
  closers: (() => Promise<void>)[],
  describe: string[],
  targets: EngineReplicaTarget[],
  enginesPaused: () => Promise<boolean>,
): Promise<Record<string, { client: InferenceClient; modelName: string }>> {
  const out: Record<string, { client: InferenceClient; modelName: string }> = {};
  for (const [name, pool] of Object.entries(config.engine.pools ?? {})) {
    const lines: string[] = [];
    let client: InferenceClient;
    try {
      client = await buildEngine({ ...config, engine: { ...pool, pools: null } }, tokenizer, closers, lines, targets, enginesPaused);
    } catch (e) {
      // The pool's own path, not the engine section's, is what to fix.
      if (e instanceof ConfigError && e.field?.startsWith("engine.")) throw new ConfigError(`engine.pools.${name}.${e.field.slice("engine.".length)}`, e.message.replace(/^config \S+: /, ""));
      throw e;
    }
    const roles = Object.entries(config.agent.roles ?? {}).filter(([, p]) => p === name).map(([r]) => r);
    for (const l of lines) describe.push(l.replace(/^engine {5}/, `pool ${name}: `) + (roles.length ? ` — roles ${roles.join(", ")}` : " — no role"));
    out[name] = { client, modelName: pool.model ?? name };
  }
  return out;
}

/** The sim's latency model from `engine.sim_latency` (absent: none). */
function simLatency(e: AppConfig["engine"]): { prefill_ms_per_token?: number; decode_ms_per_token?: number } | undefined {
  return e.sim_latency ?? undefined;
}
