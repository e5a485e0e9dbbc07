import { describe, expect, test } from "bun:test";
import { renderTrajectory, routedExpertsLine } from "../../infra/cli/inspect-command.ts";
import { expertsAt } from "../../functions/viewer/client/segments.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";

const rec: TrajectoryRecord = {
  key: "u_0_0",
  uid: "u",
  session_id: 0,
  output_index: 0,
  agent_name: "tool_agent",
  data_source: "d",
  prompt_ids: [1, 2],
  response_ids: [3],
  response_mask: [1],
  rollout_log_probs: null,
  reward_score: 1,
  num_turns: 2,
  truncated: false,
  finish_reason: "stop",
  error: null,
  metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
  extra_fields: {},
  // 3 tokens × 2 layers × 2 top_k.
  routed_experts: [3, 4, 0, 1, 5, 6, 7, 0, 2, 3, 0, 0],
  routed_experts_shape: [2, 2],
};

describe("routed experts in inspect and the viewer", () => {
  test("viewer hover: a token's experts per layer; nothing outside the array or without experts", () => {
    expect(expertsAt(rec.routed_experts, rec.routed_experts_shape, 0)).toBe("l0 [3 4] l1 [0 1]");
    expect(expertsAt(rec.routed_experts, rec.routed_experts_shape, 1)).toBe("l0 [5 6] l1 [7 0]");
    expect(expertsAt(rec.routed_experts, rec.routed_experts_shape, 3)).toBeNull();
    expect(expertsAt(undefined, undefined, 0)).toBeNull();
  });

  test("inspect: one line with the shape, the token count and the last forwarded token's experts; none without them", () => {
    expect(routedExpertsLine(rec)).toBe("routed experts: [layers, top_k] = [2, 2] over 3 tokens (prompt ‖ response); last forwarded token (#1): l0 [5 6] l1 [7 0]");
    const { routed_experts: _a, routed_experts_shape: _b, ...plain } = rec;
    expect(routedExpertsLine(plain)).toBeNull();
    const text = renderTrajectory(rec, { prompt: ["a", "b"], response: ["c"] }, { color: false });
    expect(text).toContain("routed experts: [layers, top_k] = [2, 2] over 3 tokens");
    expect(renderTrajectory(plain, { prompt: ["a", "b"], response: ["c"] }, { color: false })).not.toContain("routed experts");
  });
});
