import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { BadEngineResponseError, ContextOverflowError } from "../../shared/errors.ts";
import { SglangClient } from "../../shared/inference/sglang-client.ts";
import type { GenerateRequest } from "../../shared/inference/types.ts";
import { VllmClient } from "../../shared/inference/vllm-client.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";

/**
 * The streaming wire itself: what the simulated engine sends and refuses
 * with `stream: true` (as vLLM and SGLang do, docs/engines.md §6), and how
 * the adapters treat errors inside a stream, malformed events and the cap.
 */

const TEXT = "A short answer about streams.";
let tok: ChatTokenizer;
let sim: RunningSimEngine;
let simInc: RunningSimEngine;
let prompt: number[];
const servers: { stop: (force?: boolean) => unknown }[] = [];

beforeAll(async () => {
  tok = await defaultTokenizer();
  prompt = tok.renderIds([{ role: "user", content: "hi" }] as never, { addGenerationPrompt: true });
  const script = { seed: 2, rules: [], default: [TEXT] };
  sim = await startSimEngine({ tokenizer: tok, script, latency: { decode_ms_per_token: 5 } });
  simInc = await startSimEngine({ tokenizer: tok, script, latency: { decode_ms_per_token: 5 }, wire: { sglangIncrementalStreaming: true } });
});
afterAll(async () => {
  await sim?.stop();
  await simInc?.stop();
  for (const s of servers) s.stop(true);
});

const post = (url: string, body: unknown) => fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });

/** The `data:` payloads of an event stream, `[DONE]` included. */
async function events(res: Response): Promise<unknown[]> {
  const text = await res.text();
  return text
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice(6))
    .map((d) => (d === "[DONE]" ? d : JSON.parse(d)));
}

function request(over: Partial<GenerateRequest> = {}): GenerateRequest {
  return { request_id: crypto.randomUUID(), routing_key: "k", prompt_ids: prompt, sampling_params: SamplingParams.parse({}), max_tokens: 100, on_tokens: () => {}, ...over };
}

const expected = () => tok.encode(TEXT).concat([151645]);

