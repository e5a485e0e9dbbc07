import { sessionLimitsOf } from "../../shared/agent-loop/session-limits.ts";
import type { TelemetryEnv } from "./telemetry.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import type { AgentLoopExport } from "../../shared/agent-loop/registry.ts";
import type { AgentWebhookConfig } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { AppConfig as AppConfigSchema, parseAppConfig, type AppConfig } from "../../shared/config/app-config.ts";
import { MAX_TIMER_MS, type RolloutConfig } from "../../shared/schema/config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import type { ExecutorDeps } from "../../shared/rollout/executor.ts";
import { cachedTeacherClients } from "../../shared/rollout/teacher-scoring.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { createUpstashTransferQueue, UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { RedisPolicyVersions } from "../../shared/rollout/policy-version.ts";
import { defaultTokenizer, DEFAULT_MODEL } from "../../shared/tokens/tokenizer.ts";
import { modelIdOf } from "../../shared/models/model-id.ts";
import type { ModelId, ToolsFile } from "../../shared/schema/index.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { interactionClients } from "../../shared/tools/interaction-client.ts";
import { WebhookToolClient, type ToolExecutor } from "../../shared/tools/webhook-tool-client.ts";
import { SandboxLeases, type LeaseObserver } from "../../shared/tools/sandbox-leases.ts";
import { RedisLeaseStore } from "../../shared/tools/redis-lease-store.ts";
import type { LeaseStore } from "../../shared/tools/lease-store.ts";
import type { SandboxSpec } from "../../shared/schema/tool.ts";
import type { DurableObjectNamespace, R2Bucket } from "./cf-types.ts";
import { BlobOffloadQueue } from "../../shared/store/blob-offload-queue.ts";
import { R2BlobStore } from "./r2-blob-store.ts";

