import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ConfigError, ContextOverflowError, EngineAbortedError, EngineUnavailableError } from "../../shared/errors.ts";
import { createEngineClient } from "../../shared/inference/index.ts";
import type { GenerateRequest } from "../../shared/inference/types.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { DEFAULT_POLICY, parseSimScript, PrefixKvCache, SimEngine, SimEngineClient, type SimScriptInput } from "../../infra/sim-engine/index.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";

const EOS = 151645;
const SCRIPT: SimScriptInput = {
  seed: 1,
  rules: [
    {
      when: "capital of France",
      turns: ["Paris", { token_ids: [4272, 285, EOS] }, { text: "partial", finish_reason: "length" }],
    },
    { when: "use a tool", turns: ['<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'] },
  ],
  default: ["I cannot help with that."],
};

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const sp = SamplingParams.parse({});
function req(prompt_ids: number[], over: Partial<GenerateRequest> = {}): GenerateRequest {
  return { request_id: crypto.randomUUID(), routing_key: "k", prompt_ids, sampling_params: sp, max_tokens: 64, ...over };
}
function user(text: string): number[] {
  return tok.encode(`<|im_start|>user\n${text}<|im_end|>\n<|im_start|>assistant\n`);
}
/** Appends what the agent loop appends after an assistant turn: a tool/user message and the generation prompt. */
function next(prompt: number[], out: number[], text = "ok"): number[] {
  return [...prompt, ...out, ...tok.encode(`\n<|im_start|>user\n${text}<|im_end|>\n<|im_start|>assistant\n`)];
}

