import { describe, expect, test } from "bun:test";
import { REPLICA_HEADER, type Gateway } from "../../functions/gateway.ts";
import { SglangClient, VllmClient, type GenerateRequest, type InferenceClient } from "../../shared/inference/index.ts";
import { replyProblem } from "../../shared/inference/reply-check.ts";
import type { ReplicaStatus } from "../../shared/inference/replica-pool.ts";
import { SamplingParams, type TokenOutput } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { createSimEngineApp, SimEngine } from "../../infra/sim-engine/index.ts";
import { gatewayTestbed } from "../helpers/gateway-testbed.ts";

// A replica that answers 200 with JSON in the engine's outer shape but without what the request asked
// for (token ids, log-probs) is a bad_reply: judged against the request, by the engine clients' own rules.
const SCRIPT = { seed: 9, rules: [], default: ["Fine.", "Done. #### 4"] };
const sp = SamplingParams.parse({});

type Mode = "ok" | "text_only" | "no_logprobs";

/** Replies that match each endpoint's outer schema but carry no token ids. */
const TEXT_ONLY: Record<string, unknown> = {
  "/v1/completions": { choices: [{ text: "hi" }] },
  "/inference/v1/generate": { choices: [{ finish_reason: "stop" }] },
  "/generate": { text: "hi", meta_info: { finish_reason: { type: "stop" } } },
};

interface Replica {
  url: string;
  mode: Mode;
  calls: number;
  stop(): void;
}

/** A real loopback replica: the simulated engine, or one whose 200 replies lack ids or log-probs. */
function replica(tok: ChatTokenizer, mode: Mode): Replica {
  const app = createSimEngineApp(new SimEngine({ tokenizer: tok, script: SCRIPT, name: "bad" }));
  const r: Replica = { url: "", mode, calls: 0, stop: () => server.stop(true) };
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const path = new URL(req.url).pathname;
      if (path === "/health") return new Response(null, { status: 200 });
      r.calls++;
      if (r.mode === "text_only") return Response.json(TEXT_ONLY[path] ?? {});
      const res = await app.fetch(req);
      if (r.mode !== "no_logprobs") return res;
      const body = (await res.json()) as Record<string, any>;
      if (body.choices) for (const c of body.choices) c.logprobs = null;
      if (body.meta_info) delete body.meta_info.output_token_logprobs;
      return Response.json(body);
    },
  });
  r.url = `http://127.0.0.1:${server.port}`;
  return r;
}

const bed = gatewayTestbed({ script: SCRIPT, replicas: 1 });
const { cleanups, serveGateway } = bed;
function badReplica(mode: Mode): Replica {
  const r = replica(bed.tok, mode);
  cleanups.push(() => r.stop());
  return r;
}
const statusOf = (gw: Gateway, url: string): ReplicaStatus => gw.replicas().find((r) => r.url === url)!;
const USER_REQUEST = { model: "x", prompt: [1, 2, 3], max_tokens: 5, logprobs: 0, return_token_ids: true };