/** The worker's bindings and variables (wrangler.toml `[vars]`, secrets, the Durable Object binding). */
export interface Env extends TelemetryEnv {
  /** Durable Object namespace of {@link TrajectorySessionObject} (wrangler.toml `durable_objects.bindings`). */
  SESSIONS: DurableObjectNamespace;
  /** The inference engine or gateway base URL (default `engine.url` of `EDGELOOP_CONFIG`). */
  EDGELOOP_ENGINE_URL?: string;
  /** `vllm`, `vllm-generate` or `sglang` (default `engine.format` of `EDGELOOP_CONFIG`, itself `vllm` by default). */
  EDGELOOP_ENGINE_FORMAT?: string;
  /** The teacher engine's `--api-key` (a Worker secret), sent as `Authorization: Bearer` on scoring calls. */
  EDGELOOP_TEACHER_API_KEY?: string;
  /** The engine's `--api-key` (a Worker secret; default `engine.api_key` of `EDGELOOP_CONFIG`), sent as `Authorization: Bearer`. */
  EDGELOOP_ENGINE_API_KEY?: string;
  /** The tools file as JSON text (tool URLs inside). */
  EDGELOOP_TOOLS?: string;
  /** HMAC secret for tool webhooks and their callbacks. */
  EDGELOOP_TOOLS_SECRET?: string;
  /** App config as JSON text (`{rollout: {...}}`), merged over the defaults. */
  EDGELOOP_CONFIG?: string;
  /** Bearer token for the API (`/v1/rollouts`, `/v1/groups`); a secret (`wrangler secret put`). Without it the API is refused unless `EDGELOOP_ALLOW_ANONYMOUS` is `1`. */
  EDGELOOP_API_TOKEN?: string;
  /** `1` (or `true`): serve `/v1/*` without `EDGELOOP_API_TOKEN` (anyone reaching the URL may use it). Anything else: refused (403 `auth_not_configured`). */
  EDGELOOP_ALLOW_ANONYMOUS?: string;
  UPSTASH_REDIS_REST_URL: string;
  UPSTASH_REDIS_REST_TOKEN: string;
  /** Prefix of every Redis key (default `edgeloop:`). */
  EDGELOOP_STORE_PREFIX?: string;
  /**
   * Largest Durable Object storage value the sessions write, bytes (default 1,000,000 for
   * SQLite-backed objects; set 130816 for classes on the legacy KV backend, whose limit is 128 KiB).
   */
  EDGELOOP_DO_MAX_VALUE_BYTES?: string;
  /**
   * The R2 bucket record parts above the blob threshold go to (wrangler.toml `r2_buckets`, binding
   * `EDGELOOP_BLOBS`; docs/queue-layout.md "Blobs"). Absent: every part stays in the record, so a
   * record of routed experts must fit one Upstash request.
   */
  EDGELOOP_BLOBS?: R2Bucket;
  /** Packed bytes from which routed experts go to `EDGELOOP_BLOBS` (default `store.blobs.threshold_bytes` of `EDGELOOP_CONFIG`, 1 MiB). */
  EDGELOOP_BLOB_THRESHOLD_BYTES?: string;
  /** Largest Upstash REST request, bytes (default 10 MB, Upstash's limit; set your plan's). */
  EDGELOOP_STORE_MAX_REQUEST_BYTES?: string;
  /**
   * The Worker's own URL as agents reach it (`https://edgeloop.<account>.workers.dev`): the task's
   * `base_url` is `{it}/v1/sessions/{key}/openai/v1` (default `agent.public_url` of `EDGELOOP_CONFIG`).
   * Needed by `openai_agent` rows.
   */
  EDGELOOP_PUBLIC_URL?: string;
  /** Where `openai_agent` POSTs each trajectory's task (the agent webhook; default `agent.url` of `EDGELOOP_CONFIG`). */
  EDGELOOP_AGENT_URL?: string;
  /** HMAC secret the tasks are signed with (`x-edgeloop-signature`); a secret (.dev.vars locally). Default unsigned. */
  EDGELOOP_AGENT_SECRET?: string;
  /**
   * Milliseconds from the task to the agent session's deadline (default 600000). The loop waits
   * inside its object's alarm, whose wall time Cloudflare bounds (15 min): keep it below that, or
   * the alarm is retried and the resumed loop waits on for the rest of the deadline.
   */
  EDGELOOP_AGENT_TIMEOUT_MS?: string;
}

/** What the worker and its Durable Objects share per isolate, built once from the env. */
export interface WorkerRuntime {
  config: AppConfig;
  deps: ExecutorDeps;
  queue: TransferQueue;
  /** The bundled tokenizer's model (`modelIdOf`): recorded in records and session inputs; a session of another model is refused. */
  model: ModelId;
  secret: string | null;
  /** The agent webhook of `openai_agent` (`EDGELOOP_AGENT_*` over the config's `agent` section). */
  agent: AgentWebhookConfig;
  /** The Worker's URL as agents reach it (`EDGELOOP_PUBLIC_URL`, else `agent.public_url`), without a trailing slash; null when unset. */
  publicUrl: string | null;
  /**
   * The tools file's sandbox lifecycle, null without a `sandbox` block: its
   * spec and the lease store every Durable Object shares (Redis over the
   * Upstash REST client, under the store prefix: the create limiter, the live
   * cap and the reaper's index are global to the deployment). Each session's
   * object builds its own {@link SandboxLeases} over it ({@link workerSandboxLeases}).
   */
  sandbox: WorkerSandbox | null;
}

/** What a Durable Object needs to hold its trajectory's sandbox lease (see {@link WorkerRuntime.sandbox}). */
export interface WorkerSandbox {
  spec: SandboxSpec;
  store: LeaseStore;
  /** `tools.secret` (or `EDGELOOP_TOOLS_SECRET`): lifecycle requests are signed like tool calls. */
  secret: string | null;
  /** `rollout.trajectory_deadline_s` of `EDGELOOP_CONFIG` (the default sandbox lifetime is it plus `ttl_s`). */
  trajectoryDeadlineS: number | null;
}

