/** The Messages wire's pure translation: request → ChatRequest, ChatReply → stop reasons, errors → Anthropic's shape. */
import { describe, expect, test } from "bun:test";
import { anthropicError, messagesBody, parseMessagesRequest, stopReasonOf } from "../../shared/agent-gateway/messages-wire.ts";
import type { ChatReply } from "../../shared/agent-gateway/openai-wire.ts";

const reply = (over: Partial<ChatReply> = {}): ChatReply => ({
  id: "chatcmpl-ab12-0-1-1",
  created: 1,
  model: "qwen3",
  message: { role: "assistant", content: "hi" },
  finish_reason: "stop",
  usage: { prompt_tokens: 10, completion_tokens: 3, total_tokens: 13 },
  ...over,
});

describe("parseMessagesRequest", () => {
  test("system blocks, a user turn of tool_results then text, an assistant turn of thinking + text + tool_use", () => {
    const r = parseMessagesRequest({
      model: "claude-x",
      max_tokens: 100,
      system: [{ type: "text", text: "Be " }, { type: "text", text: "brief." }],
      messages: [
        { role: "user", content: "Add 2 and 3, then 4 and 5." },
        {
          role: "assistant",
          content: [
            { type: "thinking", thinking: "Two sums.", signature: "sig" },
            { type: "text", text: "Calling." },
            { type: "tool_use", id: "t1", name: "calc", input: { expression: "2+3" }, caller: { type: "direct" } },
            { type: "tool_use", id: "t2", name: "calc", input: { expression: "4+5" } },
          ],
        },
        {
          role: "user",
          content: [
            { type: "text", text: "Here:" },
            { type: "tool_result", tool_use_id: "t1", content: "5" },
            { type: "tool_result", tool_use_id: "t2", content: [{ type: "text", text: "9" }], is_error: false, cache_control: { type: "ephemeral" } },
          ],
        },
      ],
      tools: [{ name: "calc", description: "math", input_schema: { type: "object", properties: { expression: { type: "string" } } } }],
      tool_choice: { type: "auto", disable_parallel_tool_use: true },
      temperature: 0.7,
      top_p: 0.9,
      stop_sequences: ["END"],
      stream: true,
    });
    expect(r).toEqual({
      model: "claude-x",
      messages: [
        { role: "system", content: [{ type: "text", text: "Be " }, { type: "text", text: "brief." }] },
        { role: "user", content: "Add 2 and 3, then 4 and 5." },
        {
          role: "assistant",
          content: "Calling.",
          reasoning_content: "Two sums.",
          tool_calls: [
            { id: "t1", type: "function", function: { name: "calc", arguments: '{"expression":"2+3"}' } },
            { id: "t2", type: "function", function: { name: "calc", arguments: '{"expression":"4+5"}' } },
          ],
        },
        { role: "tool", tool_call_id: "t1", content: "5" },
        { role: "tool", tool_call_id: "t2", content: [{ type: "text", text: "9" }] },
        { role: "user", content: [{ type: "text", text: "Here:" }] },
      ],
      tools: [{ type: "function", function: { name: "calc", description: "math", parameters: { type: "object", properties: { expression: { type: "string" } } } } }],
      tool_choice: "auto",
      max_tokens: 100,
      temperature: 0.7,
      top_p: 0.9,
      stop: ["END"],
      stream: true,
      logprobs: false,
    });
  });

  test("an assistant turn of only tool_use has null content; tool_choice none; an empty user turn is refused", () => {
    const r = parseMessagesRequest({
      model: "m",
      max_tokens: 1,
      messages: [
        { role: "user", content: "x" },
        { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "f", input: {} }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "t1", content: "ok" }] },
      ],
      tool_choice: { type: "none" },
    });
    expect(r.messages[1]).toEqual({ role: "assistant", content: null, tool_calls: [{ id: "t1", type: "function", function: { name: "f", arguments: "{}" } }] });
    expect(r.tool_choice).toBe("none");
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 1, messages: [{ role: "user", content: [] }] })).toThrow("messages[0].content: must hold at least one content block");
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 1, messages: [{ role: "assistant", content: [{ type: "redacted_thinking", data: "x" }] }] })).toThrow(
      'messages[0].content[0].type: "redacted_thinking" blocks are not supported in an assistant turn',
    );
    expect(() => parseMessagesRequest({ max_tokens: 1, messages: [{ role: "user", content: "x" }] })).toThrow("model: required");
  });

  test("a final assistant message (a prefill) and a tool_result without its tool_use are 400s naming the block", () => {
    const use = { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "f", input: {} }] };
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "x" }, { role: "assistant", content: "The answer is" }] })).toThrow(
      "messages[1].role: a final assistant message (a prefill the reply would continue) is not supported by edgeloop's Messages endpoint: end with a user turn",
    );
    const result = (id: string) => ({ role: "user", content: [{ type: "text", text: "and" }, { type: "tool_result", tool_use_id: id, content: "31" }] });
    // No tool_use at all; another id than the previous turn's; a result a turn too late.
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 1, messages: [result("toolu_nope")] })).toThrow(
      'messages[0].content[1].tool_use_id: tool_result block for "toolu_nope" has no matching tool_use block in the previous assistant message',
    );
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "x" }, use, result("t2")] })).toThrow("messages[2].content[1].tool_use_id: tool_result block for \"t2\"");
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "x" }, use, result("t1"), { role: "assistant", content: "done" }, result("t1")] })).toThrow(
      "messages[4].content[1].tool_use_id",
    );
    expect(parseMessagesRequest({ model: "m", max_tokens: 1, messages: [{ role: "user", content: "x" }, use, result("t1")] }).messages.map((m) => m.role)).toEqual(["user", "assistant", "tool", "user"]);
  });
});

describe("replies and errors", () => {
  test("stop reasons", () => {
    expect(stopReasonOf(reply())).toBe("end_turn");
    expect(stopReasonOf(reply({ stop_sequence: "END" }))).toBe("stop_sequence");
    expect(stopReasonOf(reply({ finish_reason: "length" }))).toBe("max_tokens");
    expect(stopReasonOf(reply({ finish_reason: "tool_calls" }))).toBe("tool_use");
    expect(messagesBody(reply({ stop_sequence: "END" }))).toMatchObject({ id: "msg_ab12-0-1-1", stop_reason: "stop_sequence", stop_sequence: "END", content: [{ type: "text", text: "hi", citations: null }] });
    // An empty turn has no blocks.
    expect(messagesBody(reply({ message: { role: "assistant", content: "" } })).content).toEqual([]);
  });

  test("statuses and types: 503 is the API's 529 overloaded_error, other 5xx but 504 are 500 api_error", () => {
    const e = (status: number) => anthropicError(status, "m");
    expect([400, 401, 404, 409, 413, 415, 429, 502, 503, 504, 500].map((s) => [e(s).status, (e(s).body.error as { type: string }).type])).toEqual([
      [400, "invalid_request_error"],
      [401, "authentication_error"],
      [404, "not_found_error"],
      [409, "conflict_error"],
      [413, "request_too_large"],
      [415, "invalid_request_error"],
      [429, "rate_limit_error"],
      [500, "api_error"],
      [529, "overloaded_error"],
      [504, "timeout_error"],
      [500, "api_error"],
    ]);
    expect(e(400).body).toEqual({ type: "error", error: { type: "invalid_request_error", message: "m" }, request_id: null });
  });
});
