import { sessionLimitsOf } from "../../shared/agent-loop/session-limits.ts";
import { readFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { parseAgentLoopConfig, type AgentLoopRegistry } from "../../shared/agent-loop/index.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { checkConfigFile, mergeConfig, parseAppConfig, parseLayeredConfig, type AppConfig } from "../../shared/config/app-config.ts";
import { ConfigError, InputError, StoreError, TemplateError } from "../../shared/errors.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import { createAgentExecutor, createSessionExecutor, sessionLoopFactory, sessionOutputFinisher, endLoopTrace, versionStampedClient, type ExecutorDeps } from "../../shared/rollout/executor.ts";
import { RedisSessionStorage } from "../../shared/session/redis-session-storage.ts";
import { SessionHost } from "../../shared/session/session-host.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { sessionCompletingQueue } from "../../shared/session/session-queue.ts";
import { checkUpstash, UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import type { RolloutConfig } from "../../shared/schema/config.ts";
import type { RolloutRequest } from "../../shared/rollout/batch.ts";
import type { BatchRun } from "../../shared/rollout/batch-run.ts";
import { toolCallParserNames } from "../../shared/tools/parser-registry.ts";
import { IoRedisCommander } from "../redis/ioredis-commander.ts";
import { checkRedis, maskRedisUrl } from "../redis/redis-check.ts";
import { RolloutService, type AcceptedBatch, type ExecutorFactory } from "../../shared/service/rollout-service.ts";
import { JobQueue, type JobQueueOptions } from "../../shared/jobs/job-queue.ts";
import { queuedCallbacks } from "../../shared/jobs/queued-callbacks.ts";
import type { SessionsBackend } from "../../functions/sessions.ts";
import { MemoryPolicyVersions, RedisPolicyVersions, type PolicyVersions } from "../../shared/rollout/policy-version.ts";
import type { RedisCommander } from "../../shared/store/redis-commander.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { createUpstashTransferQueue } from "../../shared/store/upstash-transfer-queue.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient, type ToolExecutor } from "../../shared/tools/webhook-tool-client.ts";
import { withMcpTools } from "./build-mcp.ts";
import { interactionClients, type InteractionClient } from "../../shared/tools/interaction-client.ts";
import type { ToolsFile } from "../../shared/schema/index.ts";
import { loadTokenizer } from "../node/model-dir.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { tokenMethodFallbacks } from "../../shared/tokens/token-methods.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { describeModel, modelIdOf } from "../../shared/models/index.ts";
import type { ModelId } from "../../shared/schema/index.ts";
import { createRedisTransferQueue } from "../redis/redis-transfer-queue.ts";
import { SimEngine } from "../sim-engine/sim-engine.ts";
import { readSimScriptFile } from "../sim-engine/script-file.ts";
import { routedExpertsEngineShape } from "./routed-experts-config.ts";
import { SimEngineClient } from "../sim-engine/sim-engine-client.ts";
import { startSimEngine } from "../sim-engine/server.ts";
import { startToolServer } from "../tools/server.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import { gatewayOptions } from "./gateway-options.ts";
import { createSimEngineApp } from "../sim-engine/app.ts";
import { EngineControl, MemoryEngineGate, RedisEngineGate, type EngineGate, type EngineReplicaTarget } from "../../shared/inference/engine-control.ts";
import { redactUrl } from "../../shared/http/outbound.ts";
import { DEADLINE_HEADER } from "../../shared/inference/engine-http.ts";
import { RedisRoutingState } from "../../shared/inference/redis-routing-state.ts";
import type { RoutingState } from "../../shared/inference/routing-state.ts";
import { readConfigFile, resolveConfigPaths } from "./files.ts";
import { processStoreHealth, watchStore } from "./store-watch.ts";
import type { StoreHealth } from "../../shared/store/store-health.ts";
import { flagConfigError, overridesFromFlags, type ConfigFlags } from "./flags.ts";
import { checkConfiguredTeacher, teacherClientsFor, validateBatchTeacher } from "./teacher.ts";

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
  /** This process's model (`modelIdOf` the tokenizer): recorded in records and queued batches; workers refuse another. */
  model: ModelId;
  /** The loaded tokenizer (what readers decode records of {@link model} with). */
  tokenizer: ChatTokenizer;
  /**
   * The durable-session host, when trajectories run as sessions (a Redis or
   * Upstash store: checkpoints live in the same Redis); its callbacks are
   * served by `functions/sessions.ts`.
   */
  sessions: SessionHost | null;
  /**
   * What `POST /v1/sessions/{key}/tool-results` and `GET /v1/sessions/{key}`
   * call: the session host itself in inline mode (a callback continues the
   * session here), or in queue mode {@link queuedCallbacks} (commit the
   * result, wake the worker running the session); null without sessions.
   */
  callbacks: SessionsBackend | null;
  /** The job queue (a Redis or Upstash store), or null for the memory store. */
  jobs: JobQueue | null;
  /** The transfer queue batches write through (for sessions: records written once, then the session marked done). */
  batchStore: TransferQueue;
  /** Builds a batch's executor (durable sessions with a Redis store): what workers run jobs with. */
  executorFor: ExecutorFactory;
  /** One line per component, for the start-up banner. */
  describe: string[];
  /** Whether the store answers now (`GET /health`); always ok for the memory store. */
  storeHealth: () => Promise<StoreHealth>;
  /** Start-up warnings (e.g. an engine URL that does not answer yet), one line each, printed before the run. */
  warnings: string[];
  /** The agent gateway (sessions of `openai_agent`; served by `functions/agent-gateway.ts`). */
  agentGateway: AgentGateway;
  /** Pause/resume of the engine replicas and the deployment's pause gate (`/v1/engine/*`). */
  engine: EngineControl;
  /** Sets the URL agents reach this process's API at, once it listens (unless `agent.public_url` is configured). */
  setPublicUrl(url: string): void;
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
  /** Timeout of the start-up checks of the store and a URL engine, in milliseconds (default 3000). */
  checkTimeoutMs?: number;
  /**
   * Queue mode: milliseconds an unfinished trajectory of a followed batch may
   * be missing from the store (no job, no record, no session step committed) before
   * `GET /v1/rollouts/{id}` reports it lost (default 30 000).
   */
  lostGraceMs?: number;
  /**
   * Called once when the store has been unreachable for longer than
   * `--store-timeout` (flags.storeTimeout) with one line saying so. Default:
   * print it on stderr and exit with status 1.
   */
  onStoreTimeout?: (line: string) => void;
  /**
   * Long-running processes (`serve`, `worker`): a store that does not answer
   * at start is waited for (one line saying so, then checks with backoff
   * capped at 5 s) instead of failing — a worker started while Redis
   * restarts comes up with it — bounded by `--store-timeout` when given. A
   * refused password or token and a bad configuration still fail at once.
   */
  waitForStore?: boolean;
  /**
   * Memory store: milliseconds a trajectory carried to the next batch
   * (`partial_rollout: carry`) keeps its in-process checkpoint without being
   * resumed before it is dropped (default {@link CARRY_IDLE_TTL_MS}).
   */
  carryIdleTtlMs?: number;
}

