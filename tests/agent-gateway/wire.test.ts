import { describe, expect, test } from "bun:test";
import { Hono } from "hono";
import OpenAI from "openai";
import { EdgeloopError, InputError } from "../../shared/errors.ts";
import { chatCompletionBody, modelsBody, parseChatRequest, type ChatReply, type ChatRequest } from "../../shared/agent-gateway/openai-wire.ts";
import { chatCompletionSse } from "../../shared/agent-gateway/sse-writers.ts";

const USER = { role: "user", content: "What is the weather in Paris?" };

/** The InputError `parseChatRequest(body)` throws (fails the test when it does not throw one). */
function rejection(body: unknown): InputError {
  try {
    parseChatRequest(body);
  } catch (e) {
    if (e instanceof InputError) return e;
    throw e;
  }
  throw new Error(`expected an InputError for ${JSON.stringify(body)}`);
}

/** The field a body with `over` merged into a minimal valid request is refused for. */
function fieldOf(over: Record<string, unknown>): string | undefined {
  return rejection({ model: "m", messages: [USER], ...over }).field;
}

describe("parseChatRequest: accepted requests", () => {
  test("a minimal request gets the defaults; optional fields stay absent", () => {
    expect(parseChatRequest({ messages: [USER] })).toEqual({
      model: null,
      messages: [{ role: "user", content: "What is the weather in Paris?" }],
      tools: undefined,
      tool_choice: "auto",
      stream: false,
      logprobs: false,
    });
  });

  test("a full agent conversation as the openai SDK / LangGraph send it", () => {
    const body = {
      model: "Qwen/Qwen3-8B",
      messages: [
        { role: "developer", content: "You are terse." },
        { role: "system", content: [{ type: "text", text: "Use tools." }] },
        { role: "user", content: [{ type: "text", text: "Weather in " }, { type: "text", text: "Paris?" }], name: "alice" },
        {
          role: "assistant",
          content: null,
          refusal: null,
          annotations: [],
          audio: null,
          function_call: null,
          reasoning_content: "The user wants weather.",
          tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }],
        },
        { role: "tool", tool_call_id: "call_1", content: "18°C, sunny" },
        { role: "assistant", content: "It is 18°C.", reasoning: "Read the tool result." },
        { role: "user", content: "Thanks" },
      ],
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            description: "Weather for a city",
            parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
            strict: true,
          },
        },
        { type: "function", function: { name: "noop" } },
      ],
      tool_choice: "auto",
      temperature: 0.7,
      top_p: 0.9,
      seed: 42,
      max_tokens: 100,
      max_completion_tokens: 256,
      stop: ["\nObservation:", "END"],
      stream: true,
      stream_options: { include_usage: true },
      logprobs: true,
      top_logprobs: 0,
      n: 1,
      frequency_penalty: 0,
      presence_penalty: 0,
      response_format: { type: "text" },
      logit_bias: {},
      user: "u-1",
      metadata: { run: "x" },
      store: false,
      parallel_tool_calls: true,
      service_tier: "auto",
      reasoning_effort: "low",
    };
    const want: ChatRequest = {
      model: "Qwen/Qwen3-8B",
      messages: [
        { role: "system", content: "You are terse." },
        { role: "system", content: [{ type: "text", text: "Use tools." }] },
        { role: "user", content: [{ type: "text", text: "Weather in " }, { type: "text", text: "Paris?" }], name: "alice" },
        {
          role: "assistant",
          content: null,
          reasoning_content: "The user wants weather.",
          tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }],
        },
        { role: "tool", tool_call_id: "call_1", content: "18°C, sunny" },
        { role: "assistant", content: "It is 18°C.", reasoning_content: "Read the tool result." },
        { role: "user", content: "Thanks" },
      ],
      tools: [
        {
          type: "function",
          function: {
            name: "get_weather",
            description: "Weather for a city",
            parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false },
          },
        },
        { type: "function", function: { name: "noop", description: "", parameters: { type: "object", properties: {} } } },
      ],
      tool_choice: "auto",
      temperature: 0.7,
      top_p: 0.9,
      seed: 42,
      max_tokens: 256,
      stop: ["\nObservation:", "END"],
      stream: true,
      include_usage: true,
      logprobs: true,
    };
    expect(parseChatRequest(body)).toEqual(want);
  });

  test("null counts as absent; stop as a string; tools [] and tool_choice none; max_tokens alone", () => {
    const r = parseChatRequest({
      model: null,
      messages: [USER],
      tools: [],
      tool_choice: "none",
      temperature: null,
      top_p: null,
      seed: null,
      stop: "###",
      max_tokens: 7,
      stream: null,
      logprobs: null,
      n: null,
      top_logprobs: null,
      response_format: null,
      logit_bias: null,
    });
    expect(r).toEqual({
      model: null,
      messages: [{ role: "user", content: "What is the weather in Paris?" }],
      tools: undefined,
      tool_choice: "none",
      max_tokens: 7,
      stop: ["###"],
      stream: false,
      logprobs: false,
    });
    expect("temperature" in r || "top_p" in r || "seed" in r).toBe(false);
    expect(parseChatRequest({ messages: [USER], stop: [] }).stop).toBeUndefined();
    expect(parseChatRequest({ messages: [USER], temperature: 0, top_p: 1 })).toMatchObject({ temperature: 0, top_p: 1 });
    expect(parseChatRequest({ messages: [USER], temperature: 2 }).temperature).toBe(2);
  });

  test("an assistant tool call with object arguments is kept as given", () => {
    const r = parseChatRequest({
      messages: [USER, { role: "assistant", tool_calls: [{ id: "c", function: { name: "f", arguments: { a: 1 } } }] }],
    });
    expect(r.messages[1]).toEqual({ role: "assistant", content: null, tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: { a: 1 } } }] });
  });
});

