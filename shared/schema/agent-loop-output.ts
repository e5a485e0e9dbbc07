import { z } from "zod";
import { AgentRoleName } from "./agent-role.ts";
import { RoutedExpertsShape } from "./routed-experts.ts";
import { MultiModal } from "./multi-modal.ts";

/**
 * Per-trajectory timing metrics, as verl's `AgentLoopMetrics`: seconds,
 * accumulated over turns; `num_preempted` summed over turns, −1 when unknown.
 */
export const AgentLoopMetrics = z.object({
  generate_sequences: z.number().min(0).default(0),
  tool_calls: z.number().min(0).default(0),
  compute_score: z.number().min(0).default(0),
  num_preempted: z.number().int().min(-1).default(-1),
});
export type AgentLoopMetrics = z.infer<typeof AgentLoopMetrics>;

/** How a trajectory ended. `stop`: the loop ended normally; `length`: a budget was hit; `abort`; `error`. */
export const FinishReason = z.enum(["stop", "length", "abort", "error"]);
export type FinishReason = z.infer<typeof FinishReason>;

/**
 * One finished trajectory, unpadded (verl's `AgentLoopOutput`). Invariants
 * (DESIGN §2) are checked by `validateTrajectory`: `response_ids`,
 * `response_mask` and `response_logprobs` (when present) have equal length,
 * at most `response_length`.
 */
export const AgentLoopOutput = z.object({
  prompt_ids: z.array(z.number().int().min(0)),
  response_ids: z.array(z.number().int().min(0)),
  response_mask: z.array(z.union([z.literal(0), z.literal(1)])),
  response_logprobs: z.array(z.number()).nullable(),
  /**
   * The teacher's log-prob of each response token (`rollout.teacher`), float32,
   * 0.0 under mask 0; absent (not null) without a teacher or when it failed
   * under `on_error: keep`. Set by edgeloop after the loop, never by loops.
   */
  teacher_log_probs: z.array(z.number()).optional(),
  reward_score: z.number().nullable().default(null),
  num_turns: z.number().int().min(0),
  truncated: z.boolean().default(false),
  finish_reason: FinishReason.default("stop"),
  metrics: AgentLoopMetrics,
  extra_fields: z.record(z.string(), z.unknown()).default({}),
  /**
   * Routed experts (`rollout.return_routed_experts`): int32 values, row-major
   * `[len(prompt_ids) + len(response_ids), layers, top_k]`, aligned with
   * `prompt_ids ‖ response_ids`; positions no engine call covered hold
   * `ROUTED_EXPERTS_FILL` (0). Absent (not null) when not requested.
   */
  routed_experts: z.array(z.number().int()).optional(),
  /** `[layers, top_k]` of `routed_experts`; present exactly when it is. */
  routed_experts_shape: RoutedExpertsShape.optional(),
  /**
   * The images the model saw (vision-language families): see `MultiModal`;
   * spans index `prompt_ids ‖ response_ids`. Absent for text-only outputs.
   */
  multi_modal: MultiModal.optional(),
  /** The agent role whose calls produced this output (agent gateway: `X-Agent-Role` or the row's `agent_role`); absent without a role. */
  agent_role: AgentRoleName.optional(),
  /** The model that sampled the output's tokens: its engine pool's model name (config `engine.pools`); present with `agent_role`. */
  served_model: z.string().min(1).optional(),
  /**
   * A branch of the session's trajectory tree: the output index (among this
   * session's outputs, an earlier one) of the output it branched from; null
   * for a root. Absent for loops that build no trees (the record then has
   * neither field).
   */
  parent_output_index: z.number().int().min(0).nullable().optional(),
  /**
   * Token index into the parent's `prompt_ids ‖ response_ids` where the branch
   * starts: this output's `prompt_ids ‖ response_ids` before it are the
   * parent's, token for token. Null exactly when `parent_output_index` is.
   */
  branch_at: z.number().int().min(0).nullable().optional(),
});
export type AgentLoopOutput = z.infer<typeof AgentLoopOutput>;
