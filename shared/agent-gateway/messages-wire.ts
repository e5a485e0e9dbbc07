import { z } from "zod";
import { InputError } from "../errors.ts";
import { imagePart, isRecord, nullish, parseField, presentKeys, unansweredToolResult } from "./wire-fields.ts";
import { fnv1a32 } from "../inference/hash.ts";
import type { ChatMessage, ToolCallMessage } from "../schema/message.ts";
import { ToolSchema } from "../schema/tool.ts";
import type { ChatReply, ChatRequest } from "./openai-wire.ts";

/**
 * The Anthropic Messages wire of the agent gateway
 * (`POST /v1/sessions/{key}/anthropic/v1/messages`): a Messages request
 * translated into the {@link ChatRequest} every API of the session samples
 * with, and a {@link ChatReply} rendered as a Messages `message` object or
 * its SSE event stream; errors in Anthropic's error shape. Pure and
 * runtime-free.
 *
 * Follows Anthropic's Messages API as typed by `@anthropic-ai/sdk` v1.16.0
 * (`resources/messages/messages.ts`: `MessageCreateParamsBase`, `Message`,
 * `RawMessageStreamEvent`; `lib/MessageStream.ts`, the stream accumulator).
 * @see https://docs.anthropic.com/en/api/messages
 */

/** Top-level request keys the translation reads (`temperature`, `top_p` as older SDKs and agents still send them). */
export const MESSAGES_REQUEST_KEYS: readonly string[] = ["model", "max_tokens", "messages", "system", "tools", "tool_choice", "temperature", "top_p", "stop_sequences", "stream"];

/**
 * Request keys accepted and not used: bookkeeping and transport options, and
 * `thinking` (whether the model thinks is the run's chat template's choice,
 * `rollout.multi_turn` / the model family, not a per-call switch). A reply to
 * a request carrying any of them (not null) names them in
 * `x-edgeloop-ignored-keys` ({@link ignoredMessagesKeys}).
 */
export const IGNORED_MESSAGES_KEYS: readonly string[] = ["metadata", "thinking", "service_tier", "cache_control", "inference_geo", "speed"];

const KNOWN_KEYS = new Set([...MESSAGES_REQUEST_KEYS, ...IGNORED_MESSAGES_KEYS]);

/** At most this many stop sequences (the engine matches each on the decoded text). */
export const MAX_STOP_SEQUENCES = 16;




const Str = z.string({ error: "expected a string" });
const TextBlock = z.looseObject({ type: z.literal("text"), text: Str });
const ThinkingBlock = z.looseObject({ type: z.literal("thinking"), thinking: Str, signature: Str.optional() });
const ToolUseBlock = z.looseObject({
  type: z.literal("tool_use"),
  id: Str.min(1, "must not be empty"),
  name: Str.min(1, "must not be empty"),
  input: z.record(z.string(), z.unknown(), { error: "expected the call's input (a JSON object)" }),
});
const ToolResultBlock = z.looseObject({
  type: z.literal("tool_result"),
  tool_use_id: Str.min(1, "must not be empty"),
  content: z.union([Str, z.array(z.unknown())], { error: "expected a string or a list of text and image blocks" }).optional(),
  is_error: z.boolean({ error: "expected true or false" }).optional(),
});
const ToolIn = z.looseObject(
  {
    name: Str.min(1, "must not be empty"),
    description: Str.nullish(),
    input_schema: z.record(z.string(), z.unknown(), { error: "expected a JSON Schema object" }),
    type: z.union([z.literal("custom"), z.null()], { error: 'only client tools ("custom") are supported: edgeloop runs no server tools' }).optional(),
  },
  { error: "expected {name, description?, input_schema}" },
);
const Temperature = z.number({ error: "expected a number in [0, 1]" }).min(0, "must be >= 0").max(1, "must be <= 1");
const TopP = z.number({ error: "expected a number in (0, 1]" }).gt(0, "must be > 0").max(1, "must be <= 1");
const MaxTokens = z.int({ error: "expected a positive integer" }).min(1, "must be a positive integer");
const Flag = z.boolean({ error: "expected true or false" });
const ThinkingConfig = z.looseObject(
  { type: z.enum(["enabled", "disabled", "adaptive", "between_tools"], { error: 'expected "enabled", "disabled", "adaptive" or "between_tools"' }), budget_tokens: z.int({ error: "expected an integer" }).optional() },
  { error: "expected {type, budget_tokens?}" },
);

