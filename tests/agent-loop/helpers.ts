import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { RolloutConfig, type AgentLoopOutput, type RolloutConfigInput, type TokenOutput, type ToolSchema } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { ToolCallRequest, ToolExecutor, ToolResult } from "../../shared/tools/webhook-tool-client.ts";
import type { AgentLoopContext } from "../../shared/agent-loop/agent-loop.ts";
import { runAgentLoop } from "../../shared/agent-loop/index.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { SelfCheckAgentLoop } from "./fixtures/self-check-loop.ts";

export const IM_END = 151645;
export const GEN_PROMPT = [151644, 77091, 198];
/** Log-prob given to every scripted sampled token (exact in float32). */
export const LP = -0.5;

/** One scripted engine reply: text (encoded with the real tokenizer) or explicit ids. */
export interface Script {
  text?: string;
  ids?: number[];
  /** Append `<|im_end|>` (default true unless finish_reason is "length"). */
  eos?: boolean;
  finish_reason?: "stop" | "length" | "abort";
  num_preempted?: number;
  extra_fields?: Record<string, unknown>;
  /** Throw this instead of answering. */
  error?: Error;
}

/** An InferenceClient that answers from a script and records every request (ids copied). */
export class ScriptedClient implements InferenceClient {
  readonly requests: Array<Omit<GenerateRequest, "prompt_ids"> & { prompt_ids: number[] }> = [];
  readonly outputs: TokenOutput[] = [];
  private i = 0;
  constructor(
    private readonly tok: ChatTokenizer,
    private readonly script: Script[],
  ) {}

  async generate(req: GenerateRequest): Promise<TokenOutput> {
    this.requests.push({ ...req, prompt_ids: Array.from(req.prompt_ids) });
    const s = this.script[this.i++];
    if (!s) throw new Error(`scripted client: no reply scripted for request ${this.i}`);
    if (s.error) throw s.error;
    const finish = s.finish_reason ?? "stop";
    const ids = s.ids ?? [...this.tok.encode(s.text ?? ""), ...((s.eos ?? finish !== "length") ? [IM_END] : [])];
    const out: TokenOutput = {
      token_ids: ids,
      log_probs: ids.map(() => LP),
      finish_reason: finish,
      num_preempted: s.num_preempted ?? -1,
      extra_fields: s.extra_fields ?? {},
    };
    this.outputs.push(out);
    return out;
  }
}

/** An in-process ToolExecutor: `answer(req)` gives the result text (or a full result); records calls. */
export class FakeTools implements ToolExecutor {
  readonly calls: ToolCallRequest[] = [];
  readonly schemas: ToolSchema[];
  readonly names: string[];
  constructor(
    names: string[],
    private readonly answer: (req: ToolCallRequest) => string | Partial<ToolResult>,
  ) {
    this.names = names;
    this.schemas = names.map((name) => ({
      type: "function" as const,
      function: { name, description: `the ${name} tool`, parameters: { type: "object" as const, properties: { x: { type: "string" } } } },
    }));
  }
  async call(req: ToolCallRequest): Promise<ToolResult> {
    if (!this.names.includes(req.name)) {
      return { ok: false, call_id: "", attempts: 0, content: `Unknown function '${req.name}'. Available tools: [${this.names.map((n) => `'${n}'`).join(", ")}]` };
    }
    this.calls.push(req);
    const a = this.answer(req);
    const r = typeof a === "string" ? { content: a } : a;
    return { ok: true, call_id: `${req.key}:${req.turn}:${req.index}`, attempts: 1, content: "", ...r };
  }
}

/** A rollout config with test-friendly defaults. */
export function config(over: RolloutConfigInput = {}): RolloutConfig {
  return RolloutConfig.parse({ prompt_length: 512, response_length: 512, max_model_len: 4096, ...over });
}

/** A clock that advances `stepMs` on every read (deterministic metrics). */
export function steppingClock(stepMs = 1000): () => number {
  let t = 0;
  return () => (t += stepMs);
}

/** Context with sequential request ids `r1, r2, …`. */
export function ctxOf(tok: ChatTokenizer, client: InferenceClient, cfg: RolloutConfig, extra: Partial<AgentLoopContext> = {}): AgentLoopContext {
  let n = 0;
  return { tokenizer: tok, client, config: cfg, newRequestId: () => `r${++n}`, ...extra };
}

export const SP = { temperature: 1, top_p: 1, top_k: -1, logprobs: true };

export function call(name: string, args: Record<string, unknown> = {}): string {
  return `<tool_call>\n${JSON.stringify({ name, arguments: args }).replace(/":/g, '": ').replace(/,"/g, ', "')}\n</tool_call>`;
}

/** Splits a response into runs of equal mask: [[mask, ids], …] (ids in order, each run non-empty). */
export function maskRuns(o: AgentLoopOutput): Array<[number, number[]]> {
  const out: Array<[number, number[]]> = [];
  o.response_ids.forEach((id, i) => {
    const m = o.response_mask[i]!;
    const last = out.at(-1);
    if (last && last[0] === m) last[1].push(id);
    else out.push([m, [id]]);
  });
  return out;
}

/** The user turn the `self_check_agent` fixture sends after its first answer. */
export const SELF_CHECK = "Check your answer. Reply with the final number after ####.";

/**
 * Runs the documented `self_check_agent` (fixtures/self-check-loop.ts,
 * registered on the built-in registry) on one row: session 0, data source
 * "edge", the user `question`, a rule reward against `groundTruth`; context
 * {@link ctxOf} with {@link config}() and the rule reward; sampling {@link SP}.
 * Returns the loop's one output.
 */
export async function runSelfCheck(tok: ChatTokenizer, client: InferenceClient, uid: string, question: string, groundTruth: string): Promise<AgentLoopOutput> {
  const registry = defaultAgentLoopRegistry();
  registry.register("self_check_agent", SelfCheckAgentLoop);
  const [o] = (await runAgentLoop(registry, ctxOf(tok, client, config(), { reward: {} }), SP, {
    uid,
    session_id: 0,
    agent_name: "self_check_agent",
    data_source: "edge",
    prompt: [{ role: "user", content: question }],
    reward_model: { style: "rule", ground_truth: groundTruth },
  })) as AgentLoopOutput[];
  return o!;
}
