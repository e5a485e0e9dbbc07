import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BadEngineResponseError, ContextOverflowError, EngineAbortedError } from "../../shared/errors.ts";
import { contextSize } from "../../shared/agent-loop/agent-loop.ts";
import { EngineControl, GatedClient, MemoryEngineGate, type EngineReplicaTarget } from "../../shared/inference/engine-control.ts";
import { CONTEXT_OVERFLOW_PATTERN, engineErrorFromReply, engineHeaders, routingKeyHint } from "../../shared/inference/engine-http.ts";
import { CachedTokensNotice, engineVersionSpans } from "../../shared/inference/finish-output.ts";
import { createEngineClient, parseSglangReply, RetryingClient, SglangClient, VllmClient, type GenerateRequest } from "../../shared/inference/index.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import { RolloutConfig, SamplingParams } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { createSimEngineApp, type SimWireOptions } from "../../infra/sim-engine/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SIM_ENGINE_VERSIONS } from "../../infra/sim-engine/wire.ts";

/**
 * The engine wire audit (../shared/fixtures/engine-wire-audit.md, ranked list
 * 1–11): each item against the strict simulator, which refuses what the real
 * servers refuse. Every test here failed on main before the fix it names.
 */

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

/** A simulated server (its engine and an in-process fetch) started as `wire` says. */
function simServer(wire: SimWireOptions = {}, maxModelLen?: number) {
  const engine = new SimEngine({ tokenizer: tok, ...(maxModelLen ? { maxModelLen } : {}) });
  const app = createSimEngineApp(engine, wire);
  const fetch = async (input: Request | string | URL, init?: RequestInit) => app.fetch(new Request(input, init));
  return { engine, app, fetch, url: "http://sim.local" };
}

function req(prompt: number[], over: Partial<GenerateRequest> = {}): GenerateRequest {
  return { request_id: crypto.randomUUID(), routing_key: "traj-1_0_0", prompt_ids: prompt, sampling_params: SamplingParams.parse({}), max_tokens: 8, ...over };
}

const userPrompt = () => tok.renderIds([{ role: "user", content: "What is 2 + 2?" }], { addGenerationPrompt: true });

describe("1. SGLang control calls carry a JSON body", () => {
  test("pause → resume and a rolled-back pause work against a server that validates the body; a bodiless continue is a 400", async () => {
    const s = simServer();
    const bare = await s.app.request("/continue_generation", { method: "POST" });
    expect(bare.status).toBe(400);
    expect(((await bare.json()) as { error: { message: string } }).error.message).toContain("Field required");
    const bareFlush = await s.app.request("/pause_generation", { method: "POST" });
    expect(bareFlush.status).toBe(400);

    const control = new EngineControl({ gate: new MemoryEngineGate(), format: "sglang", replicas: () => [s] });
    await control.pause({ mode: "abort", clear_cache: true });
    expect(s.engine.paused).toBe(true);
    expect((await control.resume()).paused).toBe(false);
    expect(s.engine.paused).toBe(false);

    // A pause that fails at one replica is rolled back at the others with the same (bodied) call.
    const dead: EngineReplicaTarget = { url: "http://dead.local", fetch: async () => new Response("down", { status: 503 }) };
    const both = new EngineControl({ gate: new MemoryEngineGate(), format: "sglang", replicas: () => [s, dead] });
    const err = (await both.pause({ mode: "abort", clear_cache: false }).catch((e) => e)) as Error;
    expect(err.message).toContain("rolled back");
    expect(s.engine.paused).toBe(false);
    expect(s.engine.pauses.map((p) => p.resumed_ms !== null)).toEqual([true, true]);
  });
});

describe("a pause while paused never ends the first", () => {
  test("same mode: the current state, no engine call; another mode or a flush: 409 naming mode, the first pause kept", async () => {
    const s = simServer();
    const control = new EngineControl({ gate: new MemoryEngineGate(), format: "sglang", replicas: () => [s] });
    await control.pause({ mode: "keep", clear_cache: false });
    const again = await control.pause({ mode: "keep", clear_cache: false });
    expect(again).toMatchObject({ paused: true, mode: "keep", epoch: 1 });
    expect(s.engine.pauses.length).toBe(1);
    for (const second of [{ mode: "abort" as const, clear_cache: true }, { mode: "abort" as const, clear_cache: false }, { mode: "wait" as const, clear_cache: false }]) {
      const e = (await control.pause(second).catch((x) => x)) as { status: number; field: string };
      expect([e.status, e.field]).toEqual([409, "mode"]);
    }
    expect(s.engine.paused).toBe(true);
    expect((await control.status()).paused).toBe(true);
    await control.resume();
    expect(s.engine.paused).toBe(false);
  });
});

