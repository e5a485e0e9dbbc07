import type { SandboxLeases } from "../../../shared/tools/sandbox-leases.ts";
import type { AgentLoopRegistry } from "../../../shared/agent-loop/index.ts";
import { sessionLimitsOf } from "../../../shared/agent-loop/session-limits.ts";
import { mergeConfig, parseAppConfig, type AppConfig } from "../../../shared/config/app-config.ts";
import { ConfigError } from "../../../shared/errors.ts";
import type { EngineGate } from "../../../shared/inference/engine-control.ts";
import type { InferenceClient } from "../../../shared/inference/types.ts";
import { JobQueue, type JobQueueOptions } from "../../../shared/jobs/job-queue.ts";
import { queuedCallbacks } from "../../../shared/jobs/queued-callbacks.ts";
import type { RolloutRequest } from "../../../shared/rollout/batch.ts";
import { createAgentExecutor, createSessionExecutor, endLoopTrace, sessionLoopFactory, sessionOutputFinisher, type ExecutorDeps } from "../../../shared/rollout/executor.ts";
import type { PolicyVersions } from "../../../shared/rollout/policy-version.ts";
import type { TeacherClientFactory } from "../../../shared/rollout/teacher-scoring.ts";
import type { RolloutConfig } from "../../../shared/schema/config.ts";
import type { ModelId } from "../../../shared/schema/index.ts";
import { RolloutService, type AcceptedBatch, type ExecutorFactory } from "../../../shared/service/rollout-service.ts";
import type { RedisSessionStorage } from "../../../shared/session/redis-session-storage.ts";
import { SessionHost } from "../../../shared/session/session-host.ts";
import { sessionCompletingQueue } from "../../../shared/session/session-queue.ts";
import { MemorySessionStorage } from "../../../shared/session/session-storage.ts";
import type { RedisCommander } from "../../../shared/store/redis-commander.ts";
import type { TransferQueue } from "../../../shared/store/types.ts";
import type { ChatTokenizer } from "../../../shared/tokens/tokenizer.ts";
import type { InteractionClient } from "../../../shared/tools/interaction-client.ts";
import type { ToolExecutor } from "../../../shared/tools/webhook-tool-client.ts";
import type { SessionsBackend } from "../../../functions/sessions.ts";
import { validateBatchTeacher } from "../teacher.ts";
import { validateBatchLoops, validateRollout } from "./loops.ts";

/** How long an in-process carried checkpoint waits for a batch to resume it: 6 hours (a Redis store keeps sessions in Redis instead). */
export const CARRY_IDLE_TTL_MS = 6 * 3600 * 1000;

/** The parts of `RuntimeHooks` (infra/cli/runtime.ts) the rollout service is built with. */
export interface ServiceHooks {
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
  /**
   * Queue mode: milliseconds an unfinished trajectory of a followed batch may
   * be missing from the store (no job, no record, no session step committed) before
   * `GET /v1/rollouts/{id}` reports it lost (default 30 000).
   */
  lostGraceMs?: number;
  /**
   * Memory store: milliseconds a trajectory carried to the next batch
   * (`partial_rollout: carry`) keeps its in-process checkpoint without being
   * resumed before it is dropped (default {@link CARRY_IDLE_TTL_MS}).
   */
  carryIdleTtlMs?: number;
}

/** What the executors of this process run trajectories with (`ExecutorDeps`, without the agent gateway: `buildAgentGateway` adds it). */
export function executorDeps(
  config: AppConfig,
  parts: { gate: EngineGate; policy: PolicyVersions; registry: AgentLoopRegistry; tokenizer: ChatTokenizer; client: InferenceClient; maxModelLen: number; tools: ToolExecutor; interactions: Record<string, InteractionClient>; teacher: TeacherClientFactory; leases?: SandboxLeases },
): ExecutorDeps {
  return {
    ...parts,
    reward: { ...(config.reward.url ? { webhook: { url: config.reward.url, timeout_ms: config.reward.timeout_ms, max_retries: config.reward.max_retries, max_reply_bytes: config.reward.max_reply_bytes } } : {}), ...(config.tools.secret ? { secret: config.tools.secret } : {}) },
    sessionLimits: sessionLimitsOf(config.limits),
    openenv: { settings: config.openenv },
  };
}