describe("parseChatRequest: each refusal names its field", () => {
  test("the body itself", () => {
    for (const b of [null, "hi", [USER], 3]) expect(rejection(b).field).toBe("body");
  });

  test("messages", () => {
    expect(rejection({}).field).toBe("messages");
    expect(rejection({ messages: [] }).message).toBe("messages: must hold at least one message");
    expect(rejection({ messages: "hi" }).field).toBe("messages");
    expect(rejection({ messages: [USER, "hi"] }).field).toBe("messages[1]");
    const role = rejection({ messages: [USER, USER, { role: "function", content: "x" }] });
    expect(role.field).toBe("messages[2].role");
    expect(role.message).toBe('messages[2].role: expected one of system, developer, user, assistant, tool; got "function"');
    expect(rejection({ messages: [{ content: "x" }] }).field).toBe("messages[0].role");
  });

  test("content: images only in user messages (read for a vision family: tests/vision/gateway-images.test.ts), audio and file parts refused; null only for an assistant with tool calls", () => {
    const image = rejection({
      messages: [USER, { role: "assistant", content: [{ type: "image_url", image_url: { url: "data:image/png;base64,AA" } }] }, USER],
    });
    const why = `messages[1].content[0].type: "image_url" parts are not supported here: image parts are accepted in user messages only (as OpenAI's chat API takes them)`;
    expect([image.field, image.message, image.status]).toEqual(["messages[1].content[0].type", why, 400]);
    expect(image.toJSON()).toEqual({ error: { code: "invalid_input", message: why, field: "messages[1].content[0].type" } });
    expect(parseChatRequest({ messages: [USER, { role: "user", content: [{ type: "image_url", image_url: { url: "data:image/png;base64,AA" } }] }] }).messages[1]!.content).toEqual([{ type: "image_url", image_url: { url: "data:image/png;base64,AA" } }]);
    const parts = (p: unknown) => ({ messages: [{ role: "user", content: [{ type: "text", text: "a" }, p] }] });
    expect(rejection(parts({ type: "input_audio", input_audio: { data: "AA", format: "wav" } })).field).toBe("messages[0].content[1].type");
    expect(rejection(parts({ type: "file", file: { file_id: "f" } })).field).toBe("messages[0].content[1].type");
    expect(rejection(parts({ text: "no type" })).field).toBe("messages[0].content[1].type");
    expect(rejection(parts({ type: "text", text: 3 })).field).toBe("messages[0].content[1].text");
    expect(rejection({ messages: [{ role: "user", content: null }] }).field).toBe("messages[0].content");
    expect(rejection({ messages: [{ role: "user" }] }).field).toBe("messages[0].content");
    expect(rejection({ messages: [{ role: "user", content: 5 }] }).field).toBe("messages[0].content");
    expect(rejection({ messages: [USER, { role: "assistant", content: null }] }).field).toBe("messages[1].content");
  });

  test("assistant tool calls, tool messages, names", () => {
    const call = (c: unknown) => ({ messages: [USER, { role: "assistant", content: null, tool_calls: [{ id: "a", function: { name: "f", arguments: "{}" } }, c] }] });
    expect(fieldOf(call({ function: { name: "f", arguments: "{}" } }))).toBe("messages[1].tool_calls[1].id");
    expect(fieldOf(call({ id: "b", type: "custom", function: { name: "f", arguments: "{}" } }))).toBe("messages[1].tool_calls[1].type");
    expect(fieldOf(call({ id: "b", function: { name: "", arguments: "{}" } }))).toBe("messages[1].tool_calls[1].function.name");
    expect(fieldOf(call({ id: "b", function: { name: "f", arguments: 3 } }))).toBe("messages[1].tool_calls[1].function.arguments");
    expect(fieldOf({ messages: [USER, { role: "assistant", content: "x", tool_calls: "no" }] })).toBe("messages[1].tool_calls");
    expect(fieldOf({ messages: [USER, { role: "tool", content: "18°C" }] })).toBe("messages[1].tool_call_id");
    expect(fieldOf({ messages: [USER, { role: "tool", content: "18°C", tool_call_id: 7 }] })).toBe("messages[1].tool_call_id");
    expect(fieldOf({ messages: [{ role: "user", content: "x", name: 1 }] })).toBe("messages[0].name");
    expect(fieldOf({ messages: [USER, { role: "assistant", content: "x", reasoning_content: 1 }] })).toBe("messages[1].reasoning_content");
  });

  test("tools and tool_choice", () => {
    expect(fieldOf({ tools: { type: "function" } })).toBe("tools");
    const web = rejection({ messages: [USER], tools: [{ type: "function", function: { name: "f" } }, { type: "web_search" }] });
    expect(web.field).toBe("tools[1].type");
    expect(web.message).toBe('tools[1].type: only "function" tools are supported, got "web_search"');
    expect(fieldOf({ tools: [{ type: "function" }] })).toBe("tools[0].function");
    expect(fieldOf({ tools: [{ type: "function", function: { name: "" } }] })).toBe("tools[0].function.name");
    expect(fieldOf({ tools: [{ type: "function", function: { name: "f", parameters: "x" } }] })).toBe("tools[0].function.parameters");
    expect(fieldOf({ tools: [{ type: "function", function: { name: "f", parameters: { type: "array" } } }] })).toBe("tools[0].function.parameters.type");
    const required = rejection({ messages: [USER], tool_choice: "required" });
    expect(required.field).toBe("tool_choice");
    expect(required.message).toBe(
      'tool_choice: edgeloop samples token-in/token-out without guided decoding: only "auto" and "none" are supported, got "required"',
    );
    expect(fieldOf({ tool_choice: { type: "function", function: { name: "f" } } })).toBe("tool_choice");
  });

  test("sampling fields out of range", () => {
    expect(fieldOf({ temperature: 2.5 })).toBe("temperature");
    expect(fieldOf({ temperature: -0.1 })).toBe("temperature");
    expect(fieldOf({ temperature: "hot" })).toBe("temperature");
    expect(fieldOf({ top_p: 0 })).toBe("top_p");
    expect(fieldOf({ top_p: 1.01 })).toBe("top_p");
    expect(fieldOf({ seed: 1.5 })).toBe("seed");
    expect(fieldOf({ max_tokens: 0 })).toBe("max_tokens");
    expect(fieldOf({ max_tokens: 2.5 })).toBe("max_tokens");
    expect(fieldOf({ max_completion_tokens: -1 })).toBe("max_completion_tokens");
    expect(fieldOf({ stream: "yes" })).toBe("stream");
    expect(fieldOf({ logprobs: 1 })).toBe("logprobs");
    expect(fieldOf({ model: 3 })).toBe("model");
  });

  test("stop: at most 4 non-empty strings", () => {
    expect(rejection({ messages: [USER], stop: ["a", "b", "c", "d", "e"] }).message).toBe("stop: at most 4 stop strings, got 5");
    expect(fieldOf({ stop: "" })).toBe("stop");
    expect(fieldOf({ stop: ["a", ""] })).toBe("stop[1]");
    expect(fieldOf({ stop: ["a", 3] })).toBe("stop[1]");
    expect(fieldOf({ stop: 3 })).toBe("stop");
  });

  test("fields that would change sampling are refused at any non-default value", () => {
    const n = rejection({ messages: [USER], n: 2 });
    expect([n.field, n.message]).toEqual(["n", "n: edgeloop samples one choice per call: n must be 1 (or absent)"]);
    expect(fieldOf({ top_logprobs: 5 })).toBe("top_logprobs");
    expect(fieldOf({ frequency_penalty: 0.5 })).toBe("frequency_penalty");
    expect(fieldOf({ presence_penalty: -1 })).toBe("presence_penalty");
    expect(fieldOf({ response_format: { type: "json_object" } })).toBe("response_format");
    expect(fieldOf({ response_format: { type: "json_schema", json_schema: { name: "x", schema: {} } } })).toBe("response_format");
    expect(fieldOf({ logit_bias: { "50256": -100 } })).toBe("logit_bias");
    expect(fieldOf({ functions: [{ name: "f" }] })).toBe("functions");
    expect(fieldOf({ function_call: { name: "f" } })).toBe("function_call");
  });
});

