import { AgentLoopRegistry } from "../agent-loop/registry.ts";
import { SingleTurnAgentLoop } from "../agent-loop/single-turn-agent.ts";
import { ToolAgentLoop } from "../agent-loop/tool-agent.ts";
import { OpenAIAgentLoop } from "./openai-agent-loop.ts";

/** A registry holding the built-ins `single_turn_agent`, `tool_agent` and `openai_agent` (the agent gateway's loop). */
export function defaultAgentLoopRegistry(): AgentLoopRegistry {
  return new AgentLoopRegistry().register("single_turn_agent", SingleTurnAgentLoop).register("tool_agent", ToolAgentLoop).register("openai_agent", OpenAIAgentLoop);
}
