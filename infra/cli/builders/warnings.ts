import type { AppConfig } from "../../../shared/config/app-config.ts";
import type { ToolSchema, ToolsFile } from "../../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../../shared/tokens/tokenizer.ts";

// The start-up warnings of settings that run, but not as one may expect: one line each, or null.

/**
 * Whether a tools file holds calls edgeloop signs with `tools.secret`:
 * webhook tools or simulated users (`interactions`). MCP requests are never
 * signed, so a file of MCP servers only has none.
 */
export function hasSignedCalls(file: Pick<ToolsFile, "tools" | "interactions">): boolean {
  return file.tools.length > 0 || file.interactions.length > 0;
}

/**
 * The start-up warning of `serve` and `worker` when a tools file with
 * webhook tools or simulated users (`signedCalls`, {@link hasSignedCalls}) is
 * configured without `tools.secret`: those calls go unsigned and
 * asynchronous results (callbacks) are refused with 403. Null otherwise
 * (no tools file, a secret, or a file of MCP servers only).
 */
export function unsignedToolsWarning(config: AppConfig, signedCalls: boolean): string | null {
  if (!config.tools.file || config.tools.secret || !signedCalls) return null;
  return "warning    tools are configured without tools.secret: tool calls are unsigned and tool-result callbacks (POST /v1/sessions/{key}/tool-results) are refused with 403; set --tools-secret (the tool servers must sign with it)";
}

/**
 * The start-up warning when agent tasks go unsigned (`agent.url` set, no
 * `agent.secret`): each task carries its session's bearer token and an agent
 * cannot tell edgeloop's tasks from forged ones. Null otherwise.
 */
export function unsignedAgentWarning(config: AppConfig): string | null {
  if (!config.agent.url || config.agent.secret) return null;
  return "warning    agent tasks are sent unsigned (no agent.secret): an agent cannot tell edgeloop's tasks (which carry session tokens) from forged ones; set --agent-secret (the agent must verify x-edgeloop-signature with it)";
}

/**
 * Bun sends at most `BUN_CONFIG_MAX_HTTP_REQUESTS` fetches at once (256 when
 * unset; `npx edgeloop` sets 4,096) and queues the rest inside the process:
 * with more trajectories in flight than that, engine, tool, store and
 * pause/resume calls wait for a generation call to end (a pause then waits
 * for the longest running generation). A warning line when `concurrency`
 * exceeds the cap, else null; null outside Bun.
 * @see https://bun.sh/docs/runtime/env (BUN_CONFIG_MAX_HTTP_REQUESTS)
 */
export function fetchCapWarning(concurrency: number, env: Record<string, string | undefined> = process.env): string | null {
  if (!process.versions.bun) return null;
  const raw = env.BUN_CONFIG_MAX_HTTP_REQUESTS;
  const cap = raw && Number.isInteger(Number(raw)) && Number(raw) > 0 ? Number(raw) : 256;
  if (concurrency <= cap) return null;
  return `warning    concurrency ${concurrency} exceeds Bun's cap of ${cap} simultaneous HTTP requests (BUN_CONFIG_MAX_HTTP_REQUESTS${raw ? "" : " unset"}): engine, tool, store and pause calls beyond it queue inside this process; run through \`npx edgeloop\` (sets 4096) or set the variable`;
}

/**
 * The start-up warning when the tool schemas alone fill the prompt budget:
 * the chat template rendered with every tool (`tools`, OpenAI function
 * format, as the loops render them) around one empty user turn and the
 * generation prompt takes at least `promptLength` tokens, so every prompt with
 * all tools offered is truncated (left by default: the tools block is what is
 * cut). MCP servers choose their own schemas, which makes this likely. Null
 * when within the budget, with no tools, or when the template fails to render
 * (that is reported where the template is probed).
 */
export function toolsBudgetWarning(tokenizer: ChatTokenizer, tools: readonly ToolSchema[], promptLength: number): string | null {
  if (tools.length === 0) return null;
  let n: number;
  try {
    n = tokenizer.renderIds([{ role: "user", content: "" }], { tools, addGenerationPrompt: true }).length;
  } catch {
    return null;
  }
  if (n < promptLength) return null;
  return `warning    the ${tools.length} tool schema${tools.length === 1 ? "" : "s"} alone take ${n} tokens of the prompt, at or over rollout.prompt_length ${promptLength}: every prompt that offers all of them is truncated (the tools block included); raise rollout.prompt_length (--prompt-length) or offer fewer tools (an MCP server's tools allow-list, a row's extra_info.tool_selection)`;
}