describe("engine control never shows a replica URL's credentials", () => {
  test("status and 502 messages name replicas without userinfo or query", async () => {
    const s = simServer();
    const secret: EngineReplicaTarget = { url: "http://user:PASSW0RD@sim.local/?token=QTOKEN", fetch: s.fetch };
    const control = new EngineControl({ gate: new MemoryEngineGate(), format: "vllm", replicas: () => [secret] });
    const st = await control.status();
    expect(st.replicas.map((r) => r.url)).toEqual(["http://sim.local/"]);
    const dead = new EngineControl({ gate: new MemoryEngineGate(), format: "vllm", replicas: () => [{ url: "http://u:PW@127.0.0.1:1/?k=SECRETQ" }] });
    const e = (await dead.pause({ mode: "abort", clear_cache: false }).catch((x) => x)) as Error;
    expect(e.message).toContain("http://127.0.0.1:1/");
    expect(e.message).not.toContain("PW");
    expect(e.message).not.toContain("SECRETQ");
  });
});

describe("2. context-overflow wordings, both engines, both vLLM endpoints", () => {
  const overflow = (message: string, status = 400) => engineErrorFromReply("http://e", { status, body: { error: { message } }, text: "" });
  test("every wording the engines use is a ContextOverflowError; other 400s are not", () => {
    for (const m of [
      "You passed 8129 input tokens and requested 64 output tokens. However, the model's context length is only 8192 tokens, resulting in a maximum input length of 8128 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=8129)",
      "max_tokens=50000 cannot be greater than max_model_len=40960. Please request fewer output tokens.",
      "This model's maximum context length is 8192 tokens. However, you requested 64 output tokens and your prompt contains at least 8129 input tokens",
      "The prompt (total length 9000) is longer than the maximum model length of 8192.",
      "The input (9000 tokens) is longer than the model's context length (8192 tokens).",
      "Requested token count exceeds the model's maximum context length of 8192 tokens. You requested a total of 8200 tokens",
    ]) {
      expect(overflow(m)).toBeInstanceOf(ContextOverflowError);
    }
    expect(overflow("temperature must be non-negative")).toBeInstanceOf(BadEngineResponseError);
    expect(overflow("You passed 9 input tokens", 500)).not.toBeInstanceOf(ContextOverflowError);
    // Literal alternatives only: a long hostile message is scanned in one pass.
    expect(CONTEXT_OVERFLOW_PATTERN.source).not.toMatch(/[*+?{]/);
  });

  for (const version of SIM_ENGINE_VERSIONS) {
    for (const endpoint of ["completions", "generate"] as const) {
      test(`vLLM ${version} ${endpoint}: prompt + max_tokens one over the context → ContextOverflowError with the version's own text; equality is served`, async () => {
        const s = simServer({ engineVersion: version }, 64);
        const client = new VllmClient({ url: s.url, fetch: s.fetch, endpoint });
        const p = userPrompt();
        const e = await client.generate(req(p, { max_tokens: 64 - p.length + 1 })).catch((x) => x);
        expect(e).toBeInstanceOf(ContextOverflowError);
        expect((e as Error).message).toContain(version === "main" ? `However, the model's context length is only 64 tokens, resulting in a maximum input length of ${p.length - 1} tokens` : "This model's maximum context length is 64 tokens");
        const ok = await client.generate(req(p, { max_tokens: 64 - p.length }));
        expect(ok.token_ids.length).toBeGreaterThan(0);
      });
    }
  }
});

describe("3. keep on SGLang never leaves a failing flush", () => {
  test("a weight update with SGLang's default flush_cache while requests sit frozen kills the scheduler; with flush_cache false the frozen request finishes", async () => {
    for (const flush of [undefined, false] as const) {
      const engine = new SimEngine({ tokenizer: tok, latency: { decode_ms_per_token: 2 } });
      const app = createSimEngineApp(engine);
      const f = async (i: Request | string | URL, init?: RequestInit) => app.fetch(new Request(i, init));
      const client = new SglangClient({ url: "http://sim.local", fetch: f });
      const control = new EngineControl({ gate: new MemoryEngineGate(), format: "sglang", replicas: () => [{ url: "http://sim.local", fetch: f }] });
      const call = client.generate(req(userPrompt(), { max_tokens: 40 })).catch((e) => e as Error);
      while (engine.generating === 0) await new Promise((r) => setTimeout(r, 1));
      await control.pause({ mode: "keep", clear_cache: false });
      expect(engine.pauseMode).toBe("in_place");
      expect(engine.pending).toBe(1);
      const update = await app.request("/update_weights_from_disk", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model_path: "/ckpt/step-2", weight_version: "v2", ...(flush === false ? { flush_cache: false } : {}) }) });
      if (flush === undefined) {
        expect(update.status).toBe(500);
        expect(engine.dead).toContain("Cache flush failed after updating weights");
        await control.resume().catch(() => undefined);
        expect(((await call) as Error).message).toContain("HTTP 500");
        expect((await app.request("/health")).status).toBe(503);
      } else {
        expect(update.status).toBe(200);
        await control.resume();
        const out = (await call) as Awaited<ReturnType<SglangClient["generate"]>>;
        expect(out.finish_reason).not.toBe("abort");
        expect(out.extra_fields.model_version).toBe("v2");
      }
    }
  });

  test("/flush_cache is a 400 while any request is pending (SGLang flushes an idle scheduler only)", async () => {
    const engine = new SimEngine({ tokenizer: tok, latency: { decode_ms_per_token: 2 } });
    const app = createSimEngineApp(engine);
    const f = async (i: Request | string | URL, init?: RequestInit) => app.fetch(new Request(i, init));
    const call = new SglangClient({ url: "http://sim.local", fetch: f }).generate(req(userPrompt(), { max_tokens: 20 }));
    while (engine.pending === 0) await new Promise((r) => setTimeout(r, 1));
    const r = await app.request("/flush_cache", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(r.status).toBe(400);
    expect(await r.text()).toStartWith("Cache not flushed because there are pending requests.");
    await call;
    expect((await app.request("/flush_cache", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" })).status).toBe(200);
  });
});

describe("4. the SGLang context is one token short", () => {
  test("SGLang refuses input + max_new_tokens == context_len; edgeloop budgets context − 1 through every wrapper", async () => {
    const s = simServer({}, 64);
    const client = new SglangClient({ url: s.url, fetch: s.fetch });
    const p = userPrompt();
    const e = await client.generate(req(p, { max_tokens: 64 - p.length })).catch((x) => x);
    expect(e).toBeInstanceOf(ContextOverflowError);
    expect((e as Error).message).toContain("Requested token count exceeds the model's maximum context length of 64 tokens");
    expect((await client.generate(req(p, { max_tokens: 63 - p.length }))).token_ids.length).toBeGreaterThan(0);
    const inputOnly = await client.generate(req(Array(64).fill(p[0]!), { max_tokens: 0 + 1 })).catch((x) => x);
    expect((inputOnly as Error).message).toContain("The input (64 tokens) is longer than the model's context length (64 tokens).");

    const config = RolloutConfig.parse({ max_model_len: 64, prompt_length: 32, response_length: 32 });
    const wrapped = new GatedClient(new RetryingClient(client, { retries: 1 }), new MemoryEngineGate());
    expect(await contextSize(config, undefined, client)).toBe(63);
    expect(await contextSize(config, undefined, wrapped)).toBe(63);
    expect(await contextSize(config, 64, wrapped)).toBe(63);
    const vllm = new VllmClient({ url: s.url, fetch: s.fetch });
    expect(await contextSize(config, undefined, new GatedClient(vllm, new MemoryEngineGate()))).toBe(64);
  });
});

describe("5. engine auth", () => {
  test("the key goes as Authorization: Bearer on generate and /v1/models; without it a 401 names the fix; SGLang control takes the admin key", async () => {
    const s = simServer({ apiKey: "k-data", adminApiKey: "k-admin" });
    const p = userPrompt();
    for (const format of ["vllm", "vllm-generate", "sglang"] as const) {
      const keyed = createEngineClient({ url: s.url, format, fetch: s.fetch, apiKey: "k-data" });
      expect((await keyed.generate(req(p))).token_ids.length).toBeGreaterThan(0);
      expect(await keyed.maxModelLen!()).toBe(s.engine.maxModelLen);
      const bare = createEngineClient({ url: s.url, format, fetch: s.fetch });
      const e = (await bare.generate(req(p)).catch((x) => x)) as Error;
      expect(e).toBeInstanceOf(BadEngineResponseError);
      expect(e.message).toContain("HTTP 401: Unauthorized");
      expect(e.message).toContain("EDGELOOP_ENGINE_API_KEY");
    }
    // SGLang with both keys: control routes take the admin key only.
    const withData = new EngineControl({ gate: new MemoryEngineGate(), format: "sglang", replicas: () => [{ ...s, apiKey: "k-data" }] });
    const refused = (await withData.pause({ mode: "abort", clear_cache: false }).catch((x) => x)) as Error;
    expect(refused.message).toContain("HTTP 401");
    expect(s.engine.paused).toBe(false);
    const withAdmin = new EngineControl({ gate: new MemoryEngineGate(), format: "sglang", replicas: () => [{ ...s, apiKey: "k-admin" }] });
    await withAdmin.pause({ mode: "abort", clear_cache: false });
    expect(s.engine.paused).toBe(true);
    await withAdmin.resume();
    // vLLM's guard covers /v1, /inference (not /tokenize, /health, the dev routes); health stays open on both.
    expect((await s.app.request("/health")).status).toBe(200);
    expect((await s.app.request("/tokenize", { method: "POST", body: JSON.stringify({ prompt: "hi" }) })).status).toBe(200);
    expect((await s.app.request("/v1/models")).status).toBe(401);
    expect(engineHeaders("k", "r", undefined, "secret").authorization).toBe("Bearer secret");
    expect(engineHeaders("k", "r").authorization).toBeUndefined();
  });
});

describe("6. cached_tokens only with --enable-prompt-tokens-details", () => {
  test("a vLLM without the flag sends none, and the client says so once with the fix", async () => {
    for (const details of [true, false]) {
      const s = simServer({ promptTokensDetails: details });
      const client = new VllmClient({ url: s.url, fetch: s.fetch });
      const out = await client.generate(req(userPrompt()));
      expect(out.cached_tokens !== undefined).toBe(details);
      expect(client.cachedTokensNotice.missing).toBe(!details);
    }
    const lines: string[] = [];
    const n = new CachedTokensNotice("vLLM", "start vLLM with --enable-prompt-tokens-details", (l) => lines.push(l));
    n.saw(false);
    n.saw(false);
    n.saw(true);
    expect(lines).toEqual(["edgeloop: warning: the vLLM engine does not report cached prompt tokens, so prefix-cache hit metrics stay empty (start vLLM with --enable-prompt-tokens-details)"]);
  });
});

describe("7. /inference/v1/generate: both switches named, both reply shapes read", () => {
  test("a server without scale-out answers 404, and the error names --enable-scale-out and VLLM_ENABLE_SCALE_OUT_ENDPOINTS", async () => {
    const s = simServer({ scaleOut: false });
    const e = (await new VllmClient({ url: s.url, fetch: s.fetch, endpoint: "generate" }).generate(req(userPrompt())).catch((x) => x)) as Error;
    expect(e).toBeInstanceOf(BadEngineResponseError);
    expect(e.message).toContain("--enable-scale-out (vLLM main) or VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (vLLM 0.2x)");
  });
  for (const version of SIM_ENGINE_VERSIONS) {
    test(`vLLM ${version}: the generate reply's ids and log-probs equal the completions reply's`, async () => {
      const s = simServer({ engineVersion: version });
      const raw = (await (await s.app.request("/inference/v1/generate", { method: "POST", body: JSON.stringify({ token_ids: userPrompt(), sampling_params: { max_tokens: 8, logprobs: 0 } }) })).json()) as { choices: { logprobs: { content: Record<string, unknown>[] } }[] };
      expect(Object.keys(raw.choices[0]!.logprobs.content[0]!).sort()).toEqual(version === "main" ? ["logprob", "rank", "token_id", "top_logprobs"] : ["bytes", "logprob", "token", "top_logprobs"]);
      const g = await new VllmClient({ url: s.url, fetch: s.fetch, endpoint: "generate" }).generate(req(userPrompt()));
      const c = await new VllmClient({ url: s.url, fetch: s.fetch, endpoint: "completions" }).generate(req(userPrompt()));
      expect(g.token_ids).toEqual(c.token_ids);
      expect(g.log_probs).toEqual(c.log_probs!);
    });
  }
});

describe("8. SGLang /update_weight_version aborts everything by default", () => {
  test("without abort_all_requests: false a frozen request ends abort; with it, the request finishes after the resume", async () => {
    for (const keep of [false, true]) {
      const engine = new SimEngine({ tokenizer: tok, latency: { decode_ms_per_token: 2 } });
      const app = createSimEngineApp(engine);
      const f = async (i: Request | string | URL, init?: RequestInit) => app.fetch(new Request(i, init));
      const client = new SglangClient({ url: "http://sim.local", fetch: f });
      const call = client.generate(req(userPrompt(), { max_tokens: 40 })).catch((e) => e as Error);
      while (engine.generating === 0) await new Promise((r) => setTimeout(r, 1));
      const control = new EngineControl({ gate: new MemoryEngineGate(), format: "sglang", replicas: () => [{ url: "http://sim.local", fetch: f }] });
      await control.pause({ mode: "keep", clear_cache: false });
      const r = await app.request("/update_weight_version", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ new_version: "v2", ...(keep ? { abort_all_requests: false } : {}) }) });
      expect(r.status).toBe(200);
      await control.resume();
      const out = await call;
      if (keep) expect((out as { finish_reason: string }).finish_reason).not.toBe("abort");
      else expect(out instanceof EngineAbortedError || (out as { finish_reason: string }).finish_reason === "abort").toBe(true);
    }
  });
});