const Nullish = <T extends z.ZodType>(t: T, what: string) => t.nullish().describe(what);

/**
 * The Messages request body the endpoint accepts, as a zod schema for the
 * OpenAPI document (`GET /openapi.json`); its keys are exactly
 * {@link MESSAGES_REQUEST_KEYS} and {@link IGNORED_MESSAGES_KEYS}, the value
 * ranges the zod types {@link parseMessagesRequest} checks with.
 * {@link parseMessagesRequest} stays the validator (it names the failing
 * field and translates the blocks). Follows `MessageCreateParamsBase` of
 * `@anthropic-ai/sdk` v1.16.0.
 */
export const MessagesRequestSchema = z.strictObject({
  model: Str.describe("informational: the gateway serves its one model"),
  max_tokens: MaxTokens.describe("the most tokens this call samples (the output's response_length still applies)"),
  messages: z
    .array(
      z.looseObject({
        role: z.enum(["user", "assistant", "system"]),
        content: z.union([Str, z.array(z.union([TextBlock, ThinkingBlock, ToolUseBlock, ToolResultBlock]))]),
      }),
    )
    .min(1),
  system: Nullish(z.union([Str, z.array(TextBlock)]), "a system message before the messages"),
  tools: Nullish(z.array(ToolIn), "client tools {name, description?, input_schema}"),
  tool_choice: Nullish(z.looseObject({ type: z.enum(["auto", "none"]), disable_parallel_tool_use: z.boolean().optional() }), 'only {type: "auto"} (default) or {type: "none"}'),
  temperature: Temperature.nullish(),
  top_p: TopP.nullish(),
  stop_sequences: Nullish(z.array(Str.min(1)).max(MAX_STOP_SEQUENCES), `at most ${MAX_STOP_SEQUENCES} stop sequences`),
  stream: Nullish(Flag, "true: text/event-stream of the Messages events"),
  ...Object.fromEntries(IGNORED_MESSAGES_KEYS.map((k) => [k, z.unknown().optional().describe("accepted and unused (named in x-edgeloop-ignored-keys)")])),
});

/** Text of a `system` / `tool_result.content` / user content value: a string, or text blocks. */
function textBlocks(v: unknown, at: string): { type: "text"; text: string }[] | string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw new InputError(at, "expected a string or a list of text blocks");
  return v.map((b, j) => {
    if (!isRecord(b) || typeof b.type !== "string") throw new InputError(`${at}[${j}].type`, 'expected a content block {type: "text", text}');
    if (b.type !== "text") throw new InputError(`${at}[${j}].type`, `${JSON.stringify(b.type)} blocks are not supported here: only text${b.type === "image" ? " (image blocks go in user turns and tool_result content)" : ""}`);
    return { type: "text" as const, text: parseField(`${at}[${j}]`, TextBlock, b).text };
  });
}

/** A content part of a user message or tool result: text, or an image as `{type: "image_url", image_url: {url}}`. */
type UserPart = { type: "text"; text: string } | { type: "image_url"; image_url: { url: string } };

/**
 * An Anthropic image block (`ImageBlockParam` of `@anthropic-ai/sdk`): a `base64` source becomes a
 * `data:{media_type};base64,{data}` URI (the format is then read from the bytes), a `url` source its URL
 * (never fetched: refused when read unless a fetcher is set); read for a vision-language family and
 * refused for a text-only one when the turn is rendered. `cache_control` is accepted (edgeloop caches no
 * prompt); `file` sources and non-empty `transformations` are refused.
 */
function imageBlock(b: Record<string, unknown>, f: string): UserPart {
  for (const k of Object.keys(b)) if (k !== "type" && k !== "source" && k !== "cache_control" && k !== "transformations") throw new InputError(`${f}.${k.slice(0, 100)}`, "not a field of an image block (source, cache_control)");
  if (isRecord(b.transformations) ? Object.keys(b.transformations).length > 0 : !nullish(b.transformations)) {
    throw new InputError(`${f}.transformations`, "not supported: the model's processor sizes the image (only absent or {})");
  }
  const src = b.source;
  if (!isRecord(src)) throw new InputError(`${f}.source`, 'expected {type: "base64", media_type, data} or {type: "url", url}');
  if (src.type === "base64") {
    if (!["image/jpeg", "image/png", "image/gif", "image/webp"].includes(src.media_type as string)) throw new InputError(`${f}.source.media_type`, "expected image/jpeg, image/png, image/gif or image/webp");
    if (typeof src.data !== "string") throw new InputError(`${f}.source.data`, "expected the image as a base64 string");
    return imagePart(`data:${src.media_type as string};base64,${src.data}`, `${f}.source.data`);
  }
  if (src.type === "url") {
    if (typeof src.url !== "string") throw new InputError(`${f}.source.url`, "expected a string");
    return imagePart(src.url, `${f}.source.url`);
  }
  throw new InputError(`${f}.source.type`, `${JSON.stringify(src.type ?? null)} sources are not supported (base64 or url; file ids need Anthropic's Files API)`);
}