describe("script semantics", () => {
  test("text turns end with <|im_end|>; turn index = assistant turns already in the prompt; default past the last turn", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
    let p = user("What is the capital of France?");
    const t0 = await c.generate(req(p));
    expect(t0.token_ids).toEqual([59604, EOS]);
    expect(t0.finish_reason).toBe("stop");
    p = next(p, t0.token_ids);
    const t1 = await c.generate(req(p));
    expect(t1.token_ids).toEqual([4272, 285, EOS]);
    expect(t1.finish_reason).toBe("stop");
    p = next(p, t1.token_ids);
    const t2 = await c.generate(req(p));
    expect(t2.token_ids).toEqual(tok.encode("partial"));
    expect(t2.finish_reason).toBe("length");
    p = next(p, t2.token_ids);
    const t3 = await c.generate(req(p));
    expect(t3.token_ids).toEqual([40, 4157, 1492, 448, 429, 13, EOS]);
    expect(tok.decode(t3.token_ids)).toBe("I cannot help with that.<|im_end|>");
  });

  test("assistantTurns: the trailing generation prompt is not a turn; closed turns are", () => {
    const e = new SimEngine({ tokenizer: tok, script: SCRIPT });
    const p0 = user("hi");
    expect(e.assistantTurns(p0)).toEqual({ count: 0, open: [] });
    const closed = [...p0, 59604, EOS];
    expect(e.assistantTurns(closed)).toEqual({ count: 1, open: undefined });
    const p1 = next(p0, [59604, EOS]);
    expect(e.assistantTurns(p1)).toEqual({ count: 1, open: [] });
    // A turn cut by length (no <|im_end|>) is still closed by the next message.
    expect(e.assistantTurns(next(p0, [37420])).count).toBe(1);
    // Rendered by the chat template, with a system message and a thinking block in the generation prompt.
    const rendered = tok.renderIds(
      [
        { role: "system", content: "be brief" },
        { role: "user", content: "q1" },
        { role: "assistant", content: "a1" },
        { role: "user", content: "q2" },
      ] as never,
      { addGenerationPrompt: true, chatTemplateKwargs: { enable_thinking: false } },
    );
    const r = e.assistantTurns(rendered);
    expect(r.count).toBe(1);
    expect(tok.decode(r.open!)).toBe("<think>\n\n</think>\n\n");
    expect(e.assistantTurns(tok.encode("no chat markup at all"))).toEqual({ count: 0, open: undefined });
  });

  test("an open turn with partial tokens (resume after abort) continues the same scripted turn", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
    const p = user("please use a tool");
    const full = await c.generate(req(p));
    const resumed = await c.generate(req([...p, ...full.token_ids.slice(0, 3)]));
    expect(resumed.token_ids).toEqual(full.token_ids.slice(3));
  });

  test("special tokens in text turns are single ids; max_tokens cuts with length and no end token", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
    const out = await c.generate(req(user("please use a tool")));
    expect(out.token_ids[0]).toBe(151657);
    expect(out.token_ids.slice(-2)).toEqual([151658, EOS]);
    expect(tok.decode(out.token_ids)).toBe('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>');
    const cut = await c.generate(req(user("hello"), { max_tokens: 3 }));
    expect(cut).toEqual({ token_ids: [40, 4157, 1492], log_probs: cut.log_probs, finish_reason: "length", stop_reason: null, num_preempted: -1, cached_tokens: 0, extra_fields: {} });
    // Exactly enough room for the end token: still a stop.
    const fits = await c.generate(req(user("hello"), { max_tokens: 7 }));
    expect(fits.finish_reason).toBe("stop");
    expect(fits.token_ids.length).toBe(7);
  });

  test("stop_reason names the end token only when it was a requested stop id (vLLM semantics)", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
    const p = user("capital of France");
    expect((await c.generate(req(p))).stop_reason).toBe(null);
    const withStop = await c.generate(req(p, { sampling_params: SamplingParams.parse({ stop_token_ids: [EOS] }) }));
    expect(withStop.stop_reason).toBe(EOS);
    // A requested stop id inside the turn ends it early, kept in the output.
    const early = await c.generate(req(user("hello"), { sampling_params: SamplingParams.parse({ stop_token_ids: [1492] }) }));
    expect(early.token_ids).toEqual([40, 4157, 1492]);
    expect(early.stop_reason).toBe(1492);
  });

  test("token_ids turns without an end token default to length", async () => {
    const e = new SimEngine({ tokenizer: tok, script: { rules: [{ when: "x", turns: [{ token_ids: [1, 2, 3] }] }] } });
    const out = await new SimEngineClient(e).generate(req(user("x")));
    expect(out.token_ids).toEqual([1, 2, 3]);
    expect(out.finish_reason).toBe("length");
  });

  test("DEFAULT_POLICY answers every turn 'I cannot help with that.'", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok }));
    expect(DEFAULT_POLICY.default).toEqual(["I cannot help with that."]);
    const p = user("capital of France");
    const t0 = await c.generate(req(p));
    const t1 = await c.generate(req(next(p, t0.token_ids)));
    expect(t0.token_ids).toEqual([40, 4157, 1492, 448, 429, 13, EOS]);
    expect(t1.token_ids).toEqual(t0.token_ids);
  });
});

describe("determinism", () => {
  test("log-probs depend on (seed, prompt, position) only and lie in [−5, 0]", async () => {
    const a = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
    const b = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
    const other = new SimEngineClient(new SimEngine({ tokenizer: tok, script: { ...SCRIPT, seed: 2 } }));
    const p = user("hello there");
    const [x, y, z] = await Promise.all([a.generate(req(p)), b.generate(req(p)), other.generate(req(p))]);
    expect(x).toEqual(y);
    expect(z.token_ids).toEqual(x.token_ids);
    expect(z.log_probs).not.toEqual(x.log_probs);
    const w = await a.generate(req(user("hello there!")));
    expect(w.log_probs).not.toEqual(x.log_probs);
    for (const lp of [...x.log_probs!, ...z.log_probs!, ...w.log_probs!]) {
      expect(lp).toBeGreaterThanOrEqual(-5);
      expect(lp).toBeLessThanOrEqual(0);
      expect(Object.is(lp, -0)).toBe(false);
    }
  });
});

