import OpenAI from "openai";
import type { ChatCompletionMessageParam, ChatCompletionMessageToolCall, ChatCompletionTool } from "openai/resources/chat/completions";
import { AgentTaskResult, type AgentTask } from "../../shared/agent-gateway/task.ts";
import { ConfigError, EdgeloopError } from "../../shared/errors.ts";
import { calcToolContent } from "../tools/calc.ts";
import { lookupFact } from "../tools/lookup.ts";

/** The fetch the agent uses for the model and the finish call (the `openai` SDK's `Fetch` shape). */
export type AgentFetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/** Options of {@link runCalculatorAgent}. */
export interface CalculatorAgentOptions {
  /** Used for every HTTP call: the chat completions (through the SDK) and the finish POST (default: the global fetch). */
  fetch?: AgentFetch;
  /** Most chat-completion calls in one run (default 8); a run that reaches it ends with the last reply's content. */
  maxSteps?: number;
  /** Aborts the run: no further model call, the session is finished with `metadata.error`. */
  signal?: AbortSignal;
  /** Milliseconds one finish attempt may take before it is abandoned (default 10 000). */
  finishTimeoutMs?: number;
}

/** What one run of the calculator agent did; `metadata` of the finish POST is `{steps, answer}` plus `error` when set. */
export interface CalculatorAgentResult {
  /** Chat-completion calls that were answered (0 when the first one failed). */
  steps: number;
  /** `content` of the last assistant reply (null when there was none or it had no text). */
  answer: string | null;
  /** Why the run ended early: the SDK's error after its retries, or the abort reason. Absent on success. */
  error?: string;
}

/** Default of {@link CalculatorAgentOptions.maxSteps}. */
export const DEFAULT_AGENT_MAX_STEPS = 8;

/** Attempts of the finish POST (network errors, 429 and 5xx are tried again). */
const FINISH_ATTEMPTS = 3;

/**
 * The example agent of the agent gateway: a ReAct loop over the `calc` and `lookup` tools,
 * written with the official `openai` SDK as any external agent would be.
 *
 * 1. `client.chat.completions.create({model: task.model, messages, tools: task.tools})`
 *    against `task.base_url` with bearer `task.api_key` (SDK `maxRetries: 2`).
 * 2. If the reply has `tool_calls`: the assistant message is appended exactly
 *    as returned (`choices[0].message`, unchanged, so the endpoint matches it
 *    to its own reply and continues at token level), then one
 *    `{role: "tool", tool_call_id, name, content}` per call, in call order.
 *    `calc` is evaluated locally with {@link calcToolContent} (the example tool
 *    server's text, e.g. `35` or `Error: …`), `lookup` with the example tool
 *    server's fact table (`lookupFact`); arguments that are not a JSON
 *    object give `Error: arguments are not a JSON object …`; any other tool
 *    gives `Error: unknown tool '<name>'`. Then step 1 again.
 * 3. It stops at a reply without tool calls, or after `maxSteps` calls.
 *
 * It then POSTs `{metadata: {steps, answer}}` (no reward: edgeloop scores the
 * last assistant message) to `task.finish_url` with the same bearer. An SDK
 * error after its retries, or an abort, still finishes, with
 * `{metadata: {steps, answer, error}}`, and resolves with `error` set.
 *
 * @throws ConfigError when `maxSteps` is not an integer >= 1 (before any call).
 * @throws EdgeloopError (code `agent_finish_failed`) when the finish POST fails
 *   after {@link FINISH_ATTEMPTS} attempts (or is refused with a 4xx): edgeloop
 *   then closes the session at `task.deadline`.
 * @see shared/agent-gateway/task.ts for the task and finish bodies.
 */
