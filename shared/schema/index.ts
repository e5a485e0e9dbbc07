/**
 * `edgeloop/schema` — the zod schemas (and their types) of everything that
 * crosses a boundary: chat messages and tools, dataset rows, sampling
 * parameters, the rollout config, loop outputs (`AgentLoopOutput`) and
 * trajectory records (`TrajectoryRecord`: `prompt_ids`, `response_ids`,
 * `response_mask`, `rollout_log_probs`, …), trajectory keys
 * (`{uid}_{session_id}_{output_index}`), model ids, agent role names, the `openenv_agent`
 * settings and the OpenEnv reset/step result, and the sandbox provider
 * contract (create, release and heartbeat bodies, the create reply).
 */
export * from "./message.ts";
export * from "./tool.ts";
export * from "./row.ts";
export * from "./sampling.ts";
export * from "./config.ts";
export * from "./routed-experts.ts";
export * from "./blob-pointer.ts";
export * from "./agent-role.ts";
export * from "./token-output.ts";
export * from "./agent-loop-output.ts";
export * from "./multi-modal.ts";
export * from "./trajectory-record.ts";
export * from "./openenv.ts";
export * from "./sandbox.ts";
