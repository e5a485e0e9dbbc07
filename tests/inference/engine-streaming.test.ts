import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { EngineUnavailableError } from "../../shared/errors.ts";
import { RetryingClient } from "../../shared/inference/retrying-client.ts";
import { SglangClient } from "../../shared/inference/sglang-client.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { VllmClient } from "../../shared/inference/vllm-client.ts";
import { SamplingParams, type TokenOutput } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine, type SimGenerateRequest } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { runAgentLoop } from "../../shared/agent-loop/index.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import { GatedClient, MemoryEngineGate } from "../../shared/inference/engine-control.ts";
import { DEFAULT_SESSION_LIMITS, SessionCallLimiter } from "../../shared/agent-loop/session-limits.ts";

/**
 * True streaming, the engine side (issue 30 item 3): every client's chunks
 * concatenate to its output, the output equals the non-streaming call's, the
 * first chunk comes while the call is still pending, a broken stream resolves
 * `abort` with exactly the tokens received, and no call is retried after a chunk.
 */

const TEXT = "The quick brown fox jumps over the lazy dog, then it naps in the afternoon sun.";
const SCRIPT = { seed: 3, rules: [], default: [TEXT] };

let tok: ChatTokenizer;
let prompt: number[];
let sim: RunningSimEngine;
let simInc: RunningSimEngine;

beforeAll(async () => {
  tok = await defaultTokenizer();
  prompt = tok.renderIds([{ role: "user", content: "tell me about the fox" }] as never, { addGenerationPrompt: true });
  sim = await startSimEngine({ tokenizer: tok, script: SCRIPT });
  simInc = await startSimEngine({ tokenizer: tok, script: SCRIPT, wire: { sglangIncrementalStreaming: true } });
});
afterAll(async () => {
  await sim?.stop();
  await simInc?.stop();
});

function request(over: Partial<GenerateRequest> = {}): GenerateRequest {
  return {
    request_id: crypto.randomUUID(),
    routing_key: "k_0_0",
    prompt_ids: prompt,
    sampling_params: SamplingParams.parse({}),
    max_tokens: 200,
    ...over,
  };
}

/** A sink that records every chunk. */
function recorder() {
  const chunks: { ids: number[]; lps: number[] | null }[] = [];
  return {
    chunks,
    on_tokens: (ids: number[], lps: number[] | null) => void chunks.push({ ids: [...ids], lps: lps ? [...lps] : null }),
    ids: () => chunks.flatMap((c) => c.ids),
    lps: () => (chunks.every((c) => c.lps) ? chunks.flatMap((c) => c.lps!) : null),
  };
}

type Make = { name: string; client: () => InferenceClient; engine: () => SimEngine };
const clients: Make[] = [
  { name: "vLLM /v1/completions", client: () => new VllmClient({ url: sim.urls[0]! }), engine: () => sim.replicas[0]!.engine },
  { name: "vLLM /inference/v1/generate", client: () => new VllmClient({ url: sim.urls[0]!, endpoint: "generate" }), engine: () => sim.replicas[0]!.engine },
  { name: "SGLang /generate (cumulative events)", client: () => new SglangClient({ url: sim.urls[0]! }), engine: () => sim.replicas[0]!.engine },
  { name: "SGLang /generate (--incremental-streaming-output)", client: () => new SglangClient({ url: simInc.urls[0]! }), engine: () => simInc.replicas[0]!.engine },
  { name: "in-process SimEngineClient", client: () => new SimEngineClient(sim.replicas[0]!.engine), engine: () => sim.replicas[0]!.engine },
];

/** The engine's `generate`, wrapped so that `onFirst` runs at the engine's first streamed chunk. */
function onFirstEngineChunk(engine: SimEngine, onFirst: () => void): () => void {
  const orig = engine.generate.bind(engine);
  engine.generate = (req: SimGenerateRequest) => {
    const sink = req.on_tokens;
    let fired = false;
    return orig({
      ...req,
      ...(sink
        ? {
            on_tokens: (ids: number[], lps: number[], last: boolean) => {
              if (!fired && ids.length > 0) {
                fired = true;
                onFirst();
              }
              sink(ids, lps, last);
            },
          }
        : {}),
    });
  };
  return () => {
    engine.generate = orig;
  };
}

