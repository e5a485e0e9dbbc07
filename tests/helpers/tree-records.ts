import type { TrajectoryRecord } from "../../shared/schema/index.ts";

/**
 * One session's records forming a trajectory tree (uid `uid`, session 0),
 * every one with routed experts (`[1 layer, top-2]`), hand-written so that
 * tests can state the exact tree-node form:
 * - `_0`: the root, prompt [10,11,12], response [20,21,22,23];
 * - `_1`: branches from `_0` at 5 (after its first two response tokens);
 * - `_2`: branches from `_0` at 2, inside its prompt (a sub-agent's own prompt);
 * - `_3`: branches from `_1` at 6 (a nested branch);
 * - `_4`: names `_0` at 5 but its tokens differ there (stays whole).
 * Log-probs are float32-exact.
 */
export function treeRecords(uid: string): TrajectoryRecord[] {
  const rec = (o: number, over: Partial<TrajectoryRecord>): TrajectoryRecord => ({
    key: `${uid}_0_${o}`,
    uid,
    session_id: 0,
    output_index: o,
    agent_name: "openai_agent",
    data_source: "gsm8k",
    prompt_ids: [],
    response_ids: [],
    response_mask: [],
    rollout_log_probs: null,
    reward_score: 1,
    num_turns: 2,
    truncated: false,
    finish_reason: "stop",
    error: null,
    metrics: { generate_sequences: 0.5, tool_calls: 0, compute_score: 0.01, num_preempted: -1 },
    extra_fields: { output_count: 5 },
    routed_experts_shape: [1, 2],
    ...over,
  });
  const range = (a: number, b: number) => Array.from({ length: b - a }, (_, i) => a + i);
  return [
    rec(0, { prompt_ids: [10, 11, 12], response_ids: [20, 21, 22, 23], response_mask: [1, 1, 0, 1], rollout_log_probs: [-1, -2, 0, -4], routed_experts: range(0, 14), parent_key: null, branch_at: null }),
    rec(1, { prompt_ids: [10, 11, 12], response_ids: [20, 21, 30, 31], response_mask: [1, 1, 1, 1], rollout_log_probs: [-1, -2, -3.5, -0.5], routed_experts: [...range(0, 10), 100, 101, 102, 103], parent_key: `${uid}_0_0`, branch_at: 5 }),
    rec(2, { prompt_ids: [10, 11, 40, 41], response_ids: [50], response_mask: [1], rollout_log_probs: [-0.25], routed_experts: [0, 1, 2, 3, ...range(200, 206)], parent_key: `${uid}_0_0`, branch_at: 2 }),
    rec(3, { prompt_ids: [10, 11, 12], response_ids: [20, 21, 30, 60], response_mask: [1, 1, 1, 1], rollout_log_probs: [-1, -2, -3.5, -0.75], routed_experts: [...range(0, 10), 100, 101, 300, 301], parent_key: `${uid}_0_1`, branch_at: 6 }),
    rec(4, { prompt_ids: [10, 11, 12], response_ids: [20, 99, 22, 23], response_mask: [1, 1, 0, 1], rollout_log_probs: [-1, -2, 0, -4], routed_experts: range(0, 14), parent_key: `${uid}_0_0`, branch_at: 5 }),
  ];
}

/** {@link treeRecords} as `deliver: "tree"` gives them: the exact node form of each. */
export function treeNodesOf(uid: string): TrajectoryRecord[] {
  const [r0, r1, r2, r3, r4] = treeRecords(uid);
  return [
    r0!,
    { ...r1!, prompt_ids: [], response_ids: [30, 31], response_mask: [1, 1], rollout_log_probs: [-3.5, -0.5], routed_experts: [100, 101, 102, 103], tree_prompt_length: 3 },
    { ...r2!, prompt_ids: [40, 41], response_ids: [50], response_mask: [1], rollout_log_probs: [-0.25], routed_experts: [200, 201, 202, 203, 204, 205], tree_prompt_length: 4 },
    { ...r3!, prompt_ids: [], response_ids: [60], response_mask: [1], rollout_log_probs: [-0.75], routed_experts: [300, 301], tree_prompt_length: 3 },
    r4!,
  ];
}
