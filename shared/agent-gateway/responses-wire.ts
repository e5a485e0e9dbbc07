import { z } from "zod";
import { InputError } from "../errors.ts";
import { imagePart, isRecord, nullish, parseField, presentKeys, unansweredToolResult } from "./wire-fields.ts";
import { fnv1a32 } from "../inference/hash.ts";
import type { ChatMessage, ToolCallMessage } from "../schema/message.ts";
import { ToolSchema } from "../schema/tool.ts";
import type { ChatReply, ChatRequest } from "./openai-wire.ts";

/**
 * The OpenAI Responses wire of the agent gateway
 * (`POST /v1/sessions/{key}/openai/v1/responses`): a Responses request
 * translated into the {@link ChatRequest} every API of the session's base URL
 * samples with, and a {@link ChatReply} rendered as a Responses `response`
 * object or its SSE event stream. Pure and runtime-free.
 *
 * Follows OpenAI's Responses API objects as typed by openai-node v6.49
 * (`resources/responses/responses.d.ts`: `ResponseCreateParamsBase`,
 * `Response`, `ResponseOutputItem`, `ResponseStreamEvent`) and the event
 * order its `ResponseAccumulator` consumes.
 * @see https://platform.openai.com/docs/api-reference/responses
 */




const Temperature = z.number({ error: "expected a number in [0, 2]" }).min(0, "must be >= 0").max(2, "must be <= 2");
const TopP = z.number({ error: "expected a number in (0, 1]" }).gt(0, "must be > 0").max(1, "must be <= 1");
const PositiveInt = z.int({ error: "expected a positive integer" }).min(1, "must be a positive integer");
const Flag = z.boolean({ error: "expected true or false" });
const Str = z.string({ error: "expected a string" });
const MetadataField = z.record(z.string(), z.unknown(), { error: "expected an object" });
const ArgumentsField = z.string({ error: "expected a JSON string of the arguments" });

/** A function tool as the Responses API sends it (flat: no `function` wrapper); `strict` is accepted and dropped. */
const FunctionToolIn = z.looseObject({
  type: z.literal("function"),
  name: z.string({ error: "expected the tool's name (a string)" }).min(1, "must not be empty"),
  description: Str.nullish(),
  parameters: z.record(z.string(), z.unknown(), { error: "expected a JSON Schema object" }).nullish(),
  strict: Flag.nullish(),
});

const INPUT_ROLES = ["user", "system", "developer", "assistant"] as const;

const INCLUDABLE = [
  "file_search_call.results", "web_search_call.results", "web_search_call.action.sources", "message.input_image.image_url",
  "computer_call_output.output.image_url", "code_interpreter_call.outputs", "reasoning.encrypted_content",
] as const;

/**
 * Request keys the Responses endpoint reads (some only at their no-op value).
 */
export const RESPONSES_REQUEST_KEYS: readonly string[] = [
  "model", "input", "instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens", "stream", "previous_response_id",
  "truncation", "text", "top_logprobs", "background", "conversation", "prompt", "context_management", "max_tool_calls",
];

/**
 * Request keys accepted and ignored: bookkeeping, caching and transport
 * options that do not change what is sampled, plus `reasoning` (effort and
 * summary settings of OpenAI's reasoning models; the served model thinks as
 * its chat template says) and `include` (the extra outputs of hosted tools
 * edgeloop does not run). Named in the reply's `x-edgeloop-ignored-keys`.
 */
export const IGNORED_RESPONSES_KEYS: readonly string[] = [
  "store", "metadata", "user", "parallel_tool_calls", "stream_options", "service_tier", "reasoning", "include",
  "prompt_cache_key", "prompt_cache_retention", "prompt_cache_options", "safety_identifier",
];

const KNOWN_KEYS = new Set([...RESPONSES_REQUEST_KEYS, ...IGNORED_RESPONSES_KEYS]);