describe("streaming clients against the simulated engine", () => {
  for (const m of clients) {
    test(`${m.name}: the chunks concatenate to the output, which equals the non-streaming call's`, async () => {
      const engine = m.engine();
      for (const logprobs of [true, false]) {
        const sp = SamplingParams.parse({ logprobs });
        engine.cache.clear();
        const plain = await m.client().generate(request({ sampling_params: sp }));
        engine.cache.clear();
        const rec = recorder();
        const streamed = await m.client().generate(request({ sampling_params: sp, on_tokens: rec.on_tokens }));
        expect(streamed).toEqual(plain);
        expect(rec.ids()).toEqual(streamed.token_ids);
        expect(rec.chunks.every((c) => c.ids.length > 0)).toBe(true);
        if (logprobs) expect(rec.lps()).toEqual(streamed.log_probs!);
        else expect(rec.chunks.every((c) => c.lps === null)).toBe(true);
        expect(streamed.token_ids).toEqual(tok.encode(TEXT).concat([151645]));
      }
    });

    test(`${m.name}: the first chunk arrives while the call is pending (the engine frozen after it)`, async () => {
      const engine = m.engine();
      engine.latency.decode_ms_per_token = 10;
      // The engine freezes in place right after its first chunk: the call cannot end until resume.
      const restore = onFirstEngineChunk(engine, () => void engine.pause("in_place"));
      try {
        let settled = false;
        let firstChunk!: () => void;
        const gotFirst = new Promise<void>((r) => (firstChunk = r));
        const rec = recorder();
        const call = m.client().generate(request({ on_tokens: (ids, lps) => (rec.on_tokens(ids, lps), firstChunk()) }));
        void call.finally(() => (settled = true));
        await gotFirst;
        await engine.pause("in_place");
        expect(settled).toBe(false);
        const early = rec.ids().length;
        expect(early).toBeGreaterThan(0);
        engine.resume();
        const out = await call;
        expect(early).toBeLessThan(out.token_ids.length);
        expect(rec.ids()).toEqual(out.token_ids);
      } finally {
        restore();
        engine.resume();
        engine.latency.decode_ms_per_token = 0;
      }
    });

    test(`${m.name}: a pause (abort mode) mid-generation resolves abort with exactly the streamed tokens`, async () => {
      const engine = m.engine();
      engine.latency.decode_ms_per_token = 10;
      const restore = onFirstEngineChunk(engine, () => void engine.pause("abort"));
      try {
        const rec = recorder();
        const out = await m.client().generate(request({ on_tokens: rec.on_tokens }));
        expect(out.finish_reason).toBe("abort");
        expect(out.token_ids.length).toBeGreaterThan(0);
        expect(out.token_ids.length).toBeLessThan(tok.encode(TEXT).length);
        expect(out.token_ids).toEqual(rec.ids());
        expect(out.token_ids).toEqual(tok.encode(TEXT).slice(0, out.token_ids.length));
      } finally {
        restore();
        engine.resume();
        engine.latency.decode_ms_per_token = 0;
      }
    });

    test(`${m.name}: an engine abort mid-stream resolves abort with exactly the streamed tokens`, async () => {
      const engine = m.engine();
      engine.setFault({ kind: "abort_after", tokens: 5, times: 1 });
      try {
        const rec = recorder();
        const out = await m.client().generate(request({ on_tokens: rec.on_tokens }));
        expect(out.finish_reason).toBe("abort");
        expect(out.token_ids).toEqual(tok.encode(TEXT).slice(0, 5));
        expect(rec.ids()).toEqual(out.token_ids);
      } finally {
        engine.setFault(null);
      }
    });
  }

  test("the in-process engine: chunks concatenate to the output for random scripts, budgets and paces (property)", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.string({ minLength: 1, maxLength: 60 }),
        fc.integer({ min: 1, max: 40 }),
        fc.constantFrom(0, 0.3, 1),
        fc.boolean(),
        async (text, maxTokens, pace, logprobs) => {
          const engine = new SimEngine({ tokenizer: tok, script: { seed: 9, rules: [], default: [text] }, latency: { decode_ms_per_token: pace } });
          const rec = recorder();
          const sp = SamplingParams.parse({ logprobs });
          const out = await new SimEngineClient(engine).generate(request({ max_tokens: maxTokens, sampling_params: sp, on_tokens: rec.on_tokens }));
          const plain = await new SimEngineClient(new SimEngine({ tokenizer: tok, script: { seed: 9, rules: [], default: [text] } })).generate(request({ max_tokens: maxTokens, sampling_params: sp }));
          expect(rec.ids()).toEqual(out.token_ids);
          expect(out).toEqual(plain);
          if (logprobs) expect(rec.lps()).toEqual(out.log_probs!);
        },
      ),
      { numRuns: 40 },
    );
  });

  test("the in-process engine: a caller that gives up after a chunk gets exactly the streamed tokens as abort", async () => {
    const engine = new SimEngine({ tokenizer: tok, script: SCRIPT, latency: { decode_ms_per_token: 5 } });
    const ac = new AbortController();
    const rec = recorder();
    const out = await new SimEngineClient(engine).generate(
      request({
        signal: ac.signal,
        on_tokens: (ids, lps) => {
          rec.on_tokens(ids, lps);
          if (rec.ids().length >= 3) ac.abort();
        },
      }),
    );
    expect(out.finish_reason).toBe("abort");
    expect(out.token_ids.length).toBeGreaterThanOrEqual(3);
    expect(out.token_ids).toEqual(rec.ids());
    expect(out.token_ids).toEqual(tok.encode(TEXT).slice(0, out.token_ids.length));
  });
});

