import { z } from "zod";
import { InputError } from "../errors.ts";
import { imagePart, isRecord, nullish, parseField, presentKeys, StringField, unansweredToolResult } from "./wire-fields.ts";
import type { ChatMessage, ToolCallMessage } from "../schema/message.ts";
import { ToolSchema } from "../schema/tool.ts";

/**
 * The OpenAI chat-completions wire of the agent gateway
 * (`POST /v1/sessions/{key}/openai/v1/chat/completions`, `GET …/models`):
 * the request parsed into what edgeloop samples with, and the reply rendered
 * as OpenAI's `chat.completion` object or `chat.completion.chunk` SSE stream.
 * Pure and runtime-free; the HTTP handler parses JSON and maps
 * {@link InputError} to a 400.
 * @see https://platform.openai.com/docs/api-reference/chat
 */

/**
 * A parsed chat-completions request.
 *
 * - `model`: as sent (null when absent); informational, edgeloop serves its one model.
 * - `messages`: edgeloop {@link ChatMessage}s; `developer` is mapped to `system`;
 *   assistant `content` is null when it only carries `tool_calls`; tool-call
 *   `arguments` are kept as given (OpenAI sends a JSON string).
 * - `tools`: OpenAI function tools ({@link ToolSchema}, `strict` dropped); undefined when absent or `[]`.
 * - `tool_choice`: `"auto"` (default) or `"none"`.
 * - `temperature` [0, 2], `top_p` (0, 1], `seed` (int): absent when not sent or null.
 * - `max_tokens`: `max_completion_tokens ?? max_tokens`, a positive int; absent when neither is sent.
 * - `stop`: stop strings (a lone string becomes `[string]`), 1–4 non-empty strings; absent when not sent.
 * - `stream`, `logprobs`: false unless sent as true.
 */
export interface ChatRequest {
  model: string | null;
  messages: ChatMessage[];
  tools: ToolSchema[] | undefined;
  tool_choice: "auto" | "none";
  temperature?: number;
  top_p?: number;
  seed?: number;
  max_tokens?: number;
  stop?: string[];
  stream: boolean;
  /** Present (true) when `stream_options.include_usage` is true: a streamed reply ends with the usage chunk (OpenAI's rule; absent: no usage chunk). Not part of the request's identity. */
  include_usage?: true;
  /** true: the reply carries the sampled tokens' log-probs (never `top_logprobs`). */
  logprobs: boolean;
}

const ROLES = ["system", "developer", "user", "assistant", "tool"] as const;

/** At most this many stop strings, as OpenAI's API allows. */
export const MAX_STOP_STRINGS = 4;


/** Parses `value` with `schema`; a failure is an {@link InputError} naming `field` (and the path below it). */

const Temperature = z.number({ error: "expected a number in [0, 2]" }).min(0, "must be >= 0").max(2, "must be <= 2");
const TopP = z.number({ error: "expected a number in (0, 1]" }).gt(0, "must be > 0").max(1, "must be <= 1");
const Seed = z.int({ error: "expected an integer" });
const PositiveInt = z.int({ error: "expected a positive integer" }).min(1, "must be a positive integer");
const Flag = z.boolean({ error: "expected true or false" });

/** An assistant message's tool call, as OpenAI sends it (`arguments` a JSON string; an object is kept too). */
const ToolCallIn = z.looseObject({
  id: z.string({ error: "expected the call's id (a string)" }),
  type: z.literal("function", { error: 'expected "function"' }).optional(),
  function: z.looseObject(
    {
      name: z.string({ error: "expected the function's name (a string)" }).min(1, "must not be empty"),
      arguments: z.union([z.string(), z.record(z.string(), z.unknown())], { error: "expected a JSON string of the arguments" }),
    },
    { error: "expected {name, arguments}" },
  ),
});

/** A function tool's `function` object; `strict` is accepted and dropped. */
const FunctionIn = z.looseObject(
  {
    name: z.string({ error: "expected the tool's name (a string)" }).min(1, "must not be empty"),
    description: StringField.nullish(),
    parameters: z.record(z.string(), z.unknown(), { error: "expected a JSON Schema object" }).nullish(),
    strict: z.boolean({ error: "expected true or false" }).nullish(),
  },
  { error: "expected {name, description?, parameters?}" },
);