describe("replyProblem judges a reply against its request", () => {
  const ask = (path: string, reply: unknown, req: unknown) => replyProblem(path, "application/json", JSON.stringify(reply), JSON.stringify(req));
  test("vLLM /v1/completions", () => {
    expect(ask("/v1/completions", { choices: [{ text: "hi" }] }, USER_REQUEST)).toBe(
      "no token ids: choices[0].token_ids is missing and logprobs.tokens are not 'token_id:<id>' strings (needs vLLM ≥ 0.10.2 or return_tokens_as_token_ids)",
    );
    // Not asked for: a text reply is what the caller wanted.
    expect(ask("/v1/completions", { choices: [{ text: "hi" }] }, { prompt: "hi", max_tokens: 5 })).toBeNull();
    const ok = { index: 0, text: "", token_ids: [7, 8], finish_reason: "stop", logprobs: { token_logprobs: [-0.5, -0.25], tokens: ["token_id:7", "token_id:8"] } };
    expect(ask("/v1/completions", { choices: [ok] }, USER_REQUEST)).toBeNull();
    expect(ask("/v1/completions", { choices: [{ ...ok, logprobs: null }] }, USER_REQUEST)).toBe("log-probs were requested but the reply has none for 2 tokens");
    expect(ask("/v1/completions", { choices: [{ ...ok, logprobs: null }] }, { ...USER_REQUEST, logprobs: null })).toBeNull();
    expect(ask("/v1/completions", { choices: [ok, { ...ok, token_ids: undefined, logprobs: null }] }, { ...USER_REQUEST, n: 2 })).toStartWith("no token ids: choices[1].token_ids is missing");
    expect(ask("/v1/completions", { choices: [{ ...ok, finish_reason: null }] }, USER_REQUEST)).toBe('finish_reason null is not stop/length/abort');
  });
  test("vLLM /inference/v1/generate", () => {
    const req = { token_ids: [1, 2], sampling_params: { max_tokens: 4, logprobs: 0 } };
    expect(ask("/inference/v1/generate", { choices: [{ finish_reason: "stop" }] }, req)).toBe(
      "no token ids: choices[0].token_ids is missing and logprobs.content names no token ids (token_id or 'token_id:<id>')",
    );
    expect(ask("/inference/v1/generate", { choices: [{ token_ids: [5], finish_reason: "stop" }] }, req)).toBe("log-probs were requested but the reply has none for 1 tokens");
    expect(ask("/inference/v1/generate", { choices: [{ token_ids: [5], finish_reason: "stop" }] }, { ...req, sampling_params: { max_tokens: 4 } })).toBeNull();
  });
  test("SGLang /generate, single and batch", () => {
    const req = { input_ids: [1, 2], sampling_params: { max_new_tokens: 4 }, return_logprob: true };
    const ok = { output_ids: [5], meta_info: { finish_reason: { type: "length", length: 1 }, output_token_logprobs: [[-0.5, 5, null]] } };
    expect(ask("/generate", TEXT_ONLY["/generate"], req)).toBe("no token ids: neither output_ids nor ids in meta_info.output_token_logprobs");
    expect(ask("/generate", ok, req)).toBeNull();
    expect(ask("/generate", { ...ok, meta_info: { finish_reason: { type: "stop" } } }, req)).toBe("log-probs were requested but the reply has none for 1 tokens");
    expect(ask("/generate", [ok, TEXT_ONLY["/generate"]], { ...req, input_ids: [[1], [2]] })).toBe("no token ids: neither output_ids nor ids in meta_info.output_token_logprobs");
    expect(ask("/generate", TEXT_ONLY["/generate"], { text: "hi" })).toBeNull();
  });
});

