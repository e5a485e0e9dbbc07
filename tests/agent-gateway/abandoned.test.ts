/**
 * Abandoned turns (issue 30 item 6) over real HTTP (Bun.serve on loopback):
 * a client that goes away while its turn is sampled — a non-streaming fetch
 * aborted, a stream cancelled before its last event — leaves the turn in the
 * record marked `abandoned`, its tokens masked 0, the output not credited
 * with the reward; an agent that continues from the reply clears the mark.
 */
import { afterEach, beforeAll, describe, expect, test } from "bun:test";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { toTrajectoryRecord, type PlannedTrajectory } from "../../shared/rollout/batch.ts";
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
import { waitFor } from "../helpers/wait.ts";

const row0 = exampleRow(0);
let tok: ChatTokenizer;
let tools: ToolSchema[];
beforeAll(async () => void ({ tok, tools } = await tokenizerAndTools()));
const stops: (() => unknown)[] = [];
afterEach(async () => {
  for (const s of stops.splice(0)) await s();
});

/** Counts the tokens the engine streamed; `onToken` sees the running count. */
class CountingClient implements InferenceClient {
  produced = 0;
  onToken: ((n: number) => void) | null = null;
  constructor(readonly inner: SimEngineClient) {}
  generate(req: GenerateRequest) {
    const sink = req.on_tokens;
    return this.inner.generate({ ...req, on_tokens: (ids, lps) => ((this.produced += ids.length), sink?.(ids, lps), this.onToken?.(this.produced)) });
  }
  maxModelLen() {
    return this.inner.maxModelLen();
  }
}

/** The three wire APIs the gateway answers on one session, and their paths under the session. */
type Api = "chat" | "responses" | "messages";
const PATHS: Record<Api, string> = { chat: "/openai/v1/chat/completions", responses: "/openai/v1/responses", messages: "/anthropic/v1/messages" };

/** Row 0's first call in `api`'s request shape (the same prompt and tools in each). */
function firstCall(api: Api, stream: boolean): Record<string, unknown> {
  const prompt = row0.prompt as { role: "system" | "user"; content: string }[];
  const fns = tools.map((t) => t.function);
  const on = stream ? { stream: true } : {};
  if (api === "chat") return { model: "qwen3", messages: prompt, tools, ...on };
  if (api === "responses") return { model: "qwen3", input: prompt.map((m) => ({ role: m.role, content: m.content })), tools: fns.map((f) => ({ type: "function", name: f.name, description: f.description ?? null, parameters: f.parameters ?? null, strict: false })), ...on };
  return { model: "qwen3", max_tokens: 512, system: prompt[0]!.content, messages: prompt.slice(1), tools: fns.map((f) => ({ name: f.name, description: f.description, input_schema: f.parameters ?? { type: "object" } })), ...on };
}

/** The gateway served on loopback; `signals`: every request's signal as the server saw it. */
async function serve() {
  const engine = new SimEngine({ tokenizer: tok, script: examplePolicy(), latency: { prefill_ms_per_token: 0, decode_ms_per_token: 1, stream_every_token: true } });
  const client = new CountingClient(new SimEngineClient(engine));
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client, maxModelLen: 4096 });
  await gw.create(agentSessionInput(tools));
  const app = createAgentGatewayApp({ gateway: gw });
  const signals: AbortSignal[] = [];
  const server = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: (req) => (signals.push(req.signal), app.fetch(req)) });
  stops.push(() => server.stop(true));
  const base = `http://127.0.0.1:${server.port}/v1/sessions/u0_0_0`;
  const post = (body: unknown, init: RequestInit = {}, api: Api = "chat") =>
    fetch(`${base}${PATHS[api]}`, { method: "POST", ...init, headers: { authorization: `Bearer ${AGENT_TOKEN}`, "content-type": "application/json", ...(init.headers ?? {}) }, body: JSON.stringify(body) });
  return { engine, client, gw, post, signals };
}

const TURN1 = () => tok.encode((examplePolicy() as { rules: { turns: string[] }[] }).rules[0]!.turns[0]!).length + 1;

/**
 * Sends `body`, freezes the engine (pause `keep`) at its 5th token, aborts the
 * client, waits until the server saw the abort, then lets the turn finish.
 * `read`: read the stream's first bytes before aborting.
 */
async function abortMidTurn(s: Awaited<ReturnType<typeof serve>>, body: Record<string, unknown>, read: boolean, api: Api = "chat") {
  const ac = new AbortController();
  let frozen!: () => void;
  const atFive = new Promise<void>((r) => (frozen = r));
  s.client.onToken = (n) => {
    if (n === 5) void s.engine.pause("keep").then(frozen);
  };
  const res = s.post(body, { signal: ac.signal }, api);
  if (read) {
    const r = await res;
    const reader = r.body!.getReader();
    await reader.read();
    await atFive;
    await reader.cancel();
  } else {
    await atFive;
  }
  ac.abort();
  await res.catch(() => {});
  const sig = s.signals.at(-1)!;
  await waitFor(() => sig.aborted, "the server to see the client go away");
  s.client.onToken = null;
  s.engine.resume();
  await waitFor(async () => (await s.gw.get("u0_0_0"))!.outputs[0]?.abandoned != null, "the abandon mark");
}

