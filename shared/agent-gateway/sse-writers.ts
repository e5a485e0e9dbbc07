import { EdgeloopError } from "../errors.ts";
import { blocksOf, messageIdOf, messageObject, stopReasonOf, thinkingSignature } from "./messages-wire.ts";
import type { ChatReply } from "./openai-wire.ts";
import { outputItems, responseIdOf, responseObject, type ResponsesEcho } from "./responses-wire.ts";
import type { StreamHead, TurnSink } from "./turn-stream.ts";

/** A streamed reply that could not be completed as it began (its deltas disagree with the committed reply, or the turn failed after it began). */
export class StreamBrokenError extends EdgeloopError {
  override name = "StreamBrokenError";
  constructor(message: string, cause?: unknown) {
    super(message, { status: 500, code: "stream_broken", cause });
  }
}

/** The head of a reply that streamed nothing before it was whole (a replay, a turn that sampled nothing). */
export function headOf(r: ChatReply): StreamHead {
  return { id: r.id, created: r.created, model: r.model, prompt_tokens: r.usage.prompt_tokens };
}

/** A reply with nothing in it yet, for the objects the first events carry. */
function pendingReply(h: StreamHead): ChatReply {
  return { id: h.id, created: h.created, model: h.model, message: { role: "assistant", content: "" }, finish_reason: "stop", usage: { prompt_tokens: h.prompt_tokens, completion_tokens: 0, total_tokens: h.prompt_tokens } };
}

/**
 * One streamed reply in one API's SSE events: a {@link TurnSink} while the
 * turn is sampled, then `finish(reply)` (the committed reply: the deltas not
 * yet sent, the tool calls, the end events) or `fail(error)` (an error event
 * where the API defines one). A reply that streamed nothing is written whole
 * by `finish` alone. `write` receives each event's bytes as a string.
 * @throws StreamBrokenError from `finish` when what was sent is not a prefix of the reply (never, by {@link TurnStream}'s rules; the stream then ends with an error event).
 */
export abstract class SseTurnWriter implements TurnSink {
  protected head: StreamHead | null = null;
  protected sentReasoning: string | undefined;
  protected sentContent = "";
  private closed = false;

  constructor(protected readonly write: (s: string) => void) {}

  /** Whether `start` has been called (events were written). */
  get started(): boolean {
    return this.head !== null;
  }

  start(head: StreamHead): void {
    if (this.head) return;
    this.head = head;
    this.begin(head);
  }

  reasoning(text: string): void {
    this.sentReasoning = text;
    this.onReasoning(text);
  }

  content(delta: string): void {
    this.sentContent += delta;
    this.onContent(delta);
  }

  /** Writes the rest of `r` and the end events. */
  finish(r: ChatReply): void {
    if (this.closed) return;
    this.start(headOf(r));
    const m = r.message;
    const content = m.content ?? "";
    if (this.head!.id !== r.id || (this.sentReasoning !== undefined && this.sentReasoning !== m.reasoning_content) || !content.startsWith(this.sentContent)) {
      throw new StreamBrokenError(`the streamed reply ${this.head!.id} does not match the committed reply ${r.id}`);
    }
    if (this.sentReasoning === undefined && m.reasoning_content !== undefined) {
      if (this.sentContent) throw new StreamBrokenError(`reasoning after content in the streamed reply ${r.id}`);
      this.reasoning(m.reasoning_content);
    }
    if (content.length > this.sentContent.length) this.content(content.slice(this.sentContent.length));
    this.end(r);
    this.closed = true;
  }

  /** Ends the stream with the API's error event. */
  fail(e: unknown): void {
    if (this.closed) return;
    this.closed = true;
    const status = e instanceof EdgeloopError ? e.status : 500;
    const message = e instanceof EdgeloopError && status < 500 ? e.message : e instanceof EdgeloopError ? `${e.name}: ${e.message}`.slice(0, 500) : "internal error";
    this.error(status, message);
  }

  protected abstract begin(h: StreamHead): void;
  protected abstract onReasoning(text: string): void;
  protected abstract onContent(delta: string): void;
  protected abstract end(r: ChatReply): void;
  protected abstract error(status: number, message: string): void;
}

/**
 * OpenAI chat completions, `chat.completion.chunk` events (`data: <json>`):
 * the role chunk `{role: "assistant", content: ""}` first; `{reasoning_content}`
 * (vLLM's field, one chunk, "" included) when the turn has reasoning; `{content}` deltas; per tool call
 * one chunk `{tool_calls: [{index, id, type, function: {name, arguments}}]}`
 * (OpenAI sends `id` and `name` on a call's first chunk, arguments in pieces
 * after: one whole piece is allowed); `{}` with `finish_reason` (and the
 * turn's `logprobs` when asked); the usage chunk `{choices: [], usage}` only
 * with `stream_options.include_usage` (then every other chunk has `usage:
 * null`); `data: [DONE]`. An error after the
 * first chunk is `data: {"error": {…}}` (the SDKs throw it).
 * @see https://platform.openai.com/docs/api-reference/chat-streaming/streaming
 */
