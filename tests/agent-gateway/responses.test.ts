/**
 * The agent gateway's Responses endpoint through the official `openai` SDK
 * (`client.responses.create`, streaming and not) and `@openai/agents`
 * (in-process: the SDK's `fetch` calls the Hono app), real Qwen3 tokenizer,
 * sim engine, the example tool server for the tools. The recorded tokens are
 * compared with `tool_agent`'s for the same conversation.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { Agent, OpenAIProvider, Runner, setTracingDisabled, tool } from "@openai/agents";
import { z } from "zod";
import { readFileSync } from "node:fs";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { parseResponsesRequest } from "../../shared/agent-gateway/responses-wire.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { fnv1a32 } from "../../shared/inference/hash.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const script = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const rows = readFileSync(`${ROOT}examples/gsm8k-tool.jsonl`, "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l) as { prompt: ChatMessage[] });
/** Request options marking a call as the SDK's first retry: an equal answered call is replayed. */
const RETRY = { headers: { "x-stainless-retry-count": "1" } };
const BASE = "http://edgeloop.local";
const TOKEN = "tok_0123456789abcdef0123";
const IM_END = 151645;
const NOW = 1_700_000_000_000;

let tok: ChatTokenizer;
let toolServer: ToolServer;
let toolClient: WebhookToolClient;
let tools: ToolSchema[];
/** The session's tools as Responses function tools. */
let flatTools: OpenAI.Responses.FunctionTool[];

beforeAll(async () => {
  tok = await defaultTokenizer();
  toolServer = startToolServer({ port: 0 });
  const file = parseToolsFile(readFileSync(`${ROOT}infra/tools/tools.example.json`, "utf8"), { vars: { port: toolServer.port } });
  toolClient = new WebhookToolClient(file.tools);
  tools = [...toolClient.schemas];
  flatTools = tools.map((t) => ({ type: "function", name: t.function.name, description: t.function.description, parameters: t.function.parameters, strict: false }));
  setTracingDisabled(true);
});
afterAll(async () => {
  await toolServer.stop();
});

type Fetch = (u: string | URL | Request, i?: RequestInit) => Promise<Response>;

function setup() {
  const engine = new SimEngine({ tokenizer: tok, script });
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096, wallClockMs: () => NOW });
  const app = createAgentGatewayApp({ gateway: gw });
  const bodies: Record<string, unknown>[] = [];
  const fetchApp: Fetch = async (u, i) => {
    const req = u instanceof Request ? u : new Request(String(u), i);
    if (req.method === "POST") bodies.push(JSON.parse(await req.clone().text()));
    return app.fetch(req);
  };
  return { engine, gw, fetchApp, bodies };
}

function sdk(fetchApp: Fetch, key: string) {
  return new OpenAI({ baseURL: `${BASE}/v1/sessions/${key}/openai/v1`, apiKey: TOKEN, fetch: fetchApp, maxRetries: 0 });
}

async function createSession(gw: AgentGateway, key: string, row = 0) {
  return gw.create({ v: 1, key, uid: key.split("_")[0]!, session_id: 0, token: TOKEN, created_ms: NOW, deadline_ms: NOW + 600_000, sampling_params: SP, rollout: config(), tools, messages: rows[row]!.prompt });
}

/** `tool_agent`'s output for row `row` on its own engine (the reference tokens). */
async function toolAgentRef(row: number, uid: string) {
  const loop = new ToolAgentLoop(ctxOf(tok, new SimEngineClient(new SimEngine({ tokenizer: tok, script })), config(), { tools: toolClient, reward: false }));
  return loop.run(SP, { uid, session_id: 0, prompt: rows[row]!.prompt });
}

type Mode = { chain: boolean; stream: boolean; instructions: boolean };

/**
 * A Responses agent acting as `tool_agent` would: every function call run
 * through the example tool server, the output items sent back as returned
 * (or, chained, only the new items with `previous_response_id`).
 */
