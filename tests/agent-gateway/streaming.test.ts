/**
 * True streaming through the agent gateway (issue 30 item 3): the three APIs'
 * streams read by their official SDKs (in-process: the SDK's `fetch` calls the
 * Hono app), the sim engine streaming its tokens as it decodes them.
 * - the invariant: for random scripted turns, the streamed deltas of each API
 *   accumulate to the non-streaming reply of the same session state;
 * - the first delta reaches the client while the engine is still decoding;
 * - a pause (abort) mid-turn is one stream, equal to the record's decoded response;
 * - a replayed retry streams the recorded reply.
 */
import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { examplePolicy, exampleRow } from "../helpers/examples.ts";
import { AGENT_TOKEN, agentSessionInput, tokenizerAndTools } from "../helpers/agent-session.ts";
import { config } from "../agent-loop/helpers.ts";

const row0 = exampleRow(0);
const QUESTION: string = row0.prompt.at(-1).content;
const BASE = "http://edgeloop.local/v1/sessions/u0_0_0";
const NOW = 1_700_000_000_000;
let tok: ChatTokenizer;
let tools: ToolSchema[];
beforeAll(async () => void ({ tok, tools } = await tokenizerAndTools()));

/** The sim engine's client, counting the tokens the engine has streamed so far (`produced`). */
class CountingClient implements InferenceClient {
  produced = 0;
  calls = 0;
  onToken: ((produced: number) => void) | null = null;
  constructor(readonly inner: SimEngineClient) {}
  generate(req: GenerateRequest) {
    this.calls++;
    const sink = req.on_tokens;
    return this.inner.generate({
      ...req,
      on_tokens: (ids, lps) => {
        this.produced += ids.length;
        sink?.(ids, lps);
        this.onToken?.(this.produced);
      },
    });
  }
  maxModelLen() {
    return this.inner.maxModelLen();
  }
}

/** A gateway over a fresh sim engine playing `script`, its app, and the three SDKs on session u0_0_0. */
async function setup(script: unknown, o: { decodeMs?: number; rollout?: Parameters<typeof config>[0] } = {}) {
  const engine = new SimEngine({ tokenizer: tok, script, latency: { prefill_ms_per_token: 0, decode_ms_per_token: o.decodeMs ?? 0, stream_every_token: o.decodeMs !== undefined } });
  const client = new CountingClient(new SimEngineClient(engine));
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client, maxModelLen: 4096, wallClockMs: () => NOW });
  await gw.create(agentSessionInput(tools, { created_ms: NOW, deadline_ms: NOW + 600_000, rollout: config(o.rollout ?? {}) }));
  const app = createAgentGatewayApp({ gateway: gw });
  const fetchApp = async (u: string | URL | Request, i?: RequestInit) => app.fetch(u instanceof Request ? u : new Request(String(u), i));
  const openai = new OpenAI({ baseURL: `${BASE}/openai/v1`, apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
  const anthropic = new Anthropic({ baseURL: `${BASE}/anthropic`, apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
  return { engine, client, gw, openai, anthropic };
}

const oneTurn = (text: string) => ({ seed: 7, rules: [{ when: QUESTION, turns: [text] }] });
const chatTools = () => tools as OpenAI.ChatCompletionTool[];
const responsesTools = () => tools.map((t) => ({ type: "function" as const, name: t.function.name, description: t.function.description ?? null, parameters: (t.function.parameters ?? null) as Record<string, unknown> | null, strict: false }));
const anthropicTools = () => tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: (t.function.parameters ?? { type: "object" }) as Anthropic.Tool.InputSchema }));

/** What a chat completion says, read from the non-streaming object or accumulated from the chunks. */
interface ChatView {
  content: string | null;
  reasoning: string | undefined;
  tool_calls: { id: string; name: string; arguments: string }[];
  finish_reason: string | null;
}