/** How long an in-process carried checkpoint waits for a batch to resume it: 6 hours (a Redis store keeps sessions in Redis instead). */
export const CARRY_IDLE_TTL_MS = 6 * 3600 * 1000;

/**
 * Resolves the config (file, then CLI flags over it; relative paths inside
 * the file are relative to the file), validates it eagerly, checks that the
 * store answers (a few seconds at most), probes a URL engine (a warning if it
 * does not answer: it may come up later), and builds the tokenizer, engine
 * client, tools, store and the rollout service. With `engine.url = "sim"`
 * the simulated engine runs in-process (K > 1 replicas: real loopback
 * servers behind the gateway); with no tools file the example tool server is
 * started on a free loopback port.
 * @throws ConfigError naming the config path and the fix (including an
 *   unknown `rollout.multi_turn.format` or `rollout.agent.default_agent_loop`);
 *   StoreError/AuthError when the store cannot be reached or refuses the token.
 */
export async function buildRuntime(flags: ConfigFlags, hooks: RuntimeHooks = {}): Promise<Runtime> {
  const fileCfg = flags.config ? resolveConfigPaths(await readConfigFile(flags.config), flags.config) : {};
  let config: AppConfig;
  // The file's own values are checked first, outside the flag attribution below: a bad value in the file
  // is the file's error even when a flag replaces it.
  if (flags.config) checkConfigFile(fileCfg, flags.config);
  try {
    config = parseLayeredConfig(fileCfg, overridesFromFlags(flags), flags.config ?? "flags");
  } catch (e) {
    throw flagConfigError(e, flags);
  }
  // The parser is checked before anything starts, unless loop modules are configured (a module may register
  // its own parser with registerToolCallParser); the default agent loop once the registry is loaded.
  if (!config.rollout.agent.agent_loop_config_path) validateRollout(config.rollout, null);
  // Store flags mean nothing to the memory store (no keys, nothing to reach): refused, not ignored.
  if (config.store.url === "memory") {
    if (flags.storePrefix !== undefined) throw new InputError("--store-prefix", "applies to a Redis or Upstash store (--store); the memory store has no keys");
    if (flags.storeTimeout !== undefined) throw new InputError("--store-timeout", "applies to a Redis or Upstash store (--store); the memory store is never unreachable");
  }
  // An empty secret would sign nothing and leave callbacks refused (403): say so instead of running unsigned.
  if (flags.toolsSecret !== undefined && !/\S/.test(flags.toolsSecret)) throw new InputError("--tools-secret", "must not be empty (omit it to run without signatures)");
  const checkTimeoutMs = hooks.checkTimeoutMs ?? 3_000;
  if (hooks.waitForStore) await waitForStore(config, checkTimeoutMs, flags.storeTimeout, hooks.onStoreTimeout);
  else await checkStore(config, checkTimeoutMs);
  const closers: (() => Promise<void>)[] = [];
  const describe: string[] = [];
  const warnings: string[] = [];
  try {
    const tokenizer = await loadTokenizer(config.model ?? undefined);
    probeTemplate(tokenizer);
    const model = await modelIdOf(tokenizer);
    describe.push(`model      ${describeModel(tokenizer, config.rollout.multi_turn.format)}`);
    // Where the template falls back from token formulas to a render per prompt or observation (issue 19).
    for (const line of tokenMethodFallbacks(tokenizer, { chatTemplateKwargs: config.rollout.chat_template_kwargs })) describe.push(`tokens     ${line}`);

    const targets: EngineReplicaTarget[] = [];
    // The embedded gateway's health probes ask the pause gate (built below) whether the engines are paused on purpose.
    let healthGate: EngineGate | undefined;
    const enginesPaused = async () => (healthGate ? (await healthGate.state()).paused : false);
    const client = await buildEngine(config, tokenizer, closers, describe, targets, enginesPaused);
    const [probed, unreachable] = await Promise.all([
      client.maxModelLen?.().catch(() => undefined),
      config.engine.url === "sim" ? Promise.resolve(null) : probeEngine(config.engine.url, checkTimeoutMs),
    ]);
    if (unreachable) warnings.push(`warning    engine ${redactUrl(config.engine.url)} does not answer (${unreachable}); trajectories fail until it is up`);
    const fetchCap = fetchCapWarning(config.concurrency);
    if (fetchCap) warnings.push(fetchCap);
    const maxModelLen = config.rollout.max_model_len ?? probed ?? config.rollout.prompt_length + config.rollout.response_length;
    describe.push(`context    max_model_len ${maxModelLen}`);
    const teacher = teacherClientsFor(config, tokenizer);
    const teacherCfg = config.rollout.teacher;
    if (teacherCfg) {
      const warning = await checkConfiguredTeacher(config, tokenizer, teacher, checkTimeoutMs);
      if (warning) warnings.push(warning);
      describe.push(`teacher    ${teacher(teacherCfg).describe}${teacherCfg.urls ? ` (${teacherCfg.urls.length} replicas behind the gateway)` : ""}, on_error ${teacherCfg.on_error}${warning ? "" : ", same tokenizer"}`);
    }

    const { tools, interactions } = await buildTools(config, closers, describe);
    const store = buildStore(config, flags.storeTimeout);
    closers.push(() => store.close());
    describe.push(`store      ${config.store.url === "memory" ? "memory (in-process)" : maskRedisUrl(config.store.url)}`);

    const registry = defaultAgentLoopRegistry();
    const loopsPath = config.rollout.agent.agent_loop_config_path;
    if (loopsPath) {
      const text = await readFile(loopsPath, "utf8").catch((e) => {
        throw new ConfigError("rollout.agent.agent_loop_config_path", `cannot read ${loopsPath}: ${(e as Error).message}`);
      });
      await registry.loadConfig(parseAgentLoopConfig(text, loopsPath), { baseUrl: pathToFileURL(resolve(loopsPath)).href });
    }
    validateRollout(config.rollout, registry);
    const parser = config.rollout.multi_turn.format ?? tokenizer.traits.defaultParser;
    if (!toolCallParserNames().includes(parser)) {
      warnings.push(`warning    tool-call parser '${parser}' (default of ${tokenizer.traits.family}) is not registered in this build; tool_agent trajectories fail until rollout.multi_turn.format names one of: ${toolCallParserNames().join(", ")}`);
    }
    describe.push(`loops      ${registry.names().join(", ")} (default ${config.rollout.agent.default_agent_loop})`);

    const policy = buildPolicy(config, closers, flags.storeTimeout);
    const gate = buildGate(config, policy, closers, flags.storeTimeout);
    healthGate = gate;
    const engine = new EngineControl({ gate, format: config.engine.format, replicas: () => targets });
    const deps: ExecutorDeps = {
      gate,
      policy,
      registry,
      tokenizer,
      client,
      maxModelLen,
      tools,
      interactions,
      teacher,
      reward: { ...(config.reward.url ? { webhook: { url: config.reward.url, timeout_ms: config.reward.timeout_ms, max_retries: config.reward.max_retries, max_reply_bytes: config.reward.max_reply_bytes } } : {}), ...(config.tools.secret ? { secret: config.tools.secret } : {}) },
      sessionLimits: sessionLimitsOf(config.limits),
    };
    const built = buildSessionStorage(config, closers, flags.storeTimeout);
    const storage = built?.storage ?? null;
    // Agent sessions live with the trajectory sessions (Redis), else in this process.
    const agentGateway = new AgentGateway({ storage: storage ?? new MemorySessionStorage(), tokenizer, client: versionStampedClient(deps, null), maxModelLen, modelName: config.engine.model ?? tokenizer.name, retainSeconds: config.store.retention.sessions, limits: sessionLimitsOf(config.limits) });
    let publicUrl: string | null = config.agent.public_url;
    deps.agentGateway = { gateway: agentGateway, publicUrl: () => publicUrl, agent: { url: config.agent.url, timeout_ms: config.agent.timeout_ms, secret: config.agent.secret, max_reply_bytes: config.agent.max_reply_bytes } };
    if (config.agent.url) describe.push(`agent      openai_agent tasks to ${redactUrl(config.agent.url)} (timeout ${config.agent.timeout_ms} ms${config.agent.secret ? ", signed" : ""})`);
    const agentUnsigned = unsignedAgentWarning(config);
    if (agentUnsigned) warnings.push(agentUnsigned);
    let service: RolloutService;
    let sessions: SessionHost | null = null;
    let callbacks: SessionsBackend | null = null;
    let batchStore: TransferQueue;
    let executorFor: ExecutorFactory;
    let jobs: JobQueue | null = null;
    if (storage && built) {
      const host = new SessionHost({ storage, createLoop: sessionLoopFactory(deps), finishOutputs: sessionOutputFinisher(deps), onPause: endLoopTrace, terminalTtlSeconds: config.store.retention.sessions });
      closers.push(async () => host.close());
      sessions = host;
      batchStore = sessionCompletingQueue(hooks.wrapStore ? hooks.wrapStore(store) : store, storage, host);
      executorFor = (rollout, batch) => {
        validateRollout(rollout, registry);
        return createSessionExecutor(deps, host, store, rollout, batch);
      };
      jobs = new JobQueue(built.commander, { prefix: config.store.prefix, batchTtlSeconds: config.store.retention.batches, ...hooks.jobQueue });
      const queued = hooks.jobs === "queue" || hooks.jobs === "auto";
      service = new ValidatingRolloutService(registry, { config, store: batchStore, executorFor, policy, model, ...(queued ? { jobs } : {}), ...(hooks.lostGraceMs !== undefined ? { lostGraceMs: hooks.lostGraceMs } : {}) });
      closers.push(async () => service.close());
      describe.push(`sessions   durable, checkpoints in ${config.store.url === "upstash" ? "Upstash" : "Redis"} (${config.store.prefix ?? "edgeloop:"}session:<key>)`);
      callbacks = queued ? queuedCallbacks(host, jobs, (line) => console.error(line)) : host;
      if (queued) describe.push(`jobs       queue: batches become jobs in ${jobs.stream}; run \`edgeloop worker\` with the same --store to process them`);
    } else {
      if (hooks.jobs === "queue") throw new ConfigError("store.url", "the job queue needs a Redis or Upstash store (--store redis://host:port); the memory store runs batches in-process");
      batchStore = hooks.wrapStore ? hooks.wrapStore(store) : store;
      // Partial rollouts carried to the next batch need checkpoints: with the memory store they live in this process.
      let carryHost: SessionHost | null = null;
      // A carried trajectory no later batch names would otherwise stay in memory for the life of the process.
      const carryStorage = new MemorySessionStorage(undefined, { idleTtlMs: hooks.carryIdleTtlMs ?? CARRY_IDLE_TTL_MS });
      executorFor = (rollout, batch) => {
        validateRollout(rollout, registry);
        const plain = createAgentExecutor(deps, rollout, batch);
        if (rollout.partial_rollout !== "carry" && !carryHost) return plain;
        if (!carryHost) {
          const host = new SessionHost({ storage: carryStorage, createLoop: sessionLoopFactory(deps), finishOutputs: sessionOutputFinisher(deps), onPause: endLoopTrace });
          closers.push(async () => host.close());
          carryHost = host;
        }
        const sessions = createSessionExecutor(deps, carryHost, store, rollout, batch);
        if (rollout.partial_rollout === "carry") return sessions;
        // A later batch without carry still resumes what an earlier carry batch left checkpointed here
        // (whatever its own partial_rollout says): never generate a carried trajectory again from scratch.
        return {
          agentNameFor: (t) => plain.agentNameFor(t),
          discard: (t) => sessions.discard!(t),
          run: async (t, plan, signal) => ((await carryStorage.stepOf(t.key)) !== null ? sessions.run(t, plan, signal) : plain.run(t, plan, signal)),
        };
      };
      service = new ValidatingRolloutService(registry, { config, store: batchStore, executorFor, policy, model });
    }
    const storeName = config.store.url === "upstash" ? (process.env.UPSTASH_REDIS_REST_URL ?? "upstash") : maskRedisUrl(config.store.url);
    const storeHealth = processStoreHealth(storeName, built?.commander ?? null);
    const stopWatch = watchStore(storeHealth, flags.storeTimeout, hooks.onStoreTimeout ?? ((line) => {
      console.error(line);
      process.exit(1);
    }));
    closers.unshift(async () => stopWatch());
    return {
      config,
      service,
      store,
      storeHealth,
      client,
      model,
      tokenizer,
      sessions,
      callbacks,
      jobs,
      batchStore,
      executorFor,
      describe,
      warnings,
      agentGateway,
      engine,
      setPublicUrl(url: string) {
        publicUrl = config.agent.public_url ?? url;
      },
      async close() {
        for (const c of closers.reverse()) await c().catch(() => {});
      },
    };
  } catch (e) {
    for (const c of closers.reverse()) await c().catch(() => {});
    throw e;
  }
}