export async function runCalculatorAgent(task: AgentTask, opts: CalculatorAgentOptions = {}): Promise<CalculatorAgentResult> {
  const maxSteps = opts.maxSteps ?? DEFAULT_AGENT_MAX_STEPS;
  if (!Number.isInteger(maxSteps) || maxSteps < 1) throw new ConfigError("maxSteps", `must be an integer >= 1, got ${maxSteps}`);
  const client = new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, maxRetries: 2, ...(opts.fetch ? { fetch: opts.fetch } : {}) });
  // The task's messages and tools are OpenAI chat format already (zod-checked at the webhook); sent as given.
  const messages = [...task.messages] as ChatCompletionMessageParam[];
  const tools = task.tools.length > 0 ? (task.tools as ChatCompletionTool[]) : undefined;
  const result: CalculatorAgentResult = { steps: 0, answer: null };
  try {
    while (result.steps < maxSteps) {
      opts.signal?.throwIfAborted();
      const completion = await client.chat.completions.create({ model: task.model, messages, ...(tools ? { tools } : {}) }, { signal: opts.signal });
      result.steps++;
      const message = completion.choices[0]?.message;
      if (!message) throw new EdgeloopError("the chat completion has no choices[0].message", { code: "bad_model_response" });
      result.answer = typeof message.content === "string" ? message.content : null;
      const calls = message.tool_calls ?? [];
      if (calls.length === 0 || result.steps >= maxSteps) break;
      messages.push(message as ChatCompletionMessageParam);
      for (const call of calls) messages.push(toolMessage(call));
    }
  } catch (e) {
    result.error = describeError(e, opts.signal);
  }
  await finish(task, { metadata: { ...result } }, opts);
  return result;
}

/**
 * The tool message answering one call. `name` is not in the SDK's
 * `ChatCompletionToolMessageParam` type but is part of edgeloop's
 * `ChatMessage` (templates such as Llama 3.1 render it).
 */
function toolMessage(call: ChatCompletionMessageToolCall): ChatCompletionMessageParam {
  const name = call.type === "function" ? call.function.name : call.custom.name;
  let content: string;
  if (call.type !== "function" || (name !== "calc" && name !== "lookup")) {
    content = `Error: unknown tool '${name}'`;
  } else {
    const args = parseArguments(call.function.arguments);
    if (typeof args === "string") content = args;
    else if (name === "calc") content = calcToolContent(args);
    else {
      const q = typeof args.query === "string" ? args.query : typeof args.query === "number" ? String(args.query) : undefined;
      content = q === undefined ? "Error: lookup needs a string argument 'query'." : lookupFact(q);
    }
  }
  return { role: "tool", tool_call_id: call.id, name, content } as ChatCompletionMessageParam;
}

/** The arguments object of a function call, or the `Error: …` text to answer with. */
function parseArguments(text: string): Record<string, unknown> | string {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    return `Error: arguments are not a JSON object (${(e as Error).message})`;
  }
  if (typeof v !== "object" || v === null || Array.isArray(v)) return "Error: arguments are not a JSON object";
  return v as Record<string, unknown>;
}

function describeError(e: unknown, signal: AbortSignal | undefined): string {
  if (signal?.aborted) {
    const r = signal.reason;
    return `aborted${r instanceof Error && r.name !== "AbortError" ? `: ${r.message}` : typeof r === "string" ? `: ${r}` : ""}`;
  }
  return e instanceof Error ? e.message : String(e);
}

/** `POST task.finish_url` with the bearer; retried on network errors, 429 and 5xx. */
async function finish(task: AgentTask, body: AgentTaskResult, opts: CalculatorAgentOptions): Promise<void> {
  const f = opts.fetch ?? fetch;
  const raw = JSON.stringify(AgentTaskResult.parse(body));
  let last = "";
  for (let attempt = 1; attempt <= FINISH_ATTEMPTS; attempt++) {
    try {
      const res = await f(task.finish_url, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${task.api_key}` },
        body: raw,
        signal: AbortSignal.timeout(opts.finishTimeoutMs ?? 10_000),
      });
      const text = await res.text();
      if (res.ok) return;
      last = `HTTP ${res.status} ${text.slice(0, 200)}`;
      if (res.status !== 429 && res.status < 500) break;
    } catch (e) {
      last = e instanceof Error ? e.message : String(e);
    }
    if (attempt < FINISH_ATTEMPTS) await new Promise((r) => setTimeout(r, 200 * 2 ** (attempt - 1)));
  }
  throw new EdgeloopError(`finish of session '${task.key}' failed: ${last}`, { code: "agent_finish_failed", key: task.key });
}