describe("9. health probes while the engines are paused on purpose", () => {
  test("a failed probe while the gate is closed marks nothing unhealthy; the same failure with the gate open does", async () => {
    let paused = true;
    const gw = createGatewayApp({ replicas: ["http://a.local", "http://b.local"], healthIntervalMs: 0, fetch: async () => new Response(null, { status: 503 }), enginesPaused: () => paused });
    await gw.checkHealth();
    expect(gw.pool.status().map((r) => r.healthy)).toEqual([true, true]);
    paused = false;
    await gw.checkHealth();
    expect(gw.pool.status().map((r) => r.healthy)).toEqual([false, false]);
  });
});

describe("9b. a standalone gateway with a store reads the deployment's pause gate", () => {
  test("buildPausedReader follows the gate serve closes in Redis; the memory store has none", async () => {
    const { buildPausedReader } = await import("../../infra/cli/runtime.ts");
    const { parseAppConfig } = await import("../../shared/config/app-config.ts");
    const { IoRedisCommander } = await import("../../infra/redis/ioredis-commander.ts");
    const { RedisEngineGate } = await import("../../shared/inference/engine-control.ts");
    const { REDIS_URL, randomPrefix, deleteByPrefix } = await import("../helpers/redis.ts");
    const prefix = randomPrefix("audit-gate");
    const closers: (() => Promise<void>)[] = [];
    expect(buildPausedReader(parseAppConfig({}, "test"), closers)).toBeNull();
    const paused = buildPausedReader(parseAppConfig({ store: { url: REDIS_URL, prefix } }, "test"), closers)!;
    const commander = new IoRedisCommander(REDIS_URL);
    try {
      const gate = new RedisEngineGate(commander, { prefix });
      expect(await paused()).toBe(false);
      await gate.close("abort");
      expect(await paused()).toBe(true);
      await gate.open();
      expect(await paused()).toBe(false);
    } finally {
      await commander.close();
      for (const c of closers) await c();
      await deleteByPrefix(prefix);
    }
  });
});