describe("lognormal lengths and decode pacing", () => {
  const LEN_SCRIPT: SimScriptInput = { ...SCRIPT, lengths: { median: 300, sigma: 0.8, min: 4, max: 2000 } };

  test("unscripted turns take the drawn length: the default text repeated, closed by <|im_end|>; rules are untouched", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, script: LEN_SCRIPT }));
    const body = tok.encode("I cannot help with that.");
    const p = user("hello there");
    const lens: number[] = [];
    for (const key of ["u1_0_0", "u1_1_0", "u2_0_0"]) {
      const out = await c.generate(req(p, { routing_key: key, max_tokens: 4000 }));
      const L = SimEngine.drawLength(parseSimScript(LEN_SCRIPT).lengths!, 1, key, 0);
      lens.push(L);
      expect(out.token_ids.length).toBe(L);
      expect(out.token_ids.at(-1)).toBe(EOS);
      expect(out.token_ids.slice(0, -1)).toEqual(Array.from({ length: L - 1 }, (_, i) => body[i % body.length]!));
      expect(out.finish_reason).toBe("stop");
    }
    expect(new Set(lens).size).toBe(3);
    // The next turn of the same session draws again (turn index 1); a rule's scripted turn keeps its text.
    const first = await c.generate(req(p, { routing_key: "u1_0_0", max_tokens: 4000 }));
    const second = await c.generate(req(next(p, first.token_ids), { routing_key: "u1_0_0", max_tokens: 4000 }));
    expect(second.token_ids.length).toBe(SimEngine.drawLength(parseSimScript(LEN_SCRIPT).lengths!, 1, "u1_0_0", 1));
    const paris = await c.generate(req(user("capital of France?"), { routing_key: "u1_0_0" }));
    expect(tok.decode(paris.token_ids)).toBe("Paris<|im_end|>");
  });

  test("a turn resumed after an abort continues to the same length; max_tokens still cuts", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, script: LEN_SCRIPT }));
    const p = user("hello there");
    const full = await c.generate(req(p, { routing_key: "r_3_0", max_tokens: 4000 }));
    const resumed = await c.generate(req([...p, ...full.token_ids.slice(0, 7)], { routing_key: "r_3_0", max_tokens: 4000 }));
    expect(resumed.token_ids).toEqual(full.token_ids.slice(7));
    const cut = await c.generate(req(p, { routing_key: "r_3_0", max_tokens: 5 }));
    expect([cut.token_ids, cut.finish_reason]).toEqual([full.token_ids.slice(0, 5), "length"]);
  });

  test("draws follow the lognormal: median and 90th percentile within 6 % over 20,000 keys, clamped to min..max", () => {
    const l = parseSimScript({ lengths: { median: 2000, sigma: 0.8, max: 16384 } }).lengths!;
    const xs = Array.from({ length: 20_000 }, (_, i) => SimEngine.drawLength(l, 0, `k${i}_0_0`, 0)).sort((a, b) => a - b);
    expect(Math.abs(xs[10_000]! / 2000 - 1)).toBeLessThan(0.06);
    // exp(1.2816 × 0.8) = 2.786: the 90th percentile of lognormal(ln 2000, 0.8).
    expect(Math.abs(xs[18_000]! / (2000 * Math.exp(1.2816 * 0.8)) - 1)).toBeLessThan(0.06);
    expect(xs[0]).toBeGreaterThanOrEqual(1);
    expect(xs.at(-1)).toBe(16384);
    expect(() => parseSimScript({ lengths: { median: 10, sigma: 1, max: 5 } })).toThrow(/script\.lengths\.median: needs min <= median <= max/);
  });

  test("decode latency below a millisecond per token is paced by the clock, not a timer per token", async () => {
    const e = new SimEngine({ tokenizer: tok, script: { ...LEN_SCRIPT, lengths: { median: 2000, sigma: 0, max: 2000 } }, latency: { decode_ms_per_token: 0.01 } });
    const t0 = performance.now();
    const out = await new SimEngineClient(e).generate(req(user("hello there"), { max_tokens: 4000 }));
    const ms = performance.now() - t0;
    expect(out.token_ids.length).toBe(2000);
    // 2,000 tokens × 0.01 ms = 20 ms; one timer per token would take ≥ 2,000 ms.
    expect(ms).toBeGreaterThanOrEqual(19);
    expect(ms).toBeLessThan(1000);
  });
});

