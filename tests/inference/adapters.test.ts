import { afterAll, describe, expect, test } from "bun:test";
import * as errors from "../../shared/errors.ts";
import { ConfigError, EngineError } from "../../shared/errors.ts";
import { createEngineClient, SglangClient, VllmClient, type GenerateRequest, type InferenceClient } from "../../shared/inference/index.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { loadReplyFixtures, loadRequestFixture, startReplayServer, type EngineFixture } from "./replay-server.ts";

const server = startReplayServer();
afterAll(() => server.stop());

const reqFixture = loadRequestFixture();
const fixtures = loadReplyFixtures();

function request(over: Partial<GenerateRequest> = {}): GenerateRequest {
  const i = reqFixture.input;
  return { ...i, sampling_params: SamplingParams.parse(i.sampling_params), ...over };
}

function client(engine: EngineFixture["engine"], url = server.url, timeoutMs?: number): InferenceClient {
  return createEngineClient({ url, format: engine, model: "Qwen/Qwen3-8B", timeoutMs });
}

async function caught(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected the call to throw");
}

describe("adapters against recorded replies", () => {
  test("there are fixtures for both engines and every error class", () => {
    const errorsSeen = new Set(fixtures.map((f) => f.expect.error).filter(Boolean));
    expect([...errorsSeen].sort()).toEqual(["BadEngineResponseError", "ContextOverflowError", "EngineAbortedError", "EngineUnavailableError"]);
    expect(new Set(fixtures.map((f) => f.engine))).toEqual(new Set(["vllm", "vllm-generate", "sglang"]));
  });

  for (const f of fixtures) {
    test(`${f.name}: ${f.description}`, async () => {
      server.setReply(f.reply);
      const c = client(f.engine);
      const run = c.generate(request());
      if (f.expect.output) {
        expect(await run).toEqual(f.expect.output as never);
      } else {
        const e = await caught(run);
        const cls = (errors as Record<string, unknown>)[f.expect.error!] as new (...a: never[]) => Error;
        expect(e).toBeInstanceOf(cls);
        expect((e as Error).name).toBe(f.expect.error!);
        expect(e).toBeInstanceOf(EngineError);
      }
      // The exact wire the adapter sent, whatever the reply.
      const got = server.last();
      const want = reqFixture[f.engine];
      expect(got.method).toBe("POST");
      expect(got.path).toBe(want.path);
      expect(got.body).toEqual(want.body);
      for (const [k, v] of Object.entries(reqFixture.headers)) expect(got.headers[k]).toBe(v);
    });
  }
});

describe("error classes carry the right fields", () => {
  test("context overflow keeps the engine message, status 400, not retryable", async () => {
    server.setReply(fixtures.find((f) => f.name === "vllm-error-context-overflow")!.reply);
    const e = (await caught(client("vllm").generate(request()))) as errors.ContextOverflowError;
    expect(e.code).toBe("context_overflow");
    expect(e.retryable).toBe(false);
    expect(e.status).toBe(400);
    expect(e.message).toContain("This model's maximum context length is 8192 tokens.");
  });

  test("unavailable (503 FastAPI detail) is retryable and names the detail", async () => {
    server.setReply(fixtures.find((f) => f.name === "sglang-error-503-detail")!.reply);
    const e = (await caught(client("sglang").generate(request()))) as errors.EngineUnavailableError;
    expect(e.retryable).toBe(true);
    expect(e.message).toBe(`engine at ${server.url}/generate answered HTTP 503: The server is not ready to serve requests.`);
  });
});

describe("transport failures", () => {
  test("connection refused → EngineUnavailableError (both engines)", async () => {
    const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
    const url = `http://127.0.0.1:${s.port}`;
    await s.stop(true);
    for (const engine of ["vllm", "sglang"] as const) {
      const e = await caught(client(engine, url).generate(request()));
      expect(e).toBeInstanceOf(errors.EngineUnavailableError);
      expect((e as Error).message).toStartWith(`engine at ${url}/`);
    }
  });

  test("per-request deadline → EngineUnavailableError; the caller's abort → EngineAbortedError", async () => {
    server.setHang();
    const slow = await caught(client("vllm", server.url, 100).generate(request()));
    expect(slow).toBeInstanceOf(errors.EngineUnavailableError);
    expect((slow as Error).message).toBe(`engine at ${server.url}/v1/completions did not answer within 100 ms`);
    const ac = new AbortController();
    const pending = client("sglang").generate(request({ signal: ac.signal }));
    setTimeout(() => ac.abort(), 20);
    expect(await caught(pending)).toBeInstanceOf(errors.EngineAbortedError);
  });
});