async function chatStreamed(s: AsyncIterable<OpenAI.ChatCompletionChunk>): Promise<{ view: ChatView; chunks: OpenAI.ChatCompletionChunk[] }> {
  const chunks: OpenAI.ChatCompletionChunk[] = [];
  let content: string | null = null;
  let reasoning: string | undefined;
  const calls: { id: string; name: string; arguments: string }[] = [];
  let finish: string | null = null;
  for await (const c of s) {
    chunks.push(c);
    const ch = c.choices[0];
    if (!ch) continue;
    const d = ch.delta as OpenAI.ChatCompletionChunk.Choice.Delta & { reasoning_content?: string };
    if (typeof d.content === "string" && d.content) content = (content ?? "") + d.content;
    if (d.reasoning_content !== undefined) reasoning = (reasoning ?? "") + d.reasoning_content;
    for (const t of d.tool_calls ?? []) {
      const at = (calls[t.index] ??= { id: "", name: "", arguments: "" });
      at.id += t.id ?? "";
      at.name += t.function?.name ?? "";
      at.arguments += t.function?.arguments ?? "";
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  return { view: { content, reasoning, tool_calls: calls, finish_reason: finish }, chunks };
}

function chatView(r: OpenAI.ChatCompletion): ChatView {
  const m = r.choices[0]!.message as OpenAI.ChatCompletionMessage & { reasoning_content?: string };
  return {
    content: m.content === "" ? null : m.content,
    reasoning: m.reasoning_content,
    tool_calls: (m.tool_calls ?? []).map((c) => ({ id: c.id, name: (c as OpenAI.ChatCompletionMessageFunctionToolCall).function.name, arguments: (c as OpenAI.ChatCompletionMessageFunctionToolCall).function.arguments })),
    finish_reason: r.choices[0]!.finish_reason,
  };
}

/** Pieces random turns are made of: think tags, tool calls (good and broken), stop strings, multi-byte text, white space. */
const PIECES = [
  "<think>",
  "</think>",
  "\n",
  "\n\n",
  " ",
  "\u00a0",
  "Hello",
  " wörld",
  "日本語",
  "😀",
  "é",
  "<tool_call>\n" + JSON.stringify({ name: "calc", arguments: { expression: "1+2" } }) + "\n</tool_call>",
  '<tool_call>{"name": "calc", "arguments": oops}</tool_call>',
  "<tool_call>",
  "<tool",
  "</tool_call>",
  "<tool_call>\n<function=calc>\n<parameter=expression>\n1+2\n</parameter>\n</function>\n</tool_call>",
  "[calc(expression='1')]",
  '{"name": "calc", "parameters": {"expression": "2"}}',
  "STOP",
  "ST",
  "{",
  "}",
];
const turnText = fc.array(fc.constantFrom(...PIECES), { minLength: 1, maxLength: 14 }).map((a) => a.join(""));
const stopArb = fc.constantFrom<string[] | undefined>(undefined, ["STOP"], ["ST", "\n\n"], ["😀"]);
const maxTokensArb = fc.constantFrom<number | undefined>(undefined, undefined, 3, 9);
const choiceArb = fc.constantFrom<"auto" | "none">("auto", "auto", "none");
/** The run's tool-call parser: hermes and qwen3_coder stream up to their markers, llama3_json and pythonic stream content whole at the end. */
const formatArb = fc.constantFrom("hermes", "hermes", "qwen3_coder", "llama3_json", "pythonic");

describe("true streaming: the streamed deltas equal the non-streaming reply", () => {
  test("chat completions (property over random turns, stops, max_tokens, tool_choice)", async () => {
    await fc.assert(
      fc.asyncProperty(turnText, stopArb, maxTokensArb, choiceArb, formatArb, async (text, stop, maxTokens, choice, format) => {
        const body = { model: "qwen3", messages: row0.prompt, tools: chatTools(), tool_choice: choice, ...(stop ? { stop } : {}), ...(maxTokens ? { max_tokens: maxTokens } : {}) };
        const rollout = { multi_turn: { format } };
        const a = await setup(oneTurn(text), { rollout });
        const b = await setup(oneTurn(text), { rollout });
        const whole = await a.openai.chat.completions.create(body as OpenAI.ChatCompletionCreateParamsNonStreaming);
        const { view, chunks } = await chatStreamed(await b.openai.chat.completions.create({ ...body, stream: true } as OpenAI.ChatCompletionCreateParamsStreaming));
        expect(view).toEqual(chatView(whole));
        // Role chunk first, no usage chunk unless asked, one id across chunks.
        expect(chunks[0]!.choices[0]!.delta).toEqual({ role: "assistant", content: "" });
        expect(chunks.every((c) => c.choices.length === 1 && c.id === whole.id)).toBe(true);
        // The record is the same token-exact either way (less the wall-clock seconds of the call).
        const record = async (gw: AgentGateway) => agentOutputs((await gw.get("u0_0_0"))!, { reward: null }).map((o) => ({ ...o, metrics: { ...o.metrics, generate_sequences: 0 } }));
        expect(await record(b.gw)).toEqual(await record(a.gw));
      }),
      { numRuns: 60, seed: 30 },
    );
  });

  test("Responses (property): output items and status of the streamed final response, and the concatenated deltas", async () => {
    await fc.assert(
      fc.asyncProperty(turnText, maxTokensArb, async (text, maxTokens) => {
        const body = { model: "qwen3", input: row0.prompt.map((m: { role: string; content: string }) => ({ role: m.role as "user" | "system", content: m.content })), tools: responsesTools(), ...(maxTokens ? { max_output_tokens: maxTokens } : {}) };
        const a = await setup(oneTurn(text));
        const b = await setup(oneTurn(text));
        const whole = await a.openai.responses.create(body);
        const stream = b.openai.responses.stream(body);
        let textDeltas = "";
        let argDeltas = "";
        const types: string[] = [];
        for await (const e of stream) {
          types.push(e.type);
          if (e.type === "response.output_text.delta") textDeltas += e.delta;
          if (e.type === "response.function_call_arguments.delta") argDeltas += e.delta;
        }
        const final = await stream.finalResponse();
        // Less what the SDK's stream adds (`parsed` on text parts).
        const output = (r: OpenAI.Responses.Response) =>
          r.output.map((i) => {
            if (i.type === "function_call") {
              const { parsed_arguments: _a, ...rest } = i as typeof i & { parsed_arguments?: unknown };
              return rest;
            }
            return i.type === "message" ? { ...i, content: i.content.map((c) => { const { parsed: _p, ...rest } = c as typeof c & { parsed?: unknown }; return rest; }) } : i;
          });
        const strip = (r: OpenAI.Responses.Response) => ({ id: r.id, status: r.status, output: output(r), usage: r.usage, incomplete_details: r.incomplete_details });
        expect(strip(final)).toEqual(strip(whole));
        expect(textDeltas).toBe(whole.output_text);
        expect(argDeltas).toBe(whole.output.filter((i) => i.type === "function_call").map((i) => (i as OpenAI.Responses.ResponseFunctionToolCall).arguments).join(""));
        expect(types[0]).toBe("response.created");
        expect(types.at(-1)).toBe(whole.status === "incomplete" ? "response.incomplete" : "response.completed");
      }),
      { numRuns: 30, seed: 31 },
    );
  });

  test("Messages (property): the streamed message equals the non-streaming one, thinking, text and tool_use blocks", async () => {
    await fc.assert(
      fc.asyncProperty(turnText, stopArb, maxTokensArb, async (text, stop, maxTokens) => {
        const body: Anthropic.MessageCreateParamsNonStreaming = {
          model: "qwen3",
          max_tokens: maxTokens ?? 512,
          system: row0.prompt[0].content,
          messages: row0.prompt.slice(1).map((m: { role: "user"; content: string }) => ({ role: m.role, content: m.content })),
          tools: anthropicTools(),
          ...(stop ? { stop_sequences: stop } : {}),
        };
        const a = await setup(oneTurn(text));
        const b = await setup(oneTurn(text));
        const whole = await a.anthropic.messages.create(body);
        const stream = b.anthropic.messages.stream(body);
        let textDeltas = "";
        for await (const e of stream) if (e.type === "content_block_delta" && e.delta.type === "text_delta") textDeltas += e.delta.text;
        const final = await stream.finalMessage();
        const strip = (m: Anthropic.Message) => ({ id: m.id, content: m.content.map((c) => (c.type === "tool_use" ? { type: c.type, id: c.id, name: c.name, input: c.input } : c)), stop_reason: m.stop_reason, stop_sequence: m.stop_sequence, usage: { input_tokens: m.usage.input_tokens, output_tokens: m.usage.output_tokens } });
        expect(strip(final)).toEqual(strip(whole));
        expect(textDeltas).toBe(whole.content.filter((c) => c.type === "text").map((c) => (c as Anthropic.TextBlock).text).join(""));
      }),
      { numRuns: 30, seed: 32 },
    );
  });
});

describe("true streaming: timing by events, pauses, replays", () => {
  const LONG = "<think>\nshort\n</think>\n\n" + Array.from({ length: 40 }, (_, i) => `word${i}`).join(" ");

  test("the first content delta reaches each SDK while the engine holds the turn unfinished (chat, Responses, Messages)", async () => {
    const replyTokens = tok.encode(LONG).length + 1;
    // The engine freezes (pause `keep`) right after the token that starts the text, and resumes only once
    // the client has that text: a gateway that waited for the whole turn would never answer.
    // The token whose decoding first shows text after the reasoning: the stream sends its first delta while pushing it.
    const ids = tok.encode(LONG);
    let firstText = 1;
    while (!tok.decode(ids.slice(0, firstText)).includes("</think>\n\nw")) firstText++;
    const at: Record<string, number> = {};
    const run = async (k: string, consume: (s: Awaited<ReturnType<typeof setup>>, first: () => void) => Promise<void>) => {
      const ctx = await setup(oneTurn(LONG), { decodeMs: 1 });
      ctx.client.onToken = (n) => {
        if (n === firstText) void ctx.engine.pause("keep");
      };
      await consume(ctx, () => {
        if (at[k] !== undefined) return;
        at[k] = ctx.client.produced;
        ctx.engine.resume();
      });
      expect(ctx.engine.requests.map((r) => [r.finish_reason, r.completion_tokens])).toEqual([["stop", replyTokens]]);
    };
    await run("chat", async ({ openai }, first) => {
      for await (const c of await openai.chat.completions.create({ model: "qwen3", messages: row0.prompt, stream: true })) if (c.choices[0]?.delta.content) first();
    });
    await run("responses", async ({ openai }, first) => {
      for await (const e of openai.responses.stream({ model: "qwen3", input: row0.prompt })) if (e.type === "response.output_text.delta") first();
    });
    await run("messages", async ({ anthropic }, first) => {
      const body = { model: "qwen3", max_tokens: 512, system: row0.prompt[0].content, messages: [{ role: "user" as const, content: QUESTION }] };
      for await (const e of anthropic.messages.stream(body)) if (e.type === "content_block_delta" && e.delta.type === "text_delta") first();
    });
    expect(at).toEqual({ chat: firstText, responses: firstText, messages: firstText });
    expect(firstText).toBeLessThan(replyTokens - 30);
  });

  test("a pause (abort) mid-turn, resumed by the loop, is one uninterrupted stream equal to the record's decoded response", async () => {
    const { engine, client, gw, openai } = await setup(oneTurn(LONG), { decodeMs: 1 });
    // At the 20th token the engine pauses (abort: the call ends with its tokens), then resumes: the loop sends the rest.
    client.onToken = (n) => {
      if (n === 20) void engine.pause("abort").then(() => engine.resume());
    };
    const { view, chunks } = await chatStreamed(await openai.chat.completions.create({ model: "qwen3", messages: row0.prompt, stream: true }));
    expect(engine.requests.map((r) => r.finish_reason)).toEqual(["abort", "stop"]);
    const out = agentOutputs((await gw.get("u0_0_0"))!, { reward: null })[0]!;
    // One chunk per token (stream_every_token): the pause set at the 20th token's chunk lands before the 21st.
    expect(engine.requests[0]!.completion_tokens).toBe(20);
    expect(engine.requests[1]!.completion_tokens).toBe(out.response_ids.length - 20);
    expect(out.metrics.num_preempted).toBe(1);
    expect(out.response_ids).toEqual([...tok.encode(LONG), 151645]);
    expect(out.response_mask).toEqual(Array(out.response_ids.length).fill(1));
    const decoded = tok.decode(out.response_ids.slice(0, -1));
    expect(`<think>\n${view.reasoning}\n</think>\n\n${view.content}`).toBe(decoded);
    expect(chunks.filter((c) => c.choices[0]?.delta.content).length).toBeGreaterThan(10);
    expect(chunks.filter((c) => c.choices[0]?.finish_reason).map((c) => c.choices[0]!.finish_reason)).toEqual(["stop"]);
  });

  test("a retry (x-stainless-retry-count: 1) of a streamed call is answered from the record, streamed whole, no engine call", async () => {
    const { client, openai } = await setup(examplePolicy());
    const body = { model: "qwen3", messages: row0.prompt, tools: chatTools(), stream: true as const, stream_options: { include_usage: true } };
    const first = await chatStreamed(await openai.chat.completions.create(body));
    expect(client.calls).toBe(1);
    const again = await chatStreamed(await openai.chat.completions.create(body, { headers: { "x-stainless-retry-count": "1" } }));
    expect(client.calls).toBe(1);
    expect(again.view).toEqual(first.view);
    expect(first.view.finish_reason).toBe("tool_calls");
    // Asked for: the usage chunk (empty choices) before [DONE], in both.
    expect(first.chunks.at(-1)!.choices).toEqual([]);
    expect(again.chunks.at(-1)!.usage).toEqual(first.chunks.at(-1)!.usage);
  });
});