describe("10. routing keys fit SGLang Model Gateway's 128 bytes", () => {
  test("short keys pass unchanged; longer ones become one stable 25-byte key", () => {
    const short = `${"u".repeat(100)}_3_0`;
    expect(routingKeyHint(short)).toBe(short);
    const long = `${"u".repeat(128)}_12_0`;
    const h = routingKeyHint(long);
    expect(h).toMatch(/^edgeloop~[0-9a-f]{16}$/);
    expect(routingKeyHint(long)).toBe(h);
    expect(routingKeyHint(`${"u".repeat(128)}_13_0`)).not.toBe(h);
    expect(engineHeaders(long, "r")["x-smg-routing-key"]).toBe(h);
    expect(new TextEncoder().encode(routingKeyHint("é".repeat(100))).length).toBeLessThanOrEqual(128);
  });
});

describe("11. what the engines report for free", () => {
  test("SGLang num_retractions → num_preempted: a retract pause mid-decode counts one", async () => {
    const engine = new SimEngine({ tokenizer: tok, latency: { decode_ms_per_token: 2 } });
    const app = createSimEngineApp(engine);
    const f = async (i: Request | string | URL, init?: RequestInit) => app.fetch(new Request(i, init));
    const call = new SglangClient({ url: "http://sim.local", fetch: f }).generate(req(userPrompt(), { max_tokens: 40 }));
    while (engine.generating === 0) await new Promise((r) => setTimeout(r, 1));
    await app.request("/pause_generation", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ mode: "retract" }) });
    await app.request("/continue_generation", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect((await call).num_preempted).toBe(1);
    expect((await new SglangClient({ url: "http://sim.local", fetch: f }).generate(req(userPrompt()))).num_preempted).toBe(0);
  });

  test("weight-version spans (object or array form) become the call's token_versions; unusable spans leave the stamp", () => {
    expect(engineVersionSpans([{ version: "3", start: 0, end: 2 }, { version: "4", start: 2, end: 5 }], 5)).toEqual([[0, "3"], [2, "4"]]);
    expect(engineVersionSpans([["3", 0, 2], ["3", 2, 5]], 5)).toEqual([[0, "3"]]);
    expect(engineVersionSpans([{ version: "3", start: 0, end: 2 }], 5)).toBeUndefined();
    expect(engineVersionSpans([{ version: "3", start: 1, end: 5 }], 5)).toBeUndefined();
    expect(engineVersionSpans("3", 5)).toBeUndefined();
    const out = parseSglangReply("http://e", {
      output_ids: [5, 6, 7],
      meta_info: { finish_reason: { type: "length" }, output_token_logprobs: [[-1, 5, null], [-1, 6, null], [-1, 7, null]], weight_version: "v4", weight_versions: [["v3", 0, 1], ["v4", 1, 3]], num_retractions: 2 },
    }, true);
    expect(out.extra_fields).toEqual({ model_version: "v4", token_versions: [[0, "v3"], [1, "v4"]] });
    expect(out.num_preempted).toBe(2);
  });
});

