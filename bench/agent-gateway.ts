/**
 * Agent-gateway benchmark (issue 14 "Measure"): what the OpenAI-compatible
 * session endpoint costs compared with running the same conversation as
 * `tool_agent`, on the zero-latency simulated engine (examples/policy.json,
 * the 60 rows of examples/gsm8k-tool.jsonl, calc/lookup answered in-process
 * with the example tool server's texts).
 * 1. CPU (`process.cpuUsage()`) per chat call: `AgentGateway.chat` through
 *    the Hono app's `fetch` in-process, the JSON bodies byte-for-byte what
 *    the agent sends (full history each call, recorded once), vs
 *    `ToolAgentLoop` per assistant turn (in-process `SimEngineClient`, tool
 *    texts memoised) — raw, and minus the engine's own time (measured around
 *    `generate`); ratio target ≤ 1.5×. Compared on the conversations whose
 *    gateway output is token-exact equal to tool_agent's (checked first: 56 of
 *    60; the 4 others hold a malformed call, which tool_agent answers with an
 *    error while the gateway returns it as text and the agent stops).
 * 1b. (`apis`) The same CPU per call for each API of the session: the
 *    recorded chat bodies, the same conversations as OpenAI Responses
 *    requests (full `input` each call: messages, the assistant turns as the
 *    SDK gets them back in `output` — reasoning / message / function_call
 *    items — and function_call_output items; no instructions) and as
 *    Anthropic Messages requests (`system`, thinking / text / tool_use
 *    blocks, tool_result blocks, `max_tokens`), all through `app.fetch`
 *    against the zero-latency engine; ratio vs chat completions, target
 *    ≤ 1.2×. Checked first: every conversation records the same
 *    response_ids through all three.
 * 2. Added latency per call: the official `openai` SDK over loopback to
 *    `Bun.serve` of the gateway app (engine: the sim over HTTP, vLLM format)
 *    vs the same SDK posting the very engine requests the gateway made
 *    straight to the sim's `/v1/completions`, interleaved per conversation
 *    — p50/p99 ms (first 50 calls of each dropped as warm-up).
 * 3. Heap per idle session: N more sessions with two answered calls each
 *    added to a gateway already holding N (memory storage, folds cached),
 *    `Bun.gc(true)`, heap delta / N; then every fold dropped (`forget`) to
 *    split the cached fold from the stored events.
 *
 * 2b. (`ttft`, not in the default set) Time to first token with true
 *    streaming: raw `fetch` over loopback to `Bun.serve` of the gateway app
 *    (engine: the in-process sim decoding at `--pace` ms a token, plain-text
 *    turns), to the first `content` delta on the wire, vs the sim engine's
 *    in-process stream for the same prompt (its first `on_tokens` call),
 *    interleaved per call — p50/p90 ms; target ≤ +2 ms p50.
 *
 *   bun bench/agent-gateway.ts [--runs 5] [--passes 5] [--calls 1000] [--sessions 2000] [--only cpu,apis,latency,heap,ttft] [--pace 2] [--ttft-calls 300]
 */
import OpenAI from "openai";
import { readFileSync } from "node:fs";
import { AgentGateway } from "../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../shared/agent-gateway/agent-session.ts";
import { createAgentGatewayApp } from "../functions/agent-gateway.ts";
import { thinkingSignature } from "../shared/agent-gateway/messages-wire.ts";
import { ToolAgentLoop } from "../shared/agent-loop/tool-agent.ts";
import { createEngineClient } from "../shared/inference/create-engine-client.ts";
import type { GenerateRequest, InferenceClient } from "../shared/inference/types.ts";
import { RolloutConfig, type ChatMessage, type TokenOutput, type ToolSchema } from "../shared/schema/index.ts";
import { MemorySessionStorage } from "../shared/session/session-storage.ts";
import { defaultTokenizer } from "../shared/tokens/tokenizer.ts";
import { parseToolsFile } from "../shared/tools/tools-file.ts";
import type { ToolExecutor } from "../shared/tools/webhook-tool-client.ts";
import { SimEngine } from "../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../infra/sim-engine/sim-engine-client.ts";
import { startSimEngine } from "../infra/sim-engine/server.ts";
import { calcToolContent } from "../infra/tools/calc.ts";
import { lookupFact } from "../infra/tools/lookup.ts";
import { arg, median, printTable } from "./util.ts";

