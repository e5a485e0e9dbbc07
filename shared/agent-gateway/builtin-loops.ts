import { AgentLoopRegistry } from "../agent-loop/registry.ts";
import { SingleTurnAgentLoop } from "../agent-loop/single-turn-agent.ts";
import { ToolAgentLoop } from "../agent-loop/tool-agent.ts";
import { OpenEnvAgentLoop } from "../agent-loop/openenv-agent.ts";
import { OpenAIAgentLoop } from "./openai-agent-loop.ts";

/** A registry holding the built-ins `single_turn_agent`, `tool_agent`, `openenv_agent` (OpenEnv environments) and `openai_agent` (the agent gateway's loop). */
export function defaultAgentLoopRegistry(): AgentLoopRegistry {
  return new AgentLoopRegistry().register("single_turn_agent", SingleTurnAgentLoop).register("tool_agent", ToolAgentLoop).register("openenv_agent", OpenEnvAgentLoop).register("openai_agent", OpenAIAgentLoop);
}
