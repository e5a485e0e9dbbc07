import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseAgentLoopConfig, type AgentLoopRegistry } from "../../../shared/agent-loop/index.ts";
import { defaultAgentLoopRegistry } from "../../../shared/agent-gateway/builtin-loops.ts";
import type { AppConfig } from "../../../shared/config/app-config.ts";
import { ConfigError } from "../../../shared/errors.ts";
import type { RolloutConfig } from "../../../shared/schema/config.ts";
import type { ChatTokenizer } from "../../../shared/tokens/tokenizer.ts";
import { toolCallParserNames } from "../../../shared/tools/parser-registry.ts";

/**
 * The agent-loop registry: the built-in loops, plus the custom loops of
 * `rollout.agent.agent_loop_config_path` (imported once, relative to that
 * file). Validates the rollout config against it, warns (into `warnings`)
 * when the tool-call parser in effect is not registered, and adds the
 * `loops` line to `describe`.
 * @throws ConfigError naming `rollout.agent.agent_loop_config_path` (unreadable file) or the unknown name ({@link validateRollout}).
 */
export async function buildLoopRegistry(config: AppConfig, tokenizer: ChatTokenizer, describe: string[], warnings: string[]): Promise<AgentLoopRegistry> {
  const registry = defaultAgentLoopRegistry();
  const loopsPath = config.rollout.agent.agent_loop_config_path;
  if (loopsPath) {
    const text = await readFile(loopsPath, "utf8").catch((e) => {
      throw new ConfigError("rollout.agent.agent_loop_config_path", `cannot read ${loopsPath}: ${(e as Error).message}`);
    });
    await registry.loadConfig(parseAgentLoopConfig(text, loopsPath), { baseUrl: pathToFileURL(resolve(loopsPath)).href });
  }
  validateRollout(config.rollout, registry);
  const parser = config.rollout.multi_turn.format ?? tokenizer.traits.defaultParser;
  if (!toolCallParserNames().includes(parser)) {
    warnings.push(`warning    tool-call parser '${parser}' (default of ${tokenizer.traits.family}) is not registered in this build; tool_agent trajectories fail until rollout.multi_turn.format names one of: ${toolCallParserNames().join(", ")}`);
  }
  describe.push(`loops      ${registry.names().join(", ")} (default ${config.rollout.agent.default_agent_loop})`);
  return registry;
}

/**
 * Checks the values of a rollout config that name registered things: the
 * tool-call parser (`rollout.multi_turn.format`) and, given the registry,
 * the default agent loop. Run at start-up and for every batch's config, so a
 * typo fails once, up front, instead of failing every trajectory.
 * @throws ConfigError naming the path and listing the valid names.
 */
export function validateRollout(rollout: RolloutConfig, registry: AgentLoopRegistry | null): void {
  const parsers = toolCallParserNames();
  if (rollout.multi_turn.format !== null && !parsers.includes(rollout.multi_turn.format)) {
    throw new ConfigError("rollout.multi_turn.format", `unknown tool-call parser '${rollout.multi_turn.format}'; registered parsers: ${parsers.join(", ")}`);
  }
  const loop = rollout.agent.default_agent_loop;
  if (registry && !registry.has(loop)) {
    throw new ConfigError("rollout.agent.default_agent_loop", `unknown agent loop '${loop}'; registered agent loops: ${registry.names().join(", ")}`);
  }
}

/**
 * A batch's `rollout.agent.agent_loop_config_path`: custom loops are imported
 * once, at start, from the process's own config; a batch naming another file
 * (or any file, when none was configured) would be accepted and its loops
 * never loaded, so it is refused. The configured path itself (or null) is
 * accepted, as a no-op.
 * @throws ConfigError (400) naming `rollout.agent.agent_loop_config_path`.
 */
export function validateBatchLoops(batch: string | null, configured: string | null): void {
  if (batch === configured) return;
  throw new ConfigError(
    "rollout.agent.agent_loop_config_path",
    `custom agent loops are loaded once at start from the server's config (${configured ?? "none configured"}); a batch cannot load others: leave the key out and name a loaded loop in agent_name or default_agent_loop`,
  );
}