/**
 * A {@link SandboxLeases} over the runtime's sandbox spec and shared lease
 * store (one per Durable Object: it holds at most its own trajectory's lease),
 * `observer` told of its creates and releases.
 * @throws TypeError when `sandbox.lifetime_s` is below the trajectory deadline (the runtime's build checks it once, as a ConfigError).
 */
export function workerSandboxLeases(sandbox: WorkerSandbox, observer?: LeaseObserver): SandboxLeases {
  return new SandboxLeases(sandbox.spec, sandbox.store, { ...(sandbox.secret ? { secret: sandbox.secret } : {}), trajectoryDeadlineS: sandbox.trajectoryDeadlineS, ...(observer ? { observer } : {}) });
}

/**
 * `queue` behind the blob layer over the `EDGELOOP_BLOBS` R2 binding when it is bound, else `queue`.
 * @throws ConfigError when `EDGELOOP_CONFIG` names `store.blobs.url` (a Worker has no filesystem and reaches R2 by its binding) or the threshold is not a whole number
 */
export function workerBlobs(env: Pick<Env, "EDGELOOP_BLOBS" | "EDGELOOP_BLOB_THRESHOLD_BYTES">, config: AppConfig, prefix: string, queue: TransferQueue): TransferQueue {
  if (config.store.blobs.url) throw new ConfigError("store.blobs.url", "a Worker reaches its blob store through the R2 binding EDGELOOP_BLOBS (wrangler.toml r2_buckets), not a URL: remove store.blobs.url from EDGELOOP_CONFIG");
  if (!env.EDGELOOP_BLOBS) return queue;
  const raw = env.EDGELOOP_BLOB_THRESHOLD_BYTES;
  const threshold = raw === undefined || raw === "" ? config.store.blobs.threshold_bytes : Number(raw);
  if (!Number.isInteger(threshold) || threshold < 0) throw new ConfigError("EDGELOOP_BLOB_THRESHOLD_BYTES", `must be a whole number of bytes >= 0, got '${raw}'`);
  return new BlobOffloadQueue(queue, new R2BlobStore(env.EDGELOOP_BLOBS), { prefix, thresholdBytes: threshold });
}

let cached: { env: Env; rt: Promise<WorkerRuntime> } | undefined;
const extraLoops = new Map<string, AgentLoopExport>();

/**
 * Registers a custom agent loop (a class extending `AgentLoop`, or a
 * factory) under `name` in the registry of every runtime this isolate
 * builds: how a Worker adds loops, having no file system for
 * `agent.agent_loop_config_path`. Call it at the top level of your own
 * Worker entry, which re-exports this one (`export default` and
 * `TrajectorySessionObject`), so the Worker and its Durable Objects both see
 * it. A name equal to a built-in replaces it (as verl's registry does).
 */
export function registerWorkerAgentLoop(name: string, loop: AgentLoopExport): void {
  extraLoops.set(name, loop);
  cached = undefined;
}

/**
 * The isolate's runtime for `env` (built on first use, then cached): the
 * Qwen3 tokenizer (bundled JSON), the engine client over fetch, the webhook
 * tools from `EDGELOOP_TOOLS`, and the transfer queue over Upstash REST.
 * @throws ConfigError naming the variable to set.
 */
export function workerRuntime(env: Env): Promise<WorkerRuntime> {
  if (cached && cached.env === env) return cached.rt;
  const rt = build(env);
  cached = { env, rt };
  rt.catch(() => {
    if (cached?.rt === rt) cached = undefined;
  });
  return rt;
}