const Nullish = <T extends z.ZodType>(t: T, what: string) => t.nullish().describe(what);
const TextPartIn = z.looseObject({ type: z.enum(["input_text", "output_text"]), text: z.string() });
const ImagePartIn = z.looseObject({ type: z.literal("input_image"), image_url: z.string().describe("a data:image/…;base64 URI (vision-language families)"), detail: z.literal("auto").nullish() });
const TextOrImagesIn = z.union([z.string(), z.array(z.union([TextPartIn, ImagePartIn]))]);
const InputItemIn = z.union([
  z.looseObject({ type: z.literal("message").optional(), role: z.enum(INPUT_ROLES), content: TextOrImagesIn.describe("input_image parts in user messages only") }),
  z.looseObject({ type: z.literal("function_call"), call_id: z.string(), name: z.string().min(1), arguments: z.string() }),
  z.looseObject({ type: z.literal("function_call_output"), call_id: z.string(), output: TextOrImagesIn }),
  z.looseObject({ type: z.literal("reasoning"), summary: z.array(z.looseObject({ text: z.string() })).optional(), content: z.array(z.looseObject({ text: z.string() })).optional() }),
]);

/**
 * The Responses request body the agent gateway accepts, as a zod schema for
 * the OpenAPI document (`GET /openapi.json`), after openai-node v6.49's
 * `ResponseCreateParamsBase`. Its keys are exactly
 * {@link RESPONSES_REQUEST_KEYS} and {@link IGNORED_RESPONSES_KEYS} (a test
 * checks it). {@link parseResponsesRequest} stays the validator: it names the
 * failing field in edgeloop's own words.
 */
export const ResponsesRequestSchema = z.strictObject({
  model: Nullish(z.string(), "informational: the gateway serves its one model"),
  input: Nullish(z.union([z.string(), z.array(InputItemIn)]), "a user message, or message / function_call / function_call_output / reasoning items"),
  instructions: Nullish(z.string(), "the first (system) message"),
  tools: Nullish(z.array(FunctionToolIn), "function tools only"),
  tool_choice: Nullish(z.enum(["auto", "none"]), 'default "auto"'),
  temperature: Temperature.nullish(),
  top_p: TopP.nullish(),
  max_output_tokens: Nullish(PositiveInt, "caps this call's sampled tokens"),
  stream: Nullish(Flag, "true: text/event-stream of the Responses events"),
  previous_response_id: Nullish(z.string(), "a response id of this session: its conversation comes before input"),
  truncation: Nullish(z.literal("disabled"), 'only "disabled"'),
  text: Nullish(z.looseObject({ format: z.object({ type: z.literal("text") }).nullish() }), 'format only {type: "text"}'),
  top_logprobs: Nullish(z.literal(0), "only 0"),
  background: Nullish(z.literal(false), "only false"),
  conversation: Nullish(z.null(), "not supported"),
  prompt: Nullish(z.null(), "not supported"),
  context_management: Nullish(z.null(), "not supported"),
  max_tool_calls: Nullish(z.null(), "not supported"),
  ...Object.fromEntries(IGNORED_RESPONSES_KEYS.map((k) => [k, z.unknown().optional().describe("accepted and ignored (named in x-edgeloop-ignored-keys)")])),
});

/**
 * The request fields a Responses reply echoes (`Response.instructions`,
 * `tools`, `tool_choice`, …), as sent (null when absent).
 */
export interface ResponsesEcho {
  instructions: string | null;
  tools: Record<string, unknown>[];
  tool_choice: "auto" | "none";
  temperature: number | null;
  top_p: number | null;
  max_output_tokens: number | null;
  previous_response_id: string | null;
  metadata: Record<string, unknown> | null;
  parallel_tool_calls: boolean;
  store: boolean;
}

/**
 * A parsed Responses request before `previous_response_id` is resolved.
 * - `input`: the request's own items as chat messages (the `instructions`
 *   message not included);
 * - `instructions`: the system message `instructions` becomes (put first), or null;
 * - `chat`: everything else of the {@link ChatRequest} (`messages` filled in by {@link resolveResponsesRequest}).
 */
export interface ParsedResponsesRequest {
  input: ChatMessage[];
  instructions: ChatMessage | null;
  previous_response_id: string | null;
  chat: Omit<ChatRequest, "messages">;
  echo: ResponsesEcho;
}

/**
 * The {@link IGNORED_RESPONSES_KEYS} a request body carries with a non-null
 * value, in the body's order (empty for a non-object body).
 */