/**
 * Request keys the gateway reads (some only at their no-op value, see
 * {@link parseChatRequest}).
 */
export const CHAT_REQUEST_KEYS: readonly string[] = [
  "model", "messages", "tools", "tool_choice", "temperature", "top_p", "seed", "max_tokens", "max_completion_tokens", "stop", "stream", "stream_options", "logprobs",
  "n", "top_logprobs", "frequency_penalty", "presence_penalty", "response_format", "logit_bias", "functions", "function_call",
];

/**
 * Request keys accepted and ignored: bookkeeping and transport options that
 * do not change what is sampled. A reply to a request carrying any of them
 * (not null) names them in the `x-edgeloop-ignored-keys` header
 * ({@link ignoredChatKeys}).
 */
export const IGNORED_CHAT_KEYS: readonly string[] = ["user", "metadata", "store", "parallel_tool_calls", "service_tier", "reasoning_effort", "prompt_cache_key", "safety_identifier"];

const KNOWN_KEYS = new Set([...CHAT_REQUEST_KEYS, ...IGNORED_CHAT_KEYS]);

const TextPart = z.object({ type: z.literal("text"), text: z.string() });
const ChatMessageIn = z.looseObject({
  role: z.enum(ROLES),
  content: z.union([z.string(), z.array(TextPart), z.null()]).describe("null only on an assistant message with tool_calls"),
  tool_calls: z.array(ToolCallIn).nullish(),
  name: z.string().nullish(),
  tool_call_id: z.string().nullish().describe("required on a tool message"),
  reasoning_content: z.string().nullish(),
  reasoning: z.string().nullish(),
});
const Nullish = <T extends z.ZodType>(s: T, what: string) => s.nullish().describe(what);

/**
 * The chat-completions request body the agent gateway accepts, as a zod
 * schema for the OpenAPI document (`GET /openapi.json`). Its keys are exactly
 * {@link CHAT_REQUEST_KEYS} and {@link IGNORED_CHAT_KEYS} (a test checks it);
 * the value ranges are the same zod types {@link parseChatRequest} checks
 * with. {@link parseChatRequest} stays the validator: it names the failing
 * field in edgeloop's own words and maps `developer` to `system`.
 */
export const ChatCompletionRequestSchema = z.strictObject({
  model: Nullish(z.string(), "informational: the gateway serves its one model"),
  messages: z.array(ChatMessageIn).min(1),
  tools: Nullish(z.array(z.object({ type: z.literal("function"), function: FunctionIn })), "function tools"),
  tool_choice: Nullish(z.enum(["auto", "none"]), 'default "auto"'),
  temperature: Temperature.nullish(),
  top_p: TopP.nullish(),
  seed: Seed.nullish(),
  max_tokens: PositiveInt.nullish(),
  max_completion_tokens: Nullish(PositiveInt, "wins over max_tokens"),
  stop: Nullish(z.union([z.string().min(1), z.array(z.string().min(1)).max(MAX_STOP_STRINGS)]), `at most ${MAX_STOP_STRINGS} stop strings`),
  stream: Nullish(Flag, "true: text/event-stream of chat.completion.chunk, then [DONE]"),
  stream_options: Nullish(z.looseObject({ include_usage: Flag.nullish() }), "include_usage: true adds the usage chunk before [DONE] (as OpenAI); other keys are ignored"),
  logprobs: Nullish(Flag, "true: the sampled tokens' log-probs"),
  n: Nullish(z.literal(1), "only 1"),
  top_logprobs: Nullish(z.literal(0), "only 0"),
  frequency_penalty: Nullish(z.literal(0), "only 0"),
  presence_penalty: Nullish(z.literal(0), "only 0"),
  response_format: Nullish(z.object({ type: z.literal("text") }), 'only {type: "text"}'),
  logit_bias: Nullish(z.object({}).strict(), "only {}"),
  functions: Nullish(z.array(z.never()).max(0), "legacy: only []"),
  function_call: Nullish(z.enum(["auto", "none"]), "legacy: only auto or none"),
  ...Object.fromEntries(IGNORED_CHAT_KEYS.map((k) => [k, z.unknown().optional().describe("accepted and ignored (named in x-edgeloop-ignored-keys)")])),
});