async function build(env: Env): Promise<WorkerRuntime> {
  if (!env.UPSTASH_REDIS_REST_URL || !env.UPSTASH_REDIS_REST_TOKEN) {
    throw new ConfigError("UPSTASH_REDIS_REST_URL", "set UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN (the transfer queue)");
  }
  let raw: unknown = {};
  try {
    raw = env.EDGELOOP_CONFIG ? JSON.parse(env.EDGELOOP_CONFIG) : {};
  } catch (e) {
    throw new ConfigError("EDGELOOP_CONFIG", `is not JSON: ${(e as Error).message}`);
  }
  const config = parseAppConfig(raw, "EDGELOOP_CONFIG");
  refuseOnWorkers(config);
  refuseRolloutOnWorkers(config.rollout, "EDGELOOP_CONFIG");
  const engineUrl = env.EDGELOOP_ENGINE_URL || (config.engine.url !== "sim" ? config.engine.url : null);
  if (!engineUrl) throw new ConfigError("EDGELOOP_ENGINE_URL", "set EDGELOOP_ENGINE_URL (or engine.url in EDGELOOP_CONFIG) to the engine or gateway URL: the Worker has no embedded simulated engine");
  const format = env.EDGELOOP_ENGINE_FORMAT || config.engine.format;
  if (format !== "vllm" && format !== "vllm-generate" && format !== "sglang") {
    throw new ConfigError("EDGELOOP_ENGINE_FORMAT", `must be vllm, vllm-generate or sglang, got '${format.slice(0, 50)}'`);
  }
  const secret = env.EDGELOOP_TOOLS_SECRET || config.tools.secret || null;
  // Only Qwen3's files are bundled into the Worker (the other families' tokenizers are 8-33 MB of JSON
  // each, past the Worker size limit): refuse any other model rather than write Qwen3 tokens for it.
  if (config.model != null && config.model !== DEFAULT_MODEL) {
    throw new ConfigError("model", `the Worker build bundles only the ${DEFAULT_MODEL} tokenizer; '${config.model}' runs with the CLI (edgeloop serve/worker --model ${config.model})`);
  }
  const tokenizer = await defaultTokenizer();
  const client = createEngineClient({
    url: engineUrl,
    format,
    timeoutMs: config.engine.timeout_ms,
    maxReplyBytes: config.engine.max_reply_bytes,
    retry: { retries: config.engine.max_retries },
    ...(config.engine.model ? { model: config.engine.model } : {}),
    apiKey: env.EDGELOOP_ENGINE_API_KEY || config.engine.api_key,
    ...(config.engine.moe ? { moe: { layers: config.engine.moe.layers, top_k: config.engine.moe.top_k } } : {}),
  });
  const toolsFile = env.EDGELOOP_TOOLS ? parseToolsFile(env.EDGELOOP_TOOLS, { source: "EDGELOOP_TOOLS" }) : undefined;
  const tools = toolsFile ? await workerTools(toolsFile, secret ?? undefined) : undefined;
  // The tools file's simulated users (`interactions`), signed like its tools.
  const interactions = toolsFile ? interactionClients(toolsFile.interactions, { secret: secret ?? undefined }) : {};
  const maxRequest = Number(env.EDGELOOP_STORE_MAX_REQUEST_BYTES || config.store.max_request_bytes || 0);
  const prefix = env.EDGELOOP_STORE_PREFIX ?? config.store.prefix;
  const upstash = createUpstashTransferQueue({
    url: env.UPSTASH_REDIS_REST_URL,
    token: env.UPSTASH_REDIS_REST_TOKEN,
    prefix,
    ...(maxRequest > 0 ? { maxRequestBytes: maxRequest } : {}),
  });
  const queue = workerBlobs(env, config, prefix, upstash);
  // The policy version `edgeloop serve` keeps in the same store (`POST /v1/model-version`), read by every engine
  // call of the Durable Objects before it is sent (one Upstash request a call: no gate admission to ride on here),
  // so a call dispatched after a POST returned carries the posted version; none posted: the batch's `model_version`.
  const policy = new RedisPolicyVersions(new UpstashCommander({ url: env.UPSTASH_REDIS_REST_URL, token: env.UPSTASH_REDIS_REST_TOKEN }), { prefix });
  if (config.rollout.teacher?.url === "sim") throw new ConfigError("rollout.teacher.url", "the Worker has no embedded simulated engine: point rollout.teacher.url (or urls) at a teacher engine");
  // Teacher replicas (`urls`) go through an in-process gateway, as in `edgeloop serve`; its tokenizer is checked by the CLI processes.
  const teacher = cachedTeacherClients((cfg) => {
    const base = { format: cfg.format, timeoutMs: cfg.timeout_ms, retry: { retries: 3 }, apiKey: env.EDGELOOP_TEACHER_API_KEY || null, ...(cfg.model ? { model: cfg.model } : {}) };
    if (!cfg.urls) return { ...base, url: cfg.url! };
    const gateway = createGatewayApp({ replicas: cfg.urls, policy: "least_inflight_sticky" });
    return { ...base, url: "http://teacher-gateway.local", fetch: (input, init) => gateway.fetch(new Request(input, init)) };
  });
  const registry = defaultAgentLoopRegistry();
  for (const [name, loop] of extraLoops) registry.register(name, loop);
  const deps: ExecutorDeps = {
    registry,
    tokenizer,
    client,
    policy,
    ...(config.rollout.max_model_len ? { maxModelLen: config.rollout.max_model_len } : {}),
    ...(tools ? { tools } : {}),
    interactions,
    // As `edgeloop serve`: a webhook reward for rows whose reward_model.style is "webhook".
    reward: { ...(config.reward.url ? { webhook: { url: config.reward.url, timeout_ms: config.reward.timeout_ms, max_retries: config.reward.max_retries, max_reply_bytes: config.reward.max_reply_bytes } } : {}), ...(secret ? { secret } : {}) },
    teacher,
    sessionLimits: sessionLimitsOf(config.limits),
    // openenv_agent: the config's `openenv` section (Workers have the global WebSocket client).
    openenv: { settings: config.openenv },
  };
  let sandbox: WorkerSandbox | null = null;
  if (toolsFile?.sandbox) {
    // The lease store is Redis over Upstash REST (the Worker always has the queue's Upstash): its Lua scripts run on the
    // store's clock, so every object of the deployment shares one token bucket, one live cap and one expiry index.
    const store = new RedisLeaseStore(new UpstashCommander({ url: env.UPSTASH_REDIS_REST_URL, token: env.UPSTASH_REDIS_REST_TOKEN }), { prefix });
    sandbox = { spec: toolsFile.sandbox, store, secret, trajectoryDeadlineS: config.rollout.trajectory_deadline_s ?? null };
    try {
      workerSandboxLeases(sandbox);
    } catch (e) {
      if (e instanceof TypeError) throw new ConfigError("EDGELOOP_TOOLS: sandbox.lifetime_s", e.message);
      throw e;
    }
  }
  return { config, deps, queue, model: await modelIdOf(tokenizer), secret, ...agentSettings(env, config), sandbox };
}

