/**
 * Retries vs resamples on the agent gateway (issue 30 item 4): the real
 * `openai` and `@anthropic-ai/sdk` retry loops against the Hono app, with
 * faults injected by their `fetch` option after the gateway answered — a
 * connection that fails (`TypeError: fetch failed`) or a 409/429/5xx in front
 * of the app. A retry (`x-stainless-retry-count` ≥ 1) or a call with a known
 * `Idempotency-Key` is a replay (one engine call); the same body sent again by
 * the application is a new sample (another engine call, a sibling output).
 */
import { beforeAll, describe, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { readFileSync } from "node:fs";
import { AgentGateway, turnOptionsOf } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { resampleSeed } from "../../shared/agent-gateway/gateway-turn.ts";
import { fnv1a32 } from "../../shared/inference/hash.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import type { SessionStorage } from "../../shared/session/session-storage.ts";
import { config, SP } from "../agent-loop/helpers.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const script = JSON.parse(readFileSync(`${ROOT}examples/policy.json`, "utf8"));
const prompt = (JSON.parse(readFileSync(`${ROOT}examples/gsm8k-tool.jsonl`, "utf8").split("\n")[0]!) as { prompt: ChatMessage[] }).prompt;
const BASE = "http://edgeloop.local";
const TOKEN = "tok_0123456789abcdef0123";
const KEY = "u0_0_0";
/** Reply ids are `chatcmpl-{fnv1a32(key) hex}-{output}-{assistant turn}-{step}`. */
const ID = `chatcmpl-${fnv1a32(KEY).toString(16)}`;
/** Messages ids are the same with `msg_`; Responses ids `resp_{…}-{output}-{turn}-{step}-{messages}` (`i`: with instructions). */
const MSG = `msg_${fnv1a32(KEY).toString(16)}`;
const RESP = `resp_${fnv1a32(KEY).toString(16)}`;
type FetchLike = (u: string | URL | Request, i?: RequestInit) => Promise<Response>;

let tok: ChatTokenizer;
let tools: ToolSchema[];
let body: OpenAI.ChatCompletionCreateParamsNonStreaming;

beforeAll(async () => {
  tok = await defaultTokenizer();
  // Only the schemas: the gateway never calls the tools.
  tools = [...new WebhookToolClient(parseToolsFile(readFileSync(`${ROOT}infra/tools/tools.example.json`, "utf8"), { vars: { port: 1 } }).tools).schemas];
  body = { model: "qwen3", messages: prompt as OpenAI.ChatCompletionMessageParam[], tools: tools as OpenAI.ChatCompletionTool[], temperature: 1 };
});

/** The sim engine's client, recording each call's seed; `hold` parks calls until released. */
class CountingClient implements InferenceClient {
  readonly seeds: (number | undefined)[] = [];
  private held: (() => void)[] = [];
  private holding = false;
  constructor(readonly inner: SimEngineClient) {}
  async generate(req: GenerateRequest) {
    this.seeds.push(req.sampling_params.seed);
    if (this.holding) await new Promise<void>((r) => this.held.push(r));
    return this.inner.generate(req);
  }
  async maxModelLen() {
    return this.inner.maxModelLen();
  }
  hold(): void {
    this.holding = true;
  }
  release(): void {
    this.holding = false;
    for (const r of this.held.splice(0)) r();
  }
  /** Resolves once `n` calls have reached the client. */
  async reached(n: number): Promise<void> {
    while (this.seeds.length < n) await Bun.sleep(2);
  }
}

/** A fault injected in front of the app for one attempt: the connection fails after the gateway answered, or this status replaces its answer. */
type Fault = "drop" | 409 | 429 | 500 | 503;

function setup(o: { seed?: number; storage?: SessionStorage } = {}) {
  const engine = new SimEngine({ tokenizer: tok, script });
  const client = new CountingClient(new SimEngineClient(engine));
  const storage = o.storage ?? new MemorySessionStorage();
  const gw = new AgentGateway({ storage, tokenizer: tok, client, maxModelLen: 4096, wallClockMs: () => 1_700_000_000_000 });
  const app = createAgentGatewayApp({ gateway: gw });
  /** Per attempt the app saw: `x-stainless-retry-count` and `idempotency-key`. */
  const attempts: { retry: string | null; idem: string | null }[] = [];
  /** Faults for the next attempts, in order (shifted per attempt). */
  const faults: Fault[] = [];
  const fetchApp: FetchLike = async (u, i) => {
    const req = u instanceof Request ? u : new Request(String(u), i);
    attempts.push({ retry: req.headers.get("x-stainless-retry-count"), idem: req.headers.get("idempotency-key") });
    const res = await app.fetch(req);
    const fault = faults.shift();
    if (fault === undefined) return res;
    // The gateway answered (and committed) this attempt; the client never sees it.
    await res.arrayBuffer();
    if (fault === "drop") throw new TypeError("fetch failed");
    return Response.json({ error: { message: `injected ${fault}`, type: "server_error" } }, { status: fault, headers: { "retry-after-ms": "1" } });
  };
  return { engine, client, gw, fetchApp, attempts, faults, storage };
}

async function createSession(gw: AgentGateway, seed?: number) {
  const now = 1_700_000_000_000;
  return gw.create({
    v: 1,
    key: KEY,
    uid: "u0",
    session_id: 0,
    token: TOKEN,
    created_ms: now,
    deadline_ms: now + 600_000,
    sampling_params: seed === undefined ? SP : { ...SP, seed },
    rollout: config(),
    tools,
    messages: prompt,
  });
}

function openai(fetchApp: FetchLike, maxRetries = 2) {
  return new OpenAI({ baseURL: `${BASE}/v1/sessions/${KEY}/openai/v1`, apiKey: TOKEN, fetch: fetchApp, maxRetries });
}

function anthropic(fetchApp: FetchLike, maxRetries = 2) {
  return new Anthropic({ baseURL: `${BASE}/v1/sessions/${KEY}/anthropic`, apiKey: TOKEN, fetch: fetchApp as typeof fetch, maxRetries });
}

/** The stored outputs of the session (its record). */
async function outputs(gw: AgentGateway) {
  return agentOutputs((await gw.get(KEY))!, { reward: 1 });
}

describe("turnOptionsOf", () => {
  test("retry from x-stainless-retry-count >= 1, the Idempotency-Key trimmed; a bad key is a 400 naming it", () => {
    expect(turnOptionsOf(new Headers())).toEqual({ retry: false });
    expect(turnOptionsOf(new Headers({ "x-stainless-retry-count": "0" }))).toEqual({ retry: false });
    expect(turnOptionsOf(new Headers({ "x-stainless-retry-count": "1" }))).toEqual({ retry: true });
    expect(turnOptionsOf(new Headers({ "x-stainless-retry-count": "2", "idempotency-key": " k1 " }))).toEqual({ retry: true, idempotencyKey: "k1" });
    expect(turnOptionsOf(new Headers({ "x-stainless-retry-count": "-1" }))).toEqual({ retry: false });
    expect(turnOptionsOf(new Headers({ "x-stainless-retry-count": "yes" }))).toEqual({ retry: false });
    expect(() => turnOptionsOf(new Headers({ "idempotency-key": " " }))).toThrow("Idempotency-Key: expected 1 to 255 characters, got 0");
    expect(() => turnOptionsOf(new Headers({ "idempotency-key": "k".repeat(256) }))).toThrow("Idempotency-Key: expected 1 to 255 characters, got 256");
  });
});

describe("retries vs resamples through the SDKs", () => {
  test("openai chat: a connection failure after the gateway answered; the SDK's retry gets the identical reply, one engine call", async () => {
    const { engine, gw, fetchApp, attempts, faults } = setup();
    await createSession(gw);
    faults.push("drop");
    const r = await openai(fetchApp).chat.completions.create(body);
    expect(r.id).toBe(`${ID}-0-1-1`);
    expect(attempts).toEqual([{ retry: "0", idem: null }, { retry: "1", idem: null }]);
    expect(engine.stats.requests).toBe(1);
    expect((await outputs(gw)).length).toBe(1);
    expect((await gw.get(KEY))!.step).toBe(1);
  });

  for (const fault of [409, 429, 500, 503] as const) {
    test(`openai chat: a ${fault} in front of the app is retried and answered from the record`, async () => {
      const { engine, gw, fetchApp, attempts, faults } = setup();
      await createSession(gw);
      faults.push(fault);
      const r = await openai(fetchApp).chat.completions.create(body);
      expect(r.id).toBe(`${ID}-0-1-1`);
      expect(attempts.map((a) => a.retry)).toEqual(["0", "1"]);
      expect(engine.stats.requests).toBe(1);
      expect((await outputs(gw)).length).toBe(1);
    });
  }

  test("openai chat: two failed attempts (drop, then 503), the second retry (x-stainless-retry-count: 2) replays", async () => {
    const { engine, gw, fetchApp, attempts, faults } = setup();
    await createSession(gw);
    faults.push("drop", 503);
    const r = await openai(fetchApp).chat.completions.create(body);
    expect(r.id).toBe(`${ID}-0-1-1`);
    expect(attempts.map((a) => a.retry)).toEqual(["0", "1", "2"]);
    expect(engine.stats.requests).toBe(1);
  });

  test("openai chat: the same body sent again by the application is a new sample: its own engine call, a sibling output", async () => {
    const { engine, gw, fetchApp } = setup();
    await createSession(gw);
    const client = openai(fetchApp);
    const a = await client.chat.completions.create(body);
    const b = await client.chat.completions.create(body);
    expect([a.id, b.id]).toEqual([`${ID}-0-1-1`, `${ID}-1-1-2`]);
    expect(engine.stats.requests).toBe(2);
    const outs = await outputs(gw);
    expect(outs.length).toBe(2);
    // Siblings: the same prompt, each its own sample (the sim engine is deterministic, so the same tokens here).
    expect(outs[1]!.prompt_ids).toEqual(outs[0]!.prompt_ids);
    expect(outs[1]!.response_ids).toEqual(outs[0]!.response_ids);
    // A retry now replays the newest answer of that body.
    expect((await client.chat.completions.create(body, { headers: { "x-stainless-retry-count": "1" } })).id).toBe(`${ID}-1-1-2`);
    expect(engine.stats.requests).toBe(2);
  });

  test("a resample at the session's fixed seed is sent with a seed of its own; the first call and a continuation keep the session's", async () => {
    const { gw, fetchApp, client } = setup();
    await createSession(gw, 7);
    const sdk = openai(fetchApp);
    await sdk.chat.completions.create(body);
    await sdk.chat.completions.create(body);
    // A request naming its seed is sampled with it, resample or not.
    await sdk.chat.completions.create({ ...body, seed: 3 });
    await sdk.chat.completions.create({ ...body, seed: 3 });
    expect(resampleSeed(7, 1)).toBe(7_015_859);
    expect(client.seeds).toEqual([7, 7_015_859, 3, 3]);
  });

  test("openai Responses: a dropped connection is replayed (same response id, one engine call); the same body again samples", async () => {
    const { engine, gw, fetchApp, attempts, faults } = setup();
    await createSession(gw);
    const sdk = openai(fetchApp);
    const rbody = { model: "qwen3", instructions: prompt[0]!.content as string, input: prompt.slice(1).map((m) => ({ role: m.role as "user", content: m.content as string })), tools: tools.map((t) => ({ type: "function" as const, name: t.function.name, description: t.function.description ?? null, parameters: t.function.parameters as Record<string, unknown>, strict: false })) };
    faults.push("drop");
    const r1 = await sdk.responses.create(rbody);
    expect(attempts.map((a) => a.retry)).toEqual(["0", "1"]);
    expect(engine.stats.requests).toBe(1);
    const r2 = await sdk.responses.create(rbody);
    expect(engine.stats.requests).toBe(2);
    expect([r1.id, r2.id]).toEqual([`${RESP}-0-1-1-${prompt.length}i`, `${RESP}-1-1-2-${prompt.length}i`]);
    expect((await outputs(gw)).length).toBe(2);
  });

  test("anthropic messages: a dropped connection and a 529-style 503 are replayed (one engine call); the same body again samples", async () => {
    const { engine, gw, fetchApp, attempts, faults } = setup();
    await createSession(gw);
    const a = anthropic(fetchApp);
    const mbody: Anthropic.MessageCreateParamsNonStreaming = {
      model: "qwen3",
      max_tokens: 1024,
      system: prompt[0]!.content as string,
      messages: prompt.slice(1).map((m) => ({ role: m.role as "user", content: m.content as string })),
      tools: tools.map((t) => ({ name: t.function.name, description: t.function.description, input_schema: t.function.parameters as Anthropic.Tool.InputSchema })),
    };
    faults.push("drop", 503);
    const m1 = await a.messages.create(mbody);
    expect(m1.id).toBe(`${MSG}-0-1-1`);
    expect(attempts.map((x) => x.retry)).toEqual(["0", "1", "2"]);
    expect(engine.stats.requests).toBe(1);
    const m2 = await a.messages.create(mbody);
    expect(m2.id).toBe(`${MSG}-1-1-2`);
    expect(engine.stats.requests).toBe(2);
    expect((await outputs(gw)).length).toBe(2);
  });
});

describe("concurrent duplicates", () => {
  const post = (fetchApp: FetchLike, headers: Record<string, string>) =>
    fetchApp(`${BASE}/v1/sessions/${KEY}/openai/v1/chat/completions`, { method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json", ...headers }, body: JSON.stringify(body) }).then(async (r) => ((await r.json()) as { id: string }).id);

  test("a retry arriving while the first attempt is still sampling waits for it and replays it", async () => {
    const { engine, gw, fetchApp, client } = setup();
    await createSession(gw);
    client.hold();
    const first = post(fetchApp, { "x-stainless-retry-count": "0" });
    await client.reached(1);
    const retry = post(fetchApp, { "x-stainless-retry-count": "1" });
    await Bun.sleep(20);
    client.release();
    expect(await Promise.all([first, retry])).toEqual([`${ID}-0-1-1`, `${ID}-0-1-1`]);
    expect(engine.stats.requests).toBe(1);
  });

  test("two equal calls in parallel without a retry marker are two samples", async () => {
    const { engine, gw, fetchApp, client } = setup();
    await createSession(gw);
    client.hold();
    const a = post(fetchApp, {});
    await client.reached(1);
    const b = post(fetchApp, {});
    await Bun.sleep(20);
    client.release();
    expect(await Promise.all([a, b])).toEqual([`${ID}-0-1-1`, `${ID}-1-1-2`]);
    expect(engine.stats.requests).toBe(2);
    expect((await outputs(gw)).length).toBe(2);
  });

  test("across processes: the first attempt loses the step fence to its retry answered elsewhere and answers with the retry's reply", async () => {
    const storage = new MemorySessionStorage();
    const p1 = setup({ storage });
    const p2 = setup({ storage });
    await createSession(p1.gw);
    p1.client.hold();
    const first = post(p1.fetchApp, { "x-stainless-retry-count": "0" });
    await p1.client.reached(1);
    // The client gave up on process 1 and its retry reached process 2, which samples and commits first.
    expect(await post(p2.fetchApp, { "x-stainless-retry-count": "1" })).toBe(`${ID}-0-1-1`);
    p1.client.release();
    expect(await first).toBe(`${ID}-0-1-1`);
    expect(p1.engine.stats.requests + p2.engine.stats.requests).toBe(2);
    const st = (await p1.gw.get(KEY))!;
    expect([st.step, st.outputs.length]).toEqual([1, 1]);
  });
});

describe("Idempotency-Key", () => {
  test("same key and body: a replay (even without a retry marker); same key, other body: 422 naming Idempotency-Key, not retried; a new key samples", async () => {
    const { engine, gw, fetchApp, attempts, storage } = setup();
    await createSession(gw);
    const sdk = openai(fetchApp);
    const k1 = { headers: { "Idempotency-Key": "k1" } };
    const r1 = await sdk.chat.completions.create(body, k1);
    expect(r1.id).toBe(`${ID}-0-1-1`);
    expect((await sdk.chat.completions.create(body, k1)).id).toBe(`${ID}-0-1-1`);
    expect(engine.stats.requests).toBe(1);

    const n = attempts.length;
    const err = await sdk.chat.completions.create({ ...body, temperature: 0.5 }, k1).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.UnprocessableEntityError);
    expect((err as InstanceType<typeof OpenAI.APIError>).status).toBe(422);
    expect((err as InstanceType<typeof OpenAI.APIError>).error).toEqual({
      code: "idempotency_key_reused",
      field: "Idempotency-Key",
      message: "Idempotency-Key 'k1' was already used with another request body in this session; send a new key for a new request",
      type: "invalid_request_error",
      param: "Idempotency-Key",
    });
    expect(attempts.length).toBe(n + 1);
    expect(engine.stats.requests).toBe(1);

    // Another key with the same body is another call: a new sample (the key decides, not the body).
    const r2 = await sdk.chat.completions.create(body, { headers: { "Idempotency-Key": "k2" } });
    expect(r2.id).toBe(`${ID}-1-1-2`);
    expect(engine.stats.requests).toBe(2);
    // A keyed retry of a dropped attempt replays by its key.
    const { fetchApp: f2, faults, engine: e2, attempts: a2 } = setup({ storage });
    faults.push("drop");
    expect((await openai(f2).chat.completions.create(body, { headers: { "Idempotency-Key": "k2" } })).id).toBe(`${ID}-1-1-2`);
    expect(a2).toEqual([{ retry: "0", idem: "k2" }, { retry: "1", idem: "k2" }]);
    expect(e2.stats.requests).toBe(0);

    // The keys are durable: a gateway folding the stored session replays k1 and refuses it for another body.
    const { gw: fresh, fetchApp: f3, engine: e3 } = setup({ storage });
    expect((await fresh.get(KEY))!.keyed.size).toBe(2);
    expect((await openai(f3).chat.completions.create(body, k1)).id).toBe(`${ID}-0-1-1`);
    const again = await openai(f3).chat.completions.create({ ...body, temperature: 0.5 }, k1).catch((e: unknown) => e);
    expect((again as InstanceType<typeof OpenAI.APIError>).status).toBe(422);
    expect(e3.stats.requests).toBe(0);
    expect((await outputs(fresh)).length).toBe(2);
  });

  test("the Messages route: a replay by key, and the 422 in Anthropic's shape; a malformed key is a 400", async () => {
    const { engine, gw, fetchApp } = setup();
    await createSession(gw);
    const mbody = { model: "qwen3", max_tokens: 1024, system: prompt[0]!.content as string, messages: prompt.slice(1).map((m) => ({ role: m.role, content: m.content })) };
    const send = (b: unknown, key: string) =>
      fetchApp(`${BASE}/v1/sessions/${KEY}/anthropic/v1/messages`, { method: "POST", headers: { "x-api-key": TOKEN, "content-type": "application/json", "idempotency-key": key }, body: JSON.stringify(b) });
    const r1 = await send(mbody, "m1");
    expect(((await r1.json()) as { id: string }).id).toBe(`${MSG}-0-1-1`);
    const r2 = await send(mbody, "m1");
    expect(((await r2.json()) as { id: string }).id).toBe(`${MSG}-0-1-1`);
    expect(engine.stats.requests).toBe(1);
    const r3 = await send({ ...mbody, max_tokens: 10 }, "m1");
    expect([r3.status, await r3.json()]).toEqual([
      422,
      { type: "error", error: { type: "invalid_request_error", message: "Idempotency-Key 'm1' was already used with another request body in this session; send a new key for a new request" }, request_id: null },
    ]);
    const r4 = await send(mbody, "");
    expect(r4.status).toBe(400);
    expect(engine.stats.requests).toBe(1);
  });
});
