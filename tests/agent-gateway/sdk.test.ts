/**
 * The agent gateway through the official `openai` SDK (in-process: the SDK's
 * `fetch` option calls the Hono app), real Qwen3 tokenizer, sim engine, and
 * the example tool server over loopback for the tools.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { readFileSync } from "node:fs";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { OpenAIAgentLoop, type AgentGatewayLink } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
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
import type { ChatMessage, RolloutConfig, ToolSchema } from "../../shared/schema/index.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const script = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const rows = readFileSync(`${ROOT}examples/gsm8k-tool.jsonl`, "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l) as { prompt: ChatMessage[] });
const BASE = "http://edgeloop.local";
const TOKEN = "tok_0123456789abcdef0123";
const IM_END = 151645;
/** Reply ids are `chatcmpl-{fnv1a32(key) hex}-{output}-{assistant turn}-{step}`. */
const ID = `chatcmpl-${fnv1a32("u0_0_0").toString(16)}`;

let tok: ChatTokenizer;
let toolServer: ToolServer;
let toolClient: WebhookToolClient;
let tools: ToolSchema[];
let sdkTools: OpenAI.ChatCompletionTool[];

beforeAll(async () => {
  tok = await defaultTokenizer();
  toolServer = startToolServer({ port: 0 });
  const file = parseToolsFile(readFileSync(`${ROOT}infra/tools/tools.example.json`, "utf8"), { vars: { port: toolServer.port } });
  toolClient = new WebhookToolClient(file.tools);
  tools = [...toolClient.schemas];
  sdkTools = tools as OpenAI.ChatCompletionTool[];
});
afterAll(async () => {
  await toolServer.stop();
});