/**
 * A fetch that passes the first `events` SSE events of each stream through,
 * then errors the body (a connection reset mid-stream).
 */
function cuttingFetch(events: number): typeof fetch {
  return (async (input: Request | string | URL, init?: RequestInit) => {
    const res = await fetch(input, init);
    if (!res.body || !(res.headers.get("content-type") ?? "").startsWith("text/event-stream")) return res;
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    const enc = new TextEncoder();
    let buf = "";
    let seen = 0;
    const body = new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        for (;;) {
          const at = buf.indexOf("\n\n");
          if (at >= 0) {
            const ev = buf.slice(0, at + 2);
            buf = buf.slice(at + 2);
            if (seen++ >= events) {
              await reader.cancel();
              ctrl.error(new TypeError("connection reset by peer"));
              return;
            }
            ctrl.enqueue(enc.encode(ev));
            return;
          }
          const r = await reader.read();
          if (r.done) {
            ctrl.close();
            return;
          }
          buf += dec.decode(r.value, { stream: true });
        }
      },
    });
    return new Response(body, { status: res.status, headers: res.headers });
  }) as typeof fetch;
}

describe("a stream cut mid-way", () => {
  const http = [
    { name: "vLLM /v1/completions", make: (f: typeof fetch) => new VllmClient({ url: sim.urls[0]!, fetch: f }), engine: () => sim.replicas[0]!.engine },
    { name: "vLLM /inference/v1/generate", make: (f: typeof fetch) => new VllmClient({ url: sim.urls[0]!, endpoint: "generate", fetch: f }), engine: () => sim.replicas[0]!.engine },
    { name: "SGLang /generate", make: (f: typeof fetch) => new SglangClient({ url: sim.urls[0]!, fetch: f }), engine: () => sim.replicas[0]!.engine },
    { name: "SGLang /generate (incremental)", make: (f: typeof fetch) => new SglangClient({ url: simInc.urls[0]!, fetch: f }), engine: () => simInc.replicas[0]!.engine },
  ];
  for (const h of http) {
    test(`${h.name}: after 4 events resolves abort with exactly the tokens of those events; resuming from them completes the reply within the budget`, async () => {
      const engine = h.engine();
      engine.latency.decode_ms_per_token = 10;
      try {
        const rec = recorder();
        const out = await h.make(cuttingFetch(4)).generate(request({ on_tokens: rec.on_tokens }));
        expect(out.finish_reason).toBe("abort");
        expect(rec.chunks.length).toBe(4);
        expect(out.token_ids).toEqual(rec.ids());
        expect(out.token_ids).toEqual(tok.encode(TEXT).slice(0, out.token_ids.length));
        expect(out.log_probs).toEqual(rec.lps()!);
        // Resuming as the agent loop does (prompt ‖ received, max_tokens − received) completes the same reply.
        const rest = await h.make(fetch).generate(request({ prompt_ids: prompt.concat(out.token_ids), max_tokens: 200 - out.token_ids.length }));
        expect(out.token_ids.concat(rest.token_ids)).toEqual(tok.encode(TEXT).concat([151645]));
      } finally {
        engine.latency.decode_ms_per_token = 0;
      }
    });

    test(`${h.name}: a stream cut before any token throws a retryable EngineUnavailableError`, async () => {
      const rec = recorder();
      const err = await h.make(cuttingFetch(0)).generate(request({ on_tokens: rec.on_tokens })).catch((e) => e);
      expect(err).toBeInstanceOf(EngineUnavailableError);
      expect(err.retryable).toBe(true);
      expect(rec.chunks).toEqual([]);
    });
  }
});

