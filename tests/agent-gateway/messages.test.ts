/**
 * The agent gateway's Anthropic Messages endpoint through the official
 * `@anthropic-ai/sdk` (in-process: the SDK's `fetch` calls the Hono app),
 * real Qwen3 tokenizer, sim engine, the example tool server over loopback.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { readFileSync } from "node:fs";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { OpenAIAgentLoop, type AgentGatewayLink } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { thinkingSignature } from "../../shared/agent-gateway/messages-wire.ts";
import { fnv1a32 } from "../../shared/inference/hash.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { EngineUnavailableError } from "../../shared/errors.ts";
import type { ChatMessage, RolloutConfig, ToolSchema } from "../../shared/schema/index.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const script = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const rows = readFileSync(`${ROOT}examples/gsm8k-tool.jsonl`, "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l) as { prompt: ChatMessage[] });
/** Request options (and headers) marking a call as the SDK's first retry: an equal answered call is replayed. */
const RETRY = { headers: { "x-stainless-retry-count": "1" } };
const BASE = "http://edgeloop.local";
const TOKEN = "tok_0123456789abcdef0123";
const IM_END = 151645;
/** Message ids are `msg_{fnv1a32(key) hex}-{output}-{assistant turn}-{step}`. */
const ID = `msg_${fnv1a32("u0_0_0").toString(16)}`;
type FetchLike = (u: string | URL | Request, i?: RequestInit) => Promise<Response>;

let tok: ChatTokenizer;
let toolServer: ToolServer;
let toolClient: WebhookToolClient;
let tools: ToolSchema[];
/** The example tools as Anthropic tools. */
let anthropicTools: Anthropic.Tool[];

beforeAll(async () => {
  tok = await defaultTokenizer();
  toolServer = startToolServer({ port: 0 });
  const file = parseToolsFile(readFileSync(`${ROOT}infra/tools/tools.example.json`, "utf8"), { vars: { port: toolServer.port } });
  toolClient = new WebhookToolClient(file.tools);
  tools = [...toolClient.schemas];
  anthropicTools = asAnthropicTools(tools);
});
afterAll(async () => {
  await toolServer.stop();
});

function asAnthropicTools(ts: readonly ToolSchema[]): Anthropic.Tool[] {
  return ts.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters as Anthropic.Tool.InputSchema }));
}

/** The sim engine client, recording every request's `max_tokens`, stop strings and prompt ids. */
class CountingClient implements InferenceClient {
  readonly requests: { max_tokens: number | undefined; stop: string[] | undefined; prompt_ids: number[] }[] = [];
  constructor(readonly inner: SimEngineClient) {}
  async generate(req: GenerateRequest) {
    this.requests.push({ max_tokens: req.max_tokens, stop: req.sampling_params.stop, prompt_ids: Array.from(req.prompt_ids) });
    return this.inner.generate(req);
  }
  async maxModelLen() {
    return this.inner.maxModelLen();
  }
}

function setup() {
  const engine = new SimEngine({ tokenizer: tok, script });
  const client = new CountingClient(new SimEngineClient(engine));
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client, maxModelLen: 4096, wallClockMs: () => 1_700_000_000_000 });
  const app = createAgentGatewayApp({ gateway: gw, maxBodyBytes: 64 * 1024 });
  const seen: string[] = [];
  const fetchApp: FetchLike = async (u, i) => {
    const req = u instanceof Request ? u : new Request(String(u), i);
    seen.push(`${req.method} ${new URL(req.url).pathname}`);
    return app.fetch(req);
  };
  return { engine, client, gw, fetchApp, seen };
}

function anthropic(fetchApp: FetchLike, key = "u0_0_0", apiKey = TOKEN, maxRetries = 0) {
  return new Anthropic({ baseURL: `${BASE}/v1/sessions/${key}/anthropic`, apiKey, fetch: fetchApp as typeof fetch, maxRetries });
}

async function createSession(gw: AgentGateway, o: { key?: string; rollout?: RolloutConfig; row?: number } = {}) {
  const now = 1_700_000_000_000;
  return gw.create({
    v: 1,
    key: o.key ?? "u0_0_0",
    uid: "u0",
    session_id: 0,
    token: TOKEN,
    created_ms: now,
    deadline_ms: now + 600_000,
    sampling_params: SP,
    rollout: o.rollout ?? config(),
    tools,
    messages: rows[o.row ?? 0]!.prompt,
  });
}