/** The rollout side of a runtime: what `POST /v1/rollouts`, session callbacks and workers call. */
export interface RolloutParts {
  service: RolloutService;
  sessions: SessionHost | null;
  callbacks: SessionsBackend | null;
  jobs: JobQueue | null;
  batchStore: TransferQueue;
  executorFor: ExecutorFactory;
}

/** What {@link buildRolloutService} composes. */
export interface RolloutServiceInput {
  config: AppConfig;
  deps: ExecutorDeps;
  registry: AgentLoopRegistry;
  /** The transfer queue (unwrapped). */
  store: TransferQueue;
  /** Session storage in the store's Redis and its connection, or null for the memory store. */
  sessionStore: { storage: RedisSessionStorage; commander: RedisCommander } | null;
  policy: PolicyVersions;
  model: ModelId;
  hooks: ServiceHooks;
  closers: (() => Promise<void>)[];
  describe: string[];
}

/**
 * The rollout service and its executors: with a Redis or Upstash store,
 * durable sessions (checkpoints in the store's Redis) and the job queue
 * (used by `POST /v1/rollouts` when `hooks.jobs` is `queue` or `auto`);
 * with the memory store, plain loops run in-process, with in-process
 * checkpoints only for `partial_rollout: carry`.
 * @throws ConfigError (`store.url`) when `hooks.jobs` is `queue` with the memory store.
 */
export function buildRolloutService(input: RolloutServiceInput): RolloutParts {
  return input.sessionStore ? durableService(input, input.sessionStore) : inProcessService(input);
}

function durableService({ config, deps, registry, store, policy, model, hooks, closers, describe }: RolloutServiceInput, built: { storage: RedisSessionStorage; commander: RedisCommander }): RolloutParts {
  const storage = built.storage;
  const host = new SessionHost({ storage, createLoop: sessionLoopFactory(deps), finishOutputs: sessionOutputFinisher(deps), onPause: endLoopTrace, terminalTtlSeconds: config.store.retention.sessions });
  closers.push(async () => host.close());
  const batchStore = sessionCompletingQueue(hooks.wrapStore ? hooks.wrapStore(store) : store, storage, host);
  const executorFor: ExecutorFactory = (rollout, batch) => {
    validateRollout(rollout, registry);
    return createSessionExecutor(deps, host, store, rollout, batch);
  };
  const jobs = new JobQueue(built.commander, { prefix: config.store.prefix, batchTtlSeconds: config.store.retention.batches, ...hooks.jobQueue });
  const queued = hooks.jobs === "queue" || hooks.jobs === "auto";
  const service = new ValidatingRolloutService(registry, { config, store: batchStore, executorFor, policy, model, ...(queued ? { jobs } : {}), ...(hooks.lostGraceMs !== undefined ? { lostGraceMs: hooks.lostGraceMs } : {}) });
  closers.push(async () => service.close());
  describe.push(`sessions   durable, checkpoints in ${config.store.url === "upstash" ? "Upstash" : "Redis"} (${config.store.prefix ?? "edgeloop:"}session:<key>)`);
  const callbacks = queued ? queuedCallbacks(host, jobs, (line) => console.error(line)) : host;
  if (queued) describe.push(`jobs       queue: batches become jobs in ${jobs.stream}; run \`edgeloop worker\` with the same --store to process them`);
  return { service, sessions: host, callbacks, jobs, batchStore, executorFor };
}

function inProcessService({ config, deps, registry, store, policy, model, hooks, closers }: RolloutServiceInput): RolloutParts {
  if (hooks.jobs === "queue") throw new ConfigError("store.url", "the job queue needs a Redis or Upstash store (--store redis://host:port); the memory store runs batches in-process");
  const batchStore = hooks.wrapStore ? hooks.wrapStore(store) : store;
  // Partial rollouts carried to the next batch need checkpoints: with the memory store they live in this process.
  let carryHost: SessionHost | null = null;
  // A carried trajectory no later batch names would otherwise stay in memory for the life of the process.
  const carryStorage = new MemorySessionStorage(undefined, { idleTtlMs: hooks.carryIdleTtlMs ?? CARRY_IDLE_TTL_MS });
  const executorFor: ExecutorFactory = (rollout, batch) => {
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
  const service = new ValidatingRolloutService(registry, { config, store: batchStore, executorFor, policy, model });
  return { service, sessions: null, callbacks: null, jobs: null, batchStore, executorFor };
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