describe("faults", () => {
  test("http_500 with times: 1 fails once, then answers", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, fault: { kind: "http_500", times: 1 } }));
    expect(c.generate(req(user("a")))).rejects.toBeInstanceOf(EngineUnavailableError);
    expect((await c.generate(req(user("a")))).finish_reason).toBe("stop");
  });

  test("rule faults: abort_after k returns k partial tokens; abort_after 0 is an EngineAbortedError; turn filter", async () => {
    const e = new SimEngine({
      tokenizer: tok,
      script: {
        rules: [
          { when: "abort two", turns: ["one two three four"], fault: { kind: "abort_after", tokens: 2 } },
          { when: "abort none", turns: ["x"], fault: { kind: "abort_after" } },
          { when: "second turn", turns: ["a", "b"], fault: { kind: "context_overflow", turn: 1 } },
        ],
      },
    });
    const c = new SimEngineClient(e);
    const partial = await c.generate(req(user("abort two")));
    expect(partial.token_ids).toEqual(tok.encode("one two"));
    expect(partial.finish_reason).toBe("abort");
    expect(c.generate(req(user("abort none")))).rejects.toBeInstanceOf(EngineAbortedError);
    const p = user("second turn");
    const t0 = await c.generate(req(p));
    expect(t0.token_ids).toEqual([64, EOS]);
    expect(c.generate(req(next(p, t0.token_ids)))).rejects.toBeInstanceOf(ContextOverflowError);
  });

  test("hang lasts until the caller gives up (or for ms, then answers)", async () => {
    const e = new SimEngine({ tokenizer: tok, fault: { kind: "hang" } });
    const ac = new AbortController();
    const pending = new SimEngineClient(e).generate(req(user("a"), { signal: ac.signal }));
    setTimeout(() => ac.abort(), 10);
    expect(pending).rejects.toBeInstanceOf(EngineAbortedError);
    await pending.catch(() => undefined);
    e.setFault({ kind: "hang", ms: 5 });
    expect((await new SimEngineClient(e).generate(req(user("a")))).token_ids.at(-1)).toBe(EOS);
  });

  test("max_model_len is enforced with the engine's context-overflow error", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, maxModelLen: 20 }));
    const p = user("hello");
    expect(p.length).toBe(9);
    expect((await c.generate(req(p, { max_tokens: 11 }))).token_ids.length).toBe(7);
    const e = await c.generate(req(p, { max_tokens: 12 })).catch((x) => x);
    expect(e).toBeInstanceOf(ContextOverflowError);
    expect(e.message).toBe(
      "engine at sim:sim failed: You passed 9 input tokens and requested 12 output tokens. However, the model's context length is only 20 tokens, resulting in a maximum input length of 8 tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=9)",
    );
  });

  test("bad scripts and faults are ConfigErrors naming the path", () => {
    expect(() => parseSimScript({ rules: [{ when: "x", turns: ["a", { txt: "b" }] }] })).toThrow(ConfigError);
    try {
      parseSimScript({ rules: [{ when: "x", turns: ["a", { text: "b", finish_reason: "done" }] }] });
    } catch (e) {
      expect((e as ConfigError).field).toBe("script.rules[0].turns[1]");
    }
    expect(() => parseSimScript("{not json", "policy.json")).toThrow("config policy.json: is not valid JSON");
    expect(() => parseSimScript({ default: [] })).toThrow("config script.default: needs at least one turn");
    expect(() => new SimEngine({ tokenizer: tok, fault: { kind: "explode" } as never })).toThrow("config fault.kind");
  });
});