describe("the simulated engine's streams", () => {
  test("vLLM /v1/completions: delta events, prompt ids on the first only, the finish reason last, usage when asked, then [DONE]", async () => {
    const res = await post(`${sim.urls[0]}/v1/completions`, { prompt, max_tokens: 100, logprobs: 0, return_token_ids: true, stream: true, stream_options: { include_usage: true } });
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toStartWith("text/event-stream");
    const evs = await events(res);
    expect(evs.at(-1)).toBe("[DONE]");
    const chunks = evs.slice(0, -2) as { choices: { token_ids: number[]; prompt_token_ids: number[] | null; finish_reason: string | null; logprobs: { token_logprobs: number[] } }[] }[];
    expect(chunks.flatMap((c) => c.choices[0]!.token_ids)).toEqual(expected());
    expect(chunks[0]!.choices[0]!.prompt_token_ids).toEqual(prompt);
    expect(chunks.slice(1).every((c) => c.choices[0]!.prompt_token_ids === null)).toBe(true);
    expect(chunks.slice(0, -1).every((c) => c.choices[0]!.finish_reason === null)).toBe(true);
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("stop");
    for (const c of chunks) expect(c.choices[0]!.logprobs.token_logprobs.length).toBe(c.choices[0]!.token_ids.length);
    const usage = evs.at(-2) as { choices: unknown[]; usage: { completion_tokens: number } };
    expect(usage.choices).toEqual([]);
    expect(usage.usage.completion_tokens).toBe(expected().length);
  });

  test("vLLM /inference/v1/generate: delta events, the finish reason on the last tokens' event, no usage unless asked", async () => {
    const res = await post(`${sim.urls[0]}/inference/v1/generate`, { token_ids: prompt, sampling_params: { max_tokens: 100, logprobs: 0 }, stream: true });
    const evs = await events(res);
    expect(evs.at(-1)).toBe("[DONE]");
    const chunks = evs.slice(0, -1) as { choices: { token_ids: number[]; finish_reason: string | null }[] }[];
    expect(chunks.length).toBeGreaterThan(1);
    expect(chunks.flatMap((c) => c.choices[0]!.token_ids)).toEqual(expected());
    expect(chunks.every((c) => c.choices[0]!.token_ids.length > 0)).toBe(true);
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe("stop");
  });

  test("SGLang /generate: cumulative events by default (output_ids = completion_tokens), new tokens only with --incremental-streaming-output", async () => {
    const body = { input_ids: prompt, sampling_params: { max_new_tokens: 100 }, return_logprob: true, stream: true };
    const cum = (await events(await post(`${sim.urls[0]}/generate`, body))).slice(0, -1) as { output_ids: number[]; meta_info: { completion_tokens: number; output_token_logprobs: unknown[]; finish_reason: unknown } }[];
    expect(cum.length).toBeGreaterThan(1);
    for (const e of cum) {
      expect(e.output_ids.length).toBe(e.meta_info.completion_tokens);
      expect(e.meta_info.output_token_logprobs.length).toBe(e.output_ids.length);
    }
    expect(cum.at(-1)!.output_ids).toEqual(expected());
    expect(cum.slice(0, -1).every((e) => e.meta_info.finish_reason === null)).toBe(true);
    expect(cum.at(-1)!.meta_info.finish_reason).toEqual({ type: "stop", matched: 151645 });
    const inc = (await events(await post(`${simInc.urls[0]}/generate`, body))).slice(0, -1) as { output_ids: number[]; meta_info: { completion_tokens: number } }[];
    let sum = 0;
    for (const e of inc) {
      sum += e.output_ids.length;
      expect(e.meta_info.completion_tokens).toBe(sum);
    }
    expect(inc.flatMap((e) => e.output_ids)).toEqual(expected());
  });

  test("refuses what vLLM refuses: stream_options without stream, prompt_logprobs with stream", async () => {
    const a = await post(`${sim.urls[0]}/v1/completions`, { prompt, max_tokens: 5, stream: false, stream_options: { include_usage: true } });
    expect(a.status).toBe(400);
    expect(((await a.json()) as { error: { message: string } }).error.message).toBe("stream_options: Stream options can only be defined when `stream=True`.");
    const b = await post(`${sim.urls[0]}/v1/completions`, { prompt, max_tokens: 5, stream: true, prompt_logprobs: 1 });
    expect(b.status).toBe(400);
    expect(((await b.json()) as { error: { message: string } }).error.message).toBe("prompt_logprobs: `prompt_logprobs` are not available when `stream=True`.");
    const c = await post(`${sim.urls[0]}/v1/completions`, { prompt, max_tokens: 5, stream: "yes" });
    expect(c.status).toBe(400);
  });

  test("a context overflow: vLLM answers a 400 before the stream, SGLang an error event inside a 200 stream; both adapters throw ContextOverflowError", async () => {
    const v = await post(`${sim.urls[0]}/v1/completions`, { prompt, max_tokens: 50_000, stream: true });
    expect(v.status).toBe(400);
    const s = await post(`${sim.urls[0]}/generate`, { input_ids: prompt, sampling_params: { max_new_tokens: 50_000 }, stream: true });
    expect(s.status).toBe(200);
    const evs = await events(s);
    expect(evs.length).toBe(2);
    expect((evs[0] as { error: { message: string } }).error.message).toStartWith("Requested token count exceeds the model's maximum context length");
    expect(evs[1]).toBe("[DONE]");
    for (const client of [new VllmClient({ url: sim.urls[0]! }), new VllmClient({ url: sim.urls[0]!, endpoint: "generate" }), new SglangClient({ url: sim.urls[0]! })]) {
      const got: number[] = [];
      const err = await client.generate(request({ max_tokens: 50_000, on_tokens: (ids) => void got.push(...ids) })).catch((e) => e);
      expect(err).toBeInstanceOf(ContextOverflowError);
      expect(got).toEqual([]);
    }
  });
});

/** A server that sends `body` as an event stream. */
function fakeStream(body: string): string {
  const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(body, { headers: { "content-type": "text/event-stream" } }) });
  servers.push(s);
  return `http://127.0.0.1:${s.port}`;
}

const sgEvent = (ids: number[], total: number, finish: unknown = null) =>
  `data: ${JSON.stringify({ output_ids: ids, meta_info: { id: "r", finish_reason: finish, completion_tokens: total, output_token_logprobs: ids.map((id) => [-0.5, id, null]) } })}\n\n`;