/**
 * The start-up warning of `serve` and `worker` when a tools file is
 * configured without `tools.secret`: tool calls go unsigned and
 * asynchronous results (callbacks) are refused with 403. Null otherwise.
 */
export function unsignedToolsWarning(config: AppConfig): string | null {
  if (!config.tools.file || config.tools.secret) return null;
  return "warning    tools are configured without tools.secret: tool calls are unsigned and tool-result callbacks (POST /v1/sessions/{key}/tool-results) are refused with 403; set --tools-secret (the tool servers must sign with it)";
}

/**
 * The start-up warning when agent tasks go unsigned (`agent.url` set, no
 * `agent.secret`): each task carries its session's bearer token and an agent
 * cannot tell edgeloop's tasks from forged ones. Null otherwise.
 */
export function unsignedAgentWarning(config: AppConfig): string | null {
  if (!config.agent.url || config.agent.secret) return null;
  return "warning    agent tasks are sent unsigned (no agent.secret): an agent cannot tell edgeloop's tasks (which carry session tokens) from forged ones; set --agent-secret (the agent must verify x-edgeloop-signature with it)";
}

/**
 * Checks the values of a rollout config that name registered things: the
 * tool-call parser (`rollout.multi_turn.format`) and, given the registry,
 * the default agent loop. Run at start-up and for every batch's config, so a
 * typo fails once, up front, instead of failing every trajectory.
 * @throws ConfigError naming the path and listing the valid names.
 */