describe("prefix KV cache", () => {
  test("cached_tokens counts full 16-token blocks of a previously seen prefix, never the last prompt token", async () => {
    const e = new SimEngine({ tokenizer: tok });
    const c = new SimEngineClient(e);
    const p = user("a question long enough to fill more than one block of sixteen tokens, surely");
    const t0 = await c.generate(req(p));
    expect(t0.cached_tokens).toBe(0);
    const p1 = next(p, t0.token_ids);
    const t1 = await c.generate(req(p1));
    expect(t1.cached_tokens).toBe(Math.floor((p.length + t0.token_ids.length) / 16) * 16);
    expect((await c.generate(req(p1))).cached_tokens).toBe(Math.floor((p1.length - 1) / 16) * 16);
    expect(e.stats.cached_tokens).toBe(t1.cached_tokens! + Math.floor((p1.length - 1) / 16) * 16);
  });

  test("LRU eviction over blocks; a prefix hit needs every earlier block", () => {
    const cache = new PrefixKvCache({ capacityBlocks: 2, blockSize: 4 });
    const a = [1, 2, 3, 4, 5, 6, 7, 8, 9];
    cache.insert(a);
    expect(cache.lookup(a)).toBe(8);
    expect(cache.lookup([1, 2, 3, 4, 9, 9, 9, 9, 9])).toBe(4);
    expect(cache.lookup([0, 2, 3, 4, 5, 6, 7, 8, 9])).toBe(0);
    cache.insert([7, 7, 7, 7, 7]);
    expect(cache.size).toBe(2);
    expect(cache.lookup(a)).toBe(4);
  });
});

describe("HTTP endpoints", () => {
  let sim: RunningSimEngine;
  beforeAll(async () => {
    sim = await startSimEngine({ replicas: 2, script: SCRIPT, tokenizer: tok, maxModelLen: 4096 });
  });
  afterAll(() => sim.stop());

  test("/health, /v1/models, /tokenize, /detokenize", async () => {
    const base = sim.urls[0];
    const h = await fetch(`${base}/health`);
    expect([h.status, await h.text()]).toEqual([200, ""]);
    const models = await (await fetch(`${base}/v1/models`)).json();
    expect(models.data[0].max_model_len).toBe(4096);
    const t = await fetch(`${base}/tokenize`, { method: "POST", body: JSON.stringify({ prompt: "Paris", return_token_strs: true }) });
    expect(await t.json()).toEqual({ count: 1, max_model_len: 4096, tokens: [59604], token_strs: ["Paris"] });
    const m = await fetch(`${base}/tokenize`, { method: "POST", body: JSON.stringify({ messages: [{ role: "user", content: "hi" }] }) });
    expect((await m.json()).tokens).toEqual(user("hi"));
    const d = await fetch(`${base}/detokenize`, { method: "POST", body: JSON.stringify({ tokens: [59604, EOS] }) });
    expect(await d.json()).toEqual({ prompt: "Paris<|im_end|>" });
    sim.replicas[0].engine.healthy = false;
    expect((await fetch(`${base}/health`)).status).toBe(503);
    sim.replicas[0].engine.healthy = true;
  });

  test("bad requests are 400s in each engine's error shape", async () => {
    const base = sim.urls[0];
    const v = await fetch(`${base}/v1/completions`, { method: "POST", body: JSON.stringify({ prompt: [], max_tokens: 4 }) });
    expect(v.status).toBe(400);
    expect((await v.json()).error).toMatchObject({ type: "BadRequestError", code: 400 });
    const s = await fetch(`${base}/generate`, { method: "POST", body: JSON.stringify({ sampling_params: { max_new_tokens: 4 } }) });
    expect([s.status, await s.json()]).toEqual([400, { error: { message: "Either text or input_ids should be provided (exactly one)." } }]);
    const k = await fetch(`${base}/generate`, { method: "POST", body: JSON.stringify({ input_ids: [1], sampling_params: { top_k: 0 } }) });
    // SGLang's own words (SamplingParams.verify), and msgspec's for a key SamplingParams does not have.
    expect((await k.json()).error.message).toBe("top_k must be -1 (disable) or at least 1, got 0.");
    const u = await fetch(`${base}/generate`, { method: "POST", body: JSON.stringify({ input_ids: [1], sampling_params: { max_new_tokens: 4, max_tokens: 4 } }) });
    expect([u.status, (await u.json()).error.message]).toEqual([400, "Unexpected keyword argument 'max_tokens'"]);
  });

  test("each replica has its own cache and can be killed and revived", async () => {
    const [r0, r1] = sim.replicas;
    const p = user("a question long enough to fill more than one block of sixteen tokens, surely");
    const body = JSON.stringify({ prompt: p, max_tokens: 8, return_token_ids: true });
    const post = (u: string) => fetch(`${u}/v1/completions`, { method: "POST", body }).then((r) => r.json());
    await post(r0.url);
    expect((await post(r0.url)).usage.prompt_tokens_details.cached_tokens).toBe(16);
    expect((await post(r1.url)).usage.prompt_tokens_details.cached_tokens).toBe(0);
    await r1.kill();
    expect(fetch(`${r1.url}/health`)).rejects.toThrow();
    r1.revive();
    expect((await fetch(`${r1.url}/health`)).status).toBe(200);
  });
});

