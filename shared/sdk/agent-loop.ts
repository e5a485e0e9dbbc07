/**
 * `edgeloop/agent-loop` — what a custom agent loop is written with
 * (docs/custom-agent-loop.md): the loop base `AgentLoop` and its
 * `AgentLoopContext`, metrics helpers (`emptyMetrics`, `addPreempted`), the
 * built-in loops, the loop registry (`defaultAgentLoopRegistry` holds
 * `single_turn_agent`, `tool_agent`, `openenv_agent` and `openai_agent`; `parseAgentLoopConfig`
 * reads `agent_loop_config_path` files; `runAgentLoop` routes a row), prompt
 * and observation encoding, the trajectory builder that keeps `response_mask`
 * and `rollout_log_probs` aligned, and the tokenizer loader. The schema types
 * a loop returns (`AgentLoopOutput`, …) are `edgeloop/schema`.
 */
export * from "../agent-loop/index.ts";
export { defaultAgentLoopRegistry } from "../agent-gateway/builtin-loops.ts";
export * from "../tokens/index.ts";