/** The sim engine client, recording every request's `max_tokens` and prompt ids. */
class CountingClient implements InferenceClient {
  readonly requests: { max_tokens: number | undefined; prompt_ids: number[] }[] = [];
  constructor(readonly inner: SimEngineClient) {}
  async generate(req: GenerateRequest) {
    this.requests.push({ max_tokens: req.max_tokens, prompt_ids: Array.from(req.prompt_ids) });
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
  const app = createAgentGatewayApp({ gateway: gw });
  /** Every request the app saw (method, path). */
  const seen: string[] = [];
  const fetchApp = async (u: string | URL | Request, i?: RequestInit) => {
    const req = u instanceof Request ? u : new Request(String(u), i);
    seen.push(`${req.method} ${new URL(req.url).pathname}`);
    return app.fetch(req);
  };
  return { engine, client, gw, app, fetchApp, seen };
}

function sdk(fetchApp: (u: string | URL | Request, i?: RequestInit) => Promise<Response>, key = "u0_0_0", apiKey = TOKEN, maxRetries = 0) {
  return new OpenAI({ baseURL: `${BASE}/v1/sessions/${key}/openai/v1`, apiKey, fetch: fetchApp, maxRetries });
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

async function finishCall(fetchApp: (u: string, i?: RequestInit) => Promise<Response>, key = "u0_0_0", body: unknown = {}, token = TOKEN) {
  const res = await fetchApp(`${BASE}/v1/sessions/${key}/finish`, { method: "POST", headers: { authorization: `Bearer ${token}`, "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

/** Request options marking a call as the SDK's first retry (what it sends after a failed attempt). */
const RETRY = { headers: { "x-stainless-retry-count": "1" } };

/** The first tool call's id in session u0_0_0 (ids carry the session's tag: unique across sessions). */
const CALL1_ID = `call_${sessionTag("u0_0_0")}_0_0_0`;
const CALL1 = { id: CALL1_ID, type: "function", function: { name: "calc", arguments: '{"expression":"12*3-5"}' } };

describe("agent gateway through the openai SDK", () => {
  test("non-streaming, then stream().finalChatCompletion(), then create({stream: true}) chunks of a replay", async () => {
    const { gw, fetchApp, engine } = setup();
    await createSession(gw);
    const client = sdk(fetchApp);
    const messages: OpenAI.ChatCompletionMessageParam[] = [...rows[0]!.prompt] as OpenAI.ChatCompletionMessageParam[];
    const r1 = await client.chat.completions.create({ model: "qwen3", messages, tools: sdkTools });
    expect(r1.id).toBe(`${ID}-0-1-1`);
    expect(r1.object).toBe("chat.completion");
    expect(r1.created).toBe(1_700_000_000);
    expect(r1.model).toBe("qwen3");
    expect(r1.choices[0]!.finish_reason).toBe("tool_calls");
    expect(r1.choices[0]!.message.tool_calls).toEqual([CALL1] as OpenAI.ChatCompletionMessageToolCall[]);
    expect(r1.choices[0]!.message.content).toBe(null);
    expect((r1.choices[0]!.message as unknown as { reasoning_content: string }).reasoning_content).toBe("Let me compute 12*3-5.");
    const prompt0 = tok.renderIds(rows[0]!.prompt, { tools, addGenerationPrompt: true });
    const turn1 = tok.encode(script.rules[0].turns[0]).length + 1;
    expect(r1.usage).toEqual({ prompt_tokens: prompt0.length, completion_tokens: turn1, total_tokens: prompt0.length + turn1 });

    messages.push(r1.choices[0]!.message as OpenAI.ChatCompletionMessageParam, { role: "tool", tool_call_id: CALL1_ID, content: "31" });
    const final = await client.chat.completions.stream({ model: "qwen3", messages, tools: sdkTools }).finalChatCompletion();
    expect(final.choices[0]!.message.content).toBe("The answer is 31.\n#### 31");
    expect(final.choices[0]!.finish_reason).toBe("stop");
    expect(final.choices[0]!.message.tool_calls ?? []).toEqual([]);
    expect(engine.stats.requests).toBe(2);

    // Without stream_options.include_usage there is no usage chunk (OpenAI's rule): every chunk has a choice.
    expect(final.usage).toBeUndefined();
    const plain: OpenAI.ChatCompletionChunk[] = [];
    for await (const c of await client.chat.completions.create({ model: "qwen3", messages, tools: sdkTools, stream: true }, RETRY)) plain.push(c);
    expect(plain.map((c) => c.choices.length)).toEqual([1, 1, 1, 1]);

    // The same body retried, streamed with include_usage: the stored reply, chunk by chunk, and no engine call.
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const c of await client.chat.completions.create({ model: "qwen3", messages, tools: sdkTools, stream: true, stream_options: { include_usage: true } }, RETRY)) chunks.push(c);
    expect(engine.stats.requests).toBe(2);
    expect(chunks.map((c) => c.id)).toEqual(Array(5).fill(final.id));
    expect(chunks.map((c): unknown => c.choices[0]?.delta ?? null)).toEqual([
      { role: "assistant", content: "" },
      { reasoning_content: "The tool says 31." } as OpenAI.ChatCompletionChunk.Choice.Delta,
      { content: "The answer is 31.\n#### 31" },
      {},
      null,
    ]);
    expect(chunks.map((c) => c.choices[0]?.finish_reason ?? null)).toEqual([null, null, null, "stop", null]);
    expect(chunks[4]!.usage).toEqual({ prompt_tokens: engine.requests[1]!.prompt_tokens, completion_tokens: engine.requests[1]!.completion_tokens!, total_tokens: engine.requests[1]!.prompt_tokens! + engine.requests[1]!.completion_tokens! });
  });

  test("create({stream: true}) with a tool call: the call arrives as one tool_calls delta", async () => {
    const { gw, fetchApp } = setup();
    await createSession(gw);
    const client = sdk(fetchApp);
    const stream = await client.chat.completions.create({ model: "qwen3", messages: rows[0]!.prompt as OpenAI.ChatCompletionMessageParam[], tools: sdkTools, stream: true });
    const deltas: OpenAI.ChatCompletionChunk.Choice.Delta[] = [];
    const finishes: (string | null)[] = [];
    for await (const c of stream) {
      if (c.choices[0]) {
        deltas.push(c.choices[0].delta);
        finishes.push(c.choices[0].finish_reason);
      }
    }
    expect(deltas).toEqual([
      { role: "assistant", content: "" },
      { reasoning_content: "Let me compute 12*3-5." } as OpenAI.ChatCompletionChunk.Choice.Delta,
      { tool_calls: [{ index: 0, ...CALL1 } as OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall] },
      {},
    ]);
    expect(finishes).toEqual([null, null, null, "tool_calls"]);
  });

  test("openai_agent (an SDK agent, tools through WebhookToolClient) and tool_agent record identical tokens", async () => {
    // Row 0: one calc call; row 3: lookup then calc. (A malformed call, as in row 5, differs by design:
    // tool_agent answers it with an error observation, an OpenAI agent sees no tool_calls and stops.)
    for (const rowIndex of [0, 3]) {
      const { gw, fetchApp, client: counting } = setup();
      const agentRuns: Promise<void>[] = [];
      // The test agent: the webhook answers 202 and runs an SDK loop in the background.
      const agentFetch = (async (u: string | URL | Request, init?: RequestInit) => {
        expect(String(u)).toBe("http://agent.local/tasks");
        const task = AgentTask.parse(JSON.parse(String(init!.body)));
        agentRuns.push(runToolAgent(task, fetchApp));
        return new Response(null, { status: 202 });
      }) as typeof fetch;
      const link: AgentGatewayLink = { gateway: gw, publicUrl: () => BASE, agent: { url: "http://agent.local/tasks", timeout_ms: 600_000, secret: null }, fetch: agentFetch };
      const row = rows[rowIndex]!;
      const loop = new OpenAIAgentLoop(ctxOf(tok, counting, config(), { tools: toolClient, reward: false, agentGateway: link }));
      // Own keys per run (the tool server deduplicates calls on `{key}:{turn}:{index}`).
      const outs = await loop.run(SP, { uid: `oa${rowIndex}`, session_id: 0, prompt: row.prompt });
      await Promise.all(agentRuns);
      expect(agentRuns.length).toBe(1);
      expect(outs.length).toBe(1);

      const ref = await new ToolAgentLoop(ctxOf(tok, new SimEngineClient(new SimEngine({ tokenizer: tok, script })), config(), { tools: toolClient, reward: false })).run(SP, {
        uid: `ta${rowIndex}`,
        session_id: 0,
        prompt: row.prompt,
      });
      const out = outs[0]!;
      expect(out.prompt_ids).toEqual(ref.prompt_ids);
      expect(out.response_ids).toEqual(ref.response_ids);
      expect(out.response_mask).toEqual(ref.response_mask);
      expect(out.response_logprobs).toEqual(ref.response_logprobs);
      expect(out.num_turns).toBe(ref.num_turns);
      expect(counting.requests.length).toBe(rowIndex === 3 ? 3 : 2);
      expect(out.response_ids[out.response_ids.length - 1]).toBe(IM_END);
      expect(out.extra_fields.tool_calls).toBe(rowIndex === 3 ? 2 : 1);
    }
  });

  test("an agent that rewrites history: two outputs, the second's prompt_ids the fresh render of the second request", async () => {
    for (const edit of ["system", "drop"] as const) {
      const { gw, fetchApp, client: counting } = setup();
      await createSession(gw);
      const client = sdk(fetchApp);
      const first = rows[0]!.prompt as OpenAI.ChatCompletionMessageParam[];
      const r1 = await client.chat.completions.create({ model: "qwen3", messages: first, tools: sdkTools });
      const second: OpenAI.ChatCompletionMessageParam[] =
        edit === "system"
          ? [{ role: "system", content: "You are terse." }, first[1]!, r1.choices[0]!.message as OpenAI.ChatCompletionMessageParam, { role: "tool", tool_call_id: CALL1_ID, content: "31" }]
          : [first[0]!, { role: "user", content: "Ana bakes 12 loaves a day for 3 days and gives away 5. How many loaves are left? Use calc." }];
      const r2 = await client.chat.completions.create({ model: "qwen3", messages: second, tools: sdkTools });
      const st = await gw.finish("u0_0_0", { by: "agent", reward: 0.5 });
      const outs = agentOutputs(st, { reward: 0.5 });
      expect(outs.length).toBe(2);
      expect(outs[0]!.prompt_ids).toEqual(tok.renderIds(first as ChatMessage[], { tools, addGenerationPrompt: true }));
      // What the second request renders to, with the assistant message as the SDK sent it back (reasoning, tool_calls).
      const fresh = tok.renderIds(second as ChatMessage[], { tools, addGenerationPrompt: true });
      expect(outs[1]!.prompt_ids).toEqual(fresh);
      expect(counting.requests[1]!.prompt_ids).toEqual(fresh);
      // The sim engine plays the rule's turn after the assistant turns the prompt holds.
      const played = script.rules[0].turns[edit === "system" ? 1 : 0];
      expect(outs[1]!.response_ids).toEqual([...tok.encode(played), IM_END]);
      expect(r2.choices[0]!.finish_reason).toBe(edit === "system" ? "stop" : "tool_calls");
      expect(outs.map((o) => o.extra_fields.output_count)).toEqual([2, 2]);
      expect(r2.id).toBe(`${ID}-1-1-2`);
    }
  });

  test("S16: keys that would change sampling are refused with a 400 naming them (no engine call); ignored ones are named in the reply", async () => {
    const { gw, fetchApp, engine } = setup();
    await createSession(gw);
    const client = sdk(fetchApp);
    const body = { model: "qwen3", messages: rows[0]!.prompt as OpenAI.ChatCompletionMessageParam[], tools: sdkTools };
    for (const [key, value] of [["top_k", 1], ["min_tokens", 5000], ["repetition_penalty", 1.2], ["chat_template_kwargs", { enable_thinking: false }], ["guided_json", {}]] as const) {
      const err = await client.chat.completions.create({ ...body, [key]: value } as never).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(OpenAI.BadRequestError);
      expect((err as InstanceType<typeof OpenAI.BadRequestError>).error).toEqual({
        code: "invalid_input",
        field: key,
        message: `${key}: not supported by edgeloop's agent gateway (it samples only with model, messages, tools, tool_choice, temperature, top_p, seed, max_tokens, max_completion_tokens, stop, stream, logprobs): remove it`,
        // OpenAI's own fields too (the SDK's e.type / e.param).
        type: "invalid_request_error",
        param: key,
      });
    }
    expect(engine.stats.requests).toBe(0);
    // Bookkeeping keys are accepted, and the reply says they were not used.
    const { response } = await client.chat.completions.create({ ...body, user: "u-1", metadata: { run: "x" }, parallel_tool_calls: false, service_tier: null } as never).withResponse();
    expect(response.status).toBe(200);
    expect(response.headers.get("x-edgeloop-ignored-keys")).toBe("user,metadata,parallel_tool_calls");
    const plain = await client.chat.completions.create(body, RETRY).withResponse();
    expect(plain.response.headers.get("x-edgeloop-ignored-keys")).toBeNull();
    expect(engine.stats.requests).toBe(1);
  });

  test("a retried request (x-stainless-retry-count ≥ 1) gets the identical reply and no engine call", async () => {
    const { gw, fetchApp, engine } = setup();
    await createSession(gw);
    const client = sdk(fetchApp);
    const body = { model: "qwen3", messages: rows[0]!.prompt as OpenAI.ChatCompletionMessageParam[], tools: sdkTools, temperature: 0.7 };
    const a = await client.chat.completions.create(body);
    expect(engine.stats.requests).toBe(1);
    const b = await client.chat.completions.create(body, RETRY);
    const c = await client.chat.completions.create(body, { headers: { "x-stainless-retry-count": "2" } });
    expect(b).toEqual(a);
    expect(c).toEqual(a);
    expect(engine.stats.requests).toBe(1);
    expect((await gw.get("u0_0_0"))!.step).toBe(1);
    // Other sampling is another call: it opens the next output with one more engine call.
    await client.chat.completions.create({ ...body, temperature: 0.2 });
    expect(engine.stats.requests).toBe(2);
  });

  test("401 (wrong token or unknown key alike), 400 naming the field, 409 after finish (not retried by the SDK), finish idempotent", async () => {
    const { gw, fetchApp, engine, seen } = setup();
    await createSession(gw);
    const msgs = rows[0]!.prompt as OpenAI.ChatCompletionMessageParam[];
    const err = async (p: Promise<unknown>) => {
      try {
        await p;
      } catch (e) {
        const x = e as InstanceType<typeof OpenAI.APIError>;
        return { status: x.status, error: x.error };
      }
      throw new Error("expected an error");
    };
    expect(await err(sdk(fetchApp, "u0_0_0", "wrong").chat.completions.create({ model: "m", messages: msgs }))).toMatchObject({ status: 401, error: { code: "unauthorized" } });
    const noBearer = await fetchApp(`${BASE}/v1/sessions/u0_0_0/openai/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "m", messages: msgs }) });
    expect(noBearer.status).toBe(401);
    expect(noBearer.headers.get("www-authenticate")).toBe('Bearer realm="edgeloop"');
    // S15: an unknown key is the same 401 as a wrong token (no session-existence oracle).
    const unknown = await err(sdk(fetchApp, "nope_0_0").chat.completions.create({ model: "m", messages: msgs }));
    expect(unknown).toEqual({ status: 401, error: { code: "unauthorized", message: "wrong or missing bearer token for agent session 'nope_0_0'", type: "authentication_error", param: null } });
    expect(await err(sdk(fetchApp, "u0_0_0", "wrong").chat.completions.create({ model: "m", messages: msgs }))).toEqual({
      status: 401,
      error: { code: "unauthorized", message: "wrong or missing bearer token for agent session 'u0_0_0'", type: "authentication_error", param: null },
    });
    expect(await err(sdk(fetchApp, "nope_0_0").models.list())).toMatchObject({ status: 401 });
    const client = sdk(fetchApp);
    const bad = async (extra: Record<string, unknown>, messages = msgs) => err(client.chat.completions.create({ model: "m", messages, ...extra } as OpenAI.ChatCompletionCreateParamsNonStreaming));
    expect(await bad({ n: 2 })).toMatchObject({ status: 400, error: { code: "invalid_input", field: "n" } });
    expect(await bad({ tool_choice: "required", tools: sdkTools })).toMatchObject({ status: 400, error: { code: "invalid_input", field: "tool_choice" } });
    expect(await bad({ logprobs: true, top_logprobs: 3 })).toMatchObject({ status: 400, error: { code: "invalid_input", field: "top_logprobs" } });
    const image: OpenAI.ChatCompletionMessageParam[] = [msgs[0]!, { role: "user", content: [{ type: "text", text: "what is this?" }, { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } }] }];
    // An image on a text-only family: refused when the turn is rendered, naming the part.
    expect(await bad({}, image)).toMatchObject({ status: 400, error: { code: "invalid_input", field: "messages[1].content[1].image_url.url" } });
    expect(engine.stats.requests).toBe(0);
    expect((await sdk(fetchApp).models.list()).data.map((m) => m.id)).toEqual([gw.modelName]);

    const f1 = await finishCall(fetchApp, "u0_0_0", { reward: 1, metadata: { steps: 0 } });
    expect(f1).toEqual({ status: 200, body: { ok: true, key: "u0_0_0", outputs: 0, finished_by: "agent" } });
    // The same finish again (a retry) is answered again; another outcome is refused, never silently dropped.
    expect(await finishCall(fetchApp, "u0_0_0", { reward: 1, metadata: { steps: 0 } })).toEqual(f1);
    const f2 = await finishCall(fetchApp, "u0_0_0", { reward: 0 });
    expect(f2.status).toBe(409);
    expect(f2.body).toMatchObject({ error: { code: "session_closed", message: "agent session 'u0_0_0' is closed (finished; already finished with reward 1); no more calls are answered" } });
    const st = (await gw.get("u0_0_0"))!;
    expect(st.finish).toMatchObject({ by: "agent", reward: 1, metadata: { steps: 0 } });
    expect(st.step).toBe(1);
    expect((await finishCall(fetchApp, "u0_0_0", {}, "wrong")).status).toBe(401);
    expect((await finishCall(fetchApp, "nope_0_0")).status).toBe(401);
    expect((await finishCall(fetchApp, "u0_0_0", { reward: "high" })).body).toMatchObject({ error: { field: "reward" } });

    // 409 even with the SDK's default retries: answered once (x-should-retry: false), no engine call.
    const before = seen.length;
    const closed = await err(sdk(fetchApp, "u0_0_0", TOKEN, 2).chat.completions.create({ model: "m", messages: msgs }));
    expect(closed).toMatchObject({ status: 409, error: { code: "session_closed" } });
    expect(seen.length - before).toBe(1);
    expect(engine.stats.requests).toBe(0);
  });

  test("response_length reached mid-conversation ends the output (finish_reason length); the next call opens output 1", async () => {
    const { gw, fetchApp, client: counting } = setup();
    const prompt0 = tok.renderIds(rows[0]!.prompt, { tools, addGenerationPrompt: true });
    const turn1 = tok.encode(script.rules[0].turns[0]).length + 1;
    const obs = tok.renderIds([...rows[0]!.prompt, { role: "assistant", content: script.rules[0].turns[0] }, { role: "tool", content: "31" }], { tools, addGenerationPrompt: true }).length - prompt0.length - turn1;
    const responseLength = turn1 + obs + 5;
    await createSession(gw, { rollout: config({ response_length: responseLength }) });
    const client = sdk(fetchApp);
    const messages = [...rows[0]!.prompt] as OpenAI.ChatCompletionMessageParam[];
    const r1 = await client.chat.completions.create({ model: "m", messages, tools: sdkTools });
    messages.push(r1.choices[0]!.message as OpenAI.ChatCompletionMessageParam, { role: "tool", tool_call_id: CALL1_ID, content: "31" });
    const r2 = await client.chat.completions.create({ model: "m", messages, tools: sdkTools });
    expect(counting.requests.map((r) => r.max_tokens)).toEqual([responseLength, 5]);
    expect(r2.choices[0]!.finish_reason).toBe("length");
    expect(r2.usage!.completion_tokens).toBe(5);
    const turn2 = tok.encode(script.rules[0].turns[1]).slice(0, 5);
    // No `</think>` in the cut turn: all of it is content (as vLLM's qwen3 reasoning parser does).
    expect(r2.choices[0]!.message.content).toBe("<think>\nThe tool says");
    expect(tok.decode(turn2)).toBe("<think>\nThe tool says");
    expect("reasoning_content" in r2.choices[0]!.message).toBe(false);

    messages.push(r2.choices[0]!.message as OpenAI.ChatCompletionMessageParam, { role: "user", content: "Go on." });
    const r3 = await client.chat.completions.create({ model: "m", messages, tools: sdkTools });
    expect(r3.id).toBe(`${ID}-1-1-3`);
    const st = await gw.finish("u0_0_0", { by: "agent" });
    const outs = agentOutputs(st, { reward: null });
    expect(outs.length).toBe(2);
    expect(outs[0]!.response_ids.length).toBe(responseLength);
    expect(outs[0]!.response_ids.slice(-5)).toEqual(turn2);
    expect(outs[0]!.response_mask).toEqual([...Array(turn1).fill(1), ...Array(obs).fill(0), ...Array(5).fill(1)]);
    expect(outs[0]!.extra_fields.terminated_by).toBe("response_length");
    expect([outs[0]!.truncated, outs[1]!.truncated]).toEqual([true, false]);
    expect(outs[1]!.prompt_ids).toEqual(tok.renderIds(messages as ChatMessage[], { tools, addGenerationPrompt: true }));
    expect(counting.requests[2]!.prompt_ids).toEqual(outs[1]!.prompt_ids);
    expect(counting.requests[2]!.max_tokens).toBe(responseLength);
  });

  test("max_tokens in the request caps the engine call; the output goes on", async () => {
    const { gw, fetchApp, client: counting } = setup();
    await createSession(gw);
    const client = sdk(fetchApp);
    const messages = [...rows[0]!.prompt] as OpenAI.ChatCompletionMessageParam[];
    const r1 = await client.chat.completions.create({ model: "m", messages, tools: sdkTools, max_tokens: 7 });
    expect(counting.requests.map((r) => r.max_tokens)).toEqual([7]);
    expect(r1.choices[0]!.finish_reason).toBe("length");
    expect(r1.usage!.completion_tokens).toBe(7);
    const r1b = await client.chat.completions.create({ model: "m", messages, tools: sdkTools, max_completion_tokens: 9 });
    expect(counting.requests.map((r) => r.max_tokens)).toEqual([7, 9]);
    expect(r1b.usage!.completion_tokens).toBe(9);
    const st = (await gw.get("u0_0_0"))!;
    expect(st.outputs.length).toBe(2);
    expect(st.outputs[0]!.ended).toBe(false);
  });
});

/**
 * A test agent written with the SDK, as `tool_agent` would act: every tool
 * call executed through the same {@link WebhookToolClient} (the example tool
 * server), the assistant message sent back as returned, then finish.
 */
async function runToolAgent(task: AgentTask, fetchApp: (u: string | URL | Request, i?: RequestInit) => Promise<Response>): Promise<void> {
  const client = new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, fetch: fetchApp, maxRetries: 0 });
  const messages = [...task.messages] as OpenAI.ChatCompletionMessageParam[];
  for (let turn = 1; turn <= 8; turn++) {
    const r = await client.chat.completions.create({ model: task.model, messages, tools: task.tools as OpenAI.ChatCompletionTool[] });
    const m = r.choices[0]!.message;
    if (!m.tool_calls?.length) break;
    messages.push(m as OpenAI.ChatCompletionMessageParam);
    for (const [index, c] of m.tool_calls.entries()) {
      if (c.type !== "function") throw new Error("not a function call");
      const res = await toolClient.call({ name: c.function.name, arguments: JSON.parse(c.function.arguments), key: task.key, turn, index });
      messages.push({ role: "tool", tool_call_id: c.id, content: res.content });
    }
  }
  const res = await fetchApp(task.finish_url, { method: "POST", headers: { authorization: `Bearer ${task.api_key}`, "content-type": "application/json" }, body: "{}" });
  if (res.status !== 200) throw new Error(`finish answered ${res.status}`);
}