describe("E4: the model's whole stop list ends a turn, as in a real engine", () => {
  const EOT = 151643;
  const stopScript: SimScriptInput = {
    rules: [
      { when: "end on endoftext", turns: [{ token_ids: [...[40, 4157, 1492], EOT] }, "Next."] },
      { when: "endoftext mid-turn", turns: ["Half<|endoftext|> and more"] },
    ],
  };

  test("a token_ids turn ending in 151643 finishes stop by default, 151643 kept; the next turn is indexed after it", async () => {
    const e = new SimEngine({ tokenizer: tok, script: stopScript });
    const c = new SimEngineClient(e);
    const p = user("end on endoftext");
    const out = await c.generate(req(p));
    expect([out.token_ids, out.finish_reason, out.stop_reason]).toEqual([[40, 4157, 1492, EOT], "stop", null]);
    // Requested as a stop id (as edgeloop's loops do), vLLM's stop_reason names it.
    const asked = await c.generate(req(p, { sampling_params: SamplingParams.parse({ stop_token_ids: [EOS, EOT] }) }));
    expect(asked.stop_reason).toBe(EOT);
    // The closed turn (…<|endoftext|><|im_end|>\n) counts as one assistant turn; the generation prompt is the open one.
    const p2 = [...p, ...out.token_ids, EOS, ...tok.encode("\n<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n")];
    expect(e.assistantTurns(p2)).toEqual({ count: 1, open: [] });
    expect((await c.generate(req(p2))).token_ids).toEqual([...tok.encode("Next."), EOS]);
  });

  test("generation stops at a 151643 inside a scripted turn; the SGLang wire reports it as matched", async () => {
    const sim = await startSimEngine({ tokenizer: tok, script: stopScript });
    try {
      const res = await fetch(`${sim.urls[0]}/generate`, { method: "POST", body: JSON.stringify({ input_ids: user("endoftext mid-turn"), sampling_params: { max_new_tokens: 32 } }) });
      const body = await res.json();
      expect(body.output_ids).toEqual([...tok.encode("Half"), EOT]);
      expect(body.meta_info.finish_reason).toEqual({ type: "stop", matched: EOT });
    } finally {
      await sim.stop();
    }
  });
});