export function ignoredResponsesKeys(body: unknown): string[] {
  return presentKeys(body, IGNORED_RESPONSES_KEYS);
}

/**
 * Parses an OpenAI Responses request body (already JSON-decoded), strict like
 * `parseChatRequest`: a key outside {@link RESPONSES_REQUEST_KEYS} and
 * {@link IGNORED_RESPONSES_KEYS} is a 400 naming it. Accepted only at their
 * no-op value (anything else would sample, or answer, something edgeloop
 * does not do): `top_logprobs` 0, `truncation` `"disabled"`, `text.format`
 * `{type: "text"}` (`text.verbosity` is ignored), `background` false,
 * `conversation`/`prompt`/`context_management`/`max_tool_calls` null,
 * `include` only the hosted-tool values (`message.output_text.logprobs` is
 * refused: ask chat completions with `logprobs`). `input` items: `message`
 * (roles user, system, developer → system, assistant; content a string or
 * `input_text`/`output_text` parts, joined), `function_call` (joins the
 * assistant message before it as a tool call: an assistant turn's text and
 * calls are one chat message), `function_call_output` (a tool message),
 * `reasoning` (the next assistant message's `reasoning_content`).
 * @throws InputError naming the field: an unknown key, `input`, `input[2].type`,
 *   `input[1].content[0].type` (files, audio; images outside user messages and tool outputs),
 *   `tools[0].type` (hosted tools), `tool_choice`, `temperature`, `top_p`,
 *   `max_output_tokens`, `text.format`, `include[0]`, …
 */
export function parseResponsesRequest(body: unknown): ParsedResponsesRequest {
  if (!isRecord(body)) throw new InputError("body", "expected a JSON object (an OpenAI Responses request)");
  const b = body;
  for (const k of Object.keys(b)) {
    if (!KNOWN_KEYS.has(k)) {
      throw new InputError(k.slice(0, 100), "not supported by edgeloop's agent gateway (its Responses endpoint samples only with model, input, instructions, tools, tool_choice, temperature, top_p, max_output_tokens, stream, previous_response_id): remove it");
    }
  }
  if (!nullish(b.top_logprobs) && b.top_logprobs !== 0) throw new InputError("top_logprobs", "edgeloop returns no top log-probs: top_logprobs must be 0 (or absent)");
  if (!nullish(b.truncation) && b.truncation !== "disabled") {
    throw new InputError("truncation", 'edgeloop never drops input items to fit the context (the trajectory is recorded as sent): only "disabled" (or absent)');
  }
  if (!nullish(b.background) && b.background !== false) throw new InputError("background", "background responses are not supported: the call is answered when sampled");
  for (const f of ["conversation", "prompt", "context_management", "max_tool_calls"] as const) {
    if (!nullish(b[f])) throw new InputError(f, "not supported by edgeloop's agent gateway: send the conversation as input (or previous_response_id)");
  }
  if (!nullish(b.text)) {
    if (!isRecord(b.text)) throw new InputError("text", "expected {format: {type: \"text\"}}");
    const fmt = b.text.format;
    if (!nullish(fmt) && !(isRecord(fmt) && fmt.type === "text")) {
      throw new InputError("text.format", 'edgeloop samples without guided decoding: only {type: "text"} (or absent)');
    }
  }
  if (!nullish(b.include)) {
    if (!Array.isArray(b.include)) throw new InputError("include", "expected a list");
    b.include.forEach((v, i) => {
      if (v === "message.output_text.logprobs") {
        throw new InputError(`include[${i}]`, "the Responses endpoint returns no log-probs: use chat completions with logprobs: true");
      }
      if (!(INCLUDABLE as readonly unknown[]).includes(v)) throw new InputError(`include[${i}]`, `expected one of ${INCLUDABLE.join(", ")}`);
    });
  }

  const model = nullish(b.model) ? null : parseField("model", Str, b.model);
  const instructionsText = nullish(b.instructions) ? null : parseField("instructions", Str, b.instructions);
  const input = parseInput(b.input);
  const { tools, echoTools } = parseTools(b.tools);

  let toolChoice: "auto" | "none" = "auto";
  if (!nullish(b.tool_choice)) {
    if (b.tool_choice !== "auto" && b.tool_choice !== "none") {
      throw new InputError("tool_choice", `edgeloop samples token-in/token-out without guided decoding: only "auto" and "none" are supported, got ${JSON.stringify(b.tool_choice).slice(0, 100)}`);
    }
    toolChoice = b.tool_choice;
  }
  const chat: Omit<ChatRequest, "messages"> = {
    model,
    tools,
    tool_choice: toolChoice,
    stream: nullish(b.stream) ? false : parseField("stream", Flag, b.stream),
    logprobs: false,
  };
  if (!nullish(b.temperature)) chat.temperature = parseField("temperature", Temperature, b.temperature);
  if (!nullish(b.top_p)) chat.top_p = parseField("top_p", TopP, b.top_p);
  if (!nullish(b.max_output_tokens)) chat.max_tokens = parseField("max_output_tokens", PositiveInt, b.max_output_tokens);
  const previous = nullish(b.previous_response_id) ? null : parseField("previous_response_id", Str.min(1, "must not be empty"), b.previous_response_id);
  const metadata = nullish(b.metadata) ? null : parseField("metadata", MetadataField, b.metadata);
  return {
    input,
    instructions: instructionsText === null ? null : { role: "system", content: instructionsText },
    previous_response_id: previous,
    chat,
    echo: {
      instructions: instructionsText,
      tools: echoTools,
      tool_choice: toolChoice,
      temperature: chat.temperature ?? null,
      top_p: chat.top_p ?? null,
      max_output_tokens: chat.max_tokens ?? null,
      previous_response_id: previous,
      metadata,
      parallel_tool_calls: b.parallel_tool_calls !== false,
      store: b.store !== false,
    },
  };
}