describe("RetryingClient with a streaming call", () => {
  /** A client that streams `first` then throws a retryable error (a contract breaker), or throws at once. */
  class Flaky implements InferenceClient {
    calls = 0;
    constructor(private readonly first: number[] | null) {}
    async generate(req: GenerateRequest): Promise<TokenOutput> {
      this.calls++;
      if (this.first && this.calls === 1) {
        req.on_tokens?.(this.first, this.first.map(() => -0.5));
        throw new EngineUnavailableError("connection reset after a chunk");
      }
      if (this.calls === 1) throw new EngineUnavailableError("refused");
      return { token_ids: [7, 8], log_probs: [-1, -1], finish_reason: "stop", num_preempted: -1, extra_fields: {} };
    }
  }

  test("a failure after a chunk is not retried: the call resolves abort with the forwarded tokens", async () => {
    const inner = new Flaky([5, 6, 9]);
    const rec = recorder();
    const out = await new RetryingClient(inner, { retries: 3, minDelayMs: 1 }).generate(request({ on_tokens: rec.on_tokens }));
    expect(inner.calls).toBe(1);
    expect(out).toEqual({ token_ids: [5, 6, 9], log_probs: [-0.5, -0.5, -0.5], finish_reason: "abort", num_preempted: -1, extra_fields: {} });
    expect(rec.ids()).toEqual([5, 6, 9]);
  });

  test("a failure before any chunk is retried as without streaming", async () => {
    const inner = new Flaky(null);
    const rec = recorder();
    const out = await new RetryingClient(inner, { retries: 3, minDelayMs: 1 }).generate(request({ on_tokens: rec.on_tokens }));
    expect(inner.calls).toBe(2);
    expect(out.token_ids).toEqual([7, 8]);
  });

  test("over HTTP: a cut stream is not retried and a cut before any token is", async () => {
    sim.replicas[0]!.engine.latency.decode_ms_per_token = 10;
    try {
      let posts = 0;
      const counting = (f: typeof fetch) => ((i: Request | string | URL, init?: RequestInit) => (posts++, f(i, init))) as typeof fetch;
      const rec = recorder();
      const out = await new RetryingClient(new SglangClient({ url: sim.urls[0]!, fetch: counting(cuttingFetch(2)) }), { retries: 3, minDelayMs: 1 }).generate(request({ on_tokens: rec.on_tokens }));
      expect(posts).toBe(1);
      expect(out.finish_reason).toBe("abort");
      expect(out.token_ids).toEqual(rec.ids());
      posts = 0;
      const err = await new RetryingClient(new SglangClient({ url: sim.urls[0]!, fetch: counting(cuttingFetch(0)) }), { retries: 2, minDelayMs: 1 }).generate(request({ on_tokens: recorder().on_tokens })).catch((e) => e);
      expect(err).toBeInstanceOf(EngineUnavailableError);
      expect(posts).toBe(3);
    } finally {
      sim.replicas[0]!.engine.latency.decode_ms_per_token = 0;
    }
  });
});

