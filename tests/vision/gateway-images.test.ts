import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import sharp from "sharp";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs, AgentSessionEvent, foldAgentSession } from "../../shared/agent-gateway/agent-session.ts";
import { parseChatRequest } from "../../shared/agent-gateway/openai-wire.ts";
import { SglangClient } from "../../shared/inference/sglang-client.ts";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { ChatMessage, type ChatMessageInput, type ToolSchema } from "../../shared/schema/index.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { expandImagePads, resolveImages, visionOf } from "../../shared/vision/multimodal-tokens.ts";
import { call } from "../agent-loop/helpers.ts";
import { AGENT_TOKEN, agentSessionInput } from "../helpers/agent-session.ts";

// The agent gateway with a vision family (qwen3_vl), driven by the official openai SDK: images in the agent's
// messages (OpenAI `image_url` parts in user messages) are rendered with expanded placeholders, sent to the engine
// as SGLang `image_data` (the sim checks every entry against its placeholder run), and recorded in `multi_modal`.
const VS = 151652;
const VE = 151653;
const PAD = 151655;
const ZOOM: ToolSchema = { type: "function", function: { name: "zoom", description: "Zoom into the picture", parameters: { type: "object", properties: { factor: { type: "integer" } }, required: ["factor"] } } };
const QUESTION = "What is in the picture?";
const COLOUR = "What colour is the picture?";
const DRAW = "Draw a placeholder.";
const script = (vl: ChatTokenizer) => ({
  seed: 3,
  rules: [
    { when: QUESTION, turns: [call("zoom", { factor: 2 }), "A red square."] },
    { when: COLOUR, turns: ["It is blue."] },
    // A turn that samples vision tokens (a policy can): the next call with an image must not reach the engine.
    { when: DRAW, turns: [{ token_ids: [...vl.encode("look: "), VS, PAD, VE, 151645], finish_reason: "stop" as const }, "ok"] },
  ],
  default: ["I cannot help with that."],
});
const KEY = "u0_0_0";

let vl: ChatTokenizer;
let promptUri: string;
let secondUri: string;
let sim: RunningSimEngine;
const wire: Record<string, unknown>[] = [];
const png = async (w: number, h: number, background: string) => `data:image/png;base64,${(await sharp({ create: { width: w, height: h, channels: 3, background } }).png().toBuffer()).toString("base64")}`;

beforeAll(async () => {
  vl = await builtinTokenizer("qwen3_vl");
  promptUri = await png(640, 480, "blue");
  secondUri = await png(100, 900, "red");
  sim = await startSimEngine({ tokenizer: vl, script: script(vl) });
});
afterAll(() => sim.stop());