/** A message's or tool output's text: a string, or `input_text`/`output_text` parts joined. */
function partsText(v: unknown, at: string, what: string): string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw new InputError(at, `expected a string or a list of ${what} parts`);
  return v
    .map((p, j) => {
      if (!isRecord(p) || typeof p.type !== "string") throw new InputError(`${at}[${j}].type`, 'expected a content part {type: "input_text", text}');
      if (p.type !== "input_text" && p.type !== "output_text") {
        throw new InputError(`${at}[${j}].type`, `${JSON.stringify(p.type).slice(0, 60)} parts are not supported here: only text${p.type === "input_image" ? " (input_image parts go in user messages and function_call_output)" : ""}`);
      }
      if (typeof p.text !== "string") throw new InputError(`${at}[${j}].text`, "expected a string");
      return p.text;
    })
    .join("");
}

/**
 * A user message's or tool output's content: as {@link partsText} when it holds no image; with
 * `input_image` parts (`{type: "input_image", image_url, detail?}`, openai-node's
 * `ResponseInputImage`) the parts in order, images as `{type: "image_url", image_url: {url}}` (read
 * for a vision-language family, refused for a text-only one when the turn is rendered). `detail`
 * only `auto` (the model's processor sizes the image); `file_id` is refused (no Files API here).
 */
function partsContent(v: unknown, at: string): ChatMessage["content"] {
  if (!Array.isArray(v) || !v.some((p) => isRecord(p) && p.type === "input_image")) return partsText(v, at, "input_text or input_image");
  return v.map((p, j) => {
    const f = `${at}[${j}]`;
    if (!isRecord(p) || typeof p.type !== "string") throw new InputError(`${f}.type`, 'expected a content part {type: "input_text", text} or {type: "input_image", image_url}');
    if (p.type === "input_image") {
      for (const k of Object.keys(p)) if (!["type", "image_url", "detail", "file_id"].includes(k)) throw new InputError(`${f}.${k.slice(0, 100)}`, "not a field of an input_image part (image_url, detail)");
      if (!nullish(p.file_id)) throw new InputError(`${f}.file_id`, "file ids are not supported (no Files API here): send image_url as a data:image/…;base64 URI");
      if (typeof p.image_url !== "string") throw new InputError(`${f}.image_url`, "expected a string: a data:image/…;base64 URI");
      if (!nullish(p.detail) && p.detail !== "auto") throw new InputError(`${f}.detail`, `only "auto" (or absent): the model's processor sizes the image, got ${JSON.stringify(p.detail)}`);
      return imagePart(p.image_url, `${f}.image_url`);
    }
    if (p.type !== "input_text" && p.type !== "output_text") throw new InputError(`${f}.type`, `${JSON.stringify(p.type).slice(0, 60)} parts are not supported: input_text and input_image only`);
    if (typeof p.text !== "string") throw new InputError(`${f}.text`, "expected a string");
    return { type: "text" as const, text: p.text };
  });
}