describe("the agent loop over a stream cut mid-way", () => {
  test("the turn resumes from exactly the streamed tokens with the rest of its budget, and ends with the whole reply", async () => {
    const engine = sim.replicas[0]!.engine;
    engine.latency.decode_ms_per_token = 10;
    let posts = 0;
    const firstCut: typeof fetch = ((i: Request | string | URL, init?: RequestInit) => (++posts === 1 ? cuttingFetch(3) : fetch)(i, init)) as typeof fetch;
    const inner = new RetryingClient(new SglangClient({ url: sim.urls[0]!, fetch: firstCut }), { retries: 2, minDelayMs: 1 });
    // As a streaming caller (the gateway) would: every call carries a sink.
    const seen: { max_tokens: number; prompt: number; streamed: number[] }[] = [];
    const streaming: InferenceClient = {
      generate: (req) => {
        const rec = { max_tokens: req.max_tokens, prompt: req.prompt_ids.length, streamed: [] as number[] };
        seen.push(rec);
        return inner.generate({ ...req, on_tokens: (ids) => void rec.streamed.push(...ids) });
      },
    };
    try {
      const [o] = await runAgentLoop(defaultAgentLoopRegistry(), ctxOf(tok, streaming, config()), SP, {
        uid: "u",
        session_id: 0,
        prompt: [{ role: "user", content: "tell me about the fox" }],
        agent_name: "single_turn_agent",
      });
      const full = tok.encode(TEXT).concat([151645]);
      expect(posts).toBe(2);
      expect(seen.length).toBe(2);
      const k = seen[0]!.streamed.length;
      expect(k).toBeGreaterThan(0);
      expect(seen[0]!.streamed).toEqual(full.slice(0, k));
      expect(seen[1]!.prompt).toBe(seen[0]!.prompt + k);
      expect(seen[1]!.max_tokens).toBe(seen[0]!.max_tokens - k);
      expect(seen[0]!.streamed.concat(seen[1]!.streamed)).toEqual(full);
      expect(o!.response_ids).toEqual(full);
      expect(o!.metrics.num_preempted).toBeGreaterThanOrEqual(1);
    } finally {
      engine.latency.decode_ms_per_token = 0;
    }
  });
});

describe("through edgeloop's inference gateway", () => {
  test("each format streams through the gateway: the same chunks and output as direct", async () => {
    const gw = createGatewayApp({ replicas: [sim.urls[0]!], healthIntervalMs: 0, adminToken: "t" });
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: gw.fetch });
    const url = `http://127.0.0.1:${server.port}`;
    const engine = sim.replicas[0]!.engine;
    try {
      for (const make of [(u: string) => new VllmClient({ url: u }), (u: string) => new VllmClient({ url: u, endpoint: "generate" }), (u: string) => new SglangClient({ url: u })]) {
        engine.cache.clear();
        const direct = await make(sim.urls[0]!).generate(request());
        engine.cache.clear();
        const rec = recorder();
        const via = await make(url).generate(request({ on_tokens: rec.on_tokens }));
        expect(rec.ids()).toEqual(via.token_ids);
        const { extra_fields: _e, ...rest } = via;
        const { extra_fields: _d, ...restDirect } = direct;
        expect(rest).toEqual(restDirect);
      }
    } finally {
      server.stop(true);
    }
  });
});

describe("wrapper clients forward on_tokens", () => {
  test("GatedClient, SessionCallLimiter and RetryingClient around the SGLang client: the caller gets the engine's chunks", async () => {
    const engine = sim.replicas[0]!.engine;
    engine.latency.decode_ms_per_token = 5;
    try {
      const wrapped = new SessionCallLimiter(new GatedClient(new RetryingClient(new SglangClient({ url: sim.urls[0]! }), { retries: 1 }), new MemoryEngineGate(), { version: async () => 7 }), "k", DEFAULT_SESSION_LIMITS);
      const rec = recorder();
      const out = await wrapped.generate(request({ on_tokens: rec.on_tokens }));
      expect(rec.chunks.length).toBeGreaterThan(1);
      expect(rec.ids()).toEqual(out.token_ids);
      expect(rec.lps()).toEqual(out.log_probs!);
      expect(out.extra_fields.model_version).toBe(7);
    } finally {
      engine.latency.decode_ms_per_token = 0;
    }
  });
});