/** A non-default value at `path` of `config` (defaults from the schema). */
/**
 * The Worker's tools: the webhook tools of `EDGELOOP_TOOLS`, plus the tools of
 * its `mcp_servers` over Streamable HTTP, listed when the runtime is built
 * (a `command` server is a ConfigError: no processes here).
 */
async function workerTools(file: ToolsFile, secret: string | undefined): Promise<ToolExecutor> {
  const webhook = new WebhookToolClient(file.tools, { secret });
  if (file.mcp_servers.length === 0) return webhook;
  const [{ McpToolClient }, { webhookAndMcpTools }] = await Promise.all([import("../../shared/tools/mcp-tool-client.ts"), import("../../shared/tools/composite-tool-executor.ts")]);
  return webhookAndMcpTools(webhook, await McpToolClient.connect(file.mcp_servers));
}

function isSet(config: AppConfig, path: string): boolean {
  const get = (o: unknown) => path.split(".").reduce<unknown>((v, k) => (v as Record<string, unknown> | null)?.[k], o);
  return JSON.stringify(get(config)) !== JSON.stringify(get(DEFAULTS));
}
const DEFAULTS = AppConfigSchema.parse({});

/**
 * Settings of `EDGELOOP_CONFIG` the Worker has no way to honour, refused at
 * start instead of accepted and ignored: the simulated engine's (`script`,
 * `replicas`, `sim_latency`), `engine.admin_urls` (no `/v1/engine/*` here),
 * `tools.file` (no file system: `EDGELOOP_TOOLS` holds the file's JSON), a
 * store other than Upstash, `concurrency` (one Durable Object per
 * trajectory), the `gateway` section (no engine gateway here), and
 * `engine.pools` / `agent.roles` (one engine: no policy per agent role).
 * @throws ConfigError naming the path and what to use instead.
 */