/** A reasoning item's text: its `reasoning_text` content, else its summary texts (joined by a blank line). */
function reasoningText(item: Record<string, unknown>, at: string): string {
  const texts = (key: "content" | "summary") => {
    const v = item[key];
    if (nullish(v)) return [];
    if (!Array.isArray(v)) throw new InputError(`${at}.${key}`, "expected a list of text parts");
    return v.map((p, j) => {
      if (!isRecord(p) || typeof p.text !== "string") throw new InputError(`${at}.${key}[${j}].text`, "expected a string");
      return p.text;
    });
  };
  const content = texts("content");
  return content.length ? content.join("") : texts("summary").join("\n\n");
}

/**
 * The `input` items as chat messages (see {@link parseResponsesRequest}).
 * A lone string is one user message.
 */
/** The `input[i].call_id` path of each tool message {@link parseInput} made (for the error naming an unanswered one). */
const TOOL_RESULT_PATHS = new WeakMap<ChatMessage, string>();

function parseInput(v: unknown): ChatMessage[] {
  if (nullish(v)) return [];
  if (typeof v === "string") return [{ role: "user", content: v }];
  if (!Array.isArray(v)) throw new InputError("input", "expected a string or a list of input items");
  const out: ChatMessage[] = [];
  /** The assistant message function calls join (the last pushed, while nothing else came after it). */
  let open: ChatMessage | null = null;
  let reasoning: string | null = null;
  const assistant = (content: string | null): ChatMessage => {
    const m: ChatMessage = { role: "assistant", content };
    if (reasoning !== null) m.reasoning_content = reasoning;
    reasoning = null;
    out.push(m);
    return m;
  };
  v.forEach((item, i) => {
    const at = `input[${i}]`;
    if (!isRecord(item)) throw new InputError(at, "expected an input item object");
    const type = nullish(item.type) ? "message" : item.type;
    switch (type) {
      case "message": {
        const role = item.role;
        if (typeof role !== "string" || !(INPUT_ROLES as readonly string[]).includes(role)) {
          throw new InputError(`${at}.role`, `expected one of ${INPUT_ROLES.join(", ")}; got ${JSON.stringify(role ?? null).slice(0, 60)}`);
        }
        if (role === "assistant") {
          open = assistant(partsText(item.content, `${at}.content`, "input_text"));
        } else {
          // Images in user messages only (as the chat template renders them).
          const content = role === "user" ? partsContent(item.content, `${at}.content`) : partsText(item.content, `${at}.content`, "input_text");
          out.push({ role: role === "developer" ? "system" : (role as "user" | "system"), content });
          open = null;
        }
        return;
      }
      case "function_call": {
        const call_id = parseField(`${at}.call_id`, Str, item.call_id);
        const name = parseField(`${at}.name`, Str.min(1, "must not be empty"), item.name);
        const args = parseField(`${at}.arguments`, ArgumentsField, item.arguments);
        const call: ToolCallMessage = { id: call_id, type: "function", function: { name, arguments: args } };
        const m: ChatMessage = open ?? assistant(null);
        m.tool_calls = [...(m.tool_calls ?? []), call];
        open = m;
        return;
      }
      case "function_call_output": {
        const call_id = parseField(`${at}.call_id`, Str, item.call_id);
        const result: ChatMessage = { role: "tool", tool_call_id: call_id, content: partsContent(item.output, `${at}.output`) };
        TOOL_RESULT_PATHS.set(result, `${at}.call_id`);
        out.push(result);
        open = null;
        return;
      }
      case "reasoning":
        // Reasoning comes before the turn it belongs to: it opens a new assistant turn.
        reasoning = reasoningText(item, at);
        open = null;
        return;
      default:
        throw new InputError(`${at}.type`, `${JSON.stringify(type).slice(0, 60)} items are not supported: expected message, function_call, function_call_output or reasoning`);
    }
  });
  return out;
}