/** A `tool_result`'s content: a string, or text and image blocks. */
function toolResultContent(v: unknown, at: string): UserPart[] | string {
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw new InputError(at, "expected a string or a list of text and image blocks");
  return v.map((b, j) => {
    if (!isRecord(b) || typeof b.type !== "string") throw new InputError(`${at}[${j}].type`, 'expected a content block {type: "text" | "image", …}');
    if (b.type === "image") return imageBlock(b, `${at}[${j}]`);
    if (b.type !== "text") throw new InputError(`${at}[${j}].type`, `${JSON.stringify(b.type)} blocks are not supported in a tool result (text and image)`);
    return { type: "text" as const, text: parseField(`${at}[${j}]`, TextBlock, b).text };
  });
}

/** One user turn: its `tool_result` blocks as tool messages (in order), then its text and image blocks as one user message. */
function userMessages(content: unknown, at: string): ChatMessage[] {
  if (typeof content === "string") return [{ role: "user", content }];
  if (!Array.isArray(content)) throw new InputError(at, "expected a string or a list of content blocks");
  const tools: ChatMessage[] = [];
  const text: UserPart[] = [];
  content.forEach((b, j) => {
    const f = `${at}[${j}]`;
    if (!isRecord(b) || typeof b.type !== "string") throw new InputError(`${f}.type`, "expected a content block {type, …}");
    if (b.type === "text") text.push({ type: "text", text: parseField(f, TextBlock, b).text });
    else if (b.type === "image") text.push(imageBlock(b, f));
    else if (b.type === "tool_result") {
      const r = parseField(f, ToolResultBlock, b);
      const c = r.content === undefined ? "" : toolResultContent(r.content, `${f}.content`);
      const result: ChatMessage = { role: "tool", tool_call_id: r.tool_use_id, content: c };
      TOOL_RESULT_PATHS.set(result, `${f}.tool_use_id`);
      tools.push(result);
    } else throw new InputError(`${f}.type`, `${JSON.stringify(b.type)} blocks are not supported in a user turn (edgeloop reads text, image and tool_result)`);
  });
  if (content.length === 0) throw new InputError(at, "must hold at least one content block");
  if (text.length > 0 && tools.length === 0) return [{ role: "user", content: text }];
  return text.length > 0 ? [...tools, { role: "user", content: text }] : tools;
}

/** One assistant turn: text joined, `thinking` as reasoning_content, `tool_use` as tool_calls (arguments = JSON of input). */
function assistantMessage(content: unknown, at: string): ChatMessage {
  if (typeof content === "string") return { role: "assistant", content };
  if (!Array.isArray(content)) throw new InputError(at, "expected a string or a list of content blocks");
  let text = "";
  let reasoning: string | undefined;
  const calls: ToolCallMessage[] = [];
  content.forEach((b, j) => {
    const f = `${at}[${j}]`;
    if (!isRecord(b) || typeof b.type !== "string") throw new InputError(`${f}.type`, "expected a content block {type, …}");
    if (b.type === "text") text += parseField(f, TextBlock, b).text;
    else if (b.type === "thinking") reasoning = (reasoning ?? "") + parseField(f, ThinkingBlock, b).thinking;
    else if (b.type === "tool_use") {
      const u = parseField(f, ToolUseBlock, b);
      calls.push({ id: u.id, type: "function", function: { name: u.name, arguments: JSON.stringify(u.input) } });
    } else throw new InputError(`${f}.type`, `${JSON.stringify(b.type)} blocks are not supported in an assistant turn (edgeloop reads text, thinking and tool_use)`);
  });
  const out: ChatMessage = { role: "assistant", content: text === "" && calls.length > 0 ? null : text };
  if (reasoning !== undefined) out.reasoning_content = reasoning;
  if (calls.length > 0) out.tool_calls = calls;
  return out;
}