export function validateRollout(rollout: RolloutConfig, registry: AgentLoopRegistry | null): void {
  const parsers = toolCallParserNames();
  if (rollout.multi_turn.format !== null && !parsers.includes(rollout.multi_turn.format)) {
    throw new ConfigError("rollout.multi_turn.format", `unknown tool-call parser '${rollout.multi_turn.format}'; registered parsers: ${parsers.join(", ")}`);
  }
  const loop = rollout.agent.default_agent_loop;
  if (registry && !registry.has(loop)) {
    throw new ConfigError("rollout.agent.default_agent_loop", `unknown agent loop '${loop}'; registered agent loops: ${registry.names().join(", ")}`);
  }
}

/**
 * A batch's `rollout.agent.agent_loop_config_path`: custom loops are imported
 * once, at start, from the process's own config; a batch naming another file
 * (or any file, when none was configured) would be accepted and its loops
 * never loaded, so it is refused. The configured path itself (or null) is
 * accepted, as a no-op.
 * @throws ConfigError (400) naming `rollout.agent.agent_loop_config_path`.
 */
export function validateBatchLoops(batch: string | null, configured: string | null): void {
  if (batch === configured) return;
  throw new ConfigError(
    "rollout.agent.agent_loop_config_path",
    `custom agent loops are loaded once at start from the server's config (${configured ?? "none configured"}); a batch cannot load others: leave the key out and name a loaded loop in agent_name or default_agent_loop`,
  );
}