const RUNS = Number(arg("--runs", "5"));
const PASSES = Number(arg("--passes", "5"));
const LAT_CALLS = Number(arg("--calls", "1000"));
const SESSIONS = Number(arg("--sessions", "2000"));
const ONLY = arg("--only", "cpu,apis,latency,heap").split(",");

const ROOT = new URL("../", import.meta.url).pathname;
const tok = await defaultTokenizer();
const script = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const rows: { prompt: ChatMessage[] }[] = readFileSync(`${ROOT}examples/gsm8k-tool.jsonl`, "utf8")
  .split("\n")
  .filter((l) => l.trim())
  .map((l) => JSON.parse(l));
const tools: ToolSchema[] = parseToolsFile(readFileSync(`${ROOT}infra/tools/tools.example.json`, "utf8"), { vars: { port: 1 } }).tools.map((t) => t.schema);
const config = RolloutConfig.parse({ prompt_length: 1024, response_length: 1024, max_model_len: 4096 });
const SP = { temperature: 1, top_p: 1, top_k: -1, logprobs: true };
const TOKEN = "tok_0123456789abcdef0123";
const T0 = Date.now();

/** The tool text the example tool server (and the example agent) answers with. */
function toolContent(name: string, args: Record<string, unknown>): string {
  if (name === "calc") return calcToolContent(args);
  if (name === "lookup") return lookupFact(typeof args.query === "string" ? args.query : String(args.query));
  return `Error: unknown tool '${name}'`;
}

/** An engine wrapper summing the wall time spent inside `generate` (zero latency: the engine's CPU) and counting calls. */
class Timed implements InferenceClient {
  ms = 0;
  calls = 0;
  constructor(readonly inner: InferenceClient) {}
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const t0 = performance.now();
    try {
      return await this.inner.generate(req);
    } finally {
      this.ms += performance.now() - t0;
      this.calls++;
    }
  }
  maxModelLen() {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
}

/** tool_agent's in-process tools: the same texts, memoised (the gateway side gets them inside the recorded bodies, so neither side pays for calc). */
const toolMemo = new Map<string, string>();
const executor: ToolExecutor = {
  schemas: tools,
  names: tools.map((t) => t.function.name),
  call: async (r) => {
    const k = `${r.name}\u0000${JSON.stringify(r.arguments)}`;
    let content = toolMemo.get(k);
    if (content === undefined) toolMemo.set(k, (content = toolContent(r.name, r.arguments as Record<string, unknown>)));
    return { ok: true, content, call_id: `${r.key}:${r.turn}:${r.index}`, attempts: 1 };
  },
};

function newGateway(client: InferenceClient) {
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client, maxModelLen: 4096, wallClockMs: () => T0 });
  return { gw, app: createAgentGatewayApp({ gateway: gw }) };
}

function createSession(gw: AgentGateway, key: string, i: number) {
  return gw.create({
    v: 1,
    key,
    uid: `u${i}`,
    session_id: 0,
    token: TOKEN,
    created_ms: T0,
    deadline_ms: T0 + 3_600_000,
    sampling_params: SP,
    rollout: config,
    tools,
    messages: rows[i % rows.length]!.prompt,
  });
}

type ReplyJson = { choices: { message: Record<string, unknown> & { tool_calls?: { id: string; function: { name: string; arguments: string } }[] }; finish_reason: string }[] };

/** What the agent appends after a reply: the assistant message as received, then one tool message per call. */
function nextMessages(reply: ReplyJson): Record<string, unknown>[] | null {
  const { message, finish_reason } = reply.choices[0]!;
  if (finish_reason !== "tool_calls") return null;
  const out: Record<string, unknown>[] = [message];
  for (const c of message.tool_calls ?? []) {
    let args: Record<string, unknown> = {};
    try {
      args = JSON.parse(c.function.arguments);
    } catch {}
    out.push({ role: "tool", tool_call_id: c.id, name: c.function.name, content: toolContent(c.function.name, args) });
  }
  return out;
}

