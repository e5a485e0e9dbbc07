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
const SCRIPT = { seed: 3, rules: [{ when: QUESTION, turns: [call("zoom", { factor: 2 }), "A red square."] }], default: ["I cannot help with that."] };
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
  sim = await startSimEngine({ tokenizer: vl, script: SCRIPT });
});
afterAll(() => sim.stop());

function setup(storage = new MemorySessionStorage(), tok: ChatTokenizer = vl) {
  const client = new SglangClient({
    url: sim.urls[0]!,
    fetch: async (input, init) => {
      const req = new Request(input, init);
      if (new URL(req.url).pathname === "/generate") wire.push(JSON.parse(await req.clone().text()));
      return fetch(req);
    },
  });
  const gw = new AgentGateway({ storage, tokenizer: tok, client, maxModelLen: 8192 });
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