describe("request translation", () => {
  const ok = fixtures.find((f) => f.name === "vllm-completion-token-ids")!;
  const sgOk = fixtures.find((f) => f.name === "sglang-generate-stop")!;

  test("top_k: −1/0 = disabled → vLLM 0, SGLang −1; positive passes through", async () => {
    for (const [topK, v, s] of [[-1, 0, -1], [0, 0, -1], [40, 40, 40]] as const) {
      const sp = SamplingParams.parse({ top_k: topK });
      server.setReply(ok.reply);
      await new VllmClient({ url: server.url }).generate(request({ sampling_params: sp }));
      expect((server.last().body as { top_k: number }).top_k).toBe(v);
      server.setReply(sgOk.reply);
      await new SglangClient({ url: server.url }).generate(request({ sampling_params: sp }));
      expect((server.last().body as { sampling_params: { top_k: number } }).sampling_params.top_k).toBe(s);
    }
  });

  test("without model/seed/stop ids those fields are omitted; logprobs:false drops log_probs from the output", async () => {
    server.setReply(ok.reply);
    const out = await new VllmClient({ url: server.url }).generate(request({ sampling_params: SamplingParams.parse({ logprobs: false }) }));
    expect(out).toEqual({ token_ids: [12095, 13, 151645], finish_reason: "stop", stop_reason: 151645, num_preempted: -1, cached_tokens: 12, extra_fields: {} });
    const body = server.last().body as Record<string, unknown>;
    expect("model" in body || "seed" in body || "stop_token_ids" in body).toBe(false);
    expect(body.logprobs).toBe(0);
  });

  test("stop strings: vLLM `stop` (generate: with detokenize on, which vLLM requires), SGLang `sampling_params.stop`; a string stop_reason is kept", async () => {
    const sp = SamplingParams.parse({ ...reqFixture.input.sampling_params, stop: ["\nObservation:", "END"] });
    const stop = ["\nObservation:", "END"];
    const matched = structuredClone(ok.reply);
    Object.assign((matched.body as { choices: Record<string, unknown>[] }).choices[0]!, { stop_reason: "END" });
    server.setReply(matched);
    const out = await client("vllm").generate(request({ sampling_params: sp }));
    expect([out.token_ids, out.finish_reason, out.stop_reason]).toEqual([[12095, 13, 151645], "stop", "END"]);
    expect(server.last().body).toEqual({ ...reqFixture.vllm.body, stop });

    server.setReply(fixtures.find((f) => f.name === "vllm-generate-tokens")!.reply);
    await client("vllm-generate").generate(request({ sampling_params: sp }));
    const gen = reqFixture["vllm-generate"].body as { sampling_params: Record<string, unknown> };
    expect(server.last().body).toEqual({ ...gen, sampling_params: { ...gen.sampling_params, stop, detokenize: true } });

    const sgMatched = structuredClone(sgOk.reply);
    (sgMatched.body as { meta_info: Record<string, unknown> }).meta_info.finish_reason = { type: "stop", matched: "END" };
    server.setReply(sgMatched);
    expect((await client("sglang").generate(request({ sampling_params: sp }))).stop_reason).toBe("END");
    const sg = reqFixture.sglang.body as { sampling_params: Record<string, unknown> };
    expect(server.last().body).toEqual({ ...sg, sampling_params: { ...sg.sampling_params, stop } });

    // An empty list sends nothing, as absent.
    server.setReply(ok.reply);
    await client("vllm").generate(request({ sampling_params: SamplingParams.parse({ ...reqFixture.input.sampling_params, stop: [] }) }));
    expect(server.last().body).toEqual(reqFixture.vllm.body);
    expect(SamplingParams.safeParse({ stop: ["a", ""] }).error?.issues[0]).toMatchObject({ path: ["stop", 1], message: "a stop string must not be empty" });
  });

  test("the routing key and request id headers follow the request", async () => {
    server.setReply(sgOk.reply);
    await new SglangClient({ url: server.url }).generate(request({ request_id: "r-2", routing_key: "traj-7" }));
    const h = server.last().headers;
    expect([h["x-session-id"], h["x-smg-routing-key"], h["x-request-id"]]).toEqual(["traj-7", "traj-7", "r-2"]);
    expect((server.last().body as { rid: string }).rid).toBe("r-2");
  });

  test("maxModelLen reads /v1/models", async () => {
    server.setReply({ status: 200, body: { object: "list", data: [{ id: "Qwen/Qwen3-8B", object: "model", max_model_len: 32768 }] } });
    expect(await new VllmClient({ url: server.url }).maxModelLen()).toBe(32768);
    expect(server.last().path).toBe("/v1/models");
    expect(server.last().method).toBe("GET");
  });

  test("createEngineClient validates its options", () => {
    expect(() => createEngineClient({ url: "nope", format: "vllm" })).toThrow(ConfigError);
    expect(() => createEngineClient({ url: "http://x", format: "trt" as never })).toThrow("config engine.format");
    expect(createEngineClient({ url: "http://x", format: "sglang" })).toBeInstanceOf(SglangClient);
  });

  test("an injected fetch is used (runtime-neutral)", async () => {
    const seen: string[] = [];
    const c = createEngineClient({
      url: "http://engine.invalid",
      format: "sglang",
      fetch: async (input) => {
        seen.push(String(input));
        return Response.json(sgOk.reply.body);
      },
    });
    expect((await c.generate(request())).token_ids).toEqual([12095, 13, 151645]);
    expect(seen).toEqual(["http://engine.invalid/generate"]);
  });
});