const CHAT = "openai/v1/chat/completions";
const post = (app: ReturnType<typeof newGateway>["app"], key: string, body: string, path = CHAT) =>
  app.fetch(
    new Request(`http://edgeloop.local/v1/sessions/${key}/${path}`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` },
      body,
    }),
  );

// ---- Record the agent's request bodies once (and check the recording equals tool_agent's) ----
const bodies: string[][] = [];
/** Rows whose gateway output equals tool_agent's (the others hold a malformed call, which tool_agent answers with an error observation while the gateway returns it as text, so the agent stops). */
const same: number[] = [];
{
  const { gw, app } = newGateway(new SimEngineClient(new SimEngine({ tokenizer: tok, script })));
  let mismatched = 0;
  for (const [i, row] of rows.entries()) {
    const key = `rec_${i}`;
    await createSession(gw, key, i);
    const messages: unknown[] = [...row.prompt];
    const mine: string[] = [];
    for (let turn = 0; turn < 16; turn++) {
      const body = JSON.stringify({ model: "qwen3", messages, tools });
      mine.push(body);
      const res = await post(app, key, body);
      if (res.status !== 200) throw new Error(`row ${i} call ${turn}: HTTP ${res.status} ${await res.text()}`);
      const more = nextMessages((await res.json()) as ReplyJson);
      if (!more) break;
      messages.push(...more);
    }
    bodies.push(mine);
    const [out] = agentOutputs((await gw.finish(key, { by: "agent", reward: null }))!, { reward: null });
    const ref = await new ToolAgentLoop({ tokenizer: tok, client: new SimEngineClient(new SimEngine({ tokenizer: tok, script })), config, tools: executor, reward: false }).run(SP, {
      uid: `u${i}`,
      session_id: 0,
      prompt: row.prompt,
    });
    if (JSON.stringify([out!.prompt_ids, out!.response_ids, out!.response_mask, out!.response_logprobs]) === JSON.stringify([ref.prompt_ids, ref.response_ids, ref.response_mask, ref.response_logprobs])) same.push(i);
  }
  console.log(`recorded ${rows.length} conversations, ${bodies.reduce((n, b) => n + b.length, 0)} calls; gateway output token-exact = tool_agent's for ${same.length}/${rows.length} (the rest: a malformed call in the script; CPU is compared on those ${same.length})`);
  if (same.length < rows.length - 4) throw new Error("the gateway's outputs differ from tool_agent's");
}
const CALLS_PER_PASS = same.reduce((n, i) => n + bodies[i]!.length, 0);

// ---- 1. CPU per call vs tool_agent per turn ----
async function cpu(f: () => Promise<void>): Promise<number> {
  const c0 = process.cpuUsage();
  await f();
  const c = process.cpuUsage(c0);
  return c.user + c.system;
}

async function gatewayRun(run: number): Promise<{ total: number; engine: number; calls: number }> {
  const eng = new Timed(new SimEngineClient(new SimEngine({ tokenizer: tok, script })));
  const { gw, app } = newGateway(eng);
  const keys: string[] = [];
  const conv: number[] = [];
  for (let p = 0; p < PASSES; p++) for (const i of same) keys.push(`b${run}_${p}_${i}`), conv.push(i);
  for (const [j, k] of keys.entries()) await createSession(gw, k, conv[j]!);
  const total = await cpu(async () => {
    for (const [j, key] of keys.entries()) {
      for (const body of bodies[conv[j]!]!) {
        const res = await post(app, key, body);
        if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
        await res.text();
      }
    }
  });
  return { total, engine: eng.ms * 1000, calls: eng.calls };
}

async function toolAgentRun(): Promise<{ total: number; engine: number; calls: number }> {
  const eng = new Timed(new SimEngineClient(new SimEngine({ tokenizer: tok, script })));
  const total = await cpu(async () => {
    for (let p = 0; p < PASSES; p++) {
      for (const i of same) {
        await new ToolAgentLoop({ tokenizer: tok, client: eng, config, tools: executor, reward: false }).run(SP, { uid: `u${i}`, session_id: p, prompt: rows[i]!.prompt });
      }
    }
  });
  return { total, engine: eng.ms * 1000, calls: eng.calls };
}

if (ONLY.includes("cpu")) {
  await gatewayRun(-1); // warm-up (JIT, tokenizer caches)
  await toolAgentRun();
  const g: { raw: number; net: number }[] = [];
  const t: { raw: number; net: number }[] = [];
  for (let r = 0; r < RUNS; r++) {
    for (const [into, res] of [
      [g, await gatewayRun(r)],
      [t, await toolAgentRun()],
    ] as const) {
      if (res.calls !== CALLS_PER_PASS * PASSES) throw new Error(`expected ${CALLS_PER_PASS * PASSES} engine calls, got ${res.calls}`);
      into.push({ raw: res.total / res.calls, net: (res.total - res.engine) / res.calls });
    }
  }
  const gRaw = median(g.map((x) => x.raw));
  const gNet = median(g.map((x) => x.net));
  const tRaw = median(t.map((x) => x.raw));
  const tNet = median(t.map((x) => x.net));
  printTable(`CPU per engine call (median of ${RUNS} runs × ${PASSES * CALLS_PER_PASS} calls)`, [
    ["what", "µs/call incl. engine", "µs/call excl. engine"],
    ["gateway chat call (app.fetch, full history JSON)", gRaw.toFixed(0), gNet.toFixed(0)],
    ["tool_agent turn (in-process tools)", tRaw.toFixed(0), tNet.toFixed(0)],
    ["ratio gateway / tool_agent (target ≤ 1.5×)", `${(gRaw / tRaw).toFixed(2)}×`, `${(gNet / tNet).toFixed(2)}×`],
  ]);
}

// ---- 1b. CPU per call of each API of the session (chat completions, Responses, Messages) ----
type ChatBody = { model: string; messages: (Record<string, unknown> & { role: string; content: string | null })[]; tools: ToolSchema[] };
type Call = { id: string; function: { name: string; arguments: string } };

/** A recorded chat body as an OpenAI Responses request: the full `input` (messages, then each assistant turn as the SDK gets it back in `output` — reasoning, message, function_call items — and function_call_output items), no instructions. */
function responsesRequest(chat: string): string {
  const b = JSON.parse(chat) as ChatBody;
  const input = b.messages.flatMap((m): Record<string, unknown>[] => {
    if (m.role === "tool") return [{ type: "function_call_output", call_id: m.tool_call_id, output: m.content }];
    if (m.role !== "assistant") return [{ type: "message", role: m.role, content: m.content }];
    const calls = (m.tool_calls ?? []) as Call[];
    return [
      ...(m.reasoning_content ? [{ type: "reasoning", summary: [], content: [{ type: "reasoning_text", text: m.reasoning_content }] }] : []),
      ...(m.content || !calls.length ? [{ type: "message", role: "assistant", content: [{ type: "output_text", text: m.content ?? "", annotations: [] }] }] : []),
      ...calls.map((c) => ({ type: "function_call", call_id: c.id, name: c.function.name, arguments: c.function.arguments })),
    ];
  });
  const fns = b.tools.map((t) => ({ type: "function", name: t.function.name, description: t.function.description, parameters: t.function.parameters }));
  return JSON.stringify({ model: b.model, input, tools: fns });
}

/** A recorded chat body as an Anthropic Messages request: `system`, assistant turns as thinking/text/tool_use blocks, each run of tool messages as one user turn of tool_result blocks, `max_tokens` = the response length. */
function messagesRequest(chat: string): string {
  const b = JSON.parse(chat) as ChatBody;
  let system: string | undefined;
  const messages: { role: string; content: string | Record<string, unknown>[] }[] = [];
  for (const [j, m] of b.messages.entries()) {
    if (m.role === "system" && j === 0) system = m.content ?? "";
    else if (m.role === "tool") {
      const block = { type: "tool_result", tool_use_id: m.tool_call_id, content: m.content };
      const last = messages.at(-1);
      if (last?.role === "user" && Array.isArray(last.content)) last.content.push(block);
      else messages.push({ role: "user", content: [block] });
    } else if (m.role === "assistant") {
      const content: Record<string, unknown>[] = [];
      if (m.reasoning_content) content.push({ type: "thinking", thinking: m.reasoning_content, signature: thinkingSignature(m.reasoning_content as string) });
      if (m.content) content.push({ type: "text", text: m.content });
      for (const c of (m.tool_calls ?? []) as Call[]) content.push({ type: "tool_use", id: c.id, name: c.function.name, input: JSON.parse(c.function.arguments) });
      messages.push({ role: "assistant", content });
    } else messages.push({ role: m.role, content: m.content ?? "" });
  }
  const fns = b.tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters }));
  return JSON.stringify({ model: b.model, max_tokens: config.response_length, ...(system === undefined ? {} : { system }), messages, tools: fns });
}