describe("malformed and oversized streams", () => {
  test("a malformed first event is a retryable BadEngineResponseError naming the field; no chunk goes out", async () => {
    const url = fakeStream(`data: ${JSON.stringify({ output_ids: "seven", meta_info: {} })}\n\ndata: [DONE]\n\n`);
    const got: number[] = [];
    const err = await new SglangClient({ url }).generate(request({ on_tokens: (ids) => void got.push(...ids) })).catch((e) => e);
    expect(err).toBeInstanceOf(BadEngineResponseError);
    expect(err.retryable).toBe(true);
    expect(err.message).toContain("output_ids");
    expect(got).toEqual([]);
  });

  test("an event that is not JSON names the data field", async () => {
    const url = fakeStream("data: {oops\n\n");
    const err = await new VllmClient({ url }).generate(request()).catch((e) => e);
    expect(err).toBeInstanceOf(BadEngineResponseError);
    expect(err.message).toContain("data field that is not JSON");
  });

  test("a malformed event after tokens ends the call as abort with the tokens before it", async () => {
    const url = fakeStream(sgEvent([11, 12], 2) + `data: ${JSON.stringify({ output_ids: [11, 12, 13], meta_info: { completion_tokens: 9 } })}\n\n` + "data: [DONE]\n\n");
    const got: number[] = [];
    const out = await new SglangClient({ url }).generate(request({ on_tokens: (ids) => void got.push(...ids) }));
    expect(out.finish_reason).toBe("abort");
    expect(out.token_ids).toEqual([11, 12]);
    expect(out.log_probs).toEqual([-0.5, -0.5]);
    expect(got).toEqual([11, 12]);
  });

  test("SGLang cumulative events must repeat the ids received", async () => {
    const url = fakeStream(sgEvent([11, 12], 2) + sgEvent([99, 12, 13], 3) + "data: [DONE]\n\n");
    const out = await new SglangClient({ url }).generate(request());
    expect(out.token_ids).toEqual([11, 12]);
    expect(out.finish_reason).toBe("abort");
  });

  test("the reply cap counts the stream's bytes: over it before a token throws reply_too_large, after tokens it resolves abort", async () => {
    const big = sgEvent([11], 1) + sgEvent([11, 12], 2) + `: ${"x".repeat(4096)}\n\n` + sgEvent([11, 12, 13], 3, { type: "stop", matched: 13 }) + "data: [DONE]\n\n";
    const url = fakeStream(big);
    const out = await new SglangClient({ url, maxReplyBytes: 2048 }).generate(request());
    expect(out.finish_reason).toBe("abort");
    expect(out.token_ids).toEqual([11, 12]);
    const whole = await new SglangClient({ url }).generate(request());
    expect(whole.token_ids).toEqual([11, 12, 13]);
    expect(whole.finish_reason).toBe("stop");
    const err = await new SglangClient({ url, maxReplyBytes: 16 }).generate(request()).catch((e) => e);
    expect(err).toBeInstanceOf(BadEngineResponseError);
    expect(err.code).toBe("reply_too_large");
  });

  test("vLLM's tokens endpoint: [DONE] with no finish reason after tokens is an abort (empty outputs are skipped)", async () => {
    const ev = (ids: number[]) => `data: ${JSON.stringify({ request_id: "r", choices: [{ index: 0, finish_reason: null, token_ids: ids, logprobs: { content: ids.map((id) => ({ token_id: id, logprob: -1 })) } }] })}\n\n`;
    const url = fakeStream(ev([5]) + ev([6]) + "data: [DONE]\n\n");
    const out = await new VllmClient({ url, endpoint: "generate" }).generate(request());
    expect(out.token_ids).toEqual([5, 6]);
    expect(out.finish_reason).toBe("abort");
  });
});

describe("SGLang scheduler aborts inside a stream", () => {
  test("an abort with status 503 before any token fails as the non-streaming 503 would (retryable); after tokens it is an abort", async () => {
    const { EngineUnavailableError } = await import("../../shared/errors.ts");
    const abort503 = { type: "abort", message: "scheduler overloaded", status_code: 503 };
    const none = fakeStream(sgEvent([], 0, abort503) + "data: [DONE]\n\n");
    const err = await new SglangClient({ url: none }).generate(request()).catch((e) => e);
    expect(err).toBeInstanceOf(EngineUnavailableError);
    expect(err.retryable).toBe(true);
    const some = fakeStream(sgEvent([11], 1) + sgEvent([11, 12], 2, abort503) + "data: [DONE]\n\n");
    const out = await new SglangClient({ url: some }).generate(request());
    expect(out.finish_reason).toBe("abort");
    expect(out.token_ids).toEqual([11, 12]);
  });
});

describe("vLLM error events inside a stream", () => {
  test("an error event before any token is mapped by its code (nested and the older flat body); after tokens the call is an abort", async () => {
    const { EngineUnavailableError } = await import("../../shared/errors.ts");
    const nested = fakeStream(`data: ${JSON.stringify({ error: { message: "engine dead", type: "InternalServerError", param: null, code: 500 } })}\n\ndata: [DONE]\n\n`);
    expect(await new VllmClient({ url: nested }).generate(request()).catch((e) => e)).toBeInstanceOf(EngineUnavailableError);
    const flat = fakeStream(`data: ${JSON.stringify({ object: "error", message: "This model's maximum context length is 10 tokens.", code: 400 })}\n\ndata: [DONE]\n\n`);
    expect(await new VllmClient({ url: flat }).generate(request()).catch((e) => e)).toBeInstanceOf(ContextOverflowError);
    const ev = `data: ${JSON.stringify({ id: "c", choices: [{ index: 0, text: "", finish_reason: null, token_ids: [5, 6], logprobs: { token_logprobs: [-1, -2], tokens: ["token_id:5", "token_id:6"] } }] })}\n\n`;
    const late = fakeStream(ev + `data: ${JSON.stringify({ error: { message: "boom", code: 500 } })}\n\ndata: [DONE]\n\n`);
    const out = await new VllmClient({ url: late }).generate(request());
    expect(out).toEqual({ token_ids: [5, 6], log_probs: [-1, -2], finish_reason: "abort", num_preempted: -1, extra_fields: {} });
  });
});