describe("abandoned turns", () => {
  for (const stream of [false, true]) {
    test(`${stream ? "a stream cancelled" : "a fetch aborted"} mid-turn: the turn is kept, marked abandoned, masked 0, never credited; continuing from it clears the mark`, async () => {
      const s = await serve();
      const body = { model: "qwen3", messages: row0.prompt, tools, ...(stream ? { stream: true } : {}) };
      await abortMidTurn(s, body, stream);
      const n = TURN1();
      const [out] = agentOutputs((await s.gw.get("u0_0_0"))!, { reward: 1 });
      expect(out!.response_ids.length).toBe(n);
      expect(out!.response_mask).toEqual(Array(n).fill(0));
      expect(out!.reward_score).toBe(null);
      expect(out!.extra_fields.abandoned).toEqual({ turn: 1, start: 0, end: n });
      // Log-probs 0.0 under the mask: the output passes the one validator and becomes a record (a fresh-user trial
      // found every abandoned turn failing its whole trajectory with observation_logprob_zero).
      expect(out!.response_logprobs).toEqual(Array(n).fill(0));
      const st = (await s.gw.get("u0_0_0"))!;
      const planned = { key: "u0_0_0", uid: "u0", session_id: 0, row_index: 0, row: null, row_error: null, group_size: 1, trajectory_info: { step: 0, sample_index: 0, rollout_n: 0, validate: false } } as unknown as PlannedTrajectory;
      const rec = toTrajectoryRecord(planned, "openai_agent", out!, st.input.rollout, 0);
      expect([rec.response_mask, rec.rollout_log_probs, rec.reward_score]).toEqual([Array(n).fill(0), Array(n).fill(0), null]);
      // Kept for inspection: the tokens are there, and "keep" leaves the mask and log-probs as sampled (and valid).
      const kept = agentOutputs((await s.gw.get("u0_0_0"))!, { reward: 1, abandonedMask: "keep" })[0]!;
      expect(kept.response_mask).toEqual(Array(n).fill(1));
      expect(kept.response_logprobs!.every((v) => v < 0)).toBe(true);
      expect(toTrajectoryRecord(planned, "openai_agent", kept, st.input.rollout, 0).rollout_log_probs).toEqual(kept.response_logprobs);
      // The stored events fold to the same mark.
      s.gw.forget("u0_0_0");
      expect(agentOutputs((await s.gw.get("u0_0_0"))!, { reward: 1 })[0]!.extra_fields.abandoned).toEqual({ turn: 1, start: 0, end: n });

      // The agent's retry gets the recorded reply; it continues from it with the tool result: the mark is gone.
      const again = (await (await s.post({ ...body, stream: false }, { headers: { "x-stainless-retry-count": "1" } })).json()) as { choices: { message: { tool_calls: { id: string }[] } }[] };
      const msg = again.choices[0]!.message;
      const r2 = await s.post({ model: "qwen3", messages: [...row0.prompt, msg, { role: "tool", tool_call_id: msg.tool_calls[0]!.id, content: "31" }], tools });
      expect(r2.status).toBe(200);
      await r2.json();
      const [done] = agentOutputs((await s.gw.get("u0_0_0"))!, { reward: 1 });
      expect(done!.extra_fields.abandoned).toBeUndefined();
      expect(done!.reward_score).toBe(1);
      expect(done!.response_mask.slice(0, n)).toEqual(Array(n).fill(1));
    });
  }

  // The same mark through the Responses and Messages APIs (a break test found none there): every wire API
  // ends its turn through one abandon path, streamed or not.
  for (const api of ["responses", "messages"] as const) {
    for (const stream of [false, true]) {
      test(`${api}: ${stream ? "a stream cancelled" : "a fetch aborted"} mid-turn is marked abandoned, masked 0 with log-probs 0.0, never credited`, async () => {
        const s = await serve();
        await abortMidTurn(s, firstCall(api, stream), stream, api);
        const n = TURN1();
        const [out] = agentOutputs((await s.gw.get("u0_0_0"))!, { reward: 1 });
        expect(out!.extra_fields.abandoned).toEqual({ turn: 1, start: 0, end: n });
        expect(out!.response_ids.length).toBe(n);
        expect(out!.response_mask).toEqual(Array(n).fill(0));
        expect(out!.response_logprobs).toEqual(Array(n).fill(0));
        expect(out!.reward_score).toBe(null);
      });
    }
    test(`${api}: a reply received whole is not marked`, async () => {
      for (const stream of [false, true]) {
        const s = await serve();
        const r = await s.post(firstCall(api, stream), {}, api);
        expect(r.status).toBe(200);
        await r.text();
        const outs = agentOutputs((await s.gw.get("u0_0_0"))!, { reward: 1 });
        expect(outs.length).toBe(1);
        expect(outs[0]!.extra_fields.abandoned).toBeUndefined();
        expect(outs[0]!.reward_score).toBe(1);
        expect(outs[0]!.response_mask).toEqual(Array(TURN1()).fill(1));
      }
    });
  }

  test("a call whose reply was received is not marked", async () => {
    const s = await serve();
    const r = await s.post({ model: "qwen3", messages: row0.prompt, tools, stream: true });
    await r.text();
    const [out] = agentOutputs((await s.gw.get("u0_0_0"))!, { reward: 1 });
    expect(out!.extra_fields.abandoned).toBeUndefined();
    expect(out!.reward_score).toBe(1);
    expect(out!.response_mask).toEqual(Array(TURN1()).fill(1));
  });
});

describe("config agent.abandoned_mask", () => {
  test("defaults to zero, takes keep, and refuses anything else naming the field", () => {
    expect(parseAppConfig({}).agent.abandoned_mask).toBe("zero");
    expect(parseAppConfig({ agent: { abandoned_mask: "keep" } }).agent.abandoned_mask).toBe("keep");
    expect(() => parseAppConfig({ agent: { abandoned_mask: "one" } })).toThrow(/agent\.abandoned_mask/);
  });
});