/**
 * The rollout service with the batch's config validated before anything is
 * planned or written, in queue mode too (where no executor is built in this
 * process): an unknown parser or agent loop is a 400, not a batch of failures.
 */
class ValidatingRolloutService extends RolloutService {
  constructor(
    private readonly registry: AgentLoopRegistry,
    opts: ConstructorParameters<typeof RolloutService>[0],
  ) {
    super(opts);
  }

  override async accept(req: RolloutRequest): Promise<AcceptedBatch> {
    this.check(req);
    return super.accept(req);
  }

  override async enqueue(req: RolloutRequest): Promise<AcceptedBatch> {
    this.check(req);
    return super.enqueue(req);
  }

  /** A batch's own config: registered names (parser, default loop) and what it may ask of the teacher. */
  private check(req: RolloutRequest): void {
    if (req.config) {
      let rollout: RolloutConfig | null = null;
      try {
        rollout = parseAppConfig(mergeConfig(this.config, req.config), "request config").rollout;
      } catch {
        // The service reports a config that does not parse (or sets other sections) itself.
      }
      if (rollout) {
        validateRollout(rollout, this.registry);
        validateBatchTeacher(rollout.teacher, this.config.rollout.teacher);
        validateBatchLoops(rollout.agent.agent_loop_config_path, this.config.rollout.agent.agent_loop_config_path);
      }
    }
  }
}