if (ONLY.includes("apis")) {
  const apis = [
    { name: "chat completions", path: CHAT, reqs: bodies },
    { name: "Responses", path: "openai/v1/responses", reqs: bodies.map((b) => b.map(responsesRequest)) },
    { name: "Messages", path: "anthropic/v1/messages", reqs: bodies.map((b) => b.map(messagesRequest)) },
  ];
  // Same tokens: each conversation through each API records the same outputs (response_ids compared per conversation).
  const { gw, app } = newGateway(new SimEngineClient(new SimEngine({ tokenizer: tok, script })));
  let equal = 0;
  for (const i of same) {
    const ids: string[] = [];
    for (const [a, api] of apis.entries()) {
      const key = `api${a}_${i}`;
      await createSession(gw, key, i);
      for (const body of api.reqs[i]!) {
        const res = await post(app, key, body, api.path);
        if (res.status !== 200) throw new Error(`${api.name} row ${i}: HTTP ${res.status} ${await res.text()}`);
        await res.text();
      }
      ids.push(JSON.stringify(agentOutputs((await gw.finish(key, { by: "agent", reward: null }))!, { reward: null }).map((o) => o.response_ids)));
    }
    if (ids.every((x) => x === ids[0])) equal++;
  }
  console.log(`response_ids equal across chat completions / Responses / Messages for ${equal}/${same.length} conversations`);
  if (equal !== same.length) throw new Error("the APIs recorded different tokens");

  /** One run: a gateway (and engine) per API, every conversation PASSES times; the APIs interleaved per conversation (rotated by run), so load drift and GC fall on all three alike. */
  const apisRun = async (run: number) => {
    const gws = apis.map(() => {
      const eng = new Timed(new SimEngineClient(new SimEngine({ tokenizer: tok, script })));
      return { eng, total: 0, ...newGateway(eng) };
    });
    for (const [a, g] of gws.entries()) for (let p = 0; p < PASSES; p++) for (const i of same) await createSession(g.gw, `a${run}_${a}_${p}_${i}`, i);
    for (let p = 0; p < PASSES; p++) {
      for (const i of same) {
        for (let k = 0; k < apis.length; k++) {
          const a = (k + run + p + apis.length) % apis.length;
          const g = gws[a]!;
          const key = `a${run}_${a}_${p}_${i}`;
          g.total += await cpu(async () => {
            for (const body of apis[a]!.reqs[i]!) {
              const res = await post(g.app, key, body, apis[a]!.path);
              if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
              await res.text();
            }
          });
        }
      }
    }
    return gws.map((g) => ({ total: g.total, engine: g.eng.ms * 1000, calls: g.eng.calls }));
  };
  await apisRun(-1); // warm-up
  const per = apis.map(() => [] as { raw: number; net: number }[]);
  for (let r = 0; r < RUNS; r++) {
    for (const [a, res] of (await apisRun(r)).entries()) {
      if (res.calls !== CALLS_PER_PASS * PASSES) throw new Error(`${apis[a]!.name}: expected ${CALLS_PER_PASS * PASSES} engine calls, got ${res.calls}`);
      per[a]!.push({ raw: res.total / res.calls, net: (res.total - res.engine) / res.calls });
    }
  }
  const stat = (xs: number[]) => `${median(xs).toFixed(0)} (${Math.min(...xs).toFixed(0)}–${Math.max(...xs).toFixed(0)})`;
  const chatRaw = median(per[0]!.map((x) => x.raw));
  const chatNet = median(per[0]!.map((x) => x.net));
  printTable(`CPU per call by API (app.fetch, full history each call; median (min–max) of ${RUNS} runs × ${PASSES * CALLS_PER_PASS} calls, APIs interleaved per conversation; target ≤ 1.2× chat)`, [
    ["API", "µs/call incl. engine", "µs/call excl. engine", "ratio vs chat (incl. / excl.)", "calls"],
    ...apis.map((api, a) => {
      const raw = per[a]!.map((x) => x.raw);
      const net = per[a]!.map((x) => x.net);
      return [api.name, stat(raw), stat(net), `${(median(raw) / chatRaw).toFixed(2)}× / ${(median(net) / chatNet).toFixed(2)}×`, String(RUNS * PASSES * CALLS_PER_PASS)];
    }),
  ]);
}

