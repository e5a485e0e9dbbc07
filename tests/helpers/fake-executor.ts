import type { PlannedTrajectory } from "../../shared/rollout/batch.ts";
import type { TrajectoryExecutor } from "../../shared/rollout/batch-run.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";

/**
 * One fixed output for trajectory `t`: prompt ids [1, 2, session_id], a
 * two-token response [5, 6] (mask [1, 1], log-probs [-0.5, -0.25]), reward 1,
 * 2 turns, finished by "stop", zero timings.
 */
export function fixedOutput(t: PlannedTrajectory): AgentLoopOutput {
  return {
    prompt_ids: [1, 2, t.session_id],
    response_ids: [5, 6],
    response_mask: [1, 1],
    response_logprobs: [-0.5, -0.25],
    reward_score: 1,
    num_turns: 2,
    truncated: false,
    finish_reason: "stop",
    metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
    extra_fields: {},
  };
}

/**
 * An executor of agent "fake" that awaits `hook(t)` (when given) and then
 * returns {@link fixedOutput} as the trajectory's one output; a hook that
 * throws fails the trajectory with that error.
 */
export function fakeExecutor(hook?: (t: PlannedTrajectory) => Promise<void>): TrajectoryExecutor {
  return {
    agentNameFor: () => "fake",
    async run(t) {
      await hook?.(t);
      return { agentName: "fake", outputs: [fixedOutput(t)] };
    },
  };
}