describe("the strict simulator refuses what vLLM's SamplingParams refuses", () => {
  test("out-of-range values on both vLLM endpoints, in vLLM's words; what edgeloop sends passes", async () => {
    const s = simServer();
    const ask = async (path: string, sp: Record<string, unknown>) => {
      const body = path === "/v1/completions" ? { prompt: [1, 2, 3], ...sp } : { token_ids: [1, 2, 3], sampling_params: sp };
      const r = await s.app.request(path, { method: "POST", body: JSON.stringify(body) });
      return r.status === 200 ? "ok" : ((await r.json()) as { error: { message: string } }).error.message;
    };
    for (const path of ["/v1/completions", "/inference/v1/generate"]) {
      expect(await ask(path, { max_tokens: 2, temperature: -0.5 })).toBe("temperature must be non-negative, got -0.5.");
      expect(await ask(path, { max_tokens: 2, top_p: 1.5 })).toBe("top_p must be in (0, 1], got 1.5.");
      expect(await ask(path, { max_tokens: 2, top_k: -2 })).toBe("top_k must be 0 (disable), or at least 1, got -2.");
      expect(await ask(path, { max_tokens: 0 })).toBe("max_tokens must be at least 1, got 0.");
      expect(await ask(path, { max_tokens: 2, top_k: 0, temperature: 0, top_p: 1 })).toBe("ok");
    }
  });
});