function parseTools(v: unknown): { tools: ToolSchema[] | undefined; echoTools: Record<string, unknown>[] } {
  if (nullish(v)) return { tools: undefined, echoTools: [] };
  if (!Array.isArray(v)) throw new InputError("tools", 'expected a list of {type: "function", name, description?, parameters?}');
  const echoTools: Record<string, unknown>[] = [];
  const tools = v.map((t, i) => {
    if (!isRecord(t)) throw new InputError(`tools[${i}]`, 'expected {type: "function", name, …}');
    if (t.type !== "function") {
      throw new InputError(`tools[${i}].type`, `only "function" tools are supported (edgeloop runs no hosted tools), got ${JSON.stringify(t.type ?? null).slice(0, 60)}`);
    }
    const fn = parseField(`tools[${i}]`, FunctionToolIn, t);
    echoTools.push({ type: "function", name: fn.name, description: fn.description ?? null, parameters: fn.parameters ?? null, strict: fn.strict ?? null });
    return parseField(`tools[${i}]`, ToolSchema, {
      type: "function",
      function: {
        name: fn.name,
        ...(nullish(fn.description) ? {} : { description: fn.description }),
        ...(nullish(fn.parameters) ? {} : { parameters: fn.parameters }),
      },
    });
  });
  return { tools: tools.length ? tools : undefined, echoTools };
}

/**
 * A response id names where its conversation sits in the session's own
 * record: `resp_{fnv1a32(key) hex}-{output}-{assistant turn}-{step}-{n}` with
 * a trailing `i` when the request's first message was its `instructions`.
 * `n` = the request's message count: the conversation of the response is the
 * output's first `n` recorded messages and the assistant message after them
 * (a continued output's messages are the request's, compared equal; a turn
 * that sampled nothing recorded no assistant message).
 */
export interface ResponseRef {
  keyHash: string;
  output: number;
  turn: number;
  step: number;
  messages: number;
  instructions: boolean;
}

/** The response id of a reply (`chatcmpl-{h}-{output}-{turn}-{step}`) to a request of `messages` messages. */
export function responseIdOf(reply: ChatReply, messages: number, instructions: boolean): string {
  return `resp_${reply.id.replace(/^chatcmpl-/, "")}-${messages}${instructions ? "i" : ""}`;
}

/** The {@link ResponseRef} of a response id of session `key`, or null when it is not one of its ids. */
export function parseResponseId(key: string, id: string): ResponseRef | null {
  const m = /^resp_([0-9a-f]+)-(\d+)-(\d+)-(\d+)-(\d+)(i?)$/.exec(id);
  if (!m || m[1] !== fnv1a32(key).toString(16)) return null;
  return { keyHash: m[1]!, output: Number(m[2]), turn: Number(m[3]), step: Number(m[4]), messages: Number(m[5]), instructions: m[6] === "i" };
}

/**
 * The {@link ChatRequest} of a parsed request: `instructions` first, then the
 * previous response's conversation (its own instructions message dropped, as
 * OpenAI does not carry instructions over), then the request's input.
 * `previous`: the resolved conversation of `previous_response_id` (null when none was sent).
 * @throws InputError (`input`) when the result holds no message.
 */
export function responsesChatRequest(p: ParsedResponsesRequest, previous: { messages: ChatMessage[]; instructions: boolean } | null): ChatRequest {
  const prior = previous ? (previous.instructions ? previous.messages.slice(1) : previous.messages) : [];
  const messages = [...(p.instructions ? [p.instructions] : []), ...prior, ...p.input];
  if (messages.length === 0) throw new InputError("input", "required: a string or a non-empty list of input items");
  const bad = unansweredToolResult(messages);
  if (bad) {
    // The record's own history answers its calls: the culprit is an input item, named by its path.
    throw new InputError(TOOL_RESULT_PATHS.get(messages[bad.index]!) ?? "input", `no tool call found for function_call_output with call_id ${JSON.stringify(bad.id.slice(0, 100))}: it must follow the function_call item (or the previous response's call) with that call_id`);
  }
  return { ...p.chat, messages };
}

