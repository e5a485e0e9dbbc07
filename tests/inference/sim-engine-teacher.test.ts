import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createTeacherClient } from "../../shared/inference/teacher-client.ts";
import { checkTeacherTokenizer, TOKENIZER_PROBE } from "../../shared/rollout/teacher-scoring.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { simPromptLogProbs } from "../../infra/sim-engine/prompt-logprobs.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";

// The simulated engine as a teacher, over real loopback HTTP: its scoring wire forms, their offsets, its tokenize endpoints.
let tok: ChatTokenizer;
let sim: RunningSimEngine;
let ids: number[];
const post = async (path: string, body: unknown) => {
  const r = await fetch(`${sim.urls[0]}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
};

beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({ tokenizer: tok, scoreSeed: 5 });
  ids = tok.encode("What is 2+2? The answer is 4.");
});
afterAll(() => sim.stop());

describe("simulated teacher: scoring wire forms", () => {
  test("prompt log-probs are deterministic, null at position 0, seeded apart from the policy's and per scoreSeed", () => {
    const engine = sim.replicas[0]!.engine;
    const lp = simPromptLogProbs(engine, ids);
    expect(ids).toEqual([3838, 374, 220, 17, 10, 17, 30, 576, 4226, 374, 220, 19, 13]);
    expect(lp.slice(0, 5)).toEqual([null, -2.9628, -0.0203, -2.3502, -0.0872]);
    expect(simPromptLogProbs(new SimEngine({ tokenizer: tok, scoreSeed: 5 }), ids)).toEqual(lp);
    const other = simPromptLogProbs(new SimEngine({ tokenizer: tok, scoreSeed: 6 }), ids);
    expect(other.slice(1).every((v, i) => v !== lp[i + 1])).toBe(true);
    // Position j depends on ids[0..j] only: a longer stream keeps the earlier scores.
    expect(simPromptLogProbs(engine, [...ids, 42]).slice(0, ids.length)).toEqual(lp);
    expect(engine.logProbs(ids.slice(0, 3), 3)).not.toEqual(lp.slice(3, 6));
  });

  test("vLLM /v1/completions prompt_logprobs: entry 0 null, entry j keyed by ids[j] (a JSON string) with its log-prob", async () => {
    const lp = simPromptLogProbs(sim.replicas[0]!.engine, ids);
    const r = await post("/v1/completions", { prompt: ids, max_tokens: 1, prompt_logprobs: 1, temperature: 1 });
    expect(r.status).toBe(200);
    const list = (r.body.choices as { prompt_logprobs: unknown[] }[])[0]!.prompt_logprobs;
    expect(list).toHaveLength(ids.length);
    expect(list[0]).toBeNull();
    expect(list[1]).toEqual({ "374": { logprob: -2.9628, rank: 1, decoded_token: " is" } });
    for (let j = 1; j < ids.length; j++) expect(list[j]).toEqual({ [String(ids[j])]: { logprob: lp[j]!, rank: 1, decoded_token: tok.decode([ids[j]!]) } });
    // Without prompt_logprobs the field stays null (unchanged replies).
    const plain = await post("/v1/completions", { prompt: ids, max_tokens: 1 });
    expect((plain.body.choices as { prompt_logprobs: unknown }[])[0]!.prompt_logprobs).toBeNull();
  });

  test("vLLM /inference/v1/generate: top-level prompt_logprobs", async () => {
    const r = await post("/inference/v1/generate", { token_ids: ids, sampling_params: { max_tokens: 1, prompt_logprobs: 1, detokenize: false } });
    expect(r.status).toBe(200);
    const list = r.body.prompt_logprobs as unknown[];
    expect(list[0]).toBeNull();
    expect(list[2]).toEqual({ "220": { logprob: -0.0203, rank: 1, decoded_token: " " } });
  });

  test("SGLang /generate max_new_tokens 0, logprob_start_len 3: entries for positions 3…n−1, the first null; no output", async () => {
    const lp = simPromptLogProbs(sim.replicas[0]!.engine, ids);
    const r = await post("/generate", { input_ids: ids, sampling_params: { max_new_tokens: 0 }, return_logprob: true, logprob_start_len: 3 });
    expect(r.status).toBe(200);
    expect(r.body.output_ids).toEqual([]);
    const meta = r.body.meta_info as Record<string, unknown>;
    expect(meta.finish_reason).toEqual({ type: "length", length: 0 });
    expect(meta.input_token_logprobs).toEqual(ids.slice(3).map((id, k) => [k === 0 ? null : lp[3 + k]!, id, null]));
    expect((meta.input_token_logprobs as unknown[][])[1]).toEqual([-0.0872, 10, null]);
    // logprob_start_len −1 (the default): no input_token_logprobs (generation replies unchanged).
    const gen = await post("/generate", { input_ids: ids, sampling_params: { max_new_tokens: 4 }, return_logprob: true });
    expect("input_token_logprobs" in (gen.body.meta_info as object)).toBe(false);
  });

  for (const format of ["vllm", "vllm-generate", "sglang"] as const) {
    test(`the teacher client scores through the ${format} form: the same values at the same positions`, async () => {
      const lp = simPromptLogProbs(sim.replicas[0]!.engine, ids);
      const client = createTeacherClient({ url: sim.urls[0]!, format, retry: { retries: 0 } });
      expect(await client.score({ request_id: "r", routing_key: "k", prompt_ids: ids.slice(0, 4), response_ids: ids.slice(4) })).toEqual(lp.slice(4) as number[]);
    });
  }

  test("tokenize endpoints (vLLM /tokenize, SGLang /v1/tokenize) give the policy tokenizer's ids: the start-up check passes", async () => {
    for (const format of ["vllm", "sglang"] as const) {
      const client = createTeacherClient({ url: sim.urls[0]!, format, retry: { retries: 0 } });
      expect(await client.tokenize(TOKENIZER_PROBE)).toEqual(tok.encode(TOKENIZER_PROBE));
      expect(await checkTeacherTokenizer(client, tok.encode(TOKENIZER_PROBE))).toBeNull();
    }
  });
});