describe("stop strings: the turn ends at the token that completes one, that token kept (vLLM keeps ids, trims only text)", () => {
  // DEFAULT_POLICY: "I" " cannot" " help" " with" " that" "." <|im_end|>
  const TURN = [40, 4157, 1492, 448, 429, 13, EOS];
  const stopReq = (prompt: number[], stop: string[], over: Partial<SamplingParams> = {}, max_tokens = 64) =>
    req(prompt, { sampling_params: SamplingParams.parse({ stop, ...over }), max_tokens });

  test("a stop string inside one token, across tokens, never matched; stop_reason is the string", async () => {
    const e = new SimEngine({ tokenizer: tok });
    const c = new SimEngineClient(e);
    const p = user("hello");
    const one = await c.generate(stopReq(p, ["help"]));
    expect([one.token_ids, one.finish_reason, one.stop_reason]).toEqual([[40, 4157, 1492], "stop", "help"]);
    expect(one.log_probs).toEqual(e.logProbs(p, 3));
    // " cannot he" is completed by " help".
    expect((await c.generate(stopReq(p, [" cannot he"]))).token_ids).toEqual([40, 4157, 1492]);
    const across = await c.generate(stopReq(p, ["with th"]));
    expect([across.token_ids, across.stop_reason]).toEqual([[40, 4157, 1492, 448, 429], "with th"]);
    const never = await c.generate(stopReq(p, ["Paris"]));
    expect([never.token_ids, never.finish_reason, never.stop_reason]).toEqual([TURN, "stop", null]);
    expect(e.requests.at(-1)!.stop).toEqual(["Paris"]);
  });

  test("the earliest completion wins; at the same token, the first string in request order", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok }));
    const p = user("hello");
    expect((await c.generate(stopReq(p, ["that", "cannot"]))).stop_reason).toBe("cannot");
    expect((await c.generate(stopReq(p, ["annot", "cannot"]))).stop_reason).toBe("annot");
    expect((await c.generate(stopReq(p, ["cannot", "annot"]))).stop_reason).toBe("cannot");
  });

  test("stop ids and stop strings: the earlier ends the turn; the stop token's own text is not matched", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok }));
    const p = user("hello");
    const byId = await c.generate(stopReq(p, ["that"], { stop_token_ids: [4157] }));
    expect([byId.token_ids, byId.stop_reason]).toEqual([[40, 4157], 4157]);
    const byString = await c.generate(stopReq(p, ["cannot"], { stop_token_ids: [429] }));
    expect([byString.token_ids, byString.stop_reason]).toEqual([[40, 4157], "cannot"]);
    // <|im_end|> ends the turn as a stop id before its text is matched (vLLM does not detokenize the stop token).
    const eos = await c.generate(stopReq(p, ["<|im_end|>"], { stop_token_ids: [EOS] }));
    expect([eos.token_ids, eos.stop_reason]).toEqual([TURN, EOS]);
  });

  test("max_tokens before the completing token: length, no stop_reason", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok }));
    const cut = await c.generate(stopReq(user("hello"), ["that"], {}, 3));
    expect([cut.token_ids, cut.finish_reason, cut.stop_reason]).toEqual([[40, 4157, 1492], "length", null]);
    // Exactly enough room for the completing token: a stop.
    const fits = await c.generate(stopReq(user("hello"), ["that"], {}, 5));
    expect([fits.token_ids, fits.finish_reason, fits.stop_reason]).toEqual([[40, 4157, 1492, 448, 429], "stop", "that"]);
  });

  test("only the text generated in this call is matched: a resumed turn's earlier tokens are prompt", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok }));
    const p = [...user("hello"), 40, 4157, 1492];
    const rest = await c.generate(stopReq(p, ["help"]));
    expect([rest.token_ids, rest.stop_reason]).toEqual([[448, 429, 13, EOS], null]);
    expect((await c.generate(stopReq(p, ["help with"]))).token_ids).toEqual([448, 429, 13, EOS]);
    expect((await c.generate(stopReq(p, ["at."]))).token_ids).toEqual([448, 429, 13]);
  });

  test("a special token's text in a scripted turn can complete a stop string (skip_special_tokens false)", async () => {
    const c = new SimEngineClient(new SimEngine({ tokenizer: tok, script: SCRIPT }));
    const out = await c.generate(stopReq(user("please use a tool"), ["<tool_call>"]));
    expect([out.token_ids, out.stop_reason]).toEqual([[151657], "<tool_call>"]);
  });
});