/**
 * Checks, before anything is built, that the store answers: one PING over a
 * fresh connection (Redis) or over REST with no retries (Upstash), within
 * `timeoutMs`. The memory store needs nothing.
 * @throws StoreError naming the (masked) URL; AuthError for a refused Upstash token; ConfigError when Upstash credentials are missing.
 */
export async function checkStore(config: AppConfig, timeoutMs: number): Promise<void> {
  const url = config.store.url;
  if (url === "memory") return;
  if (url === "upstash") {
    const restUrl = process.env.UPSTASH_REDIS_REST_URL;
    const token = process.env.UPSTASH_REDIS_REST_TOKEN;
    if (!restUrl || !token) throw new ConfigError("store.url", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
    await checkUpstash({ url: restUrl, token, timeoutMs });
    return;
  }
  await checkRedis(url, { timeoutMs, what: "store.url / --store" });
}

/**
 * Renders what every run needs once before anything starts — a first turn
 * with a tool declared, a tool result and a user turn as observations — so a
 * chat template that cannot (one that raises, or a model directory's Gemma
 * template without the built-in family's message shaping: "roles must
 * alternate") fails at start naming the model, not every trajectory later.
 * @throws ConfigError (field `model`) with the template's own message.
 */
function probeTemplate(tokenizer: ChatTokenizer): void {
  const tool = { type: "function" as const, function: { name: "probe", description: "probe", parameters: { type: "object" as const, properties: {} } } };
  const eot = tokenizer.stopTokenIds[0];
  const what = ["the first turn", "a tool result", "a user turn"];
  let step = 0;
  try {
    tokenizer.renderIds([{ role: "user", content: "ping" }], { tools: [tool], addGenerationPrompt: true });
    const enc = new ObservationEncoder(tokenizer);
    step = 1;
    enc.encode([{ role: "tool", content: "pong", name: "probe" }], eot);
    step = 2;
    enc.encode([{ role: "user", content: "pong" }], eot);
  } catch (e) {
    if (!(e instanceof TemplateError)) throw e;
    throw new ConfigError("model", `the chat template of ${tokenizer.name} cannot render ${what[step]}: ${e.message}`, { cause: e });
  }
}

/**
 * {@link checkStore} until the store answers: the first failure is reported
 * in one line naming the store and how to bound the wait, then checks repeat
 * with backoff (0.5 s doubling, capped at 5 s). After `timeoutS` seconds
 * (`--store-timeout`) `onTimeout` is called with one line (default: print it
 * and exit 1, as when the store stays unreachable mid-run).
 * @throws AuthError, ConfigError, and a StoreError that is a refusal (wrong password, ACL), at once.
 */
async function waitForStore(config: AppConfig, checkTimeoutMs: number, timeoutS: number | undefined, onTimeout?: (line: string) => void): Promise<void> {
  const start = Date.now();
  let delay = 500;
  for (let said = false; ; ) {
    try {
      await checkStore(config, checkTimeoutMs);
      if (said) console.error(`edgeloop: store ${maskRedisUrl(config.store.url)} answers after ${((Date.now() - start) / 1000).toFixed(1)} s`);
      return;
    } catch (e) {
      if (!(e instanceof StoreError) || /WRONGPASS|NOAUTH|NOPERM|invalid (username|password)/i.test(e.message)) throw e;
      if (timeoutS !== undefined && Date.now() - start >= timeoutS * 1000) {
        const line = `edgeloop: ${e.message}; unreachable for ${Math.round((Date.now() - start) / 1000)} s at start (--store-timeout ${timeoutS}); exiting`;
        if (!onTimeout) {
          console.error(line);
          process.exit(1);
        }
        onTimeout(line);
        throw e;
      }
      if (!said) {
        console.error(`edgeloop: ${e.message}; waiting for it${timeoutS === undefined ? " (bound the wait with --store-timeout SECONDS)" : ` for up to ${timeoutS} s (--store-timeout)`}`);
        said = true;
      }
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5_000);
    }
  }
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
async function buildEngine(
  config: AppConfig,
  tokenizer: Awaited<ReturnType<typeof loadTokenizer>>,
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
 * The webhook tools, MCP servers (`withMcpTools`, build-mcp.ts) and simulated users (`interactions`) of `tools.file`, the webhooks
 * signed with `tools.secret`; with no file, the example tool server's (its
 * `calc`, `lookup` and the `gsm8k_user` simulated user) on a free loopback port.
 */
async function buildTools(config: AppConfig, closers: (() => Promise<void>)[], describe: string[]): Promise<{ tools: ToolExecutor; interactions: Record<string, InteractionClient> }> {
  const secret = config.tools.secret ?? undefined;
  const users = (file: ToolsFile) => (file.interactions.length > 0 ? `; simulated users ${file.interactions.map((i) => i.name).join(", ")}` : "");
  if (config.tools.file) {
    const text = await readFile(config.tools.file, "utf8").catch((e) => {
      throw new ConfigError("tools.file", `cannot read ${config.tools.file}: ${(e as Error).message}`);
    });
    const file = parseToolsFile(text, { source: config.tools.file });
    describe.push(`tools      ${file.tools.map((t) => t.name).join(", ") || "(no webhook tools)"} from ${config.tools.file}${users(file)}`);
    return { tools: await withMcpTools(file, new WebhookToolClient(file.tools, { secret }), closers, describe), interactions: interactionClients(file.interactions, { secret }) };
  }
  const server = startToolServer({ port: 0, secret });
  closers.push(() => server.stop());
  const text = await readFile(join(PACKAGE_ROOT, "infra", "tools", "tools.example.json"), "utf8");
  const file = parseToolsFile(text, { source: "infra/tools/tools.example.json", vars: { port: server.port } });
  describe.push(`tools      ${file.tools.map((t) => t.name).join(", ")} (example tool server on ${server.url})${users(file)}`);
  return { tools: new WebhookToolClient(file.tools, { secret }), interactions: interactionClients(file.interactions, { secret }) };
}

/** Session storage in the store's Redis (its own connection, shared with the job queue), or null for the memory store (no durable sessions). */
function buildSessionStorage(config: AppConfig, closers: (() => Promise<void>)[], storeTimeoutS?: number): { storage: RedisSessionStorage; commander: RedisCommander } | null {
  const url = config.store.url;
  if (url === "memory") return null;
  const commander =
    url === "upstash"
      ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN!, ...sizeLimit(config) })
      : new IoRedisCommander(url, { ...sizeLimit(config), storeTimeoutS });
  closers.push(() => commander.close());
  return { storage: new RedisSessionStorage(commander, { prefix: config.store.prefix }), commander };
}