// ---- 2. Added latency over loopback ----
if (ONLY.includes("latency")) {
  const sim = await startSimEngine({ script, tokenizer: tok });
  const engineBodies: string[] = [];
  const engine = createEngineClient({
    url: sim.urls[0]!,
    format: "vllm",
    fetch: (input, init) => {
      if (typeof init?.body === "string" && String(input).endsWith("/v1/completions")) engineBodies.push(init.body);
      return fetch(input, init);
    },
  });
  const { gw, app } = newGateway(engine);
  const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: app.fetch, idleTimeout: 0 });
  const base = `http://127.0.0.1:${server.port}`;
  const sdk = new OpenAI({ baseURL: `${sim.urls[0]}/v1`, apiKey: "none", maxRetries: 0 });
  const viaGateway: number[] = [];
  const direct: number[] = [];
  // Interleaved per conversation: its calls through the gateway, then the engine requests they made, sent direct.
  for (let s = 0; viaGateway.length < LAT_CALLS + 50; s++) {
    const key = `lat_${s}`;
    await createSession(gw, key, s);
    const client = new OpenAI({ baseURL: `${base}/v1/sessions/${key}/openai/v1`, apiKey: TOKEN, maxRetries: 0 });
    const messages = [...rows[s % rows.length]!.prompt] as OpenAI.ChatCompletionMessageParam[];
    engineBodies.length = 0;
    for (let turn = 0; turn < 16; turn++) {
      const t0 = performance.now();
      const r = await client.chat.completions.create({ model: "qwen3", messages, tools: tools as OpenAI.ChatCompletionTool[] });
      viaGateway.push(performance.now() - t0);
      const more = nextMessages(r as unknown as ReplyJson);
      if (!more) break;
      messages.push(...(more as unknown as OpenAI.ChatCompletionMessageParam[]));
    }
    for (const b of engineBodies.splice(0)) {
      const body = JSON.parse(b) as OpenAI.CompletionCreateParamsNonStreaming;
      const t0 = performance.now();
      await sdk.completions.create(body);
      direct.push(performance.now() - t0);
    }
  }
  await server.stop(true);
  await sim.stop();
  // The first 50 calls of each warm the connection pools and the JIT.
  const q = (xs: number[], p: number) => {
    const s = xs.slice(50).sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
  };
  const rowsL: string[][] = [["what", "p50 ms", "p99 ms"]];
  rowsL.push(["SDK → gateway (Bun.serve) → sim engine (HTTP)", q(viaGateway, 0.5).toFixed(2), q(viaGateway, 0.99).toFixed(2)]);
  rowsL.push(["SDK → sim engine /v1/completions (same requests)", q(direct, 0.5).toFixed(2), q(direct, 0.99).toFixed(2)]);
  rowsL.push(["added by the gateway", (q(viaGateway, 0.5) - q(direct, 0.5)).toFixed(2), (q(viaGateway, 0.99) - q(direct, 0.99)).toFixed(2)]);
  printTable(`latency per call over loopback (${viaGateway.length - 50} calls each, zero-latency engine)`, rowsL);
}