/** The `messages[i].content[j].tool_use_id` path of each tool message {@link userMessages} made (for the error naming an unanswered one). */
const TOOL_RESULT_PATHS = new WeakMap<ChatMessage, string>();

function parseMessages(v: unknown): ChatMessage[] {
  if (nullish(v)) throw new InputError("messages", "required: a non-empty list of {role, content}");
  if (!Array.isArray(v)) throw new InputError("messages", "expected a list of {role, content}");
  if (v.length === 0) throw new InputError("messages", "must hold at least one message");
  return v.flatMap((m, i): ChatMessage[] => {
    const at = `messages[${i}]`;
    if (!isRecord(m)) throw new InputError(at, "expected a message object {role, content}");
    if (nullish(m.content)) throw new InputError(`${at}.content`, "required: a string or a list of content blocks");
    if (m.role === "user") return userMessages(m.content, `${at}.content`);
    if (m.role === "assistant") return [assistantMessage(m.content, `${at}.content`)];
    if (m.role === "system") return [{ role: "system", content: textBlocks(m.content, `${at}.content`) }];
    throw new InputError(`${at}.role`, `expected "user" or "assistant"; got ${JSON.stringify(m.role ?? null)}`);
  });
}

function parseTools(v: unknown): ToolSchema[] | undefined {
  if (nullish(v)) return undefined;
  if (!Array.isArray(v)) throw new InputError("tools", "expected a list of {name, description?, input_schema}");
  if (v.length === 0) return undefined;
  return v.map((t, i) => {
    if (isRecord(t) && !nullish(t.type) && t.type !== "custom") {
      throw new InputError(`tools[${i}].type`, `only client tools ("custom" or absent) are supported, got ${JSON.stringify(t.type)}: edgeloop runs no server tools`);
    }
    const p = parseField(`tools[${i}]`, ToolIn, t);
    return parseField(`tools[${i}]`, ToolSchema, { type: "function", function: { name: p.name, ...(nullish(p.description) ? {} : { description: p.description }), parameters: p.input_schema } });
  });
}

function parseToolChoice(v: unknown): "auto" | "none" {
  if (nullish(v)) return "auto";
  if (!isRecord(v) || typeof v.type !== "string") throw new InputError("tool_choice", 'expected {type: "auto"} or {type: "none"}');
  if (v.type === "auto" || v.type === "none") return v.type;
  throw new InputError("tool_choice", `edgeloop samples token-in/token-out without guided decoding: only {type: "auto"} and {type: "none"} are supported, got ${JSON.stringify(v.type)}`);
}

function parseStopSequences(v: unknown): string[] | undefined {
  if (nullish(v)) return undefined;
  if (!Array.isArray(v)) throw new InputError("stop_sequences", `expected a list of at most ${MAX_STOP_SEQUENCES} strings`);
  if (v.length > MAX_STOP_SEQUENCES) throw new InputError("stop_sequences", `at most ${MAX_STOP_SEQUENCES} stop sequences, got ${v.length}`);
  v.forEach((s, i) => {
    if (typeof s !== "string") throw new InputError(`stop_sequences[${i}]`, "expected a string");
    if (s === "") throw new InputError(`stop_sequences[${i}]`, "a stop sequence must not be empty");
  });
  return v.length > 0 ? [...(v as string[])] : undefined;
}

/**
 * Translates an Anthropic Messages request into a {@link ChatRequest}
 * (follows Anthropic's Messages API, `@anthropic-ai/sdk` v1.16.0 types):
 * - `system` (a string or text blocks) → a system message first; a
 *   `role: "system"` message in `messages` is kept in place;
 * - a user turn → its `tool_result` blocks as tool messages, in order
 *   (`content` a string or text and image blocks; `is_error` is accepted, the
 *   template has no place for it), then its text and image blocks as one user
 *   message (images: see `imageBlock`, for a vision-language family);
 * - an assistant turn → one assistant message: text blocks joined,
 *   `thinking` blocks as `reasoning_content` (the family's template decides
 *   whether history keeps it; `signature` is not checked), `tool_use`
 *   `{id, name, input}` as tool_calls with `arguments` = JSON of `input`;
 * - `tools` `[{name, description?, input_schema}]` → function tools;
 * - `tool_choice` `{type: "auto"|"none"}` (`disable_parallel_tool_use` accepted, unused);
 * - `max_tokens` (required) caps the call; `temperature` [0, 1] and `top_p`
 *   (0, 1] are passed as sampled with; `stop_sequences` → `stop`;
 * - the keys of {@link IGNORED_MESSAGES_KEYS} are accepted and unused.
 * Refused (400 naming the field): `tool_choice` `any`/`tool` (no guided
 * decoding through token-in/token-out), `top_k` (not a per-call setting
 * here), document/search/server-tool blocks, image blocks outside user
 * turns and tool results (and with `file` sources), server tools, any
 * other key.
 * @throws InputError naming the field: `body`, a key, `model`, `max_tokens`,
 *   `messages[1].content[0].type`, `messages[2].content[1].input`,
 *   `tools[0].input_schema`, `tool_choice`, `temperature`, `top_p`, `top_k`,
 *   `stop_sequences[0]`, `stream`, `thinking`.
 */