async function runResponsesAgent(client: OpenAI, key: string, row: number, mode: Mode): Promise<OpenAI.Responses.Response[]> {
  const prompt = rows[row]!.prompt;
  const sys = prompt[0]!;
  const first: OpenAI.Responses.ResponseInputItem[] = (mode.instructions ? prompt.slice(1) : prompt).map((m) => ({ role: m.role as "user" | "system", content: m.content as string }));
  let input = first;
  let previous: string | undefined;
  const replies: OpenAI.Responses.Response[] = [];
  for (let turn = 1; turn <= 8; turn++) {
    const body: OpenAI.Responses.ResponseCreateParamsNonStreaming = {
      model: "qwen3",
      input,
      tools: flatTools,
      ...(mode.instructions ? { instructions: sys.content as string } : {}),
      ...(previous ? { previous_response_id: previous } : {}),
    };
    const r = mode.stream ? await client.responses.stream(body as Parameters<OpenAI["responses"]["stream"]>[0]).finalResponse() : await client.responses.create(body);
    replies.push(r);
    const calls = r.output.filter((o) => o.type === "function_call") as OpenAI.Responses.ResponseFunctionToolCall[];
    if (!calls.length) break;
    const results: OpenAI.Responses.ResponseInputItem[] = [];
    for (const [index, c] of calls.entries()) {
      const res = await toolClient.call({ name: c.name, arguments: JSON.parse(c.arguments), key, turn, index });
      results.push({ type: "function_call_output", call_id: c.call_id, output: res.content });
    }
    if (mode.chain) {
      input = results;
      previous = r.id;
    } else {
      input = [...input, ...(r.output as OpenAI.Responses.ResponseInputItem[]), ...results];
    }
  }
  return replies;
}

const H = fnv1a32;