/**
 * The {@link IGNORED_CHAT_KEYS} a request body carries with a non-null value,
 * in the body's order (empty for a non-object body).
 */
export function ignoredChatKeys(body: unknown): string[] {
  return presentKeys(body, IGNORED_CHAT_KEYS);
}

/**
 * Parses an OpenAI chat-completions request body (already JSON-decoded).
 *
 * Strict like the rest of edgeloop's API: a key outside
 * {@link CHAT_REQUEST_KEYS} and {@link IGNORED_CHAT_KEYS} is refused with a
 * 400 naming it (`top_k`, `min_tokens`, `repetition_penalty`, … would change
 * sampling in a way edgeloop does not do or record: silently dropping them
 * would sample something other than what the agent asked for). Accepted and
 * ignored (named in the reply's `x-edgeloop-ignored-keys`): `user`, `metadata`, `store`,
 * `parallel_tool_calls`, `stream_options`, `service_tier`, `reasoning_effort`,
 * `prompt_cache_key`, `safety_identifier`. Accepted only
 * at their no-op value (anything else changes sampling in a way edgeloop does
 * not do, so it is refused rather than ignored): `n` 1, `top_logprobs` 0,
 * `frequency_penalty`/`presence_penalty` 0, `response_format` `{type:"text"}`,
 * `logit_bias` `{}`, legacy `functions` `[]`, `function_call` `"auto"`/`"none"`;
 * null counts as absent everywhere.
 *
 * @throws InputError naming the field: an unknown key, `body`, `messages`, `messages[2].role`,
 *   `messages[2].content[0].type` (audio/file parts, image parts outside user
 *   messages), `messages[2].content[0].image_url.url` / `.detail`, `messages[1].tool_calls[0].id`, `tools[0].type`, `tool_choice`,
 *   `temperature`, `top_p`, `seed`, `max_tokens`, `max_completion_tokens`,
 *   `stop`/`stop[i]`, `stream`, `logprobs`, `n`, `top_logprobs`, …
 */
export function parseChatRequest(body: unknown): ChatRequest {
  if (!isRecord(body)) throw new InputError("body", "expected a JSON object (an OpenAI chat-completions request)");
  const b = body;
  for (const k of Object.keys(b)) {
    if (!KNOWN_KEYS.has(k)) {
      throw new InputError(k.slice(0, 100), "not supported by edgeloop's agent gateway (it samples only with model, messages, tools, tool_choice, temperature, top_p, seed, max_tokens, max_completion_tokens, stop, stream, logprobs): remove it");
    }
  }

  if (!nullish(b.n) && b.n !== 1) throw new InputError("n", "edgeloop samples one choice per call: n must be 1 (or absent)");
  if (!nullish(b.top_logprobs) && b.top_logprobs !== 0) {
    throw new InputError("top_logprobs", "edgeloop returns only the sampled token's log-prob: top_logprobs must be 0 (or absent)");
  }
  for (const f of ["frequency_penalty", "presence_penalty"] as const) {
    if (!nullish(b[f]) && b[f] !== 0) throw new InputError(f, "edgeloop samples without penalties: must be 0 (or absent)");
  }
  if (!nullish(b.response_format) && !(isRecord(b.response_format) && b.response_format.type === "text")) {
    throw new InputError("response_format", 'edgeloop samples without guided decoding: only {type: "text"} (or absent)');
  }
  if (!nullish(b.logit_bias) && !(isRecord(b.logit_bias) && Object.keys(b.logit_bias).length === 0)) {
    throw new InputError("logit_bias", "edgeloop samples without logit bias: must be empty (or absent)");
  }
  if (!nullish(b.functions) && !(Array.isArray(b.functions) && b.functions.length === 0)) {
    throw new InputError("functions", "legacy function calling is not supported: send `tools`");
  }
  if (!nullish(b.function_call) && b.function_call !== "auto" && b.function_call !== "none") {
    throw new InputError("function_call", "legacy function calling is not supported: send `tools`");
  }

  const model = nullish(b.model) ? null : parseField("model", StringField, b.model);
  const messages = parseMessages(b.messages);
  const tools = parseTools(b.tools);

  let toolChoice: "auto" | "none" = "auto";
  if (!nullish(b.tool_choice)) {
    if (b.tool_choice !== "auto" && b.tool_choice !== "none") {
      throw new InputError(
        "tool_choice",
        `edgeloop samples token-in/token-out without guided decoding: only "auto" and "none" are supported, got ${JSON.stringify(b.tool_choice)}`,
      );
    }
    toolChoice = b.tool_choice;
  }

  const out: ChatRequest = {
    model,
    messages,
    tools,
    tool_choice: toolChoice,
    stream: nullish(b.stream) ? false : parseField("stream", Flag, b.stream),
    logprobs: nullish(b.logprobs) ? false : parseField("logprobs", Flag, b.logprobs),
  };
  if (!nullish(b.temperature)) out.temperature = parseField("temperature", Temperature, b.temperature);
  if (!nullish(b.top_p)) out.top_p = parseField("top_p", TopP, b.top_p);
  if (!nullish(b.seed)) out.seed = parseField("seed", Seed, b.seed);
  const maxCompletion = nullish(b.max_completion_tokens) ? undefined : parseField("max_completion_tokens", PositiveInt, b.max_completion_tokens);
  const maxTokens = nullish(b.max_tokens) ? undefined : parseField("max_tokens", PositiveInt, b.max_tokens);
  const max = maxCompletion ?? maxTokens;
  if (max !== undefined) out.max_tokens = max;
  const stop = parseStop(b.stop);
  if (stop) out.stop = stop;
  if (!nullish(b.stream_options)) {
    if (!isRecord(b.stream_options)) throw new InputError("stream_options", "expected an object ({include_usage: true} adds the usage chunk)");
    const inc = b.stream_options.include_usage;
    if (!nullish(inc) && parseField("stream_options.include_usage", Flag, inc)) out.include_usage = true;
  }
  return out;
}