export class ChatSseWriter extends SseTurnWriter {
  constructor(
    write: (s: string) => void,
    private readonly o: { includeUsage?: boolean } = {},
  ) {
    super(write);
  }
  private chunk(delta: Record<string, unknown>, finish: ChatReply["finish_reason"] | null = null, logprobs: unknown = null): void {
    const h = this.head!;
    // With include_usage every other chunk carries `usage: null` (OpenAI's `stream_options` doc).
    const usage = this.o.includeUsage ? { usage: null } : {};
    this.write(`data: ${JSON.stringify({ id: h.id, object: "chat.completion.chunk", created: h.created, model: h.model, choices: [{ index: 0, delta, logprobs, finish_reason: finish }], ...usage })}\n\n`);
  }
  protected begin(): void {
    this.chunk({ role: "assistant", content: "" });
  }
  protected onReasoning(text: string): void {
    // Sent even when "" (`<think></think>`): the reply's `reasoning_content` is "" then, not absent.
    this.chunk({ reasoning_content: text });
  }
  protected onContent(delta: string): void {
    this.chunk({ content: delta });
  }
  protected end(r: ChatReply): void {
    (r.message.tool_calls ?? []).forEach((c, index) => this.chunk({ tool_calls: [{ index, id: c.id, type: "function", function: { name: c.function.name, arguments: c.function.arguments } }] }));
    const lps = r.logprobs ? { content: r.logprobs.map((e) => ({ token: e.token, logprob: e.logprob, bytes: e.bytes, top_logprobs: [] })), refusal: null } : null;
    this.chunk({}, r.finish_reason, lps);
    if (this.o.includeUsage) {
      const h = this.head!;
      this.write(`data: ${JSON.stringify({ id: h.id, object: "chat.completion.chunk", created: h.created, model: h.model, choices: [], usage: { ...r.usage } })}\n\n`);
    }
    this.write("data: [DONE]\n\n");
  }
  protected error(status: number, message: string): void {
    this.write(`data: ${JSON.stringify({ error: { code: status >= 500 ? "internal" : "stream_error", type: status >= 500 ? "server_error" : "invalid_request_error", message } })}\n\n`);
  }
}

/**
 * OpenAI Responses events (`event: <type>` + `data: <json>`, `sequence_number`
 * from 0): `response.created`, `response.in_progress`; a reasoning item
 * (`response.output_item.added`, `response.content_part.added`,
 * `response.reasoning_text.delta`/`.done`, `response.content_part.done`,
 * `response.output_item.done`), closed when the text starts; a message item
 * (`…output_item.added`, `…content_part.added`, `response.output_text.delta`s,
 * `…output_text.done`, `…content_part.done`, `…output_item.done`); per call a
 * function_call item (`…output_item.added` with empty arguments,
 * `response.function_call_arguments.delta`/`.done`, `…output_item.done`); last
 * `response.completed` (or `response.incomplete`) with the object
 * `responsesBody` returns. An error is the `error` event.
 * @see https://platform.openai.com/docs/api-reference/responses-streaming
 */
export class ResponsesSseWriter extends SseTurnWriter {
  private seq = 0;
  private index = 0;
  private reasoningOpen = false;
  private messageOpen = false;

