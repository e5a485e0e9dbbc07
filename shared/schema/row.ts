import { z } from "zod";
import { AgentRoleName } from "./agent-role.ts";
import { ChatMessage } from "./message.ts";

/** `reward_model` of a verl dataset row: how to score it. */
export const RewardModelSpec = z.looseObject({
  style: z.string().default("rule"),
  ground_truth: z.unknown().optional(),
});

/**
 * `extra_info` of a verl dataset row. A field that is `null` counts as absent
 * (Parquet rows carry null for a missing struct field); `index` is the
 * sample's index in its dataset (default: the row's position in the batch).
 */
export const ExtraInfo = z.looseObject({
  index: z.number().int().min(0, "extra_info.index must be >= 0").nullish(),
  tools_kwargs: z.record(z.string(), z.looseObject({ create_kwargs: z.record(z.string(), z.unknown()).nullish() })).nullish(),
  interaction_kwargs: z.record(z.string(), z.unknown()).nullish(),
  /** The sandbox create's `create_kwargs` (a tools file's `sandbox` lifecycle): an object; anything else fails the row rather than create a sandbox without them. */
  sandbox_kwargs: z.record(z.string(), z.unknown()).nullish(),
  tool_selection: z.array(z.string()).nullish(),
});

/**
 * One dataset record in verl's format. `agent_name` absent or `null` routes
 * to `default_agent_loop` (DESIGN §4.3). `__rollout_n__` overrides
 * `rollout.n` for this row. `agent_role` (absent or null: none) is the
 * `openai_agent` session's role: its engine pool (config `agent.roles`) and
 * the records' `agent_role`. Unknown fields are kept and passed to loops.
 */
export const DatasetRow = z.looseObject({
  data_source: z.string().default("unknown"),
  agent_name: z.string().nullish(),
  agent_role: AgentRoleName.nullish(),
  prompt: z.array(ChatMessage).min(1, "prompt must hold at least one message"),
  reward_model: RewardModelSpec.optional(),
  extra_info: ExtraInfo.optional(),
  __rollout_n__: z.number().int().min(1).optional(),
});
export type DatasetRow = z.infer<typeof DatasetRow>;