describe("gateway over real loopback replicas", () => {
  test("the user's request against a text-only replica: 502 bad_reply; with a good replica too, retried there (200)", async () => {
    const a = badReplica("text_only");
    const alone = serveGateway([a.url], { ejectAfter: 5 });
    const res = await fetch(`${alone.url}/v1/completions`, { method: "POST", body: JSON.stringify(USER_REQUEST), headers: { "content-type": "application/json" } });
    expect(res.status).toBe(502);
    expect(await res.json()).toEqual({
      error: {
        code: "bad_reply",
        type: "BadGatewayError",
        message: `engine replica sent an unusable reply: ${a.url}: no token ids: choices[0].token_ids is missing and logprobs.tokens are not 'token_id:<id>' strings (needs vLLM ≥ 0.10.2 or return_tokens_as_token_ids)`,
      },
    });
    expect(statusOf(alone.gw, a.url).failures_by_kind.bad_reply).toBe(1);

    const { gw, url } = serveGateway([a.url, bed.sim.urls[0]!], { ejectAfter: 5 });
    const ok = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify(USER_REQUEST), headers: { "x-session-id": "k" } });
    expect(ok.status).toBe(200);
    expect(ok.headers.get(REPLICA_HEADER)).toBe(bed.sim.urls[0]!);
    const body = (await ok.json()) as { choices: { token_ids: number[]; logprobs: { token_logprobs: number[] } }[] };
    expect(body.choices[0]!.token_ids.length).toBe(body.choices[0]!.logprobs.token_logprobs.length);
    expect(statusOf(gw, a.url).failures_by_kind).toEqual({ timeout: 0, client_abort: 0, connect: 0, http_5xx: 0, bad_reply: 1 });
    // A text request (no ids asked for) is served by the same replica as it is.
    const text = await fetch(`${alone.url}/v1/completions`, { method: "POST", body: JSON.stringify({ model: "x", prompt: "hi", max_tokens: 5 }) });
    expect(text.status).toBe(200);
    expect(await text.json()).toEqual({ choices: [{ text: "hi" }] });
  });

  test("a half-open probe answered without token ids fails and keeps the replica ejected", async () => {
    let now = 5_000_000;
    const a = badReplica("ok");
    const { gw, url } = serveGateway([a.url, bed.sim.urls[0]!], { ejectAfter: 1, cooldownMs: 1_000, now: () => now });
    const call = async (key: string) => {
      const res = await fetch(`${url}/v1/completions`, { method: "POST", body: JSON.stringify(USER_REQUEST), headers: { "x-session-id": key } });
      expect(res.status).toBe(200);
      await res.arrayBuffer();
      return res.headers.get(REPLICA_HEADER);
    };
    a.mode = "text_only";
    expect(await call("p0")).toBe(bed.sim.urls[0]!);
    expect(statusOf(gw, a.url)).toMatchObject({ state: "ejected", probes: 0 });
    now += 1_000;
    expect(await call("p1")).toBe(bed.sim.urls[0]!);
    expect(statusOf(gw, a.url)).toMatchObject({ state: "ejected", probes: 1, probes_ok: 0, probes_failed: 1, failures_by_kind: { bad_reply: 2 } });
    a.mode = "ok";
    now += 1_000;
    expect(await call("p2")).toBe(a.url);
    expect(statusOf(gw, a.url)).toMatchObject({ state: "healthy", probes: 2, probes_ok: 1, probes_failed: 1 });
  });

  const clients: [string, (url: string) => InferenceClient][] = [
    ["vLLM completions", (url) => new VllmClient({ url, timeoutMs: 3_000 })],
    ["vLLM generate", (url) => new VllmClient({ url, timeoutMs: 3_000, endpoint: "generate" })],
    ["SGLang", (url) => new SglangClient({ url, timeoutMs: 3_000 })],
  ];
  for (const [name, make] of clients) {
    for (const mode of ["text_only", "no_logprobs"] as const) {
      test(`${name}, replica ${mode}: every call fails over, no trajectory fails, outputs are the good replica's`, async () => {
        const a = badReplica(mode);
        const { gw, url } = serveGateway([a.url, bed.sim.urls[0]!], { ejectAfter: 100, cooldownMs: 60_000, policy: "round_robin" });
        const client = make(url);
        const req = (i: number): GenerateRequest => ({
          request_id: `r${i}`,
          routing_key: `k${i}`,
          prompt_ids: bed.tok.encode(`<|im_start|>user\n[${i}] What is 2+2?<|im_end|>\n<|im_start|>assistant\n`),
          sampling_params: sp,
          max_tokens: 32,
        });
        const outs: TokenOutput[] = [];
        for (let i = 0; i < 6; i++) outs.push(await client.generate(req(i)));
        for (const o of outs) {
          expect(o.extra_fields.replica).toBe(bed.sim.urls[0]!);
          expect(o.log_probs!.length).toBe(o.token_ids.length);
        }
        expect(outs[0]!.token_ids).toEqual([...bed.tok.encode("Fine."), 151645]);
        const s = statusOf(gw, a.url);
        expect(s.failures_by_kind.bad_reply).toBe(a.calls);
        expect(a.calls).toBeGreaterThanOrEqual(3);
      });
    }
  }
});
