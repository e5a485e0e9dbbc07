import { readFileSync } from "node:fs";
import { join } from "node:path";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { RolloutConfig, type RolloutConfigInput } from "../../shared/schema/index.ts";
import { sessionLoopFactory, type ExecutorDeps } from "../../shared/rollout/executor.ts";
import type { SessionInputArg } from "../../shared/session/checkpoint.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";

export const ROOT = join(import.meta.dir, "..", "..");
export const POLICY = JSON.parse(readFileSync(join(ROOT, "examples", "policy.json"), "utf8"));
export const ROWS: Record<string, unknown>[] = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l));

/** The rollout config the session tests run with. */
export function rolloutConfig(over: RolloutConfigInput = {}): RolloutConfig {
  return RolloutConfig.parse({ prompt_length: 512, response_length: 512, max_model_len: 4096, seed: 7, ...over });
}

/** Executor deps over the in-process simulated engine and webhook tools at `toolsUrl` (a server's base URL). */
export async function depsFor(toolsUrl: string, opts: { secret?: string; toolsJson?: string } = {}): Promise<{ deps: ExecutorDeps; tok: ChatTokenizer; engine: SimEngine }> {
  const tok = await defaultTokenizer();
  const engine = new SimEngine({ tokenizer: tok, script: POLICY });
  const port = Number(new URL(toolsUrl).port);
  const text = opts.toolsJson ?? readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8");
  const file = parseToolsFile(text, { source: "tools", vars: { port } });
  const tools = new WebhookToolClient(file.tools, { secret: opts.secret, retryMinTimeoutMs: 5, retryMaxTimeoutMs: 20 });
  const deps: ExecutorDeps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096, tools, reward: {} };
  return { deps, tok, engine };
}

/** A session input for row `i`, session `s`. */
export function inputFor(i: number, s = 0, rollout = rolloutConfig(), uid = `u${i}`): SessionInputArg {
  const row = ROWS[i % ROWS.length]!;
  const key = `${uid}_${s}_0`;
  return {
    key,
    agent_name: "tool_agent",
    sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true, seed: 1000 + i * 10 + s },
    kwargs: { ...row, uid, session_id: s, global_steps: 0, key },
    rollout,
    model_version: "v1",
  };
}

/** What must be identical between two runs of one trajectory: everything but wall-clock seconds. */
export function comparable(o: AgentLoopOutput) {
  const { metrics, ...rest } = o;
  return { ...rest, num_preempted: metrics.num_preempted };
}

export { sessionLoopFactory };
