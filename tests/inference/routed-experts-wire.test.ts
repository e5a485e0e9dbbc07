import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createGatewayApp } from "../../functions/gateway.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { BadEngineResponseError, ConfigError } from "../../shared/errors.ts";
import { hashInt } from "../../shared/inference/hash.ts";
import { createEngineClient, SglangClient } from "../../shared/inference/index.ts";
import { decodeSglangRoutedExperts } from "../../shared/inference/sglang-client.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { decodeInt32, encodeInt32 } from "../../shared/schema/typed-base64.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

const SCRIPT = { seed: 5, rules: [], default: ["Hello there."] };
const MOE = { layers: 3, top_k: 2, num_experts: 8 };
const SP = SamplingParams.parse({ temperature: 1, top_p: 1, top_k: -1, logprobs: true });

let tok: ChatTokenizer;
let sim: RunningSimEngine;
beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({ replicas: 1, script: SCRIPT, tokenizer: tok, moe: MOE });
});
afterAll(() => sim.stop());

/** The sim's documented routing, written out independently: slot k of layer l = (hash(seed, p, id, prev, l) + k) mod E. */
function reference(stream: number[], tokens: number, seed: number, m = MOE): number[] {
  const out: number[] = [];
  for (let p = 0; p < tokens; p++) {
    const h0 = hashInt(hashInt(hashInt(hashInt(0x9e3779b9, seed), p), stream[p]!), p > 0 ? stream[p - 1]! : 0xffffffff);
    for (let l = 0; l < m.layers; l++) {
      const base = hashInt(h0, l) % m.num_experts;
      for (let k = 0; k < m.top_k; k++) out.push((base + k) % m.num_experts);
    }
  }
  return out;
}

const PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198];