describe("the strict simulator refuses what SGLang's SamplingParams refuses", () => {
  test("unknown keys, out-of-range values; accepts what edgeloop sends", async () => {
    const s = simServer();
    const ask = async (sp: Record<string, unknown>) => {
      const r = await s.app.request("/generate", { method: "POST", body: JSON.stringify({ input_ids: [1, 2, 3], sampling_params: sp }) });
      return r.status === 200 ? "ok" : ((await r.json()) as { error: { message: string } }).error.message;
    };
    expect(await ask({ max_new_tokens: 2, top_k: -1, temperature: 1, top_p: 1, n: 1, no_stop_trim: true, skip_special_tokens: false, sampling_seed: 3 })).toBe("ok");
    expect(await ask({ max_new_tokens: 2, logprobs: 0 })).toBe("Unexpected keyword argument 'logprobs'");
    expect(await ask({ top_p: 0 })).toBe("top_p must be in (0, 1], got 0.");
    expect(await ask({ temperature: -1 })).toBe("temperature must be a non-negative finite number, got -1.");
    expect(await ask({ max_new_tokens: 2, min_new_tokens: 3 })).toBe("min_new_tokens must be in [0, max_new_tokens(2)], got 3.");
    // temperature 0 is greedy (top_k 1), so top_k 0 then passes, as in SGLang's __post_init__.
    expect(await ask({ temperature: 0, top_k: 0, max_new_tokens: 1 })).toBe("ok");
    const body = new SglangClient({ url: s.url }).generateBody(req([1, 2, 3]));
    expect(await ask(body.sampling_params as Record<string, unknown>)).toBe("ok");
  });
});

afterAll(() => undefined);