function parseStop(v: unknown): string[] | undefined {
  if (nullish(v)) return undefined;
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list)) throw new InputError("stop", `expected a string or a list of at most ${MAX_STOP_STRINGS} strings`);
  if (list.length > MAX_STOP_STRINGS) throw new InputError("stop", `at most ${MAX_STOP_STRINGS} stop strings, got ${list.length}`);
  list.forEach((s, i) => {
    const field = typeof v === "string" ? "stop" : `stop[${i}]`;
    if (typeof s !== "string") throw new InputError(field, "expected a string");
    if (s === "") throw new InputError(field, "a stop string must not be empty");
  });
  // An empty list means no stop strings, as for an absent field.
  return list.length > 0 ? [...(list as string[])] : undefined;
}

function parseMessages(v: unknown): ChatMessage[] {
  if (nullish(v)) throw new InputError("messages", "required: a non-empty list of chat messages");
  if (!Array.isArray(v)) throw new InputError("messages", "expected a list of chat messages");
  if (v.length === 0) throw new InputError("messages", "must hold at least one message");
  const messages = v.map((m, i) => parseMessage(m, `messages[${i}]`));
  const bad = unansweredToolResult(messages);
  if (bad) throw new InputError(`messages[${bad.index}].tool_call_id`, `${JSON.stringify(bad.id.slice(0, 100))} answers no tool call: a tool message must follow the assistant message whose tool_calls hold its id`);
  return messages;
}

function parseMessage(m: unknown, at: string): ChatMessage {
  if (!isRecord(m)) throw new InputError(at, "expected a message object {role, content}");
  const role = m.role;
  if (typeof role !== "string" || !(ROLES as readonly string[]).includes(role)) {
    throw new InputError(`${at}.role`, `expected one of ${ROLES.join(", ")}; got ${JSON.stringify(role ?? null)}`);
  }
  const r = role as (typeof ROLES)[number];

  let toolCalls: ToolCallMessage[] | undefined;
  if (r === "assistant" && !nullish(m.tool_calls)) {
    if (!Array.isArray(m.tool_calls)) throw new InputError(`${at}.tool_calls`, "expected a list of tool calls");
    toolCalls = m.tool_calls.map((c, k) => {
      const p = parseField(`${at}.tool_calls[${k}]`, ToolCallIn, c);
      return { id: p.id, type: "function" as const, function: { name: p.function.name, arguments: p.function.arguments } };
    });
    if (toolCalls.length === 0) toolCalls = undefined;
  }

  const content = parseContent(m.content, `${at}.content`, r === "assistant" && toolCalls !== undefined, r === "user");
  const out: ChatMessage = { role: r === "developer" ? "system" : r, content };
  if (toolCalls) out.tool_calls = toolCalls;
  if (!nullish(m.name)) out.name = parseField(`${at}.name`, StringField, m.name);
  if (r === "tool") {
    if (nullish(m.tool_call_id)) throw new InputError(`${at}.tool_call_id`, "required on a tool message: the id of the call it answers");
    out.tool_call_id = parseField(`${at}.tool_call_id`, StringField, m.tool_call_id);
  }
  if (r === "assistant") {
    // vLLM ≥ 0.11 names the field `reasoning` in its replies; agents echo back whichever they got.
    const key = !nullish(m.reasoning_content) ? "reasoning_content" : !nullish(m.reasoning) ? "reasoning" : undefined;
    if (key) out.reasoning_content = parseField(`${at}.${key}`, StringField, m[key]);
  }
  return out;
}

