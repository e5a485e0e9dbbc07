import { processLoopLag } from "../../shared/telemetry/loop-lag.ts";
import type { AppConfig } from "../../shared/config/app-config.ts";
import type { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { EngineControl, type EngineGate, type EngineReplicaTarget } from "../../shared/inference/engine-control.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import type { JobQueue } from "../../shared/jobs/job-queue.ts";
import type { queuedCallbacks } from "../../shared/jobs/queued-callbacks.ts";
import type { ModelId } from "../../shared/schema/index.ts";
import type { ExecutorFactory, RolloutService } from "../../shared/service/rollout-service.ts";
import type { SessionHost } from "../../shared/session/session-host.ts";
import type { StoreHealth } from "../../shared/store/store-health.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { SessionsBackend } from "../../functions/sessions.ts";
import { maskRedisUrl } from "../redis/redis-check.ts";
import { buildAgentGateway } from "./builders/agent.ts";
import { resolveRuntimeConfig } from "./builders/config.ts";
import { buildEngine, buildEnginePools, buildTeacher, probePolicyEngine } from "./builders/engine.ts";
import { buildLoopRegistry } from "./builders/loops.ts";
import { buildModel } from "./builders/model.ts";
import { buildRolloutService, executorDeps, type ServiceHooks } from "./builders/service.ts";
import { buildGate, buildPolicy, buildSessionStorage, buildStore, checkStore, waitForStore } from "./builders/store.ts";
import { buildTools } from "./builders/tools.ts";
import { buildSandboxLeases } from "./builders/sandbox.ts";
import type { SandboxLeases } from "../../shared/tools/sandbox-leases.ts";
import type { PromFamily } from "../../shared/telemetry/prometheus.ts";
import { fetchCapWarning, toolsBudgetWarning } from "./builders/warnings.ts";
import type { ConfigFlags } from "./flags.ts";
import { processStoreHealth, watchStore } from "./store-watch.ts";

// The composition root of `serve`, `worker` and `rollout`: buildRuntime composes the builders of
// ./builders/ (one per part: config, model, engine, tools, store, loops, agent gateway, rollout service).
// Commands that need only a part (gateway, sim-engine, gc) import those builders directly.
export { DEFAULT_SCRIPT, PACKAGE_ROOT } from "./builders/package-paths.ts";
export { CARRY_IDLE_TTL_MS } from "./builders/service.ts";
export { buildPausedReader, buildRoutingState, checkStore } from "./builders/store.ts";
export { validateBatchLoops, validateRollout } from "./builders/loops.ts";
export { fetchCapWarning, hasSignedCalls, toolsBudgetWarning, unsignedAgentWarning, unsignedToolsWarning } from "./builders/warnings.ts";

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
  /** Whether `tools.file` has webhook tools or simulated users, whose calls are signed with `tools.secret` (MCP requests never are); false without a file. */
  signedToolCalls: boolean;
  /** The agent gateway (sessions of `openai_agent`; served by `functions/agent-gateway.ts`). */
  agentGateway: AgentGateway;
  /** Pause/resume of the engine replicas and the deployment's pause gate (`/v1/engine/*`). */
  engine: EngineControl;
  /** The sandbox leases of the tools file's `sandbox` lifecycle (their metrics go to `/metrics`), or null without one. */
  leases: SandboxLeases | null;
  /** The sandbox leases' `/metrics` families (`storeWide`: the store's shared gauges and counters too: serve only), or null without leases. */
  leaseMetrics: ((storeWide: boolean) => Promise<PromFamily[]>) | null;
  /** Sets the URL agents reach this process's API at, once it listens (unless `agent.public_url` is configured). */
  setPublicUrl(url: string): void;
  /** Stops what the runtime started (tool server, sim replicas, store connections). */
  close(): Promise<void>;
}

