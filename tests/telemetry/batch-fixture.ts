import { parseAppConfig } from "../../shared/config/app-config.ts";
import { planBatch } from "../../shared/rollout/batch.ts";
import { BatchRun, type TrajectoryExecutor } from "../../shared/rollout/batch-run.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";

/**
 * A batch of four rows with hand-made loop outputs (one per row, n = 1) and
 * tool-call latencies, run through the real BatchRun and memory queue:
 * row 0 two turns with a tool round, row 1 truncated, row 2 fails, row 3 a
 * slow tool round without reward. The expected figures in the tests are
 * computed by hand from these numbers.
 */
export const OUTPUTS: (AgentLoopOutput & { latenciesMs: number[] })[] = [
  {
    prompt_ids: [1, 2, 3],
    response_ids: [10, 11, 20, 21, 12],
    response_mask: [1, 1, 0, 0, 1],
    response_logprobs: [-0.5, -0.25, 0, 0, -1],
    reward_score: 1,
    num_turns: 4,
    truncated: false,
    finish_reason: "stop",
    metrics: { generate_sequences: 1.5, tool_calls: 0.5, compute_score: 0.1, num_preempted: -1 },
    extra_fields: { tool_calls: 2, tool_errors: 0 },
    latenciesMs: [100, 300],
  },
  {
    prompt_ids: [1, 2],
    response_ids: [30, 31, 32],
    response_mask: [1, 1, 1],
    response_logprobs: [-0.1, -0.2, -0.3],
    reward_score: 0,
    num_turns: 2,
    truncated: true,
    finish_reason: "length",
    metrics: { generate_sequences: 3, tool_calls: 0, compute_score: 0.2, num_preempted: 2 },
    extra_fields: {},
    latenciesMs: [],
  },
  null as never,
  {
    prompt_ids: [5],
    response_ids: [40, 50],
    response_mask: [1, 0],
    response_logprobs: [-2, 0],
    reward_score: null,
    num_turns: 3,
    truncated: false,
    finish_reason: "stop",
    metrics: { generate_sequences: 0.5, tool_calls: 2, compute_score: 0, num_preempted: 0 },
    extra_fields: { tool_calls: 3, tool_errors: 1 },
    latenciesMs: [50, 2000, 20],
  },
];

/** Runs the fixture batch to completion; `now` is a fake clock (1000 at start, 5000 at the end). */
export async function runFixtureBatch(): Promise<BatchRun> {
  const rollout = parseAppConfig({}).rollout;
  const rows = OUTPUTS.map((_, i) => ({ uid: `row${i}`, data_source: "fixture", prompt: [{ role: "user", content: `q${i}` }], __rollout_n__: 1 }));
  const plan = planBatch({ rows, global_steps: 1, model_version: null, validate: false }, rollout);
  const executor: TrajectoryExecutor = {
    agentNameFor: () => "tool_agent",
    async run(t) {
      const o = OUTPUTS[t.row_index];
      if (!o) throw new Error("engine down");
      const { latenciesMs, ...out } = o;
      return { agentName: "tool_agent", outputs: [out], toolLatenciesMs: latenciesMs };
    },
  };
  let clock = 1000;
  const run = new BatchRun(plan, { executor, store: new MemoryTransferQueue(), rollout, concurrency: 1, now: () => (clock += 4000) - 4000 });
  await run.run();
  return run;
}