// ---- 2b. Time to first token (true streaming) ----
// The same first turn of each row, streamed: raw fetch over loopback to Bun.serve of the gateway app (engine: the
// in-process sim, decoding at --pace ms a token), timed to the first `content` delta on the wire, vs the sim
// engine's own in-process stream for the very prompt (SimEngineClient.generate's first on_tokens call).
// Interleaved per call; plain-text turns (the built-in policy) so the first token is content.
if (ONLY.includes("ttft")) {
  const PACE = Number(arg("--pace", "2"));
  const N = Number(arg("--ttft-calls", "300"));
  const engine = new SimEngine({ tokenizer: tok, script: { seed: 1, rules: [] }, latency: { prefill_ms_per_token: 0, decode_ms_per_token: PACE } });
  const sim = new SimEngineClient(engine);
  const { gw, app } = newGateway(sim);
  const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: app.fetch, idleTimeout: 0 });
  const base = `http://127.0.0.1:${server.port}`;
  const viaGateway: number[] = [];
  const inProcess: number[] = [];
  const direct: number[] = [];
  const dec = new TextDecoder();
  /** Milliseconds from the call to its first content delta, over `fetchFn`. */
  const firstDelta = async (fetchFn: (u: string, i: RequestInit) => Promise<Response>, key: string, messages: ChatMessage[]) => {
    const t0 = performance.now();
    const res = await fetchFn(`${base}/v1/sessions/${key}/openai/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "qwen3", messages, tools, stream: true }),
    });
    const reader = res.body!.getReader();
    let seen = "";
    let first = -1;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      seen += dec.decode(value, { stream: true });
      if (first < 0 && /"content":"[^"]/.test(seen)) first = performance.now() - t0;
    }
    if (first < 0) throw new Error(`no content delta in ${seen.slice(0, 300)}`);
    return first;
  };
  for (let i = 0; i < N + 20; i++) {
    const key = `ttft_${i}`;
    await createSession(gw, key, i);
    await createSession(gw, `${key}_in`, i);
    const messages = rows[i % rows.length]!.prompt;
    viaGateway.push(await firstDelta((u, init) => fetch(u, init), key, messages));
    inProcess.push(await firstDelta(async (u, init) => app.fetch(new Request(u, init)), `${key}_in`, messages));
    const promptIds = tok.renderIds(messages, { tools, addGenerationPrompt: true });
    const t1 = performance.now();
    let firstDirect = -1;
    await sim.generate({ request_id: `d${i}`, routing_key: `d${i}`, prompt_ids: promptIds, sampling_params: SP, max_tokens: 64, on_tokens: () => void (firstDirect < 0 && (firstDirect = performance.now() - t1)) });
    direct.push(firstDirect);
  }
  await server.stop(true);
  const q = (xs: number[], p: number) => {
    const s = xs.slice(20).sort((a, b) => a - b);
    return s[Math.min(s.length - 1, Math.floor(p * s.length))]!;
  };
  printTable(`time to first token, streamed (${N} calls each after 20 warm-up, sim decoding at ${PACE} ms/token; target ≤ +2 ms p50)`, [
    ["what", "p50 ms", "p90 ms"],
    ["raw fetch → gateway (Bun.serve, loopback) → first content delta", q(viaGateway, 0.5).toFixed(2), q(viaGateway, 0.9).toFixed(2)],
    ["app.fetch in-process (no HTTP) → first content delta", q(inProcess, 0.5).toFixed(2), q(inProcess, 0.9).toFixed(2)],
    ["sim engine in-process stream → first token", q(direct, 0.5).toFixed(2), q(direct, 0.9).toFixed(2)],
    ["added by the gateway", (q(viaGateway, 0.5) - q(direct, 0.5)).toFixed(2), (q(viaGateway, 0.9) - q(direct, 0.9)).toFixed(2)],
  ]);
}

// ---- 3. Heap per idle session ----
// Marginal cost: N sessions are added to a gateway already holding N (the engine's prefix cache and request
// log are at their steady size by then, and no baseline depends on an object being collected).
if (ONLY.includes("heap")) {
  const { gw, app } = newGateway(new SimEngineClient(new SimEngine({ tokenizer: tok, script })));
  const fill = async (from: number) => {
    for (let i = from; i < from + SESSIONS; i++) {
      const key = `idle_${i}`;
      await createSession(gw, key, i);
      for (const body of bodies[i % rows.length]!.slice(0, 2)) {
        const res = await post(app, key, body);
        if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
        await res.text();
      }
    }
  };
  const heap = () => {
    for (let i = 0; i < 3; i++) Bun.gc(true);
    return process.memoryUsage().heapUsed;
  };
  await fill(0);
  const h1 = heap();
  await fill(SESSIONS);
  const h2 = heap();
  if (gw.cached !== 2 * SESSIONS) throw new Error(`expected ${2 * SESSIONS} cached folds, got ${gw.cached}`);
  for (let i = 0; i < 2 * SESSIONS; i++) gw.forget(`idle_${i}`);
  const h3 = heap();
  const session = (h2 - h1) / SESSIONS;
  const fold = (h2 - h3) / (2 * SESSIONS);
  printTable(`heap per idle session (${SESSIONS} more sessions × 2 answered calls, memory storage; heapUsed after Bun.gc(true))`, [
    ["what", "bytes/session"],
    ["storage + cached fold", session.toFixed(0)],
    ["  the cached fold (released by forget)", fold.toFixed(0)],
    ["  memory storage (events as JSON)", (session - fold).toFixed(0)],
  ]);
}