describe("stop strings over HTTP, in each engine's wire", () => {
  let sim: RunningSimEngine;
  beforeAll(async () => {
    sim = await startSimEngine({ tokenizer: tok });
  });
  afterAll(() => sim.stop());
  const post = async (path: string, body: unknown) => {
    const r = await fetch(`${sim.urls[0]}${path}`, { method: "POST", body: JSON.stringify(body) });
    return { status: r.status, body: (await r.json()) as Record<string, any> };
  };

  test("vLLM /v1/completions: token_ids keep the completing token, text is trimmed unless include_stop_str_in_output", async () => {
    const base = { prompt: user("hello"), max_tokens: 32, return_token_ids: true, skip_special_tokens: false };
    const r = await post("/v1/completions", { ...base, stop: ["help"] });
    expect(r.status).toBe(200);
    const ch = r.body.choices[0];
    expect([ch.token_ids, ch.text, ch.finish_reason, ch.stop_reason]).toEqual([[40, 4157, 1492], "I cannot ", "stop", "help"]);
    expect(r.body.usage.completion_tokens).toBe(3);
    const kept = (await post("/v1/completions", { ...base, stop: "help", include_stop_str_in_output: true })).body.choices[0];
    expect([kept.token_ids, kept.text, kept.stop_reason]).toEqual([[40, 4157, 1492], "I cannot help", "help"]);
    const empty = await post("/v1/completions", { ...base, stop: ["ok", ""] });
    expect([empty.status, empty.body.error.message]).toEqual([400, "stop: stop cannot contain an empty string."]);
  });

  test("vLLM /inference/v1/generate: stop needs detokenize (vLLM's own refusal otherwise)", async () => {
    const body = (sp: Record<string, unknown>) => ({ token_ids: user("hello"), sampling_params: { max_tokens: 32, ...sp } });
    const r = await post("/inference/v1/generate", body({ stop: ["help"], detokenize: true }));
    expect([r.status, r.body.choices[0].token_ids, r.body.choices[0].finish_reason]).toEqual([200, [40, 4157, 1492], "stop"]);
    const refused = await post("/inference/v1/generate", body({ stop: ["help"], detokenize: false }));
    expect([refused.status, refused.body.error.message]).toEqual([
      400,
      "sampling_params.detokenize: stop strings are only supported when detokenize is True. Set detokenize=True to use stop.",
    ]);
    expect((await post("/inference/v1/generate", body({ detokenize: false }))).body.choices[0].token_ids).toEqual(TURN_IDS);
  });

  test("SGLang /generate: matched is the string; text trimmed unless no_stop_trim", async () => {
    const body = (sp: Record<string, unknown>) => ({ input_ids: user("hello"), sampling_params: { max_new_tokens: 32, skip_special_tokens: false, ...sp } });
    const r = await post("/generate", body({ stop: "help" }));
    expect([r.body.output_ids, r.body.text, r.body.meta_info.finish_reason]).toEqual([[40, 4157, 1492], "I cannot ", { type: "stop", matched: "help" }]);
    const kept = await post("/generate", body({ stop: ["with th"], no_stop_trim: true }));
    expect([kept.body.output_ids, kept.body.text, kept.body.meta_info.finish_reason]).toEqual([
      [40, 4157, 1492, 448, 429],
      "I cannot help with that",
      { type: "stop", matched: "with th" },
    ]);
  });

  test("end to end: each adapter sends SamplingParams.stop and reads back the same tokens (and stop_reason where the wire has one)", async () => {
    const sp = SamplingParams.parse({ stop: ["with th"], stop_token_ids: [EOS] });
    for (const format of ["vllm", "vllm-generate", "sglang"] as const) {
      const c = createEngineClient({ url: sim.urls[0], format });
      const out = await c.generate(req(user("hello"), { sampling_params: sp }));
      // vLLM's GenerateResponseChoice has no stop_reason: that endpoint cannot say which stop ended the turn.
      const reason = format === "vllm-generate" ? undefined : "with th";
      expect([format, out.token_ids, out.finish_reason, out.stop_reason]).toEqual([format, [40, 4157, 1492, 448, 429], "stop", reason]);
      expect(sim.replicas[0].engine.requests.at(-1)!.stop).toEqual(["with th"]);
    }
  });
});

const TURN_IDS = [40, 4157, 1492, 448, 429, 13, EOS];