export function refuseOnWorkers(config: AppConfig): void {
  const refuse: [string, string][] = [
    ["engine.script", "the Worker has no simulated engine"],
    ["engine.replicas", "the Worker has no simulated engine: put replicas behind `edgeloop gateway` and point EDGELOOP_ENGINE_URL at it"],
    ["engine.sim_latency", "the Worker has no simulated engine"],
    ["engine.sim_kv_cache_blocks", "the Worker has no simulated engine"],
    ["engine.admin_urls", "the Worker serves no /v1/engine/pause|resume: pause engines through edgeloop serve"],
    ["tools.file", "the Worker has no file system: put the tools file's JSON in EDGELOOP_TOOLS"],
    ["concurrency", "each trajectory runs in its own Durable Object: there is no per-process limit to set"],
    ["gateway", "the Worker runs no engine gateway: run `edgeloop gateway` and point EDGELOOP_ENGINE_URL at it"],
    ["engine.pools", "the Worker's agent gateway calls one engine (EDGELOOP_ENGINE_URL): serve a policy per agent role with edgeloop serve"],
    ["agent.roles", "the Worker's agent gateway calls one engine (EDGELOOP_ENGINE_URL): serve a policy per agent role with edgeloop serve"],
  ];
  for (const [path, why] of refuse) if (isSet(config, path)) throw new ConfigError(path, `${why} (in EDGELOOP_CONFIG)`);
  if (config.store.url !== "memory" && config.store.url !== "upstash") {
    throw new ConfigError("store.url", "the Worker's store is Upstash (UPSTASH_REDIS_REST_URL/TOKEN); leave store.url out (in EDGELOOP_CONFIG)");
  }
}

/**
 * Rollout settings the Worker entry cannot honour, from `EDGELOOP_CONFIG` or
 * a batch's own `config.rollout`: `agent_loop_config_path` (no file system:
 * {@link registerWorkerAgentLoop}), `max_staleness` (no policy-version store:
 * `POST /v1/model-version` is served by `edgeloop serve`), and over-sampling
 * (`oversample`, `filter_groups`, `partial_rollout: carry`), whose group
 * gate lives in `edgeloop serve` and its workers.
 * @throws ConfigError naming the path (`source` says where it came from).
 */
export function refuseRolloutOnWorkers(rollout: RolloutConfig, source: string): void {
  const r: [boolean, string, string][] = [
    [rollout.agent.agent_loop_config_path != null, "rollout.agent.agent_loop_config_path", "the Worker has no file system: register custom loops with registerWorkerAgentLoop(name, loop) in your Worker entry"],
    [rollout.max_staleness != null, "rollout.max_staleness", "the Worker keeps no policy versions (POST /v1/model-version, /v1/consumed-version are served by edgeloop serve): run admission-controlled batches there"],
    [rollout.oversample != null, "rollout.oversample", "over-sampling runs in edgeloop serve and its workers, not on the Worker"],
    [rollout.filter_groups != null, "rollout.filter_groups", "dynamic sampling runs in edgeloop serve and its workers, not on the Worker"],
    [rollout.partial_rollout === "carry", "rollout.partial_rollout", "carrying partial rollouts runs in edgeloop serve and its workers, not on the Worker"],
  ];
  for (const [bad, path, why] of r) if (bad) throw new ConfigError(path, `${why} (in ${source})`);
}