/**
 * Bun sends at most `BUN_CONFIG_MAX_HTTP_REQUESTS` fetches at once (256 when
 * unset; `npx edgeloop` sets 4,096) and queues the rest inside the process:
 * with more trajectories in flight than that, engine, tool, store and
 * pause/resume calls wait for a generation call to end (a pause then waits
 * for the longest running generation). A warning line when `concurrency`
 * exceeds the cap, else null; null outside Bun.
 * @see https://bun.sh/docs/runtime/env (BUN_CONFIG_MAX_HTTP_REQUESTS)
 */
export function fetchCapWarning(concurrency: number, env: Record<string, string | undefined> = process.env): string | null {
  if (!process.versions.bun) return null;
  const raw = env.BUN_CONFIG_MAX_HTTP_REQUESTS;
  const cap = raw && Number.isInteger(Number(raw)) && Number(raw) > 0 ? Number(raw) : 256;
  if (concurrency <= cap) return null;
  return `warning    concurrency ${concurrency} exceeds Bun's cap of ${cap} simultaneous HTTP requests (BUN_CONFIG_MAX_HTTP_REQUESTS${raw ? "" : " unset"}): engine, tool, store and pause calls beyond it queue inside this process; run through \`npx edgeloop\` (sets 4096) or set the variable`;
}