const TOOL_REPLY: ChatReply = {
  id: "chatcmpl-k1-3",
  created: 1767225600,
  model: "Qwen/Qwen3-8B",
  message: {
    role: "assistant",
    content: "Let me check.",
    reasoning_content: "The user wants the weather.",
    tool_calls: [
      { id: "call_k1_3_0", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
      { id: "call_k1_3_1", type: "function", function: { name: "get_time", arguments: '{"tz": "CET"}' } },
    ],
  },
  finish_reason: "tool_calls",
  usage: { prompt_tokens: 31, completion_tokens: 9, total_tokens: 40 },
};

const TEXT_REPLY: ChatReply = {
  id: "chatcmpl-k2-0",
  created: 1767225601,
  model: "Qwen/Qwen3-8B",
  message: { role: "assistant", content: "Paris" },
  finish_reason: "stop",
  usage: { prompt_tokens: 12, completion_tokens: 2, total_tokens: 14 },
  logprobs: [
    { token: "Paris", logprob: -0.0123, bytes: [80, 97, 114, 105, 115] },
    { token: "<|im_end|>", logprob: -0.5, bytes: [...new TextEncoder().encode("<|im_end|>")] },
  ],
};

describe("reply bodies", () => {
  test("chat.completion: exact body with tool calls and reasoning", () => {
    expect(chatCompletionBody(TOOL_REPLY)).toEqual({
      id: "chatcmpl-k1-3",
      object: "chat.completion",
      created: 1767225600,
      model: "Qwen/Qwen3-8B",
      choices: [
        {
          index: 0,
          message: {
            role: "assistant",
            content: "Let me check.",
            refusal: null,
            reasoning_content: "The user wants the weather.",
            tool_calls: [
              { id: "call_k1_3_0", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
              { id: "call_k1_3_1", type: "function", function: { name: "get_time", arguments: '{"tz": "CET"}' } },
            ],
          },
          logprobs: null,
          finish_reason: "tool_calls",
        },
      ],
      usage: { prompt_tokens: 31, completion_tokens: 9, total_tokens: 40 },
    });
  });

  test("chat.completion: log-probs as OpenAI's {content: [{token, logprob, bytes, top_logprobs: []}]}", () => {
    const choice = (chatCompletionBody(TEXT_REPLY).choices as Record<string, unknown>[])[0];
    expect(choice.logprobs).toEqual({
      content: [
        { token: "Paris", logprob: -0.0123, bytes: [80, 97, 114, 105, 115], top_logprobs: [] },
        { token: "<|im_end|>", logprob: -0.5, bytes: [60, 124, 105, 109, 95, 101, 110, 100, 124, 62], top_logprobs: [] },
      ],
      refusal: null,
    });
    expect(choice.message).toEqual({ role: "assistant", content: "Paris", refusal: null });
  });

  test("SSE: the exact event sequence, the usage chunk only with include_usage, then [DONE]", () => {
    const one = { ...TOOL_REPLY, message: { ...TOOL_REPLY.message, tool_calls: TOOL_REPLY.message.tool_calls!.slice(0, 1) } };
    const sse = chatCompletionSse(one, { includeUsage: true });
    // Without stream_options.include_usage (OpenAI's rule) no chunk has empty choices.
    const plainSse = chatCompletionSse(one);
    // With it, every other chunk has `usage: null` (OpenAI's stream_options doc).
    expect(plainSse).toBe(sse.replace(/data: \{[^\n]*"choices":\[\],"usage"[^\n]*\n\n/, "").replaceAll(',"usage":null', ""));
    expect(plainSse).not.toContain('"usage"');
    const head = '"id":"chatcmpl-k1-3","object":"chat.completion.chunk","created":1767225600,"model":"Qwen/Qwen3-8B"';
    const choice = (delta: string, finish = "null") => `data: {${head},"choices":[{"index":0,"delta":${delta},"logprobs":null,"finish_reason":${finish}}],"usage":null}\n\n`;
    expect(sse).toBe(
      choice('{"role":"assistant","content":""}') +
        choice('{"reasoning_content":"The user wants the weather."}') +
        choice('{"content":"Let me check."}') +
        choice('{"tool_calls":[{"index":0,"id":"call_k1_3_0","type":"function","function":{"name":"get_weather","arguments":"{\\"city\\": \\"Paris\\"}"}}]}') +
        choice("{}", '"tool_calls"') +
        `data: {${head},"choices":[],"usage":{"prompt_tokens":31,"completion_tokens":9,"total_tokens":40}}\n\n` +
        "data: [DONE]\n\n",
    );
  });

  test("models list", () => {
    expect(modelsBody("Qwen/Qwen3-8B", 1767225600)).toEqual({
      object: "list",
      data: [{ id: "Qwen/Qwen3-8B", object: "model", created: 1767225600, owned_by: "edgeloop" }],
    });
  });
});

/** A tiny gateway stand-in: parses with the wire layer, answers `reply`, records what it parsed. */
function gateway(reply: ChatReply) {
  const seen: ChatRequest[] = [];
  const app = new Hono();
  app.post("/v1/chat/completions", async (c) => {
    const req = parseChatRequest(await c.req.json());
    seen.push(req);
    const r = { ...reply, ...(req.logprobs ? {} : { logprobs: undefined }) };
    if (req.stream) return new Response(chatCompletionSse(r, { includeUsage: req.include_usage === true }), { headers: { "content-type": "text/event-stream" } });
    return c.json(chatCompletionBody(r));
  });
  app.get("/v1/models", (c) => c.json(modelsBody("Qwen/Qwen3-8B", 1767225600)));
  app.onError((e) => (e instanceof EdgeloopError ? e.toResponse() : new Response("internal error", { status: 500 })));
  const client = new OpenAI({
    baseURL: "http://gateway.test/v1",
    apiKey: "session-token",
    maxRetries: 0,
    fetch: async (u: string | URL | Request, i?: RequestInit) => app.fetch(new Request(u, i)),
  });
  return { client, seen };
}

/** The stream helper's message without `parsed`, which the SDK adds (null) to every final message for its structured-output helpers. */
function sdkMessage(m: object): unknown {
  const { parsed, ...rest } = m as { parsed?: unknown };
  expect(parsed).toBeNull();
  return rest;
}

const WEATHER_TOOL = {
  type: "function" as const,
  function: { name: "get_weather", description: "Weather for a city", parameters: { type: "object", properties: { city: { type: "string" } } } },
};

describe("round trip with the official openai SDK", () => {
  test("non-streaming: message, tool_calls, finish_reason and usage as sent", async () => {
    const { client, seen } = gateway(TOOL_REPLY);
    const c = await client.chat.completions.create({
      model: "Qwen/Qwen3-8B",
      messages: [{ role: "user", content: "Weather in Paris?" }],
      tools: [WEATHER_TOOL],
      temperature: 0.6,
      max_completion_tokens: 64,
      stop: "\nObservation:",
    });
    expect(seen[0]).toEqual({
      model: "Qwen/Qwen3-8B",
      messages: [{ role: "user", content: "Weather in Paris?" }],
      tools: [{ type: "function", function: { name: "get_weather", description: "Weather for a city", parameters: { type: "object", properties: { city: { type: "string" } } } } }],
      tool_choice: "auto",
      temperature: 0.6,
      max_tokens: 64,
      stop: ["\nObservation:"],
      stream: false,
      logprobs: false,
    });
    expect(c.id).toBe("chatcmpl-k1-3");
    expect(c.object).toBe("chat.completion");
    expect(c.choices).toHaveLength(1);
    expect(c.choices[0]!.finish_reason).toBe("tool_calls");
    expect(c.choices[0]!.message.content).toBe("Let me check.");
    expect(c.choices[0]!.message.tool_calls).toEqual([
      { id: "call_k1_3_0", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
      { id: "call_k1_3_1", type: "function", function: { name: "get_time", arguments: '{"tz": "CET"}' } },
    ]);
    expect((c.choices[0]!.message as unknown as { reasoning_content: string }).reasoning_content).toBe("The user wants the weather.");
    expect(c.usage).toEqual({ prompt_tokens: 31, completion_tokens: 9, total_tokens: 40 });
    // The SDK hands back the body as sent.
    expect(c as unknown).toEqual(chatCompletionBody(TOOL_REPLY));
  });

  test("streaming helper: finalChatCompletion() gives the non-streaming message, tool_calls, finish_reason and usage", async () => {
    const { client, seen } = gateway(TOOL_REPLY);
    const stream = client.chat.completions.stream({ model: "Qwen/Qwen3-8B", messages: [{ role: "user", content: "Weather?" }], tools: [WEATHER_TOOL], stream_options: { include_usage: true } });
    const deltas: string[] = [];
    stream.on("content", (d) => deltas.push(d));
    const final = await stream.finalChatCompletion();
    expect(seen[0]!.stream).toBe(true);
    expect(deltas).toEqual(["Let me check."]);
    const plain = chatCompletionBody(TOOL_REPLY) as { choices: { message: unknown; finish_reason: string }[]; usage: unknown };
    expect(sdkMessage(final.choices[0]!.message)).toEqual(plain.choices[0]!.message);
    expect(final.choices[0]!.message.tool_calls).toEqual(TOOL_REPLY.message.tool_calls!);
    expect(final.choices[0]!.finish_reason).toBe("tool_calls");
    expect(final.usage as unknown).toEqual(plain.usage);
    expect([final.id, final.created, final.model]).toEqual(["chatcmpl-k1-3", 1767225600, "Qwen/Qwen3-8B"]);
  });

  test("streaming helper with log-probs and a content-only reply", async () => {
    const { client } = gateway(TEXT_REPLY);
    const final = await client.chat.completions.stream({ model: "m", messages: [{ role: "user", content: "Capital?" }], logprobs: true }).finalChatCompletion();
    const plain = chatCompletionBody(TEXT_REPLY) as { choices: object[] };
    expect({ ...final.choices[0]!, message: sdkMessage(final.choices[0]!.message) } as unknown).toEqual(plain.choices[0]!);
    expect(final.choices[0]!.logprobs!.content!.map((e) => [e.token, e.logprob])).toEqual([["Paris", -0.0123], ["<|im_end|>", -0.5]]);
  });

  test("for await over create({stream: true}): the chunks, in order", async () => {
    const { client } = gateway(TOOL_REPLY);
    const stream = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "Weather?" }], stream: true, stream_options: { include_usage: true } });
    const got: unknown[] = [];
    for await (const chunk of stream) {
      expect([chunk.id, chunk.object]).toEqual(["chatcmpl-k1-3", "chat.completion.chunk"]);
      const ch = chunk.choices[0];
      got.push(ch ? { delta: ch.delta, finish_reason: ch.finish_reason } : { usage: chunk.usage });
    }
    expect(got).toEqual([
      { delta: { role: "assistant", content: "" }, finish_reason: null },
      { delta: { reasoning_content: "The user wants the weather." }, finish_reason: null },
      { delta: { content: "Let me check." }, finish_reason: null },
      { delta: { tool_calls: [{ index: 0, id: "call_k1_3_0", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] }, finish_reason: null },
      { delta: { tool_calls: [{ index: 1, id: "call_k1_3_1", type: "function", function: { name: "get_time", arguments: '{"tz": "CET"}' } }] }, finish_reason: null },
      { delta: {}, finish_reason: "tool_calls" },
      { usage: { prompt_tokens: 31, completion_tokens: 9, total_tokens: 40 } },
    ]);
  });

  test("a refused request reaches the SDK as a 400 naming the field; models.list reads the list", async () => {
    const { client } = gateway(TEXT_REPLY);
    let err: unknown;
    try {
      await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }], n: 2 });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    const e = err as InstanceType<typeof OpenAI.BadRequestError>;
    expect(e.status).toBe(400);
    expect(e.error).toEqual({ code: "invalid_input", message: "n: edgeloop samples one choice per call: n must be 1 (or absent)", field: "n" });
    const models = [];
    for await (const m of client.models.list()) models.push(m);
    expect(models).toEqual([{ id: "Qwen/Qwen3-8B", object: "model", created: 1767225600, owned_by: "edgeloop" }]);
  });
});