export function parseMessagesRequest(body: unknown): ChatRequest {
  if (!isRecord(body)) throw new InputError("body", "expected a JSON object (an Anthropic Messages request)");
  const b = body;
  if (!nullish(b.top_k)) throw new InputError("top_k", "edgeloop samples with the run's top_k (rollout sampling settings), not per call: remove it");
  for (const k of Object.keys(b)) {
    if (!KNOWN_KEYS.has(k) && !(k === "top_k" && nullish(b[k]))) {
      throw new InputError(k.slice(0, 100), "not supported by edgeloop's Messages endpoint (it samples only with model, max_tokens, messages, system, tools, tool_choice, temperature, top_p, stop_sequences, stream): remove it");
    }
  }
  if (nullish(b.model)) throw new InputError("model", "required: the model's name (edgeloop serves its one model whatever it is)");
  const model = parseField("model", Str, b.model);
  if (nullish(b.max_tokens)) throw new InputError("max_tokens", "required: the most tokens to sample in this call (a positive integer)");
  const maxTokens = parseField("max_tokens", MaxTokens, b.max_tokens);
  if (!nullish(b.thinking)) parseField("thinking", ThinkingConfig, b.thinking);
  const system = nullish(b.system) ? [] : [{ role: "system" as const, content: textBlocks(b.system, "system") }];
  const messages = [...system, ...parseMessages(b.messages)];
  const last = (b.messages as unknown[]).length - 1;
  // A last assistant message is a prefill: the API continues it. edgeloop would close it and sample a new turn,
  // a different trajectory, so it is refused rather than answered otherwise than the API answers it.
  if (messages[messages.length - 1]!.role === "assistant") {
    throw new InputError(`messages[${last}].role`, "a final assistant message (a prefill the reply would continue) is not supported by edgeloop's Messages endpoint: end with a user turn");
  }
  const bad = unansweredToolResult(messages);
  if (bad) {
    throw new InputError(TOOL_RESULT_PATHS.get(messages[bad.index]!) ?? "messages", `tool_result block for ${JSON.stringify(bad.id.slice(0, 100))} has no matching tool_use block in the previous assistant message`);
  }
  const out: ChatRequest = {
    model,
    messages,
    tools: parseTools(b.tools),
    tool_choice: parseToolChoice(b.tool_choice),
    max_tokens: maxTokens,
    stream: nullish(b.stream) ? false : parseField("stream", Flag, b.stream),
    logprobs: false,
  };
  if (!nullish(b.temperature)) out.temperature = parseField("temperature", Temperature, b.temperature);
  if (!nullish(b.top_p)) out.top_p = parseField("top_p", TopP, b.top_p);
  const stop = parseStopSequences(b.stop_sequences);
  if (stop) out.stop = stop;
  return out;
}

/** The keys of {@link IGNORED_MESSAGES_KEYS} a request carries (not null), in that order. */
export function ignoredMessagesKeys(body: unknown): string[] {
  return presentKeys(body, IGNORED_MESSAGES_KEYS);
}

/** Anthropic's stop reasons edgeloop gives (`StopReason` of `@anthropic-ai/sdk` v1.16.0, less `pause_turn`, `refusal`, `model_context_window_exceeded`). */
export type MessagesStopReason = "end_turn" | "tool_use" | "max_tokens" | "stop_sequence";

/**
 * A reply's stop reason: `tool_calls` → `tool_use`, `length` (the call's
 * `max_tokens`, or the output's budget) → `max_tokens`, `stop` ended by a
 * stop sequence → `stop_sequence`, else `end_turn`.
 */
export function stopReasonOf(r: ChatReply): MessagesStopReason {
  if (r.finish_reason === "tool_calls") return "tool_use";
  if (r.finish_reason === "length") return "max_tokens";
  return r.stop_sequence !== undefined ? "stop_sequence" : "end_turn";
}

