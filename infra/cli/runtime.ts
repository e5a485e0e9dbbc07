import { readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { defaultAgentLoopRegistry, parseAgentLoopConfig } from "../../shared/agent-loop/index.ts";
import { mergeConfig, parseAppConfig, type AppConfig } from "../../shared/config/app-config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import { createAgentExecutor, createSessionExecutor, sessionLoopFactory, type ExecutorDeps } from "../../shared/rollout/executor.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { SessionHost } from "../../shared/session/session-host.ts";
import { sessionCompletingQueue } from "../../shared/session/session-queue.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { IoRedisCommander } from "../redis/ioredis-commander.ts";
import { RolloutService, type ExecutorFactory } from "../../shared/rollout/service.ts";
import { JobQueue, type JobQueueOptions } from "../../shared/jobs/job-queue.ts";
import { MemoryPolicyVersions, RedisPolicyVersions, type PolicyVersions } from "../../shared/rollout/policy-version.ts";
import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { loadTokenizer } from "../node/model-dir.ts";
import { createRedisTransferQueue } from "../redis/redis-transfer-queue.ts";
import { SimEngine } from "../sim-engine/sim-engine.ts";
import { SimEngineClient } from "../sim-engine/sim-engine-client.ts";
import { startSimEngine } from "../sim-engine/server.ts";
import { startToolServer } from "../tools/server.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import { readConfigFile } from "./files.ts";
import { overridesFromFlags, type ConfigFlags } from "./flags.ts";

/** The package root (where examples/ and infra/ live). */
export const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** The scripted policy the simulated engine runs when no `--script` is given: the example data's. */
export const DEFAULT_SCRIPT = join(PACKAGE_ROOT, "examples", "policy.json");

/** Everything a process needs to run batches, built once from the config. */
export interface Runtime {
  config: AppConfig;
  service: RolloutService;
  store: TransferQueue;
  client: InferenceClient;
  /**
   * The durable-session host, when trajectories run as sessions (a Redis or
   * Upstash store: checkpoints live in the same Redis); its callbacks are
   * served by `functions/sessions.ts`.
   */
  sessions: SessionHost | null;
  /** The job queue (a Redis or Upstash store), or null for the memory store. */
  jobs: JobQueue | null;
  /** The transfer queue batches write through (for sessions: records written once, then the session marked done). */
  batchStore: TransferQueue;
  /** Builds a batch's executor (durable sessions with a Redis store): what workers run jobs with. */
  executorFor: ExecutorFactory;
  /** One line per component, for the start-up banner. */
  describe: string[];
  /** Stops what the runtime started (tool server, sim replicas, store connections). */
  close(): Promise<void>;
}

/** Instrumentation points of {@link buildRuntime} (tests, embedding). */
export interface RuntimeHooks {
  /** Wraps the transfer queue batches write to (e.g. to log writes). */
  wrapStore?: (q: TransferQueue) => TransferQueue;
  /**
   * `queue`: `POST /v1/rollouts` enqueues jobs for `edgeloop worker`
   * processes instead of running them here (needs a Redis or Upstash store);
   * `auto`: queue with such a store, inline with the memory store. Default `inline`.
   */
  jobs?: "inline" | "queue" | "auto";
  /** Options of the job queue (lease, max pending). */
  jobQueue?: Omit<JobQueueOptions, "prefix">;
}

/**
 * Resolves the config (file, then CLI flags over it), validates it eagerly,
 * and builds the tokenizer, engine client, tools, store and the rollout
 * service. With `engine.url = "sim"` the simulated engine runs in-process
 * (K > 1 replicas: real loopback servers behind the gateway); with no tools
 * file the example tool server is started on a free loopback port.
 * @throws ConfigError naming the config path and the fix.
 */
export async function buildRuntime(flags: ConfigFlags, hooks: RuntimeHooks = {}): Promise<Runtime> {
  const fileCfg = flags.config ? await readConfigFile(flags.config) : {};
  const config = parseAppConfig(mergeConfig(fileCfg, overridesFromFlags(flags)), flags.config ?? "flags");
  const closers: (() => Promise<void>)[] = [];
  const describe: string[] = [];
  try {
    const tokenizer = await loadTokenizer(config.model ?? undefined);
    describe.push(`model      ${tokenizer.name}`);

    const client = await buildEngine(config, tokenizer, closers, describe);
    const maxModelLen =
      config.rollout.max_model_len ?? (await client.maxModelLen?.().catch(() => undefined)) ?? config.rollout.prompt_length + config.rollout.response_length;
    describe.push(`context    max_model_len ${maxModelLen}`);

    const tools = await buildTools(config, closers, describe);
    const store = buildStore(config);
    closers.push(() => store.close());
    describe.push(`store      ${config.store.url === "memory" ? "memory (in-process)" : config.store.url.replace(/\/\/[^@/]*@/, "//***@")}`);

    const registry = defaultAgentLoopRegistry();
    const loopsPath = config.rollout.agent.agent_loop_config_path;
    if (loopsPath) {
      const text = await readFile(loopsPath, "utf8").catch((e) => {
        throw new ConfigError("rollout.agent.agent_loop_config_path", `cannot read ${loopsPath}: ${(e as Error).message}`);
      });
      await registry.loadConfig(parseAgentLoopConfig(text, loopsPath), { baseUrl: pathToFileURL(resolve(loopsPath)).href });
    }
    describe.push(`loops      ${registry.names().join(", ")} (default ${config.rollout.agent.default_agent_loop})`);

    const policy = buildPolicy(config, closers);
    const deps: ExecutorDeps = {
      policy,
      registry,
      tokenizer,
      client,
      maxModelLen,
      tools,
      reward: { ...(config.reward.url ? { webhook: { url: config.reward.url, timeout_ms: 30_000, max_retries: 2 } } : {}), ...(config.tools.secret ? { secret: config.tools.secret } : {}) },
    };
    const built = buildSessionStorage(config, closers);
    const storage = built?.storage ?? null;
    let service: RolloutService;
    let sessions: SessionHost | null = null;
    let batchStore: TransferQueue;
    let executorFor: ExecutorFactory;
    let jobs: JobQueue | null = null;
    if (storage && built) {
      const host = new SessionHost({ storage, createLoop: sessionLoopFactory(deps) });
      closers.push(async () => host.close());
      sessions = host;
      batchStore = sessionCompletingQueue(hooks.wrapStore ? hooks.wrapStore(store) : store, storage, host);
      executorFor = (rollout, batch) => createSessionExecutor(deps, host, store, rollout, batch);
      jobs = new JobQueue(built.commander, { prefix: config.store.prefix, ...hooks.jobQueue });
      const queued = hooks.jobs === "queue" || hooks.jobs === "auto";
      service = new RolloutService({ config, store: batchStore, executorFor, policy, ...(queued ? { jobs } : {}) });
      closers.push(async () => service.close());
      describe.push(`sessions   durable, checkpoints in ${config.store.url === "upstash" ? "Upstash" : "Redis"} (${config.store.prefix ?? "edgeloop:"}session:<key>)`);
      if (queued) describe.push(`jobs       queue: batches become jobs in ${jobs.stream}; run \`edgeloop worker\` with the same --store to process them`);
    } else {
      if (hooks.jobs === "queue") throw new ConfigError("store.url", "the job queue needs a Redis or Upstash store (--store redis://host:port); the memory store runs batches in-process");
      batchStore = hooks.wrapStore ? hooks.wrapStore(store) : store;
      executorFor = (rollout, batch) => createAgentExecutor(deps, rollout, batch);
      service = new RolloutService({ config, store: batchStore, executorFor, policy });
    }
    return {
      config,
      service,
      store,
      client,
      sessions,
      jobs,
      batchStore,
      executorFor,
      describe,
      async close() {
        for (const c of closers.reverse()) await c().catch(() => {});
      },
    };
  } catch (e) {
    for (const c of closers.reverse()) await c().catch(() => {});
    throw e;
  }
}

async function buildEngine(
  config: AppConfig,
  tokenizer: Awaited<ReturnType<typeof loadTokenizer>>,
  closers: (() => Promise<void>)[],
  describe: string[],
): Promise<InferenceClient> {
  const e = config.engine;
  if (e.url !== "sim") {
    describe.push(`engine     ${e.url} (${e.format})`);
    return createEngineClient({ url: e.url, format: e.format, model: e.model ?? undefined, timeoutMs: e.timeout_ms, retry: { retries: 3 } });
  }
  const scriptPath = e.script ?? DEFAULT_SCRIPT;
  let script: Record<string, unknown>;
  try {
    script = JSON.parse(await readFile(scriptPath, "utf8"));
  } catch (err) {
    throw new ConfigError("engine.script", `cannot read the scripted policy ${scriptPath}: ${(err as Error).message}`);
  }
  if (config.rollout.seed !== undefined) script = { ...script, seed: config.rollout.seed };
  if (e.replicas === 1) {
    describe.push(`engine     simulated, in-process (script ${scriptPath})`);
    return new SimEngineClient(new SimEngine({ tokenizer, script, maxModelLen: config.rollout.max_model_len ?? undefined }));
  }
  const sim = await startSimEngine({ replicas: e.replicas, script, tokenizer, maxModelLen: config.rollout.max_model_len ?? undefined });
  closers.push(() => sim.stop());
  const gateway = createGatewayApp({ replicas: sim.urls, policy: "least_inflight_sticky" });
  describe.push(`engine     simulated, ${e.replicas} replicas on loopback behind the gateway (script ${scriptPath})`);
  return createEngineClient({ url: "http://gateway.local", format: e.format, timeoutMs: e.timeout_ms, retry: { retries: 3 }, fetch: (input, init) => gateway.fetch(new Request(input, init)) });
}

async function buildTools(config: AppConfig, closers: (() => Promise<void>)[], describe: string[]): Promise<WebhookToolClient> {
  const secret = config.tools.secret ?? undefined;
  if (config.tools.file) {
    const text = await readFile(config.tools.file, "utf8").catch((e) => {
      throw new ConfigError("tools.file", `cannot read ${config.tools.file}: ${(e as Error).message}`);
    });
    const file = parseToolsFile(text, { source: config.tools.file });
    describe.push(`tools      ${file.tools.map((t) => t.name).join(", ")} from ${config.tools.file}`);
    return new WebhookToolClient(file.tools, { secret });
  }
  const server = startToolServer({ port: 0, secret });
  closers.push(() => server.stop());
  const text = await readFile(join(PACKAGE_ROOT, "infra", "tools", "tools.example.json"), "utf8");
  const file = parseToolsFile(text, { source: "infra/tools/tools.example.json", vars: { port: server.port } });
  describe.push(`tools      ${file.tools.map((t) => t.name).join(", ")} (example tool server on ${server.url})`);
  return new WebhookToolClient(file.tools, { secret });
}

/** Session storage in the store's Redis (its own connection, shared with the job queue), or null for the memory store (no durable sessions). */
function buildSessionStorage(config: AppConfig, closers: (() => Promise<void>)[]): { storage: RedisSessionStorage; commander: RedisCommander } | null {
  const url = config.store.url;
  if (url === "memory") return null;
  const commander =
    url === "upstash"
      ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN! })
      : new IoRedisCommander(url);
  closers.push(() => commander.close());
  return { storage: new RedisSessionStorage(commander, { prefix: config.store.prefix }), commander };
}

/** Policy versions shared through the store's Redis (API and workers see one), or in-process for the memory store. */
function buildPolicy(config: AppConfig, closers: (() => Promise<void>)[]): PolicyVersions {
  const url = config.store.url;
  if (url === "memory") return new MemoryPolicyVersions();
  const commander =
    url === "upstash"
      ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN! })
      : new IoRedisCommander(url);
  closers.push(() => commander.close());
  return new RedisPolicyVersions(commander, { prefix: config.store.prefix });
}

function buildStore(config: AppConfig): TransferQueue {
  const url = config.store.url;
  const prefix = config.store.prefix;
  if (url === "memory") return new MemoryTransferQueue();
  if (url === "upstash") {
    const restUrl = process.env.UPSTASH_REDIS_REST_URL;
    const token = process.env.UPSTASH_REDIS_REST_TOKEN;
    if (!restUrl || !token) throw new ConfigError("store.url", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
    return createUpstashTransferQueue({ url: restUrl, token, prefix });
  }
  return createRedisTransferQueue({ url, prefix });
}