/**
 * The agent webhook and public URL from `EDGELOOP_AGENT_URL`,
 * `EDGELOOP_AGENT_SECRET`, `EDGELOOP_AGENT_TIMEOUT_MS` and
 * `EDGELOOP_PUBLIC_URL`, each over the config's `agent` section.
 * @throws ConfigError naming the variable: a URL that does not parse, a timeout that is not a positive integer.
 */
export function agentSettings(env: Env, config: AppConfig): { agent: AgentWebhookConfig; publicUrl: string | null } {
  const url = (name: "EDGELOOP_AGENT_URL" | "EDGELOOP_PUBLIC_URL", fallback: string | null): string | null => {
    const v = env[name] || fallback;
    if (!v) return null;
    let ok = false;
    try {
      ok = /^https?:$/.test(new URL(v).protocol);
    } catch {
      ok = false;
    }
    if (!ok) throw new ConfigError(name, `must be an http(s) URL, got '${v.slice(0, 200)}'`);
    return v;
  };
  let timeout = config.agent.timeout_ms;
  if (env.EDGELOOP_AGENT_TIMEOUT_MS) {
    timeout = Number(env.EDGELOOP_AGENT_TIMEOUT_MS);
    if (!Number.isInteger(timeout) || timeout <= 0) throw new ConfigError("EDGELOOP_AGENT_TIMEOUT_MS", `must be a positive integer (milliseconds), got '${env.EDGELOOP_AGENT_TIMEOUT_MS.slice(0, 50)}'`);
    if (timeout > MAX_TIMER_MS) throw new ConfigError("EDGELOOP_AGENT_TIMEOUT_MS", `must be <= ${MAX_TIMER_MS} (milliseconds; setTimeout's largest delay), got '${env.EDGELOOP_AGENT_TIMEOUT_MS.slice(0, 50)}'`);
  }
  return {
    agent: { url: url("EDGELOOP_AGENT_URL", config.agent.url), timeout_ms: timeout, secret: env.EDGELOOP_AGENT_SECRET || config.agent.secret, max_reply_bytes: config.agent.max_reply_bytes, abandoned_mask: config.agent.abandoned_mask },
    publicUrl: url("EDGELOOP_PUBLIC_URL", config.agent.public_url)?.replace(/\/+$/, "") ?? null,
  };
}

/**
 * The warnings a Worker prints once per isolate, on its first request (a
 * Worker has no start; S20 as `serve` and the Deno entry print them at
 * start): agent tasks sent unsigned (`EDGELOOP_AGENT_URL` or `agent.url`
 * set, no `EDGELOOP_AGENT_SECRET` nor `agent.secret`). Each line starts with
 * `warning    `. A configuration that does not parse gives none here: the
 * requests that need it fail naming it.
 */
export function workerStartWarnings(env: Env): string[] {
  let agent: AgentWebhookConfig;
  try {
    const config = parseAppConfig(env.EDGELOOP_CONFIG ? JSON.parse(env.EDGELOOP_CONFIG) : {}, "EDGELOOP_CONFIG");
    agent = agentSettings(env, config).agent;
  } catch {
    return [];
  }
  if (!agent.url || agent.secret) return [];
  return [
    "warning    agent tasks are sent unsigned (no EDGELOOP_AGENT_SECRET): an agent cannot tell edgeloop's tasks (which carry session tokens) from forged ones; set EDGELOOP_AGENT_SECRET (a secret; the agent must verify x-edgeloop-signature with it)",
  ];
}