/** The message id of a reply: `msg_` + the chat completion id's tail (the same per session, output, turn and step). */
export function messageIdOf(r: ChatReply): string {
  return `msg_${r.id.replace(/^chatcmpl-/, "")}`;
}

/** A thinking block's signature: edgeloop signs nothing, this only fills the field the SDKs expect (it is not checked when sent back). */
export function thinkingSignature(thinking: string): string {
  return `edgeloop-${fnv1a32(thinking).toString(16).padStart(8, "0")}`;
}

/** A Messages content block as edgeloop answers it. */
export type Block =
  | { type: "thinking"; thinking: string; signature: string }
  | { type: "text"; text: string; citations: null }
  | { type: "tool_use"; id: string; name: string; input: unknown; caller: { type: "direct" } };

/** The content blocks of a reply, in order: thinking, text, tool_use per call. */
export function blocksOf(r: ChatReply): Block[] {
  const m = r.message;
  const out: Block[] = [];
  if (m.reasoning_content !== undefined) out.push({ type: "thinking", thinking: m.reasoning_content, signature: thinkingSignature(m.reasoning_content) });
  if (m.content) out.push({ type: "text", text: m.content, citations: null });
  for (const c of m.tool_calls ?? []) {
    let input: unknown;
    try {
      input = JSON.parse(c.function.arguments);
    } catch {
      input = {};
    }
    out.push({ type: "tool_use", id: c.id, name: c.function.name, input, caller: { type: "direct" } });
  }
  return out;
}

function usageOf(r: ChatReply, outputTokens: number): Record<string, unknown> {
  return {
    input_tokens: r.usage.prompt_tokens,
    output_tokens: outputTokens,
    cache_creation_input_tokens: 0,
    cache_read_input_tokens: 0,
    cache_creation: null,
    server_tool_use: null,
    service_tier: "standard",
  };
}

/** A Messages `message` object of reply `r` with `content` (`message_start` carries it empty). */
export function messageObject(r: ChatReply, content: Block[], stop: { stop_reason: MessagesStopReason | null; stop_sequence: string | null }, outputTokens: number): Record<string, unknown> {
  return {
    id: messageIdOf(r),
    type: "message",
    role: "assistant",
    model: r.model,
    content,
    stop_reason: stop.stop_reason,
    stop_sequence: stop.stop_sequence,
    stop_details: null,
    container: null,
    usage: usageOf(r, outputTokens),
  };
}

/**
 * The non-streaming body: a Messages `message` object `{id: "msg_…", type:
 * "message", role: "assistant", model, content, stop_reason, stop_sequence,
 * stop_details: null, container: null, usage: {input_tokens, output_tokens,
 * cache_creation_input_tokens: 0, cache_read_input_tokens: 0, …}}`; `content`
 * holds, in order, a `thinking` block (when the reply has reasoning, with a
 * {@link thinkingSignature}), a `text` block (when it has text), one
 * `tool_use` block `{id, name, input}` per call (`input` the parsed
 * arguments). Follows `Message` of `@anthropic-ai/sdk` v1.16.0.
 */
export function messagesBody(r: ChatReply): Record<string, unknown> {
  const reason = stopReasonOf(r);
  return messageObject(r, blocksOf(r), { stop_reason: reason, stop_sequence: reason === "stop_sequence" ? r.stop_sequence! : null }, r.usage.completion_tokens);
}

/** Anthropic's error `type` for an HTTP status (`ErrorType` of `@anthropic-ai/sdk` v1.16.0; 413 `request_too_large` per the API's error list). */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 400:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 409:
      return "conflict_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 504:
      return "timeout_error";
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

/**
 * An error on the Messages route in Anthropic's shape, from the status and
 * message edgeloop's own error answer has: `{type: "error", error: {type,
 * message}, request_id: null}`. The status is kept, except 503 (an engine or
 * store that cannot answer now), which becomes the API's 529
 * `overloaded_error`, and a 5xx other than 504, which becomes 500
 * `api_error` (the message is the one edgeloop shows, generic unless written
 * to be shown). Follows `ErrorResponse` of `@anthropic-ai/sdk` v1.16.0.
 */
export function anthropicError(status: number, message: string): { status: number; body: Record<string, unknown> } {
  const s = status === 503 ? 529 : status >= 500 && status !== 504 ? 500 : status;
  return { status: s, body: { type: "error", error: { type: anthropicErrorType(s), message }, request_id: null } };
}
