/** The Responses wire's translation into a ChatRequest and its response ids, exactly (no engine). */
import { describe, expect, test } from "bun:test";
import { fnv1a32 } from "../../shared/inference/hash.ts";
import { parseResponseId, parseResponsesRequest, responseIdOf, responsesChatRequest } from "../../shared/agent-gateway/responses-wire.ts";
import { responsesSse } from "../../shared/agent-gateway/sse-writers.ts";
import type { ChatReply } from "../../shared/agent-gateway/openai-wire.ts";
import { InputError } from "../../shared/errors.ts";

describe("parseResponsesRequest", () => {
  test("items become chat messages: calls join the assistant message before them, reasoning the next assistant message, developer is system", () => {
    const p = parseResponsesRequest({
      model: "m",
      instructions: "Be brief.",
      input: [
        { role: "developer", content: "Use tools." },
        { type: "message", role: "user", content: [{ type: "input_text", text: "2+" }, { type: "input_text", text: "3?" }] },
        { type: "reasoning", id: "rs_1", summary: [{ type: "summary_text", text: "ignored: content wins" }], content: [{ type: "reasoning_text", text: "Add." }] },
        { type: "message", id: "msg_1", role: "assistant", status: "completed", content: [{ type: "output_text", text: "Let me add.", annotations: [], logprobs: [] }] },
        { type: "function_call", id: "fc_1", call_id: "c1", name: "calc", arguments: '{"e":"2+3"}', status: "completed" },
        { type: "function_call", id: "fc_2", call_id: "c2", name: "calc", arguments: '{"e":"3+2"}', status: "completed" },
        { type: "function_call_output", call_id: "c1", output: "5" },
        { type: "function_call_output", call_id: "c2", output: [{ type: "input_text", text: "5" }] },
        { type: "reasoning", id: "rs_2", summary: [{ type: "summary_text", text: "Both" }, { type: "summary_text", text: "agree." }] },
        { type: "function_call", call_id: "c3", name: "calc", arguments: "{}" },
      ],
      tools: [{ type: "function", name: "calc", description: "adds", parameters: { type: "object", properties: { e: { type: "string" } } }, strict: true }],
      temperature: 0.5,
      max_output_tokens: 64,
      stream: true,
    });
    const req = responsesChatRequest(p, null);
    expect(req).toEqual({
      model: "m",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "system", content: "Use tools." },
        { role: "user", content: "2+3?" },
        {
          role: "assistant",
          content: "Let me add.",
          reasoning_content: "Add.",
          tool_calls: [
            { id: "c1", type: "function", function: { name: "calc", arguments: '{"e":"2+3"}' } },
            { id: "c2", type: "function", function: { name: "calc", arguments: '{"e":"3+2"}' } },
          ],
        },
        { role: "tool", tool_call_id: "c1", content: "5" },
        { role: "tool", tool_call_id: "c2", content: "5" },
        { role: "assistant", content: null, reasoning_content: "Both\n\nagree.", tool_calls: [{ id: "c3", type: "function", function: { name: "calc", arguments: "{}" } }] },
      ],
      tools: [{ type: "function", function: { name: "calc", description: "adds", parameters: { type: "object", properties: { e: { type: "string" } } } } }],
      tool_choice: "auto",
      stream: true,
      logprobs: false,
      temperature: 0.5,
      max_tokens: 64,
    });
  });

  test("a string input is one user message; previous conversation goes between instructions and input, its own instructions dropped", () => {
    const p = parseResponsesRequest({ input: "next", instructions: "New rules." });
    const prev = { messages: [{ role: "system" as const, content: "Old rules." }, { role: "user" as const, content: "first" }, { role: "assistant" as const, content: "ok" }], instructions: true };
    expect(responsesChatRequest(p, prev).messages).toEqual([
      { role: "system", content: "New rules." },
      { role: "user", content: "first" },
      { role: "assistant", content: "ok" },
      { role: "user", content: "next" },
    ]);
    expect(responsesChatRequest(p, { ...prev, instructions: false }).messages.length).toBe(5);
    expect(() => responsesChatRequest(parseResponsesRequest({}), null)).toThrow(new InputError("input", "required: a string or a non-empty list of input items"));
  });

  test("errors name the field", () => {
    const field = (body: unknown) => {
      try {
        parseResponsesRequest(body);
      } catch (e) {
        return (e as InputError).field;
      }
      return null;
    };
    expect(field([])).toBe("body");
    expect(field({ input: [{ type: "function_call", call_id: "c", name: "", arguments: "{}" }] })).toBe("input[0].name");
    expect(field({ input: [{ type: "function_call", call_id: "c", name: "f", arguments: { a: 1 } }] })).toBe("input[0].arguments");
    expect(field({ input: [{ type: "function_call_output", output: "x" }] })).toBe("input[0].call_id");
    expect(field({ input: [{ type: "function_call_output", call_id: "c", output: [{ type: "input_image" }] }] })).toBe("input[0].output[0].image_url");
    expect(field({ input: [{ type: "function_call_output", call_id: "c", output: [{ type: "input_file", file_id: "f" }] }] })).toBe("input[0].output[0].type");
    expect(field({ input: "x", tools: [{ type: "function" }] })).toBe("tools[0].name");
    expect(field({ input: "x", tools: [{ type: "file_search" }] })).toBe("tools[0].type");
    expect(field({ input: "x", text: { format: { type: "json_object" } } })).toBe("text.format");
    expect(field({ input: "x", include: ["nope"] })).toBe("include[0]");
    expect(field({ input: "x", top_p: 0 })).toBe("top_p");
    expect(field({ input: "x", stream: "yes" })).toBe("stream");
    expect(field({ input: "x", previous_response_id: "" })).toBe("previous_response_id");
  });
});

describe("response ids", () => {
  const reply: ChatReply = {
    id: `chatcmpl-${fnv1a32("k_0_0").toString(16)}-1-2-7`,
    created: 1,
    model: "m",
    message: { role: "assistant", content: "hi" },
    finish_reason: "stop",
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  };
  test("name the output, turn, step and message count; only the session's own parse", () => {
    const id = responseIdOf(reply, 4, true);
    expect(id).toBe(`resp_${fnv1a32("k_0_0").toString(16)}-1-2-7-4i`);
    expect(parseResponseId("k_0_0", id)).toEqual({ keyHash: fnv1a32("k_0_0").toString(16), output: 1, turn: 2, step: 7, messages: 4, instructions: true });
    expect(parseResponseId("other_0_0", id)).toBeNull();
    expect(parseResponseId("k_0_0", "resp_abc")).toBeNull();
  });
  test("an SSE body is `event:`/`data:` pairs whose data type is the event name", () => {
    const echo = parseResponsesRequest({ input: "x" }).echo;
    const sse = responsesSse(reply, responseIdOf(reply, 1, false), echo);
    const events = sse.trim().split("\n\n").map((b) => b.split("\n"));
    expect(events.every(([e, d]) => e!.startsWith("event: ") && JSON.parse(d!.slice(6)).type === e!.slice(7))).toBe(true);
    expect(events.map(([e]) => e!.slice(7))).toEqual([
      "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
    ]);
  });
});