  constructor(
    write: (s: string) => void,
    private readonly o: { messages: number; instructions: boolean; echo: ResponsesEcho },
  ) {
    super(write);
  }
  private ev(type: string, data: Record<string, unknown>): void {
    this.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data, sequence_number: this.seq++ })}\n\n`);
  }
  private get responseId(): string {
    return responseIdOf(pendingReply(this.head!), this.o.messages, this.o.instructions);
  }
  private get tail(): string {
    return this.responseId.replace(/^resp_/, "");
  }
  protected begin(h: StreamHead): void {
    const pending = responseObject(pendingReply(h), this.responseId, this.o.echo, [], "in_progress");
    this.ev("response.created", { response: pending });
    this.ev("response.in_progress", { response: pending });
  }
  protected onReasoning(text: string): void {
    if (!text) return;
    const item_id = `rs_${this.tail}`;
    this.ev("response.output_item.added", { output_index: this.index, item: { id: item_id, type: "reasoning", summary: [], content: [], status: "in_progress" } });
    this.ev("response.content_part.added", { item_id, output_index: this.index, content_index: 0, part: { type: "reasoning_text", text: "" } });
    this.ev("response.reasoning_text.delta", { item_id, output_index: this.index, content_index: 0, delta: text });
    this.reasoningOpen = true;
  }
  private closeReasoning(status: string): void {
    if (!this.reasoningOpen) return;
    const item_id = `rs_${this.tail}`;
    const text = this.sentReasoning!;
    this.ev("response.reasoning_text.done", { item_id, output_index: this.index, content_index: 0, text });
    this.ev("response.content_part.done", { item_id, output_index: this.index, content_index: 0, part: { type: "reasoning_text", text } });
    this.ev("response.output_item.done", { output_index: this.index, item: { id: item_id, type: "reasoning", summary: [], content: [{ type: "reasoning_text", text }], status } });
    this.reasoningOpen = false;
    this.index++;
  }
  private openMessage(): void {
    const item_id = `msg_${this.tail}`;
    this.ev("response.output_item.added", { output_index: this.index, item: { id: item_id, type: "message", role: "assistant", status: "in_progress", content: [] } });
    this.ev("response.content_part.added", { item_id, output_index: this.index, content_index: 0, part: { type: "output_text", text: "", annotations: [], logprobs: [] } });
    this.messageOpen = true;
  }
  protected onContent(delta: string): void {
    this.closeReasoning("completed");
    if (!this.messageOpen) this.openMessage();
    this.ev("response.output_text.delta", { item_id: `msg_${this.tail}`, output_index: this.index, content_index: 0, delta, logprobs: [] });
  }
  protected end(r: ChatReply): void {
    const id = responseIdOf(r, this.o.messages, this.o.instructions);
    const items = outputItems(r, id);
    const done = r.finish_reason === "length" ? "incomplete" : "completed";
    for (const item of items) {
      if (item.type === "reasoning") this.closeReasoning(item.status as string);
      else if (item.type === "message") {
        if (!this.messageOpen) this.openMessage();
        const part = (item.content as Record<string, unknown>[])[0]!;
        const item_id = item.id as string;
        this.ev("response.output_text.done", { item_id, output_index: this.index, content_index: 0, text: part.text, logprobs: [] });
        this.ev("response.content_part.done", { item_id, output_index: this.index, content_index: 0, part });
        this.ev("response.output_item.done", { output_index: this.index++, item });
        this.messageOpen = false;
      } else {
        const item_id = item.id as string;
        const args = item.arguments as string;
        this.ev("response.output_item.added", { output_index: this.index, item: { ...item, arguments: "", status: "in_progress" } });
        this.ev("response.function_call_arguments.delta", { item_id, output_index: this.index, delta: args });
        this.ev("response.function_call_arguments.done", { item_id, output_index: this.index, name: item.name, arguments: args });
        this.ev("response.output_item.done", { output_index: this.index++, item });
      }
    }
    this.ev(done === "incomplete" ? "response.incomplete" : "response.completed", { response: responseObject(r, id, this.o.echo, items, done) });
  }
  protected error(status: number, message: string): void {
    this.ev("error", { code: status >= 500 ? "server_error" : "invalid_request", message, param: null });
  }
}

/**
 * Anthropic Messages events (`event: <type>` + `data: <json>`):
 * `message_start` (the message with empty content, null `stop_reason`,
 * `output_tokens` 0), `ping`; a `thinking` block (`content_block_start` with
 * `thinking: ""` and `signature: ""`, `thinking_delta`, `signature_delta`,
 * `content_block_stop`) when the turn has reasoning; a `text` block
 * (`content_block_start` with `text: ""`, `text_delta`s,
 * `content_block_stop`); per call a `tool_use` block (start with `input: {}`,
 * one `input_json_delta` with the input's JSON, stop); `message_delta`
 * (`stop_reason`, `stop_sequence`, usage) and `message_stop`. An error is the
 * `error` event `{type: "error", error: {type, message}}`.
 * @see https://docs.anthropic.com/en/docs/build-with-claude/streaming
 */
export class MessagesSseWriter extends SseTurnWriter {
  private index = 0;
  private textOpen = false;

  private ev(type: string, data: Record<string, unknown>): void {
    this.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  }
  protected begin(h: StreamHead): void {
    const r = pendingReply(h);
    this.ev("message_start", { message: { ...messageObject(r, [], { stop_reason: null, stop_sequence: null }, 0), id: messageIdOf(r) } });
    this.ev("ping", {});
  }
  protected onReasoning(text: string): void {
    const index = this.index++;
    this.ev("content_block_start", { index, content_block: { type: "thinking", thinking: "", signature: "" } });
    this.ev("content_block_delta", { index, delta: { type: "thinking_delta", thinking: text } });
    this.ev("content_block_delta", { index, delta: { type: "signature_delta", signature: thinkingSignature(text) } });
    this.ev("content_block_stop", { index });
  }
  protected onContent(delta: string): void {
    if (!this.textOpen) {
      this.textOpen = true;
      this.ev("content_block_start", { index: this.index, content_block: { type: "text", text: "", citations: null } });
    }
    this.ev("content_block_delta", { index: this.index, delta: { type: "text_delta", text: delta } });
  }
  protected end(r: ChatReply): void {
    if (this.textOpen) this.ev("content_block_stop", { index: this.index++ });
    this.textOpen = false;
    for (const b of blocksOf(r)) {
      if (b.type !== "tool_use") continue;
      const index = this.index++;
      this.ev("content_block_start", { index, content_block: { ...b, input: {} } });
      this.ev("content_block_delta", { index, delta: { type: "input_json_delta", partial_json: JSON.stringify(b.input) } });
      this.ev("content_block_stop", { index });
    }
    const reason = stopReasonOf(r);
    this.ev("message_delta", {
      delta: { stop_reason: reason, stop_sequence: reason === "stop_sequence" ? r.stop_sequence! : null, stop_details: null, container: null },
      usage: { input_tokens: r.usage.prompt_tokens, output_tokens: r.usage.completion_tokens, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, server_tool_use: null },
    });
    this.ev("message_stop", {});
  }
  protected error(status: number, message: string): void {
    const type = status >= 500 ? "api_error" : "invalid_request_error";
    this.ev("error", { error: { type, message } });
  }
}

/**
 * The whole SSE body of a streamed reply (a reply written whole: a replay; a turn being sampled streams the same events through the SSE writer of `sse-writers.ts`), each event `event: <type>\ndata: <json>\n\n`:
 * `message_start` (the message with empty content, null stop_reason,
 * output_tokens 0), `ping`, per block `content_block_start` (the block
 * empty: `text ""`, `thinking ""` + `signature ""`, `tool_use` with `input
 * {}`), its deltas (`thinking_delta` then `signature_delta`; `text_delta`;
 * `input_json_delta` with the input's JSON) and `content_block_stop`, then
 * `message_delta` `{delta: {stop_reason, stop_sequence, stop_details: null,
 * container: null}, usage}` and `message_stop`. Follows
 * `RawMessageStreamEvent` of `@anthropic-ai/sdk` v1.16.0, read back by its
 * `MessageStream` accumulator.
 */
export function messagesSse(r: ChatReply): string {
  let out = "";
  new MessagesSseWriter((s) => (out += s)).finish(r);
  return out;
}

/**
 * The whole SSE body of a streamed reply (a reply written whole: a replay; a turn being sampled streams the same events through the SSE writer of `sse-writers.ts`), each event `event: <type>\ndata: <json>\n\n` with a
 * `sequence_number` from 0: `response.created` and `response.in_progress`
 * (status `in_progress`, no output); per output item `response.output_item.added`,
 * then for a reasoning item `response.content_part.added`,
 * `response.reasoning_text.delta`/`.done`, `response.content_part.done`; for a
 * message `response.content_part.added`, `response.output_text.delta`/`.done`,
 * `response.content_part.done`; for a function call
 * `response.function_call_arguments.delta`/`.done`; then
 * `response.output_item.done`; last `response.completed` (or
 * `response.incomplete` when cut by a budget), carrying the object
 * {@link responsesBody} returns.
 * @see https://platform.openai.com/docs/api-reference/responses-streaming
 */
export function responsesSse(r: ChatReply, responseId: string, echo: ResponsesEcho): string {
  const ref = /-(\d+)(i?)$/.exec(responseId)!;
  let out = "";
  new ResponsesSseWriter((s) => (out += s), { messages: Number(ref[1]), instructions: ref[2] === "i", echo }).finish(r);
  return out;
}

/**
 * The whole SSE body of a streamed reply, in OpenAI's `chat.completion.chunk`
 * format (a reply written whole: a replay; a turn being sampled streams the same events through the SSE writer of `sse-writers.ts`). Events, each
 * `data: <json>\n\n`:
 * 1. `delta: {role: "assistant", content: ""}`;
 * 2. `delta: {reasoning_content}` when the turn has reasoning;
 * 3. `delta: {content}` when it has content;
 * 4. per tool call k: `delta: {tool_calls: [{index: k, id, type: "function", function: {name, arguments}}]}`;
 * 5. `delta: {}` with `finish_reason`, and the turn's `logprobs` when requested
 *    (every sampled token on this one chunk; OpenAI clients concatenate chunks' log-probs);
 * 6. a usage chunk `{choices: [], usage}` when `includeUsage` (the request's
 *    `stream_options.include_usage`, OpenAI's rule: without it no chunk has
 *    empty `choices`, so code that reads `chunk.choices[0]` never breaks);
 * 7. `data: [DONE]`.
 * @see https://platform.openai.com/docs/api-reference/chat-streaming/streaming
 */
export function chatCompletionSse(r: ChatReply, o: { includeUsage?: boolean } = {}): string {
  let out = "";
  new ChatSseWriter((s) => (out += s), o).finish(r);
  return out;
}