describe("agent gateway: OpenAI Responses API", () => {
  test("responses.create: a two-tool-round conversation records tool_agent's tokens exactly (full input, streamed, chained, instructions)", async () => {
    const ref = await toolAgentRef(3, "ref3");
    const modes: Mode[] = [
      { chain: false, stream: false, instructions: false },
      { chain: false, stream: true, instructions: true },
      { chain: true, stream: false, instructions: false },
      { chain: true, stream: true, instructions: true },
    ];
    for (const [i, mode] of modes.entries()) {
      const { gw, fetchApp, engine } = setup();
      const key = `rs${i}_0_0`;
      await createSession(gw, key, 3);
      const replies = await runResponsesAgent(sdk(fetchApp, key), key, 3, mode);
      expect(engine.stats.requests).toBe(3);
      expect(replies.map((r) => r.status)).toEqual(["completed", "completed", "completed"]);
      const n = 2; // messages of the first request, the instructions message included
      expect(replies.map((r) => r.id)).toEqual([`resp_${H(key).toString(16)}-0-1-1-${n}`, `resp_${H(key).toString(16)}-0-2-2-${n + 2}`, `resp_${H(key).toString(16)}-0-3-3-${n + 4}`].map((id) => (mode.instructions ? `${id}i` : id)));
      // (The script's answer for this row is wrong on purpose.)
      expect(replies[2]!.output_text).toBe("The answer is 121.\n#### 121");
      const st = await gw.finish(key, { by: "agent" });
      const outs = agentOutputs(st, { reward: null });
      expect(outs.length).toBe(1);
      expect(outs[0]!.prompt_ids).toEqual(ref.prompt_ids);
      expect(outs[0]!.response_ids).toEqual(ref.response_ids);
      expect(outs[0]!.response_mask).toEqual(ref.response_mask);
      expect(outs[0]!.response_logprobs).toEqual(ref.response_logprobs);
      expect(outs[0]!.num_turns).toBe(ref.num_turns);
      expect(outs[0]!.extra_fields.tool_calls).toBe(2);
    }
  });

  test("the response object: reasoning, function_call and message items, usage, echoed fields; a repeat is a replay", async () => {
    const { gw, fetchApp, engine } = setup();
    const key = "ro_0_0";
    await createSession(gw, key, 0);
    const client = sdk(fetchApp, key);
    const body: OpenAI.Responses.ResponseCreateParamsNonStreaming = { model: "qwen3", input: rows[0]!.prompt.map((m) => ({ role: m.role as "system", content: m.content as string })), tools: flatTools, temperature: 0.7, metadata: { run: "x" } };
    const { data: r1, response } = await client.responses.create(body).withResponse();
    expect(response.headers.get("x-edgeloop-ignored-keys")).toBe("metadata");
    const s = `${H(key).toString(16)}-0-1-1-2`;
    const prompt0 = tok.renderIds(rows[0]!.prompt, { tools, addGenerationPrompt: true });
    const turn1 = tok.encode(script.rules[0].turns[0]).length + 1;
    expect(r1).toEqual({
      id: `resp_${s}`,
      object: "response",
      created_at: 1_700_000_000,
      status: "completed",
      background: false,
      error: null,
      incomplete_details: null,
      instructions: null,
      max_output_tokens: null,
      metadata: { run: "x" },
      model: "qwen3",
      output: [
        { id: `rs_${s}`, type: "reasoning", summary: [], content: [{ type: "reasoning_text", text: "Let me compute 12*3-5." }], status: "completed" },
        { id: `fc_${s}_0`, type: "function_call", call_id: `call_${sessionTag(key)}_0_0_0`, name: "calc", arguments: '{"expression":"12*3-5"}', status: "completed" },
      ],
      output_text: "",
      parallel_tool_calls: true,
      previous_response_id: null,
      reasoning: { effort: null, summary: null },
      store: true,
      temperature: 0.7,
      text: { format: { type: "text" } },
      tool_choice: "auto",
      tools: flatTools.map((t) => ({ ...t, strict: false })),
      top_p: null,
      truncation: "disabled",
      usage: { input_tokens: prompt0.length, input_tokens_details: { cached_tokens: 0, cache_write_tokens: 0 }, output_tokens: turn1, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: prompt0.length + turn1 },
    } as unknown as OpenAI.Responses.Response);
    // The same body again (a retry), streamed or not: the stored reply, no engine call.
    expect(await client.responses.create(body, RETRY)).toEqual(r1);
    // (The stream helper adds its parse fields to the accumulated response.)
    const streamed = await client.responses.stream(body as Parameters<OpenAI["responses"]["stream"]>[0], RETRY).finalResponse();
    expect(streamed).toEqual({ ...r1, output: [r1.output[0], { ...r1.output[1], parsed_arguments: null }], output_parsed: null } as never);
    expect(engine.stats.requests).toBe(1);

    // The final turn: a message item with output_text (and the reasoning before it).
    const r2 = await client.responses.create({ ...body, input: [...(body.input as OpenAI.Responses.ResponseInputItem[]), ...(r1.output as OpenAI.Responses.ResponseInputItem[]), { type: "function_call_output", call_id: `call_${sessionTag(key)}_0_0_0`, output: "31" }] });
    const s2 = `${H(key).toString(16)}-0-2-2-4`;
    expect(r2.output).toEqual([
      { id: `rs_${s2}`, type: "reasoning", summary: [], content: [{ type: "reasoning_text", text: "The tool says 31." }], status: "completed" },
      { id: `msg_${s2}`, type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "The answer is 31.\n#### 31", annotations: [], logprobs: [] }] },
    ] as OpenAI.Responses.ResponseOutputItem[]);
    expect(r2.output_text).toBe("The answer is 31.\n#### 31");
    expect(engine.stats.requests).toBe(2);
  });

  test("stream: true: the Responses SSE events, in order, with sequence numbers", async () => {
    const { gw, fetchApp } = setup();
    const key = "ss_0_0";
    await createSession(gw, key, 0);
    const input = rows[0]!.prompt.map((m) => ({ role: m.role as "system", content: m.content as string }));
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const e of await sdk(fetchApp, key).responses.create({ model: "qwen3", input, tools: flatTools, stream: true })) events.push(e);
    const s = `${H(key).toString(16)}-0-1-1-2`;
    expect(events.map((e) => e.type)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.reasoning_text.delta",
      "response.reasoning_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(events.map((e) => e.sequence_number)).toEqual([...Array(13).keys()]);
    expect(events[0]).toMatchObject({ response: { id: `resp_${s}`, status: "in_progress", output: [], usage: null } });
    expect(events[9]).toEqual({ type: "response.function_call_arguments.delta", item_id: `fc_${s}_0`, output_index: 1, delta: '{"expression":"12*3-5"}', sequence_number: 9 } as never);
    expect(events[10]).toEqual({ type: "response.function_call_arguments.done", item_id: `fc_${s}_0`, output_index: 1, name: "calc", arguments: '{"expression":"12*3-5"}', sequence_number: 10 } as never);
    const done = events[12] as OpenAI.Responses.ResponseCompletedEvent;
    expect(done.response.status).toBe("completed");
    expect(done.response.output.map((o) => o.type)).toEqual(["reasoning", "function_call"]);

    // A message turn streams its text as output_text deltas.
    const { data: raw } = await sdk(fetchApp, key)
      .responses.create({ model: "qwen3", input: [...input, ...(done.response.output as OpenAI.Responses.ResponseInputItem[]), { type: "function_call_output", call_id: `call_${sessionTag(key)}_0_0_0`, output: "31" }], tools: flatTools, stream: true })
      .withResponse();
    const text: string[] = [];
    for await (const e of raw) if (e.type === "response.output_text.delta" || e.type === "response.output_text.done") text.push(e.type === "response.output_text.delta" ? e.delta : `done:${e.text}`);
    // Streamed as the engine samples it (this sim has no decode pace, so it hands over the turn in one chunk;
    // token-by-token deltas at a pace: streaming.test.ts): the deltas join to the whole text, then the done event.
    expect(text.slice(0, -1).join("")).toBe("The answer is 31.\n#### 31");
    expect(text.length).toBeGreaterThanOrEqual(2);
    expect(text.at(-1)).toBe("done:The answer is 31.\n#### 31");
  });

  test("max_output_tokens: status incomplete with reason max_output_tokens (response.incomplete when streamed)", async () => {
    const { gw, fetchApp } = setup();
    const key = "mx_0_0";
    await createSession(gw, key, 0);
    const input = rows[0]!.prompt.map((m) => ({ role: m.role as "system", content: m.content as string }));
    const r = await sdk(fetchApp, key).responses.create({ model: "qwen3", input, tools: flatTools, max_output_tokens: 7 });
    expect(r.status).toBe("incomplete");
    expect(r.incomplete_details).toEqual({ reason: "max_output_tokens" });
    expect(r.max_output_tokens).toBe(7);
    expect(r.usage!.output_tokens).toBe(7);
    expect(r.output).toEqual([{ id: `msg_${H(key).toString(16)}-0-1-1-2`, type: "message", role: "assistant", status: "incomplete", content: [{ type: "output_text", text: tok.decode(tok.encode(script.rules[0].turns[0]).slice(0, 7)), annotations: [], logprobs: [] }] }] as never);
    const types: string[] = [];
    for await (const e of await sdk(fetchApp, key).responses.create({ model: "qwen3", input, tools: flatTools, max_output_tokens: 7, stream: true })) types.push(e.type);
    expect(types.at(-1)).toBe("response.incomplete");
  });

  test("previous_response_id: resolved from the session's record; an id it did not answer is a 400 naming previous_response_id", async () => {
    const { gw, fetchApp, engine } = setup();
    const key = "pr_0_0";
    await createSession(gw, key, 0);
    const client = sdk(fetchApp, key);
    const input = rows[0]!.prompt.map((m) => ({ role: m.role as "system", content: m.content as string }));
    const r1 = await client.responses.create({ model: "qwen3", input, tools: flatTools });
    const err = async (p: Promise<unknown>) => {
      const e = (await p.catch((x: unknown) => x)) as InstanceType<typeof OpenAI.APIError>;
      return { status: e.status, error: e.error };
    };
    const other = `resp_${H("zz_0_0").toString(16)}-0-1-1-2`;
    for (const id of ["resp_nope", other, r1.id.replace("-0-1-1-", "-3-1-1-"), r1.id.replace("-1-2", "-9-2")]) {
      expect(await err(client.responses.create({ model: "qwen3", input: [{ type: "function_call_output", call_id: `call_${sessionTag(key)}_0_0_0`, output: "31" }], tools: flatTools, previous_response_id: id }))).toEqual({
        status: 400,
        error: { code: "invalid_input", field: "previous_response_id", message: `previous_response_id: '${id}' is not a response of this session`, type: "invalid_request_error", param: "previous_response_id" },
      });
    }
    expect(engine.stats.requests).toBe(1);
    const r2 = await client.responses.create({ model: "qwen3", input: [{ type: "function_call_output", call_id: `call_${sessionTag(key)}_0_0_0`, output: "31" }], tools: flatTools, previous_response_id: r1.id });
    expect(r2.previous_response_id).toBe(r1.id);
    expect(r2.output_text).toBe("The answer is 31.\n#### 31");
    // The chained call continued output 0 (no second output) ...
    const st = (await gw.get(key))!;
    expect(st.outputs.length).toBe(1);
    // ... and chaining from the first response again (a branch) opens output 1 with the same messages.
    await client.responses.create({ model: "qwen3", input: [{ role: "user", content: "Use lookup instead." }], tools: flatTools, previous_response_id: r1.id });
    const st2 = (await gw.get(key))!;
    expect(st2.outputs.length).toBe(2);
    expect(st2.outputs[1]!.messages.slice(0, 3).map((m) => m.role)).toEqual(["system", "user", "assistant"]);
    expect(st2.outputs[1]!.messages[3]).toEqual({ role: "user", content: "Use lookup instead." });
  });

  test("fields edgeloop cannot honour are refused with a 400 naming them, before any engine call", async () => {
    const { gw, fetchApp, engine } = setup();
    const key = "bf_0_0";
    await createSession(gw, key, 0);
    const client = sdk(fetchApp, key);
    const input = rows[0]!.prompt.map((m) => ({ role: m.role as "system", content: m.content as string }));
    const base = { model: "qwen3", input, tools: flatTools };
    const cases: [Record<string, unknown>, string][] = [
      [{ seed: 1 }, "seed"],
      [{ top_k: 5 }, "top_k"],
      [{ truncation: "auto" }, "truncation"],
      [{ text: { format: { type: "json_schema", name: "x", schema: {} } } }, "text.format"],
      [{ tool_choice: "required" }, "tool_choice"],
      [{ tool_choice: { type: "function", name: "calc" } }, "tool_choice"],
      [{ tools: [{ type: "web_search" }] }, "tools[0].type"],
      [{ top_logprobs: 3 }, "top_logprobs"],
      [{ include: ["message.output_text.logprobs"] }, "include[0]"],
      [{ background: true }, "background"],
      [{ conversation: "conv_1" }, "conversation"],
      [{ temperature: 3 }, "temperature"],
      [{ max_output_tokens: 0 }, "max_output_tokens"],
      [{ input: [{ role: "user", content: [{ type: "input_text", text: "what is this?" }, { type: "input_image", image_url: "data:image/png;base64,AAAA" }] }] }, "input[0].content[1].image_url"],
      [{ input: [{ type: "item_reference", id: "msg_1" }] }, "input[0].type"],
      [{ input: [{ role: "tool", content: "x" }] }, "input[0].role"],
      [{ input: [] }, "input"],
    ];
    for (const [extra, field] of cases) {
      const e = (await client.responses.create({ ...base, ...extra } as never).catch((x: unknown) => x)) as InstanceType<typeof OpenAI.APIError>;
      expect(e).toBeInstanceOf(OpenAI.BadRequestError);
      expect({ field: (e.error as { field: string }).field, code: (e.error as { code: string }).code }).toEqual({ field, code: "invalid_input" });
    }
    const e = (await client.responses.create({ ...base, seed: 1 } as never).catch((x: unknown) => x)) as InstanceType<typeof OpenAI.APIError>;
    expect(e.error).toEqual({
      code: "invalid_input",
      field: "seed",
      message: "seed: not supported by edgeloop's agent gateway (its Responses endpoint samples only with model, input, instructions, tools, tool_choice, temperature, top_p, max_output_tokens, stream, previous_response_id): remove it",
      type: "invalid_request_error",
      param: "seed",
    });
    expect(engine.stats.requests).toBe(0);
    // What SDKs send by default and bookkeeping keys are accepted; the ignored ones are named.
    const { response } = await client.responses
      .create({ ...base, store: true, parallel_tool_calls: true, reasoning: { effort: "low" }, text: { format: { type: "text" }, verbosity: "low" }, truncation: "disabled", include: ["reasoning.encrypted_content"], prompt_cache_key: "k" })
      .withResponse();
    expect(response.status).toBe(200);
    expect(response.headers.get("x-edgeloop-ignored-keys")).toBe("store,parallel_tool_calls,reasoning,include,prompt_cache_key");
    expect(engine.stats.requests).toBe(1);
  });

  test("@openai/agents: an Agent with two function tools runs to its final output; the record holds its three assistant turns, mask 1 exactly on sampled tokens", async () => {
    for (const stream of [false, true]) {
      const { gw, fetchApp, bodies } = setup();
      const key = `ag${stream ? 1 : 0}_0_0`;
      await createSession(gw, key, 3);
      const client = sdk(fetchApp, key);
      const executed: string[] = [];
      const lookup = tool({
        name: "lookup",
        description: tools[1]!.function.description,
        parameters: z.object({ query: z.string() }),
        execute: async ({ query }) => {
          executed.push(`lookup:${query}`);
          return "60";
        },
      });
      const calc = tool({
        name: "calc",
        description: tools[0]!.function.description,
        parameters: z.object({ expression: z.string() }),
        execute: async ({ expression }) => {
          executed.push(`calc:${expression}`);
          return "120";
        },
      });
      const agent = new Agent({ name: "math", instructions: rows[3]!.prompt[0]!.content as string, tools: [lookup, calc] });
      const runner = new Runner({ modelProvider: new OpenAIProvider({ openAIClient: client as never, useResponses: true }), tracingDisabled: true });
      const user = rows[3]!.prompt[1]!.content as string;
      const result = stream ? await runner.run(agent, user, { stream: true }) : await runner.run(agent, user);
      if (stream) await (result as unknown as { completed: Promise<void> }).completed;
      expect(result.finalOutput).toBe("The answer is 121.\n#### 121");
      expect(executed).toEqual(["lookup:minutes per hour", "calc:2*60"]);
      expect(bodies.length).toBe(3);
      // The SDK's default model and its default settings (reasoning effort, text verbosity) are accepted.
      expect(Object.keys(bodies[0]!).sort()).toEqual(["include", "input", "instructions", "model", "reasoning", "stream", "text", "tools"]);
      expect([bodies[0]!.stream, bodies[0]!.reasoning, bodies[0]!.text, bodies[0]!.include]).toEqual([stream, { effort: "none" }, { verbosity: "low" }, []]);
      const st = await gw.finish(key, { by: "agent" });
      const outs = agentOutputs(st, { reward: null });
      expect(outs.length).toBe(1);
      const o = outs[0]!;
      // The prompt: the agent's instructions and the user turn with the agent's tools (as it sent them).
      const first = parseResponsesRequest(bodies[0]);
      expect(o.prompt_ids).toEqual(tok.renderIds([first.instructions!, ...first.input], { tools: first.chat.tools, addGenerationPrompt: true }));
      const turns = script.rules[3].turns.slice(0, 3).map((t: string) => [...tok.encode(t), IM_END]);
      const sampled = o.response_ids.filter((_, i) => o.response_mask[i] === 1);
      expect(sampled).toEqual(turns.flat());
      // Three runs of 1s (the assistant turns), the observations between them 0.
      const runs = o.response_mask.reduce<number[]>((acc, m, i) => (m === 1 && (i === 0 || o.response_mask[i - 1] === 0) ? [...acc, i] : acc), []);
      expect(runs.length).toBe(3);
      expect(runs[0]).toBe(0);
      expect(o.num_turns).toBe(3 + 2 + 1);
      expect(o.extra_fields.tool_calls).toBe(2);
      expect(o.response_mask.slice(runs[0]!, runs[0]! + turns[0].length)).toEqual(Array(turns[0].length).fill(1));
      expect(o.response_logprobs!.filter((_, i) => o.response_mask[i] === 0).every((x) => x === 0)).toBe(true);
    }
  });

  test("@openai/agents with previousResponseId: the next run sends only its new items and continues the same output", async () => {
    const { gw, fetchApp, bodies } = setup();
    const key = "ap_0_0";
    await createSession(gw, key, 3);
    const client = sdk(fetchApp, key);
    const answers: Record<string, string> = { lookup: "60", calc: "120" };
    const mk = (name: "lookup" | "calc", arg: "query" | "expression") =>
      tool({ name, description: tools[name === "calc" ? 0 : 1]!.function.description, parameters: z.object({ [arg]: z.string() }), execute: async () => answers[name]! });
    const agent = new Agent({ name: "math", instructions: rows[3]!.prompt[0]!.content as string, tools: [mk("lookup", "query"), mk("calc", "expression")] });
    const runner = new Runner({ modelProvider: new OpenAIProvider({ openAIClient: client as never }), tracingDisabled: true });
    const first = await runner.run(agent, rows[3]!.prompt[1]!.content as string);
    const second = await runner.run(agent, "Thanks.", { previousResponseId: first.lastResponseId });
    expect(bodies.length).toBe(4);
    expect(bodies.slice(0, 3).map((b) => b.previous_response_id ?? null)).toEqual([null, null, null]);
    expect(first.lastResponseId).toBe(`resp_${H(key).toString(16)}-0-3-3-6i`);
    expect([bodies[3]!.previous_response_id, bodies[3]!.input]).toEqual([first.lastResponseId, [{ role: "user", content: "Thanks." }]]);
    // (No rule of the script answers the thanks: the policy's default reply.)
    expect(second.finalOutput).toBe(script.default[0]);
    const st = await gw.finish(key, { by: "agent" });
    expect(st.outputs.map((o) => [o.assistantTurns, o.userTurns])).toEqual([[4, 3]]);
    const o = agentOutputs(st, { reward: null })[0]!;
    const sampled = o.response_ids.filter((_, i) => o.response_mask[i] === 1);
    expect(sampled).toEqual([...script.rules[3].turns.slice(0, 3), script.default[0]].flatMap((t: string) => [...tok.encode(t), IM_END]));
    // The thanks is appended as an observation (mask 0) after the third turn's <|im_end|>, exactly as the template renders it.
    const fourth = o.response_ids.length - tok.encode(script.default[0]).length - 1;
    const thirdEnd = o.response_mask.lastIndexOf(1, fourth - 1);
    const obs = o.response_ids.slice(thirdEnd + 1, fourth);
    expect(o.response_mask.slice(thirdEnd + 1, fourth)).toEqual(Array(obs.length).fill(0));
    expect(tok.decode(obs)).toBe("\n<|im_start|>user\nThanks.<|im_end|>\n<|im_start|>assistant\n");
  });
});