function setup(storage = new MemorySessionStorage(), tok: ChatTokenizer = vl, maxModelLen = 8192) {
  const client = new SglangClient({
    url: sim.urls[0]!,
    fetch: async (input, init) => {
      const req = new Request(input, init);
      if (new URL(req.url).pathname === "/generate") wire.push(JSON.parse(await req.clone().text()));
      return fetch(req);
    },
  });
  const gw = new AgentGateway({ storage, tokenizer: tok, client, maxModelLen });
  const app = createAgentGatewayApp({ gateway: gw });
  const fetchApp = (async (u: string | URL | Request, i?: RequestInit) => app.fetch(u instanceof Request ? u : new Request(String(u), i))) as typeof fetch;
  const openai = new OpenAI({ baseURL: `http://edgeloop.local/v1/sessions/${KEY}/openai/v1`, apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
  return { gw, openai, storage };
}

const firstUser = () => ({ role: "user" as const, content: [{ type: "image_url" as const, image_url: { url: promptUri } }, { type: "text" as const, text: QUESTION }] });

describe("agent gateway: OpenAI image_url parts", () => {
  test("two calls, an image in the first user message and one in a later user turn: token-exact with expanded placeholders, image_data on the wire, multi_modal recorded", async () => {
    const { gw, openai, storage } = setup();
    await gw.create(agentSessionInput([ZOOM], { rollout: { prompt_length: 2048, response_length: 2048, max_model_len: 8192 } }));
    wire.length = 0;
    const tools = [{ type: "function" as const, function: ZOOM.function }];
    const r1 = await openai.chat.completions.create({ model: "m", messages: [firstUser()], tools });
    const tc = r1.choices[0]!.message.tool_calls![0]! as { id: string; function: { name: string; arguments: string } };
    expect([tc.function.name, JSON.parse(tc.function.arguments)]).toEqual(["zoom", { factor: 2 }]);
    const second = [
      firstUser(),
      { role: "assistant" as const, content: null, tool_calls: [{ id: tc.id, type: "function" as const, function: tc.function }] },
      { role: "tool" as const, tool_call_id: tc.id, content: "zoomed x2, see the next picture" },
      { role: "user" as const, content: [{ type: "image_url" as const, image_url: { url: secondUri, detail: "auto" as const } }, { type: "text" as const, text: "Here it is." }] },
    ];
    const r2 = await openai.chat.completions.create({ model: "m", messages: second, tools });
    expect(r2.choices[0]!.message.content).toBe("A red square.");
    const st = (await gw.finish(KEY, { by: "agent", reward: 1 }))!;
    const [o] = agentOutputs(st, { reward: 1 });
    expect(st.outputs.length).toBe(1);

    // prompt ‖ response is the family's render of the whole conversation, every pad expanded.
    const msgs = ChatMessage.array().parse([
      firstUser(),
      { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "zoom", arguments: { factor: 2 } } }] },
      { role: "tool", name: "zoom", content: "zoomed x2, see the next picture" },
      { role: "user", content: [{ type: "image_url", image_url: { url: secondUri } }, { type: "text", text: "Here it is." }] },
      { role: "assistant", content: "A red square." },
    ] as ChatMessageInput[]);
    const images = [...(await resolveImages(vl, msgs.slice(0, 1), { prefix: "a" })), ...(await resolveImages(vl, msgs.slice(3, 4), { prefix: "b" }))];
    const want = expandImagePads(vl.encode(vl.renderText(msgs, { tools: [ZOOM] })), images, visionOf(vl).ids, "all");
    const ids = [...o!.prompt_ids, ...o!.response_ids];
    expect([...ids, 198]).toEqual(want.ids);
    // Masks: turn 1 sampled, the observation (tool result + user image turn) 0, turn 2 sampled.
    const a1 = [...vl.encode(call("zoom", { factor: 2 })), 151645];
    const a2 = [...vl.encode("A red square."), 151645];
    const obsLen = o!.response_ids.length - a1.length - a2.length;
    expect(o!.response_mask).toEqual([...a1.map(() => 1), ...Array(obsLen).fill(0), ...a2.map(() => 1)]);
    // Spans: 640x480 → [1, 30, 40] (300 tokens) in the prompt, 100x900 → [1, 56, 6] (84) in the response.
    const mm = o!.multi_modal!;
    expect(mm.images.map((i) => [i.span, i.image_grid_thw, i.source, i.field, i.sha256])).toEqual([
      [want.spans[0], [1, 30, 40], "prompt", "messages[0].content[0].image_url.url", images[0]!.sha256],
      [want.spans[1], [1, 56, 6], "tool", "messages[3].content[0].image_url.url", images[1]!.sha256],
    ]);
    for (const [s, e] of want.spans) expect([ids[s - 1], ids[e], ids.slice(s, e).every((x) => x === PAD)]).toEqual([VS, VE, true]);
    expect(mm.image_token_id).toBe(PAD);

    // The engine saw one image on the first call and both on the second (SGLang image_data, in placeholder order).
    expect(wire.map((w) => (w.image_data as string[]).length)).toEqual([1, 2]);
    expect(wire[1]!.image_data).toEqual([promptUri, secondUri]);
    expect(wire[1]!.input_ids).toEqual(ids.slice(0, o!.prompt_ids.length + a1.length + obsLen));

    // The session log holds each image once (the open event, then the observation's event), and folds to the same record.
    const stored = (await storage.get(AgentGateway.storageKey(KEY)))!;
    const turns = stored.deltas.map((d) => AgentSessionEvent.parse(JSON.parse(d))).filter((e) => e.e === "turn");
    expect(turns.map((e) => [e.open?.image_data?.length ?? 0, e.image_data?.length ?? 0, e.vision !== undefined])).toEqual([[1, 0, false], [0, 1, false]]);
    expect(agentOutputs(foldAgentSession(KEY, stored), { reward: 1 })).toEqual(agentOutputs(st, { reward: 1 }));
    // A new process folding the log serves the session on: the same state.
    const again = setup(storage);
    expect(agentOutputs((await again.gw.get(KEY))!, { reward: 1 })).toEqual(agentOutputs(st, { reward: 1 }));
  });

  test("an image first seen in a later user turn of a text-only prompt: the output's multi_modal starts there", async () => {
    const { gw, openai, storage } = setup();
    await gw.create(agentSessionInput([ZOOM], { rollout: { prompt_length: 2048, response_length: 2048, max_model_len: 8192 } }));
    const tools = [{ type: "function" as const, function: ZOOM.function }];
    const first = { role: "user" as const, content: QUESTION };
    const r1 = await openai.chat.completions.create({ model: "m", messages: [first], tools });
    const tc = r1.choices[0]!.message.tool_calls![0]! as { id: string; function: { name: string; arguments: string } };
    await openai.chat.completions.create({
      model: "m",
      tools,
      messages: [first, { role: "assistant", content: null, tool_calls: [{ id: tc.id, type: "function", function: tc.function }] }, { role: "tool", tool_call_id: tc.id, content: "done" }, { role: "user", content: [{ type: "image_url", image_url: { url: secondUri } }] }],
    });
    const st = (await gw.finish(KEY, { by: "agent", reward: 1 }))!;
    const [o] = agentOutputs(st, { reward: 1 });
    expect(o!.multi_modal!.images.map((i) => [i.image_grid_thw, i.field])).toEqual([[[1, 56, 6], "messages[3].content[0].image_url.url"]]);
    const stored = (await storage.get(AgentGateway.storageKey(KEY)))!;
    const turns = stored.deltas.map((d) => AgentSessionEvent.parse(JSON.parse(d))).filter((e) => e.e === "turn");
    // The processor settings are stored once, with the output's first images.
    expect(turns.map((e) => e.vision !== undefined)).toEqual([false, true]);
    expect(agentOutputs(foldAgentSession(KEY, stored), { reward: 1 })).toEqual(agentOutputs(st, { reward: 1 }));
  });

  test("refused at the boundary, naming the field: images outside user messages, detail other than auto, file URLs, a text-only family, http URLs", async () => {
    const img = { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } };
    expect(() => parseChatRequest({ messages: [{ role: "system", content: [img] }] })).toThrow('messages[0].content[0].type: "image_url" parts are not supported here: image parts are accepted in user messages only');
    expect(() => parseChatRequest({ messages: [{ role: "user", content: [{ ...img, image_url: { url: "x", detail: "high" } }] }] })).toThrow('messages[0].content[0].image_url.detail: only "auto" (or absent)');
    expect(() => parseChatRequest({ messages: [{ role: "user", content: [{ type: "image_url", image_url: {} }] }] })).toThrow("messages[0].content[0].image_url.url: expected a string");
    expect(() => parseChatRequest({ messages: [{ role: "user", content: [{ type: "input_audio", input_audio: {} }] }] })).toThrow('messages[0].content[0].type: "input_audio" parts are not supported here');

    // Through the SDK: a 400 with param, no engine call — on a text-only family, and for an image URL (never fetched).
    const text = setup(new MemorySessionStorage(), await defaultTokenizer());
    await text.gw.create(agentSessionInput([ZOOM]));
    wire.length = 0;
    const e1 = (await text.openai.chat.completions.create({ model: "m", messages: [firstUser()] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([e1.status, e1.param]).toEqual([400, "messages[0].content[0].image_url.url"]);
    expect(e1.message).toContain("qwen3");
    const v = setup();
    await v.gw.create(agentSessionInput([ZOOM], { rollout: { prompt_length: 2048, response_length: 2048, max_model_len: 8192 } }));
    const e2 = (await v.openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://169.254.169.254/latest/meta-data" } }] }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([e2.status, e2.param]).toEqual([400, "messages[0].content[0].image_url.url"]);
    expect(e2.message).toContain("image URLs are not fetched");
    expect(wire.length).toBe(0);
  });
});

describe("agent gateway: images decide what a request continues; stray vision tokens never reach the engine", () => {
  const rollout = { prompt_length: 2048, response_length: 2048, max_model_len: 8192 };

  test("the same text with another image, or without it, is another conversation: a new root with the images sent", async () => {
    const { gw, openai } = setup();
    await gw.create(agentSessionInput([ZOOM], { rollout }));
    wire.length = 0;
    const ask = (uri: string | null) => openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: [...(uri ? [{ type: "image_url" as const, image_url: { url: uri } }] : []), { type: "text" as const, text: COLOUR }] }] });
    await ask(promptUri);
    await ask(secondUri);
    await ask(null);
    await ask(promptUri);
    expect(wire.map((w) => ((w.image_data as string[] | undefined) ?? []).map((u) => (u === promptUri ? "first" : u === secondUri ? "second" : "?")))).toEqual([["first"], ["second"], [], ["first"]]);
    const outs = agentOutputs((await gw.finish(KEY, { by: "agent", reward: 1 }))!, { reward: 1 });
    // Three roots (the last call re-asks the first conversation: a branch at its sampled turn's start, sharing its image).
    expect(outs.map((o) => [o.parent_output_index, (o.multi_modal?.images ?? []).map((i) => i.sha256.slice(0, 8))])).toEqual([
      [null, [outs[0]!.multi_modal!.images[0]!.sha256.slice(0, 8)]],
      [null, [outs[1]!.multi_modal!.images[0]!.sha256.slice(0, 8)]],
      [null, []],
      [0, [outs[0]!.multi_modal!.images[0]!.sha256.slice(0, 8)]],
    ]);
    expect(outs[0]!.multi_modal!.images[0]!.sha256).not.toBe(outs[1]!.multi_modal!.images[0]!.sha256);
  });

  test("text that spells vision tokens, and a sampled turn that holds them: 400 naming messages, no engine call", async () => {
    const { gw, openai } = setup();
    await gw.create(agentSessionInput([ZOOM], { rollout }));
    wire.length = 0;
    const e1 = (await openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi <|vision_start|><|image_pad|><|vision_end|>" }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([e1.status, e1.param]).toEqual([400, "messages"]);
    expect(e1.message).toContain("the context holds 1 image placeholder run(s) for 0 image(s)");
    const e2 = (await openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi <|image_pad|>" }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([e2.status, e2.message]).toEqual([400, expect.stringContaining("is not between <|vision_start|> and <|vision_end|>")]);
    expect(wire.length).toBe(0);
    // The policy samples a placeholder run; the next call (with an image) is refused before the engine.
    const r1 = await openai.chat.completions.create({ model: "m", messages: [{ role: "user", content: DRAW }] });
    const e3 = (await openai.chat.completions.create({
      model: "m",
      messages: [{ role: "user", content: DRAW }, { role: "assistant", content: r1.choices[0]!.message.content }, { role: "user", content: [{ type: "image_url", image_url: { url: secondUri } }] }],
    }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([e3.status, e3.param]).toEqual([400, "messages"]);
    expect(e3.message).toContain("the context holds 2 image placeholder run(s) for 1 image(s)");
    expect(wire.length).toBe(1);
  });

  test("a prompt within prompt_length but over the model's context: 400 context_length_exceeded, not a record that breaks at finish", async () => {
    // The rollout config allows 8192 tokens of context; the engine serves 300 (its max_model_len wins): the image alone takes 300.
    const { gw, openai } = setup(new MemorySessionStorage(), vl, 300);
    await gw.create(agentSessionInput([ZOOM], { rollout: { prompt_length: 4096, response_length: 512, max_model_len: 8192 } }));
    wire.length = 0;
    const e = (await openai.chat.completions.create({ model: "m", messages: [firstUser()] }).catch((x: unknown) => x)) as InstanceType<typeof OpenAI.APIError>;
    expect([e.status, e.param, e.code]).toEqual([400, "messages", "context_length_exceeded"]);
    expect(e.message).toBe("400 messages: the rendered prompt holds 316 tokens and the model's context is 299 (max_model_len): no room to sample; send less");
    expect(wire.length).toBe(0);
  });
});

describe("agent gateway: Anthropic image blocks and Responses input_image", () => {
  const rollout = { prompt_length: 2048, response_length: 2048, max_model_len: 8192 };
  const b64 = (uri: string) => uri.slice("data:image/png;base64,".length);

  /** The two-turn round's record, checked against the family's render (prompt image, then a tool-result image). */
  async function checkToolImageRound(st: Awaited<ReturnType<AgentGateway["finish"]>>, fields: [string, string]) {
    const [o] = agentOutputs(st!, { reward: 1 });
    const msgs = ChatMessage.array().parse([
      firstUser(),
      { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "zoom", arguments: { factor: 2 } } }] },
      { role: "tool", name: "zoom", content: [{ type: "image_url", image_url: { url: secondUri } }, { type: "text", text: "zoomed x2" }] },
      { role: "assistant", content: "A red square." },
    ] as ChatMessageInput[]);
    const images = [...(await resolveImages(vl, msgs.slice(0, 1), { prefix: "a" })), ...(await resolveImages(vl, msgs.slice(2, 3), { prefix: "b" }))];
    const want = expandImagePads(vl.encode(vl.renderText(msgs, { tools: [ZOOM] })), images, visionOf(vl).ids, "all");
    expect([...o!.prompt_ids, ...o!.response_ids, 198]).toEqual(want.ids);
    expect(o!.multi_modal!.images.map((i) => [i.span, i.image_grid_thw, i.field])).toEqual([
      [want.spans[0], [1, 30, 40], fields[0]],
      [want.spans[1], [1, 56, 6], fields[1]],
    ]);
    expect(wire.map((w) => (w.image_data as string[]).length)).toEqual([1, 2]);
    expect(wire[1]!.image_data).toEqual([promptUri, secondUri]);
  }

  test("Messages through @anthropic-ai/sdk: a base64 image in the user turn and one inside a tool_result", async () => {
    const { default: Anthropic } = await import("@anthropic-ai/sdk");
    const { gw, storage } = setup();
    await gw.create(agentSessionInput([ZOOM], { rollout }));
    wire.length = 0;
    const app = createAgentGatewayApp({ gateway: gw });
    const fetchApp = (async (u: string | URL | Request, i?: RequestInit) => app.fetch(u instanceof Request ? u : new Request(String(u), i))) as typeof fetch;
    const client = new Anthropic({ baseURL: `http://edgeloop.local/v1/sessions/${KEY}/anthropic`, apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
    const tools = [{ name: "zoom", description: "Zoom into the picture", input_schema: ZOOM.function.parameters as { type: "object" } }];
    const user = { role: "user" as const, content: [{ type: "image" as const, source: { type: "base64" as const, media_type: "image/png" as const, data: b64(promptUri) }, cache_control: { type: "ephemeral" as const } }, { type: "text" as const, text: QUESTION }] };
    const m1 = await client.messages.create({ model: "m", max_tokens: 512, messages: [user], tools });
    const use = m1.content.find((b) => b.type === "tool_use")!;
    expect(use.type === "tool_use" && [use.name, use.input]).toEqual(["zoom", { factor: 2 }]);
    const m2 = await client.messages.create({
      model: "m",
      max_tokens: 512,
      tools,
      messages: [
        user,
        { role: "assistant", content: m1.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: b64(secondUri) } }, { type: "text", text: "zoomed x2" }] }] },
      ],
    });
    expect(m2.content).toEqual([{ type: "text", text: "A red square.", citations: null }]);
    const st = await gw.finish(KEY, { by: "agent", reward: 1 });
    // Fields name the images as the request sent them.
    await checkToolImageRound(st, ["messages[0].content[0].source.data", "messages[2].content[0].content[0].source.data"]);
    const stored = (await storage.get(AgentGateway.storageKey(KEY)))!;
    expect(agentOutputs(foldAgentSession(KEY, stored), { reward: 1 })).toEqual(agentOutputs(st!, { reward: 1 }));
  });

  test("Responses through the openai SDK: input_image in the user message and in a function_call_output", async () => {
    const { gw, openai } = setup();
    await gw.create(agentSessionInput([ZOOM], { rollout }));
    wire.length = 0;
    const tools = [{ type: "function" as const, name: "zoom", description: "Zoom into the picture", parameters: ZOOM.function.parameters as Record<string, unknown>, strict: false }];
    const user = { role: "user" as const, content: [{ type: "input_image" as const, image_url: promptUri, detail: "auto" as const }, { type: "input_text" as const, text: QUESTION }] };
    const r1 = await openai.responses.create({ model: "m", input: [user], tools });
    const fc = r1.output.find((x) => x.type === "function_call")!;
    expect(fc.type === "function_call" && [fc.name, JSON.parse(fc.arguments)]).toEqual(["zoom", { factor: 2 }]);
    const r2 = await openai.responses.create({
      model: "m",
      tools,
      input: [user, fc, { type: "function_call_output", call_id: fc.type === "function_call" ? fc.call_id : "", output: [{ type: "input_image", image_url: secondUri, detail: "auto" }, { type: "input_text", text: "zoomed x2" }] }],
    });
    expect(r2.output_text).toBe("A red square.");
    await checkToolImageRound(await gw.finish(KEY, { by: "agent", reward: 1 }), ["input[0].content[0].image_url", "input[2].output[0].image_url"]);
  });

  test("an unreadable image is refused naming it as sent, also behind a system prompt (Messages), and on the Responses API", async () => {
    const { default: Anthropic } = await import("@anthropic-ai/sdk");
    const { gw, openai } = setup();
    await gw.create(agentSessionInput([ZOOM], { rollout }));
    wire.length = 0;
    const app = createAgentGatewayApp({ gateway: gw });
    const fetchApp = (async (u: string | URL | Request, i?: RequestInit) => app.fetch(u instanceof Request ? u : new Request(String(u), i))) as typeof fetch;
    const client = new Anthropic({ baseURL: `http://edgeloop.local/v1/sessions/${KEY}/anthropic`, apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
    const e1 = (await client.messages.create({ model: "m", max_tokens: 8, system: "Look closely.", messages: [{ role: "user", content: [{ type: "text", text: "q" }, { type: "image", source: { type: "base64", media_type: "image/png", data: "bm90IGFuIGltYWdl" } }] }] }).catch((e: unknown) => e)) as { status: number; error: { error: { message: string } } };
    expect(e1.status).toBe(400);
    expect(e1.error.error.message).toMatch(/^messages\[0\]\.content\[1\]\.source\.data: /);
    const e2 = (await openai.responses.create({ model: "m", input: [{ role: "user", content: [{ type: "input_image", image_url: "data:image/png;base64,@@@@", detail: "auto" }] }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([e2.status, e2.param]).toEqual([400, "input[0].content[0].image_url"]);
    expect(wire.length).toBe(0);
  });

  test("refused naming the field: file sources, transformations, images in assistant turns, file_id, detail high", async () => {
    const { parseMessagesRequest } = await import("../../shared/agent-gateway/messages-wire.ts");
    const { parseResponsesRequest, responsesChatRequest } = await import("../../shared/agent-gateway/responses-wire.ts");
    const img = (source: unknown, extra: Record<string, unknown> = {}) => ({ model: "m", max_tokens: 8, messages: [{ role: "user", content: [{ type: "image", source, ...extra }] }] });
    expect(() => parseMessagesRequest(img({ type: "file", file_id: "f" }))).toThrow('messages[0].content[0].source.type: "file" sources are not supported');
    expect(() => parseMessagesRequest(img({ type: "base64", media_type: "image/tiff", data: "AA" }))).toThrow("messages[0].content[0].source.media_type: expected image/jpeg, image/png, image/gif or image/webp");
    expect(() => parseMessagesRequest(img({ type: "base64", media_type: "image/png", data: "AA" }, { transformations: { large: "x" } }))).toThrow("messages[0].content[0].transformations: not supported");
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "q" }, { role: "assistant", content: [{ type: "image", source: { type: "url", url: "x" } }] }, { role: "user", content: "r" }] })).toThrow('messages[1].content[0].type: "image" blocks are not supported in an assistant turn');
    expect(() => parseMessagesRequest({ model: "m", max_tokens: 8, system: [{ type: "image", source: { type: "url", url: "x" } }], messages: [{ role: "user", content: "q" }] })).toThrow('system[0].type: "image" blocks are not supported here: only text (image blocks go in user turns and tool_result content)');
    const resp = (content: unknown) => responsesChatRequest(parseResponsesRequest({ model: "m", input: [{ role: "user", content }] }), null);
    expect(() => resp([{ type: "input_image", file_id: "file-1", detail: "auto" }])).toThrow("input[0].content[0].file_id: file ids are not supported");
    expect(() => resp([{ type: "input_image", image_url: promptUri, detail: "high" }])).toThrow('input[0].content[0].detail: only "auto" (or absent)');
    expect(() => responsesChatRequest(parseResponsesRequest({ model: "m", input: [{ role: "system", content: [{ type: "input_image", image_url: promptUri, detail: "auto" }] }] }), null)).toThrow('input[0].content[0].type: "input_image" parts are not supported');
    expect(resp([{ type: "input_image", image_url: promptUri, detail: "auto" }, { type: "input_text", text: "q" }]).messages[0]!.content).toEqual([{ type: "image_url", image_url: { url: promptUri } }, { type: "text", text: "q" }]);
  });
});