/**
 * A message's content: a string, text parts (kept as `{type, text}`), image parts in a user
 * message (`{type: "image_url", image_url: {url, detail?}}`, OpenAI's `ChatCompletionContentPartImage`:
 * kept as `{type: "image_url", image_url: {url}}`, read for a vision-language family, refused
 * for a text-only one when the turn is rendered), or null where OpenAI allows it.
 */
function parseContent(v: unknown, at: string, nullAllowed: boolean, imagesAllowed = false): ChatMessage["content"] {
  if (nullish(v)) {
    if (nullAllowed) return null;
    throw new InputError(at, "required: a string or a list of text parts (null only on an assistant message with tool_calls)");
  }
  if (typeof v === "string") return v;
  if (!Array.isArray(v)) throw new InputError(at, "expected a string or a list of text parts");
  return v.map((p, j) => {
    if (!isRecord(p) || typeof p.type !== "string") throw new InputError(`${at}[${j}].type`, 'expected a content part {type: "text", text}');
    if (p.type === "image_url" && imagesAllowed) return imageUrlPart(p, `${at}[${j}]`);
    if (p.type !== "text") {
      const why = p.type === "image_url" ? "image parts are accepted in user messages only (as OpenAI's chat API takes them)" : "only text and (in user messages) image_url parts are supported";
      throw new InputError(`${at}[${j}].type`, `${JSON.stringify(p.type)} parts are not supported here: ${why}`);
    }
    if (typeof p.text !== "string") throw new InputError(`${at}[${j}].text`, "expected a string");
    return { type: "text" as const, text: p.text };
  });
}

/** An OpenAI image part: `image_url.url` a `data:` URI (or an http(s) URL, refused when read unless a fetcher is set); `detail` only `auto`. */
function imageUrlPart(p: Record<string, unknown>, at: string): { type: "image_url"; image_url: { url: string } } {
  const iu = p.image_url;
  if (!isRecord(iu) || typeof iu.url !== "string") throw new InputError(`${at}.image_url.url`, "expected a string: a data:image/…;base64 URI");
  for (const k of Object.keys(p)) if (k !== "type" && k !== "image_url") throw new InputError(`${at}.${k.slice(0, 100)}`, "not a field of an image_url part");
  for (const k of Object.keys(iu)) if (k !== "url" && k !== "detail") throw new InputError(`${at}.image_url.${k.slice(0, 100)}`, "not a field of image_url (url, detail)");
  // detail low/high picks OpenAI's own resize; the image here is sized by the model's processor (min/max pixels).
  if (!nullish(iu.detail) && iu.detail !== "auto") throw new InputError(`${at}.image_url.detail`, `only "auto" (or absent): the model's processor sizes the image, got ${JSON.stringify(iu.detail)}`);
  return imagePart(iu.url, `${at}.image_url.url`);
}