/** A row's prompt as a Messages request's `system` and `messages`. */
function anthropicPrompt(prompt: readonly ChatMessage[]): { system: string; messages: Anthropic.MessageParam[] } {
  const [sys, ...rest] = prompt;
  return { system: sys!.content as string, messages: rest.map((m) => ({ role: m.role as "user", content: m.content as string })) };
}

/** A Messages error's status and body, as the SDK saw them. */
async function apiError(p: Promise<unknown>): Promise<{ status: number | undefined; error: unknown }> {
  try {
    await p;
  } catch (e) {
    const x = e as InstanceType<typeof Anthropic.APIError>;
    return { status: x.status, error: x.error };
  }
  throw new Error("expected an error");
}

const invalid = (message: string) => ({ type: "error", error: { type: "invalid_request_error", message }, request_id: null });
const USAGE0 = { cache_creation_input_tokens: 0, cache_read_input_tokens: 0, cache_creation: null, server_tool_use: null, service_tier: "standard" };

describe("agent gateway: Anthropic Messages through @anthropic-ai/sdk", () => {
  test("openai_agent with a Messages agent (create, then stream().finalMessage()) records the tokens tool_agent records: two tool rounds", async () => {
    for (const streaming of [false, true]) {
      const { gw, fetchApp, client: counting } = setup();
      const stops: (string | null)[] = [];
      const agentRuns: Promise<void>[] = [];
      const agentFetch = (async (u: string | URL | Request, init?: RequestInit) => {
        expect(String(u)).toBe("http://agent.local/tasks");
        const task = AgentTask.parse(JSON.parse(String(init!.body)));
        agentRuns.push(runMessagesAgent(task, fetchApp, streaming, stops));
        return new Response(null, { status: 202 });
      }) as typeof fetch;
      const link: AgentGatewayLink = { gateway: gw, publicUrl: () => BASE, agent: { url: "http://agent.local/tasks", timeout_ms: 600_000, secret: null }, fetch: agentFetch };
      // Row 3: lookup, then calc, then the answer.
      const row = rows[3]!;
      const loop = new OpenAIAgentLoop(ctxOf(tok, counting, config(), { tools: toolClient, reward: false, agentGateway: link }));
      const outs = await loop.run(SP, { uid: `ma${streaming ? 1 : 0}`, session_id: 0, prompt: row.prompt });
      await Promise.all(agentRuns);
      expect(agentRuns.length).toBe(1);
      expect(stops).toEqual(["tool_use", "tool_use", "end_turn"]);
      expect(outs.length).toBe(1);

      const ref = await new ToolAgentLoop(ctxOf(tok, new SimEngineClient(new SimEngine({ tokenizer: tok, script })), config(), { tools: toolClient, reward: false })).run(SP, {
        uid: `mt${streaming ? 1 : 0}`,
        session_id: 0,
        prompt: row.prompt,
      });
      const out = outs[0]!;
      expect(out.prompt_ids).toEqual(ref.prompt_ids);
      expect(out.response_ids).toEqual(ref.response_ids);
      expect(out.response_mask).toEqual(ref.response_mask);
      expect(out.response_logprobs).toEqual(ref.response_logprobs);
      expect(out.num_turns).toBe(ref.num_turns);
      expect(out.response_ids[out.response_ids.length - 1]).toBe(IM_END);
      expect(out.extra_fields.tool_calls).toBe(2);
      expect(out.extra_fields.output_count).toBe(1);
      // One output, continued token-exact: every engine call's prompt is a prefix of the recorded stream.
      expect(counting.requests.length).toBe(3);
      const stream = [...out.prompt_ids, ...out.response_ids];
      for (const r of counting.requests) expect(stream.slice(0, r.prompt_ids.length)).toEqual(r.prompt_ids);
    }
  });

  test("the same conversation through Messages and through chat completions records identical tokens", async () => {
    const viaMessages = setup();
    await createSession(viaMessages.gw, { row: 0 });
    const a = anthropic(viaMessages.fetchApp);
    const p = anthropicPrompt(rows[0]!.prompt);
    const m1 = await a.messages.create({ model: "qwen3", max_tokens: 1024, system: p.system, messages: p.messages, tools: anthropicTools });
    const use = m1.content.find((b) => b.type === "tool_use")!;
    const m2 = await a.messages.create({
      model: "qwen3",
      max_tokens: 1024,
      system: p.system,
      messages: [...p.messages, { role: "assistant", content: m1.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "31" }] }],
      tools: anthropicTools,
    });
    expect(m2.stop_reason).toBe("end_turn");

    const viaChat = setup();
    await createSession(viaChat.gw, { row: 0 });
    const o = new OpenAI({ baseURL: `${BASE}/v1/sessions/u0_0_0/openai/v1`, apiKey: TOKEN, fetch: viaChat.fetchApp, maxRetries: 0 });
    const msgs = [...rows[0]!.prompt] as OpenAI.ChatCompletionMessageParam[];
    const c1 = await o.chat.completions.create({ model: "qwen3", max_tokens: 1024, messages: msgs, tools: tools as OpenAI.ChatCompletionTool[] });
    msgs.push(c1.choices[0]!.message as OpenAI.ChatCompletionMessageParam, { role: "tool", tool_call_id: `call_${sessionTag("u0_0_0")}_0_0_0`, content: "31" });
    await o.chat.completions.create({ model: "qwen3", max_tokens: 1024, messages: msgs, tools: tools as OpenAI.ChatCompletionTool[] });

    const [x] = agentOutputs(await viaMessages.gw.finish("u0_0_0", { by: "agent", reward: 1 }), { reward: 1 });
    const [y] = agentOutputs(await viaChat.gw.finish("u0_0_0", { by: "agent", reward: 1 }), { reward: 1 });
    expect(x!.prompt_ids).toEqual(y!.prompt_ids);
    expect(x!.response_ids).toEqual(y!.response_ids);
    expect(x!.response_mask).toEqual(y!.response_mask);
    expect(x!.response_logprobs).toEqual(y!.response_logprobs);
    expect(viaMessages.client.requests).toEqual(viaChat.client.requests);
    expect(viaMessages.client.requests.length).toBe(2);
  });

  test("the message object, the raw SSE events, and stream().finalMessage() of a replay", async () => {
    const { gw, fetchApp, engine } = setup();
    await createSession(gw);
    const a = anthropic(fetchApp);
    const p = anthropicPrompt(rows[0]!.prompt);
    const prompt0 = tok.renderIds(rows[0]!.prompt, { tools, addGenerationPrompt: true });
    const turn1 = tok.encode(script.rules[0].turns[0]).length + 1;
    const body = { model: "qwen3", max_tokens: 1024, system: p.system, messages: p.messages, tools: anthropicTools };
    const { data: m1, response } = await a.messages.create(body).withResponse();
    expect(response.headers.get("content-type")).toBe("application/json");
    expect(m1 as unknown).toEqual({
      id: `${ID}-0-1-1`,
      type: "message",
      role: "assistant",
      model: "qwen3",
      content: [
        { type: "thinking", thinking: "Let me compute 12*3-5.", signature: thinkingSignature("Let me compute 12*3-5.") },
        { type: "tool_use", id: `call_${sessionTag("u0_0_0")}_0_0_0`, name: "calc", input: { expression: "12*3-5" }, caller: { type: "direct" } },
      ],
      stop_reason: "tool_use",
      stop_sequence: null,
      stop_details: null,
      container: null,
      usage: { input_tokens: prompt0.length, output_tokens: turn1, ...USAGE0 },
    });

    // The same request retried, streamed: answered from the checkpoint (no engine call), as the API's events.
    const events: Anthropic.RawMessageStreamEvent[] = [];
    for await (const e of await a.messages.create({ ...body, stream: true }, RETRY)) events.push(e);
    expect(engine.stats.requests).toBe(1);
    expect(events as unknown[]).toEqual([
      { type: "message_start", message: { ...(m1 as unknown as Record<string, unknown>), content: [], stop_reason: null, usage: { ...m1.usage, output_tokens: 0 } } },
      { type: "content_block_start", index: 0, content_block: { type: "thinking", thinking: "", signature: "" } },
      { type: "content_block_delta", index: 0, delta: { type: "thinking_delta", thinking: "Let me compute 12*3-5." } },
      { type: "content_block_delta", index: 0, delta: { type: "signature_delta", signature: thinkingSignature("Let me compute 12*3-5.") } },
      { type: "content_block_stop", index: 0 },
      { type: "content_block_start", index: 1, content_block: { type: "tool_use", id: `call_${sessionTag("u0_0_0")}_0_0_0`, name: "calc", input: {}, caller: { type: "direct" } } },
      { type: "content_block_delta", index: 1, delta: { type: "input_json_delta", partial_json: '{"expression":"12*3-5"}' } },
      { type: "content_block_stop", index: 1 },
      {
        type: "message_delta",
        delta: { stop_reason: "tool_use", stop_sequence: null, stop_details: null, container: null },
        usage: { input_tokens: prompt0.length, output_tokens: turn1, cache_creation_input_tokens: 0, cache_read_input_tokens: 0, server_tool_use: null },
      },
      { type: "message_stop" },
    ]);
    // The raw body has a ping after message_start, each event named by `event:`.
    const raw = await fetchApp(`${BASE}/v1/sessions/u0_0_0/anthropic/v1/messages`, { method: "POST", headers: { "x-api-key": TOKEN, "content-type": "application/json", ...RETRY.headers }, body: JSON.stringify({ ...body, stream: true }) });
    expect(raw.headers.get("content-type")).toBe("text/event-stream; charset=utf-8");
    const text = await raw.text();
    expect([...text.matchAll(/^event: (\w+)$/gm)].map((x) => x[1])).toEqual([
      "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
    ]);
    expect(text.split("\n\n")[1]).toBe('event: ping\ndata: {"type":"ping"}');

    // stream().finalMessage() accumulates the same message as the non-streaming reply.
    const final = await a.messages.stream(body, RETRY).finalMessage();
    // Less what the SDK adds: request ids on create()'s result; `parsed_output` and the tool input's JSON buffer on the stream's.
    const { _request_id: _r, _workspace_id: _w, ...created } = m1 as unknown as Record<string, unknown>;
    const { parsed_output: _p, ...accumulated } = final as unknown as Record<string, unknown>;
    accumulated.content = final.content.map((b) => Object.fromEntries(Object.entries(b).filter(([k]) => k !== "__json_buf")));
    expect(accumulated).toEqual(created);
    expect(engine.stats.requests).toBe(1);

    // Turn 2 (text) through stream(): thinking + text blocks, end_turn.
    const use = m1.content[1] as Anthropic.ToolUseBlock;
    const m2 = await a.messages
      .stream({ ...body, messages: [...p.messages, { role: "assistant", content: m1.content }, { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: [{ type: "text", text: "31" }] }] }] })
      .finalMessage();
    expect(m2.content as unknown).toEqual([
      { type: "thinking", thinking: "The tool says 31.", signature: thinkingSignature("The tool says 31.") },
      { type: "text", text: "The answer is 31.\n#### 31", citations: null },
    ]);
    expect([m2.id, m2.stop_reason, m2.stop_sequence]).toEqual([`${ID}-0-2-2`, "end_turn", null]);
    expect(engine.stats.requests).toBe(2);
    expect((await gw.get("u0_0_0"))!.outputs.length).toBe(1);
  });

  test("stop_reason max_tokens (the call's max_tokens) and stop_sequence (with the sequence); stop_sequences reach the engine", async () => {
    const { gw, fetchApp, client: counting } = setup();
    await createSession(gw);
    const a = anthropic(fetchApp);
    const p = anthropicPrompt(rows[0]!.prompt);
    const cut = await a.messages.create({ model: "qwen3", max_tokens: 5, system: p.system, messages: p.messages, tools: anthropicTools });
    expect([cut.stop_reason, cut.stop_sequence, cut.usage.output_tokens]).toEqual(["max_tokens", null, 5]);
    expect(cut.content).toEqual([{ type: "text", text: tok.decode(tok.encode(script.rules[0].turns[0]).slice(0, 5)), citations: null }]);
    const stopped = await a.messages.create({ model: "qwen3", max_tokens: 1024, system: p.system, messages: p.messages, tools: anthropicTools, stop_sequences: ["zzz", "compute"] });
    expect([stopped.stop_reason, stopped.stop_sequence]).toEqual(["stop_sequence", "compute"]);
    expect(stopped.content).toEqual([{ type: "text", text: "<think>\nLet me", citations: null }]);
    expect(counting.requests.map((r) => [r.max_tokens, r.stop])).toEqual([
      [5, undefined],
      [512, ["zzz", "compute"]],
    ]);
    // temperature (0..1) and top_p are sampled with; the SDK's types no longer list them.
    const warm = await a.messages.create({ model: "qwen3", max_tokens: 1024, system: p.system, messages: p.messages, tools: anthropicTools, temperature: 0.5, top_p: 0.9 } as Anthropic.MessageCreateParamsNonStreaming);
    expect(warm.stop_reason).toBe("tool_use");
  });

  test("400 in Anthropic's shape naming the field (no engine call); ignored keys named; 401 wrong key or unknown session; x-api-key accepted", async () => {
    const { gw, fetchApp, engine } = setup();
    await createSession(gw);
    const a = anthropic(fetchApp);
    const p = anthropicPrompt(rows[0]!.prompt);
    const body = { model: "qwen3", max_tokens: 1024, system: p.system, messages: p.messages, tools: anthropicTools };
    const bad = (b: Record<string, unknown>) => apiError(a.messages.create(b as unknown as Anthropic.MessageCreateParamsNonStreaming));
    const { max_tokens: _m, ...noMax } = body;
    expect(await bad(noMax)).toEqual({ status: 400, error: invalid("max_tokens: required: the most tokens to sample in this call (a positive integer)") });
    expect(await bad({ ...body, max_tokens: 0 })).toEqual({ status: 400, error: invalid("max_tokens: must be a positive integer") });
    expect(await bad({ ...body, tool_choice: { type: "any" } })).toEqual({
      status: 400,
      error: invalid('tool_choice: edgeloop samples token-in/token-out without guided decoding: only {type: "auto"} and {type: "none"} are supported, got "any"'),
    });
    expect(await bad({ ...body, tool_choice: { type: "tool", name: "calc" } })).toMatchObject({ status: 400, error: { error: { message: expect.stringMatching(/^tool_choice: /) } } });
    expect(await bad({ ...body, top_k: 40 })).toEqual({ status: 400, error: invalid("top_k: edgeloop samples with the run's top_k (rollout sampling settings), not per call: remove it") });
    expect(await bad({ ...body, temperature: 1.5 })).toEqual({ status: 400, error: invalid("temperature: must be <= 1") });
    expect(await bad({ ...body, container: "c1" })).toEqual({
      status: 400,
      error: invalid("container: not supported by edgeloop's Messages endpoint (it samples only with model, max_tokens, messages, system, tools, tool_choice, temperature, top_p, stop_sequences, stream): remove it"),
    });
    const image = [{ role: "user", content: [{ type: "text", text: "what is this?" }, { type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } }] }];
    // An image on a text-only family: refused when the turn is rendered, naming the block as sent (tests/vision/gateway-images.test.ts reads them).
    expect(await bad({ ...body, messages: image })).toEqual({ status: 400, error: invalid("messages[0].content[1].source.data: holds image parts, and model qwen3 (family qwen3) is text-only; use a vision-language family (qwen3_vl)") });
    const doc = [{ role: "user", content: [{ type: "document", source: { type: "text", media_type: "text/plain", data: "x" } }] }];
    expect(await bad({ ...body, messages: doc })).toEqual({ status: 400, error: invalid('messages[0].content[0].type: "document" blocks are not supported in a user turn (edgeloop reads text, image and tool_result)') });
    expect(await bad({ ...body, tools: [{ type: "web_search_20250305", name: "web_search" }] })).toEqual({
      status: 400,
      error: invalid('tools[0].type: only client tools ("custom" or absent) are supported, got "web_search_20250305": edgeloop runs no server tools'),
    });
    expect(await bad({ ...body, tools: [{ name: "calc" }] })).toEqual({ status: 400, error: invalid("tools[0].input_schema: expected a JSON Schema object") });
    expect(await bad({ ...body, messages: [{ role: "tool", content: "x" }] })).toEqual({ status: 400, error: invalid('messages[0].role: expected "user" or "assistant"; got "tool"') });
    expect(await bad({ ...body, messages: [...p.messages, { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "calc", input: "2+2" }] }] })).toMatchObject({
      status: 400,
      error: { error: { type: "invalid_request_error", message: expect.stringMatching(/^messages\[1\]\.content\[0\]\.input: /) } },
    });
    expect(await bad({ ...body, stop_sequences: [""] })).toEqual({ status: 400, error: invalid("stop_sequences[0]: a stop sequence must not be empty") });
    const malformed = await fetchApp(`${BASE}/v1/sessions/u0_0_0/anthropic/v1/messages`, { method: "POST", headers: { "x-api-key": TOKEN }, body: "{" });
    expect([malformed.status, await malformed.json()]).toEqual([400, invalid("body: malformed JSON")]);
    expect(engine.stats.requests).toBe(0);

    // Accepted, unused, named.
    const { response } = await a.messages.create({ ...body, metadata: { user_id: "u-1" }, thinking: { type: "enabled", budget_tokens: 2048 } }).withResponse();
    expect(response.headers.get("x-edgeloop-ignored-keys")).toBe("metadata,thinking");
    expect(engine.stats.requests).toBe(1);

    // 401: a wrong key and an unknown session are the same answer.
    const wrong = await apiError(anthropic(fetchApp, "u0_0_0", "wrong").messages.create(body));
    expect(wrong).toEqual({ status: 401, error: { type: "error", error: { type: "authentication_error", message: "wrong or missing API key for agent session 'u0_0_0'" }, request_id: null } });
    const unknown = await apiError(anthropic(fetchApp, "nope_0_0").messages.create(body));
    expect(unknown).toEqual({ status: 401, error: { type: "error", error: { type: "authentication_error", message: "wrong or missing API key for agent session 'nope_0_0'" }, request_id: null } });
    const none = await fetchApp(`${BASE}/v1/sessions/u0_0_0/anthropic/v1/messages`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    expect([none.status, none.headers.get("www-authenticate")]).toEqual([401, 'Bearer realm="edgeloop"']);
    // x-api-key (what Anthropic's API reads) works as the bearer does.
    const viaHeader = await fetchApp(`${BASE}/v1/sessions/u0_0_0/anthropic/v1/messages`, { method: "POST", headers: { "x-api-key": TOKEN, "content-type": "application/json", ...RETRY.headers }, body: JSON.stringify(body) });
    expect(viaHeader.status).toBe(200);
    expect(((await viaHeader.json()) as { id: string }).id).toBe(`${ID}-0-1-1`);
    expect(engine.stats.requests).toBe(1);
  });

  test("404 for other paths, 413 over the body limit, 409 after finish (answered once: x-should-retry false), all in Anthropic's shape", async () => {
    const { gw, fetchApp, seen, engine } = setup();
    await createSession(gw);
    const a = anthropic(fetchApp, "u0_0_0", TOKEN, 2);
    const p = anthropicPrompt(rows[0]!.prompt);
    const body = { model: "qwen3", max_tokens: 1024, system: p.system, messages: p.messages, tools: anthropicTools };
    const counted = await fetchApp(`${BASE}/v1/sessions/u0_0_0/anthropic/v1/messages/count_tokens`, { method: "POST", headers: { "x-api-key": TOKEN }, body: "{}" });
    expect([counted.status, await counted.json()]).toEqual([
      404,
      { type: "error", error: { type: "not_found_error", message: "no route POST /v1/sessions/u0_0_0/anthropic/v1/messages/count_tokens: the Messages endpoint is POST …/anthropic/v1/messages" }, request_id: null },
    ]);
    const huge = await apiError(a.messages.create({ ...body, system: "x".repeat(70 * 1024) }));
    expect(huge).toEqual({ status: 413, error: { type: "error", error: { type: "request_too_large", message: "body: larger than 65536 bytes" }, request_id: null } });

    await gw.finish("u0_0_0", { by: "agent", reward: 1 });
    const before = seen.length;
    const closed = await apiError(a.messages.create(body));
    expect(closed).toEqual({
      status: 409,
      error: { type: "error", error: { type: "conflict_error", message: "agent session 'u0_0_0' is closed (finished); no more calls are answered" }, request_id: null },
    });
    expect(seen.length - before).toBe(1);
    expect(engine.stats.requests).toBe(0);
  });

  test("an engine that cannot answer is the API's 529 overloaded_error (retry-after 1), retried by the SDK and answered once the engine is back", async () => {
    let down = 1;
    const engine = new SimEngine({ tokenizer: tok, script });
    const inner = new SimEngineClient(engine);
    const flaky: InferenceClient = {
      generate: async (req) => {
        if (down-- > 0) throw new EngineUnavailableError("engine replica 127.0.0.1:1 is not answering");
        return inner.generate(req);
      },
      maxModelLen: () => inner.maxModelLen(),
    };
    const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: flaky, maxModelLen: 4096, wallClockMs: () => 1_700_000_000_000 });
    const app = createAgentGatewayApp({ gateway: gw });
    const statuses: number[] = [];
    const fetchApp: FetchLike = async (u, i) => {
      const res = await app.fetch(u instanceof Request ? u : new Request(String(u), i));
      statuses.push(res.status);
      return res;
    };
    await createSession(gw);
    const p = anthropicPrompt(rows[0]!.prompt);
    const body = { model: "qwen3", max_tokens: 1024, system: p.system, messages: p.messages, tools: anthropicTools };
    const raw = await fetchApp(`${BASE}/v1/sessions/u0_0_0/anthropic/v1/messages`, { method: "POST", headers: { "x-api-key": TOKEN }, body: JSON.stringify(body) });
    expect([raw.status, raw.headers.get("retry-after"), await raw.json()]).toEqual([
      529,
      "1",
      { type: "error", error: { type: "overloaded_error", message: "engine replica 127.0.0.1:1 is not answering" }, request_id: null },
    ]);
    down = 1;
    const m = await anthropic(fetchApp, "u0_0_0", TOKEN, 1).messages.create(body);
    expect(m.stop_reason).toBe("tool_use");
    expect(statuses).toEqual([529, 529, 200]);
    expect(engine.stats.requests).toBe(1);
  });
});