/** Instrumentation points of {@link buildRuntime} (tests, embedding); the rollout service's are {@link ServiceHooks}. */
export interface RuntimeHooks extends ServiceHooks {
  /** Timeout of the start-up checks of the store and a URL engine, in milliseconds (default 3000). */
  checkTimeoutMs?: number;
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
}

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
  const config = await resolveRuntimeConfig(flags);
  const checkTimeoutMs = hooks.checkTimeoutMs ?? 3_000;
  if (hooks.waitForStore) await waitForStore(config, checkTimeoutMs, flags.storeTimeout, hooks.onStoreTimeout);
  else await checkStore(config, checkTimeoutMs);
  const closers: (() => Promise<void>)[] = [];
  const describe: string[] = [];
  const warnings: string[] = [];
  // The process's event-loop lag: /metrics shows it, and sessions wait to start while it is over limits.max_event_loop_lag_ms.
  if (!processLoopLag.running) {
    processLoopLag.start();
    closers.push(async () => processLoopLag.stop());
  }
  try {
    const { tokenizer, model } = await buildModel(config, describe);

    const targets: EngineReplicaTarget[] = [];
    // The embedded gateway's health probes ask the pause gate (built below) whether the engines are paused on purpose.
    let healthGate: EngineGate | undefined;
    const enginesPaused = async () => (healthGate ? (await healthGate.state()).paused : false);
    const client = await buildEngine(config, tokenizer, closers, describe, targets, enginesPaused);
    const pools = await buildEnginePools(config, tokenizer, closers, describe, targets, enginesPaused);
    const maxModelLen = await probePolicyEngine(config, client, checkTimeoutMs, describe, warnings);
    const fetchCap = fetchCapWarning(config.concurrency);
    if (fetchCap) warnings.push(fetchCap);
    const teacher = await buildTeacher(config, tokenizer, checkTimeoutMs, describe, warnings);

    const built0 = await buildTools(config, closers, describe);
    const { interactions, signedCalls } = built0;
    const { leases, tools, leaseMetrics } = buildSandboxLeases(config, built0.sandbox, built0.tools, closers, describe, flags.storeTimeout);
    const toolsBudget = toolsBudgetWarning(tokenizer, tools.schemas, config.rollout.prompt_length);
    if (toolsBudget) warnings.push(toolsBudget);
    const store = buildStore(config, flags.storeTimeout);
    closers.push(() => store.close());
    const durable = config.store.durability === "replicated" ? ` (durability replicated: each write waits for ${config.store.wait_replicas ?? 1} replica acknowledgement(s), WAIT ${config.store.wait_timeout_ms ?? 1000} ms)` : "";
    describe.push(`store      ${config.store.url === "memory" ? "memory (in-process)" : maskRedisUrl(config.store.url)}${durable}`);
    if (config.store.blobs.url) describe.push(`blobs      ${config.store.blobs.url} (routed experts of ${config.store.blobs.threshold_bytes} packed bytes and more)`);
    const registry = await buildLoopRegistry(config, tokenizer, describe, warnings);

    const policy = buildPolicy(config, closers, flags.storeTimeout);
    const gate = buildGate(config, policy, closers, flags.storeTimeout);
    healthGate = gate;
    const engine = new EngineControl({ gate, format: config.engine.format, replicas: () => targets });
    const deps = executorDeps(config, { gate, policy, registry, tokenizer, client, maxModelLen, tools, interactions, teacher, ...(leases ? { leases } : {}) });
    const built = buildSessionStorage(config, closers, flags.storeTimeout);
    const { agentGateway, setPublicUrl } = buildAgentGateway(config, deps, built?.storage ?? null, describe, warnings, pools);
    const { service, sessions, callbacks, jobs, batchStore, executorFor } = buildRolloutService({ config, deps, registry, store, sessionStore: built, policy, model, hooks, closers, describe });
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
      signedToolCalls: signedCalls,
      agentGateway,
      engine,
      leases,
      leaseMetrics,
      setPublicUrl,
      async close() {
        for (const c of closers.reverse()) await c().catch(() => {});
      },
    };
  } catch (e) {
    for (const c of closers.reverse()) await c().catch(() => {});
    throw e;
  }
}
