import { runAgentLoop, type AgentLoopRegistry } from "../agent-loop/index.ts";
import type { AgentLoopContext } from "../agent-loop/agent-loop.ts";
import type { GenerateRequest, InferenceClient } from "../inference/types.ts";
import type { RolloutConfig, SamplingParams, TokenOutput } from "../schema/index.ts";
import { TrajectoryTracer } from "../telemetry/trajectory-tracer.ts";
import type { BatchPlan, PlannedTrajectory } from "./batch.ts";
import type { TrajectoryExecutor } from "./batch-run.ts";

/** What the agent loops of a process share: built once at start-up. */
export interface ExecutorDeps extends Omit<AgentLoopContext, "config" | "client" | "signal"> {
  registry: AgentLoopRegistry;
  client: InferenceClient;
}

/**
 * The sampling parameters of a batch: `rollout.{temperature, top_p, top_k}`
 * for training, `rollout.val_kwargs` for validation batches (verl); log-probs
 * per `calculate_log_probs`. With `rollout.seed` set, each trajectory gets its
 * own seed derived from (seed, row, session), so the `n` sessions of a prompt
 * differ while a rerun repeats them.
 */
export function samplingParamsFor(rollout: RolloutConfig, validate: boolean, t?: Pick<PlannedTrajectory, "row_index" | "session_id">): SamplingParams {
  const src = validate ? rollout.val_kwargs : rollout;
  const seed = rollout.seed === undefined || !t ? undefined : (rollout.seed * 1_000_003 + t.row_index * 9_973 + t.session_id) % 2_147_483_647;
  return {
    temperature: src.temperature,
    top_p: src.top_p,
    top_k: src.top_k,
    logprobs: rollout.calculate_log_probs,
    ...(seed === undefined ? {} : { seed }),
  };
}

/** Stamps every turn's output with the batch's policy version when the engine does not report one. */
class VersionStampingClient implements InferenceClient {
  constructor(
    private readonly inner: InferenceClient,
    private readonly version: string | number,
  ) {}
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const out = await this.inner.generate(req);
    if (out.extra_fields?.model_version != null) return out;
    return { ...out, extra_fields: { ...out.extra_fields, model_version: this.version } };
  }
  maxModelLen(): Promise<number | undefined> {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
}

/**
 * A {@link TrajectoryExecutor} that routes each row to its agent loop
 * (`agent_name`, absent/null → `default_agent_loop`) and runs it with the
 * row's fields plus `uid`, `session_id`, `global_steps` and the key.
 * Each run's engine client and tools are wrapped by a {@link TrajectoryTracer}
 * (turn, `inference.generate` and `tool.call` spans under the active
 * `agent_loop.run`; tool-call latencies returned as `toolLatenciesMs`).
 */
export function createAgentExecutor(
  deps: ExecutorDeps,
  rollout: RolloutConfig,
  batch: { model_version: string | number | null; validate: boolean },
): TrajectoryExecutor {
  const client = batch.model_version == null ? deps.client : new VersionStampingClient(deps.client, batch.model_version);
  const { registry, ...shared } = deps;
  return {
    agentNameFor: (t) => t.row?.agent_name ?? rollout.agent.default_agent_loop,
    async run(t: PlannedTrajectory, plan: BatchPlan) {
      const row = t.row!;
      const agentName = registry.resolve(row.agent_name, rollout.agent.default_agent_loop);
      const tracer = new TrajectoryTracer(t.key);
      const ctx: AgentLoopContext = { ...shared, client: tracer.client(client), ...(shared.tools ? { tools: tracer.tools(shared.tools) } : {}), config: rollout };
      try {
        const outputs = await runAgentLoop(registry, ctx, samplingParamsFor(rollout, plan.validate, t), {
          ...row,
          uid: t.uid,
          session_id: t.session_id,
          global_steps: plan.global_steps,
          key: t.key,
        });
        return { agentName, outputs, toolLatenciesMs: tracer.toolLatenciesMs };
      } finally {
        tracer.end();
      }
    },
  };
}
