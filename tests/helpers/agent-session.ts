import type { AgentSessionInputArg } from "../../shared/agent-gateway/agent-session.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { config, SP } from "../agent-loop/helpers.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { exampleRow, exampleToolSchemas } from "./examples.ts";

/** The session token the agent-gateway tests create their sessions with. */
export const AGENT_TOKEN = "tok_0123456789abcdef0123";

/**
 * The input of `AgentGateway.create` for session `u0_0_0` (uid u0, session 0)
 * of example row 0's prompt: token {@link AGENT_TOKEN}, created now, deadline
 * 60 s from now (epoch ms), sampling {@link SP}, rollout `config()`, the given
 * `tools`; `over` replaces any field.
 */
export function agentSessionInput(tools: ToolSchema[], over: Partial<AgentSessionInputArg> = {}): AgentSessionInputArg {
  return {
    v: 1,
    key: "u0_0_0",
    uid: "u0",
    session_id: 0,
    token: AGENT_TOKEN,
    created_ms: Date.now(),
    deadline_ms: Date.now() + 60_000,
    sampling_params: SP,
    rollout: config(),
    tools,
    messages: exampleRow(0).prompt,
    ...over,
  };
}

/** The default tokenizer and the example tool schemas ({@link exampleToolSchemas}), loaded once per call. */
export async function tokenizerAndTools(): Promise<{ tok: ChatTokenizer; tools: ToolSchema[] }> {
  return { tok: await defaultTokenizer(), tools: exampleToolSchemas() };
}