describe("sim engine: SGLang's routed-experts wire form", () => {
  test("POST /generate with return_routed_experts: meta_info.routed_experts = base64 int32 [P + C − 1, layers, top_k]; absent without the flag", async () => {
    const post = (extra: Record<string, unknown>) =>
      fetch(`${sim.urls[0]}/generate`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ input_ids: PROMPT, sampling_params: { max_new_tokens: 16 }, ...extra }),
      }).then((r) => r.json() as Promise<{ output_ids: number[]; meta_info: Record<string, unknown> }>);
    const plain = await post({});
    expect("routed_experts" in plain.meta_info).toBe(false);
    const r = await post({ return_routed_experts: true });
    const out = r.output_ids;
    expect(out).toEqual([...tok.encode("Hello there."), 151645]);
    expect(typeof r.meta_info.routed_experts).toBe("string");
    const experts = Array.from(decodeInt32(r.meta_info.routed_experts as string));
    const stream = [...PROMPT, ...out];
    expect(experts.length).toBe((stream.length - 1) * 3 * 2);
    expect(experts).toEqual(reference(stream, stream.length - 1, 5));
    // The first token's rows (151644 at position 0, seed 5), written out: layers 0–2, top-2 each, distinct per layer.
    expect(experts.slice(0, 6)).toEqual([3, 4, 0, 1, 5, 6]);
    for (let i = 0; i < experts.length; i += 2) expect(experts[i + 1]).toBe((experts[i]! + 1) % 8);
    // A pure function of the stream: a prefix routes the same in a longer call.
    expect(experts.slice(0, PROMPT.length * 6)).toEqual(reference(PROMPT, PROMPT.length, 5));
  });

  test("SglangClient over loopback HTTP: sends the flag and returns the span; through the gateway too (pass-through)", async () => {
    const direct = createEngineClient({ url: sim.urls[0]!, format: "sglang", moe: { layers: 3, top_k: 2 } });
    const gw = createGatewayApp({ replicas: sim.urls, healthIntervalMs: 0 });
    const viaGateway = createEngineClient({ url: "http://gw.local", format: "sglang", moe: { layers: 3, top_k: 2 }, fetch: (i, init) => gw.fetch(new Request(i, init)) });
    for (const c of [direct, viaGateway]) {
      const o = await c.generate({ request_id: crypto.randomUUID(), routing_key: "k_0_0", prompt_ids: PROMPT, sampling_params: SP, max_tokens: 16, return_routed_experts: true });
      const stream = [...PROMPT, ...o.token_ids];
      expect(o.routed_experts!.shape).toEqual([3, 2]);
      expect(o.routed_experts!.start).toBe(0);
      expect(o.routed_experts!.tokens).toBe(stream.length - 1);
      expect(Array.from(o.routed_experts!.data)).toEqual(reference(stream, stream.length - 1, 5));
      const plain = await c.generate({ request_id: crypto.randomUUID(), routing_key: "k_0_0", prompt_ids: PROMPT, sampling_params: SP, max_tokens: 16 });
      expect(plain.routed_experts).toBeUndefined();
    }
    const body = new SglangClient({ url: sim.urls[0]!, moe: { layers: 3, top_k: 2 } }).generateBody({ request_id: "r", routing_key: "k", prompt_ids: [1], sampling_params: SP, max_tokens: 1, return_routed_experts: true });
    expect(body.return_routed_experts).toBe(true);
    expect("return_routed_experts" in new SglangClient({ url: sim.urls[0]! }).generateBody({ request_id: "r", routing_key: "k", prompt_ids: [1], sampling_params: SP, max_tokens: 1 })).toBe(false);
  });

  test("an abort with partial tokens still covers input ‖ partial output minus the last token", async () => {
    const engine = new SimEngine({ tokenizer: tok, script: SCRIPT, moe: MOE, fault: { kind: "abort_after", tokens: 2, times: 1 } });
    const o = await new SimEngineClient(engine).generate({ request_id: "a", routing_key: "k", prompt_ids: PROMPT, sampling_params: SP, max_tokens: 16, return_routed_experts: true });
    expect(o.finish_reason).toBe("abort");
    expect(o.token_ids.length).toBe(2);
    expect(o.routed_experts!.tokens).toBe(PROMPT.length + 1);
    expect(Array.from(o.routed_experts!.data)).toEqual(reference([...PROMPT, ...o.token_ids], PROMPT.length + 1, 5));
  });

  test("bad shapes are BadEngineResponseError naming meta_info.routed_experts; a missing engine.moe is a ConfigError; the vLLM adapters refuse", async () => {
    const fail = (f: () => unknown) => {
      try {
        f();
      } catch (e) {
        return e as Error;
      }
      throw new Error("expected a throw");
    };
    const missing = fail(() => decodeSglangRoutedExperts("u", undefined, [3, 2], 4, 2));
    expect(missing).toBeInstanceOf(BadEngineResponseError);
    expect(missing.message).toContain("meta_info.routed_experts is missing although return_routed_experts was requested");
    const short = fail(() => decodeSglangRoutedExperts("u", encodeInt32(new Int32Array(6 * 4)), [3, 2], 4, 2));
    expect(short.message).toContain("meta_info.routed_experts holds 24 int32 values, expected (4 + 2 − 1) tokens × 3 layers × 2 top_k = 30");
    const notB64 = fail(() => decodeSglangRoutedExperts("u", "AAE=", [3, 2], 1, 0));
    expect(notB64.message).toContain("meta_info.routed_experts is not base64 of int32 values");
    // P + C rows (an engine that also reports the last token) are accepted.
    expect(decodeSglangRoutedExperts("u", encodeInt32(new Int32Array(6 * 6)), [3, 2], 4, 2).tokens).toBe(6);
    // engine.moe transposed ([top_k, layers] for [layers, top_k]): the same number of values, read across layers, so
    // a top-k row names an expert twice — refused naming engine.moe. The model's own shape reads the same bytes.
    const stream = [...PROMPT, ...PROMPT, ...PROMPT];
    const rows = new Int32Array(reference(stream, stream.length - 1, SCRIPT.seed));
    expect(decodeSglangRoutedExperts("u", encodeInt32(rows), [3, 2], stream.length - 2, 1).tokens).toBe(stream.length - 1);
    const transposed = fail(() => decodeSglangRoutedExperts("u", encodeInt32(rows), [2, 3], stream.length - 2, 1));
    expect(transposed).toBeInstanceOf(BadEngineResponseError);
    expect(transposed.message).toMatch(/read as \[2 layers, top-3\] names expert \d+ twice at token \d+, layer [01]; .*engine\.moe does not match the served model \(transposed\? \[3, 2\]\)/);
    // A row of one repeated value is a fill (verl's zeros), not a router's pick: accepted.
    const filled = rows.slice();
    filled.fill(0, 0, 6);
    expect(decodeSglangRoutedExperts("u", encodeInt32(filled), [3, 2], stream.length - 2, 1).tokens).toBe(stream.length - 1);

    const noMoe = createEngineClient({ url: sim.urls[0]!, format: "sglang" });
    const e1 = await noMoe.generate({ request_id: "x", routing_key: "k", prompt_ids: PROMPT, sampling_params: SP, max_tokens: 4, return_routed_experts: true }).catch((e) => e);
    expect(e1).toBeInstanceOf(ConfigError);
    expect(e1.field).toBe("engine.moe");
    for (const format of ["vllm", "vllm-generate"] as const) {
      const v = createEngineClient({ url: sim.urls[0]!, format });
      const e2 = await v.generate({ request_id: "x", routing_key: "k", prompt_ids: PROMPT, sampling_params: SP, max_tokens: 4, return_routed_experts: true }).catch((e) => e);
      expect(e2).toBeInstanceOf(ConfigError);
      expect(e2.field).toBe("rollout.return_routed_experts");
      expect(e2.message).toContain("use engine.format sglang");
    }
    expect(sim.replicas[0]!.engine.requests.filter((r) => r.request_id === "x").length).toBe(0);
  });
});