/** The sim's latency model from `engine.sim_latency` (absent: none). */
function simLatency(e: AppConfig["engine"]): { prefill_ms_per_token?: number; decode_ms_per_token?: number } | undefined {
  return e.sim_latency ?? undefined;
}

/**
 * The deployment's pause gate: in the store's Redis (API and workers share
 * it; its admission also reads the policy version every engine call is
 * stamped with), or in-process for the memory store.
 */
function buildGate(config: AppConfig, policy: PolicyVersions, closers: (() => Promise<void>)[], storeTimeoutS?: number): EngineGate {
  const url = config.store.url;
  if (url === "memory") return new MemoryEngineGate();
  const commander =
    url === "upstash"
      ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN!, ...sizeLimit(config) })
      : new IoRedisCommander(url, { ...sizeLimit(config), storeTimeoutS });
  closers.push(() => commander.close());
  return new RedisEngineGate(commander, { prefix: config.store.prefix, ...(policy instanceof RedisPolicyVersions ? { policyKey: policy.key } : {}) });
}

/**
 * Whether the deployment's engines are paused on purpose (its pause gate in
 * the store's Redis is closed), for a standalone `edgeloop gateway --store`:
 * its health probes then count no failure against a replica. Null for the
 * memory store (the gateway cannot see another process's gate).
 */
export function buildPausedReader(config: AppConfig, closers: (() => Promise<void>)[]): (() => Promise<boolean>) | null {
  if (config.store.url === "memory") return null;
  const gate = buildGate(config, new MemoryPolicyVersions(), closers);
  return async () => (await gate.state()).paused;
}

/**
 * The gateway's shared routing state (pins, in-flight leases, ejections) in
 * the store's Redis, over its own connection: with a `redis://` or `upstash`
 * store and `gateway.shared_state` (default true); null for the memory store
 * or when switched off (each gateway process then routes on its own state).
 */
export function buildRoutingState(config: AppConfig, closers: (() => Promise<void>)[], storeTimeoutS?: number): RoutingState | null {
  const url = config.store.url;
  if (url === "memory" || !config.gateway.shared_state) return null;
  if (url === "upstash" && (!process.env.UPSTASH_REDIS_REST_URL || !process.env.UPSTASH_REDIS_REST_TOKEN)) {
    throw new ConfigError("store.url", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
  }
  const commander =
    url === "upstash"
      ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN!, ...sizeLimit(config) })
      : new IoRedisCommander(url, { ...sizeLimit(config), storeTimeoutS });
  const state = new RedisRoutingState(commander, { prefix: config.store.prefix, leaseTtlMs: config.gateway.lease_ttl_ms, pinTtlMs: config.gateway.pin_ttl_ms });
  closers.push(async () => {
    await state.close();
    await commander.close();
  });
  return state;
}

/** Policy versions shared through the store's Redis (API and workers see one), or in-process for the memory store. */
function buildPolicy(config: AppConfig, closers: (() => Promise<void>)[], storeTimeoutS?: number): PolicyVersions {
  const url = config.store.url;
  if (url === "memory") return new MemoryPolicyVersions();
  const commander =
    url === "upstash"
      ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN!, ...sizeLimit(config) })
      : new IoRedisCommander(url, { ...sizeLimit(config), storeTimeoutS });
  closers.push(() => commander.close());
  return new RedisPolicyVersions(commander, { prefix: config.store.prefix });
}

function buildStore(config: AppConfig, storeTimeoutS?: number): TransferQueue {
  const url = config.store.url;
  const prefix = config.store.prefix;
  if (url === "memory") return new MemoryTransferQueue();
  if (url === "upstash") {
    const restUrl = process.env.UPSTASH_REDIS_REST_URL;
    const token = process.env.UPSTASH_REDIS_REST_TOKEN;
    if (!restUrl || !token) throw new ConfigError("store.url", "upstash needs UPSTASH_REDIS_REST_URL and UPSTASH_REDIS_REST_TOKEN in the environment");
    return createUpstashTransferQueue({ url: restUrl, token, prefix, ...sizeLimit(config) });
  }
  return createRedisTransferQueue({ url, prefix, ...sizeLimit(config), storeTimeoutS });
}

/** `store.max_request_bytes` as commander options (absent: the transport's default). */
function sizeLimit(config: AppConfig): { maxRequestBytes?: number } {
  return config.store.max_request_bytes ? { maxRequestBytes: config.store.max_request_bytes } : {};
}