/**
 * A test agent on `@anthropic-ai/sdk`, acting as `tool_agent` would: every
 * `tool_use` run through the same {@link WebhookToolClient}, the assistant
 * content sent back as returned, the results as one user turn of
 * `tool_result` blocks; then finish. `stops` collects the stop reasons.
 */
async function runMessagesAgent(task: AgentTask, fetchApp: FetchLike, streaming: boolean, stops: (string | null)[]): Promise<void> {
  const client = new Anthropic({ baseURL: task.base_url.replace(/\/openai\/v1$/, "/anthropic"), apiKey: task.api_key, fetch: fetchApp as typeof fetch, maxRetries: 0 });
  const { system, messages } = anthropicPrompt(task.messages as ChatMessage[]);
  const params = () => ({ model: task.model, max_tokens: 2048, system, messages, tools: asAnthropicTools(task.tools as ToolSchema[]) });
  for (let turn = 1; turn <= 8; turn++) {
    const m = streaming ? await client.messages.stream(params()).finalMessage() : await client.messages.create(params());
    stops.push(m.stop_reason);
    const uses = m.content.filter((b): b is Anthropic.ToolUseBlock => b.type === "tool_use");
    if (uses.length === 0) break;
    messages.push({ role: "assistant", content: m.content });
    const results: Anthropic.ToolResultBlockParam[] = [];
    for (const [index, u] of uses.entries()) {
      const res = await toolClient.call({ name: u.name, arguments: u.input as Record<string, unknown>, key: task.key, turn, index });
      results.push({ type: "tool_result", tool_use_id: u.id, content: res.content });
    }
    messages.push({ role: "user", content: results });
  }
  const res = await fetchApp(task.finish_url, { method: "POST", headers: { authorization: `Bearer ${task.api_key}`, "content-type": "application/json" }, body: "{}" });
  if (res.status !== 200) throw new Error(`finish answered ${res.status}`);
}