function parseTools(v: unknown): ToolSchema[] | undefined {
  if (nullish(v)) return undefined;
  if (!Array.isArray(v)) throw new InputError("tools", 'expected a list of {type: "function", function: {name, description?, parameters?}}');
  if (v.length === 0) return undefined;
  return v.map((t, i) => {
    if (!isRecord(t)) throw new InputError(`tools[${i}]`, 'expected {type: "function", function: {...}}');
    if (t.type !== "function") {
      throw new InputError(`tools[${i}].type`, `only "function" tools are supported, got ${JSON.stringify(t.type ?? null)}`);
    }
    const fn = parseField(`tools[${i}].function`, FunctionIn, t.function);
    return parseField(
      `tools[${i}]`,
      ToolSchema,
      {
        type: "function",
        function: {
          name: fn.name,
          ...(nullish(fn.description) ? {} : { description: fn.description }),
          ...(nullish(fn.parameters) ? {} : { parameters: fn.parameters }),
        },
      },
    );
  });
}


/** The assistant message of a reply. `content` is null when the turn is only tool calls. */
export interface ChatReplyMessage {
  role: "assistant";
  content: string | null;
  reasoning_content?: string;
  tool_calls?: { id: string; type: "function"; function: { name: string; arguments: string } }[];
}

/** One sampled token's log-prob entry (OpenAI `ChatCompletionTokenLogprob` without `top_logprobs`). */
export interface ChatReplyLogprob {
  /** The token's text. */
  token: string;
  /** Natural-log probability of the sampled token. */
  logprob: number;
  /** UTF-8 bytes of the token's text. */
  bytes: number[];
}

/**
 * Everything a reply carries, independent of streaming.
 * - `id`: the completion id (`chatcmpl-…`); `created`: unix seconds; `model`: the served model's name.
 * - `finish_reason`: `stop` (end of turn or a stop string), `tool_calls` (the turn ended with calls), `length`.
 * - `usage`: prompt / completion tokens of this call (`total_tokens` = their sum).
 * - `logprobs`: present when the request asked for them: one entry per sampled token, in order.
 */
export interface ChatReply {
  id: string;
  created: number;
  model: string;
  message: ChatReplyMessage;
  finish_reason: "stop" | "tool_calls" | "length";
  /** The stop string (one of the request's `stop`) that ended the turn, when one did (finish_reason `stop`); the Messages API reports it. */
  stop_sequence?: string;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  logprobs?: ChatReplyLogprob[] | null;
}

function messageBody(m: ChatReplyMessage): Record<string, unknown> {
  return {
    role: "assistant",
    content: m.content,
    refusal: null,
    ...(m.reasoning_content !== undefined ? { reasoning_content: m.reasoning_content } : {}),
    ...(m.tool_calls?.length ? { tool_calls: m.tool_calls.map((c) => ({ id: c.id, type: "function", function: { name: c.function.name, arguments: c.function.arguments } })) } : {}),
  };
}

function logprobsBody(lps: ChatReplyLogprob[] | null | undefined): Record<string, unknown> | null {
  if (!lps) return null;
  return { content: lps.map((e) => ({ token: e.token, logprob: e.logprob, bytes: e.bytes, top_logprobs: [] })), refusal: null };
}

/**
 * The non-streaming body: OpenAI's `chat.completion` object,
 * `{id, object: "chat.completion", created, model, choices: [{index: 0,
 * message: {role, content, refusal: null, reasoning_content?, tool_calls?},
 * logprobs: {content: [{token, logprob, bytes, top_logprobs: []}], refusal: null} | null,
 * finish_reason}], usage}`. `reasoning_content` follows vLLM's reasoning parsers.
 * @see https://platform.openai.com/docs/api-reference/chat/object
 */
export function chatCompletionBody(r: ChatReply): Record<string, unknown> {
  return {
    id: r.id,
    object: "chat.completion",
    created: r.created,
    model: r.model,
    choices: [{ index: 0, message: messageBody(r.message), logprobs: logprobsBody(r.logprobs), finish_reason: r.finish_reason }],
    usage: { prompt_tokens: r.usage.prompt_tokens, completion_tokens: r.usage.completion_tokens, total_tokens: r.usage.total_tokens },
  };
}

/**
 * `GET /models` body: OpenAI's model list with the one model the session serves,
 * `{object: "list", data: [{id, object: "model", created, owned_by: "edgeloop"}]}`.
 * `created` is unix seconds.
 * @see https://platform.openai.com/docs/api-reference/models/list
 */
export function modelsBody(modelName: string, created: number): Record<string, unknown> {
  return { object: "list", data: [{ id: modelName, object: "model", created, owned_by: "edgeloop" }] };
}