/**
 * Output items of a reply, with their ids (`rs_…`, `msg_…`, `fc_…`, from the
 * response id). Status `incomplete` on a turn cut by a budget, except a
 * reasoning item followed by text: its `</think>` closed it before the cut
 * (a streamed reply closes it when the text starts).
 */
export function outputItems(r: ChatReply, responseId: string): Record<string, unknown>[] {
  const s = responseId.replace(/^resp_/, "");
  const status = r.finish_reason === "length" ? "incomplete" : "completed";
  const items: Record<string, unknown>[] = [];
  const m = r.message;
  if (m.reasoning_content) items.push({ id: `rs_${s}`, type: "reasoning", summary: [], content: [{ type: "reasoning_text", text: m.reasoning_content }], status: m.content ? "completed" : status });
  if (m.content || !m.tool_calls?.length) {
    items.push({ id: `msg_${s}`, type: "message", role: "assistant", status, content: [{ type: "output_text", text: m.content ?? "", annotations: [], logprobs: [] }] });
  }
  (m.tool_calls ?? []).forEach((c, k) => items.push({ id: `fc_${s}_${k}`, type: "function_call", call_id: c.id, name: c.function.name, arguments: c.function.arguments, status }));
  return items;
}

/**
 * The non-streaming body: a Responses `response` object (openai-node v6.49
 * `Response`): `{id, object: "response", created_at, status: "completed" |
 * "incomplete", incomplete_details: {reason: "max_output_tokens"} | null,
 * error: null, model, output: [reasoning?, message?, function_call…],
 * usage: {input_tokens, input_tokens_details: {cached_tokens: 0,
 * cache_write_tokens: 0}, output_tokens, output_tokens_details:
 * {reasoning_tokens: 0}, total_tokens}, …the request's echoed fields}`.
 * A reasoning item holds the turn's `reasoning_content` as one
 * `reasoning_text` part (as vLLM's Responses endpoint does); a message item
 * is present when the turn has text or no tool calls; usage counts this call
 * (input = the context the engine was sent). `reasoning_tokens` is 0: the
 * reply does not split the sampled tokens.
 * @see https://platform.openai.com/docs/api-reference/responses/object
 */
export function responsesBody(r: ChatReply, responseId: string, echo: ResponsesEcho): Record<string, unknown> {
  return responseObject(r, responseId, echo, outputItems(r, responseId), r.finish_reason === "length" ? "incomplete" : "completed");
}

/** A Responses `response` object of reply `r` with `output` (usage null while `in_progress`): what {@link responsesBody} and the stream's events carry. */
export function responseObject(r: ChatReply, responseId: string, echo: ResponsesEcho, output: unknown[], status: "in_progress" | "completed" | "incomplete"): Record<string, unknown> {
  const done = status !== "in_progress";
  return {
    id: responseId,
    object: "response",
    created_at: r.created,
    status,
    background: false,
    error: null,
    incomplete_details: status === "incomplete" ? { reason: "max_output_tokens" } : null,
    instructions: echo.instructions,
    max_output_tokens: echo.max_output_tokens,
    metadata: echo.metadata ?? {},
    model: r.model,
    output,
    parallel_tool_calls: echo.parallel_tool_calls,
    previous_response_id: echo.previous_response_id,
    reasoning: { effort: null, summary: null },
    store: echo.store,
    temperature: echo.temperature,
    text: { format: { type: "text" } },
    tool_choice: echo.tool_choice,
    tools: echo.tools,
    top_p: echo.top_p,
    truncation: "disabled",
    usage: done
      ? {
          input_tokens: r.usage.prompt_tokens,
          input_tokens_details: { cached_tokens: 0, cache_write_tokens: 0 },
          output_tokens: r.usage.completion_tokens,
          output_tokens_details: { reasoning_tokens: 0 },
          total_tokens: r.usage.total_tokens,
        }
      : null,
  };
}

