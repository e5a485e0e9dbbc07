import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createGatewayApp, PREFIX_KEY_HEADER, REPLICA_HEADER } from "../../functions/gateway.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { rendezvousOrder } from "../../shared/inference/bounded-load-hash.ts";
import { cacheUsage } from "../../shared/inference/cache-usage.ts";
import { prefixKeyOf } from "../../shared/inference/prefix-key.ts";
import { MemoryRoutingState } from "../../shared/inference/routing-state.ts";
import { SglangClient, VllmClient } from "../../shared/inference/index.ts";
import { SamplingParams } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

let tok: ChatTokenizer;
let sim: RunningSimEngine;
const SYSTEM = "You are terse. Tools: none. ".repeat(5);
const sp = SamplingParams.parse({ stop_token_ids: [151645] });

beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({ replicas: 3, script: { seed: 2, rules: [], default: ["Fine.", "Done."] }, tokenizer: tok });
});
afterAll(() => sim.stop());

const prompt = (system: string, user: string) =>
  tok.renderIds(
    [
      { role: "system", content: system },
      { role: "user", content: user },
    ] as never,
    { addGenerationPrompt: true },
  );

describe("prefixKeyOf", () => {
  test("keys the leading block up to the first turn end: one key per system block, whatever follows", () => {
    const a = prompt(SYSTEM, "first question");
    const b = prompt(SYSTEM, "a different, longer second question");
    const imEnd = tok.tokenId("<|im_end|>")!;
    const block = a.indexOf(imEnd) + 1;
    const ka = prefixKeyOf(a, tok.turnEndIds);
    expect(ka).toMatch(new RegExp(`^${block}-[0-9a-f]{8}-[0-9a-f]{8}$`));
    expect(prefixKeyOf(b, tok.turnEndIds)).toBe(ka);
    expect(prefixKeyOf(a.slice(0, block), tok.turnEndIds)).toBe(ka);
    expect(prefixKeyOf(prompt(SYSTEM + " Be kind.", "first question"), tok.turnEndIds)).not.toBe(ka);
    // No turn end at all: the whole prompt.
    expect(prefixKeyOf([1, 2, 3], tok.turnEndIds).startsWith("3-")).toBe(true);
  });
});

describe("cacheUsage", () => {
  test("vLLM usage.prompt_tokens_details.cached_tokens; SGLang meta_info.cached_tokens (batches summed); nothing else", () => {
    expect(cacheUsage("/v1/completions", JSON.stringify({ usage: { prompt_tokens: 100, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 64 } } }))).toEqual({ prompt_tokens: 100, cached_tokens: 64 });
    // vLLM leaves prompt_tokens_details out for 0 cached tokens (and when not enabled): "not said".
    expect(cacheUsage("/v1/completions", JSON.stringify({ usage: { prompt_tokens: 100, prompt_tokens_details: null } }))).toEqual({ prompt_tokens: 100, cached_tokens: null });
    expect(cacheUsage("/v1/completions", JSON.stringify({ choices: [] }))).toBeNull();
    expect(cacheUsage("/inference/v1/generate", JSON.stringify({ usage: { prompt_tokens: 40, prompt_tokens_details: { cached_tokens: 32 } } }))).toEqual({ prompt_tokens: 40, cached_tokens: 32 });
    const sg = (p: number, c: number) => ({ text: "", output_ids: [1], meta_info: { prompt_tokens: p, cached_tokens: c } });
    expect(cacheUsage("/generate", JSON.stringify(sg(50, 48)))).toEqual({ prompt_tokens: 50, cached_tokens: 48 });
    expect(cacheUsage("/generate", JSON.stringify([sg(50, 48), sg(10, 0)]))).toEqual({ prompt_tokens: 60, cached_tokens: 48 });
    expect(cacheUsage("/generate", JSON.stringify({ meta_info: { prompt_tokens: 5 } }))).toBeNull();
    expect(cacheUsage("/v1/completions", "not json")).toBeNull();
  });
});

describe("ReplicaPool.noteCache", () => {
  test("unreported counts are 0 once the replica has reported; the hit rate is null before", async () => {
    const { ReplicaPool, createRoutingPolicy } = await import("../../shared/inference/replica-pool.ts");
    const pool = new ReplicaPool(["http://a:1"], createRoutingPolicy("round_robin"));
    pool.noteCache("http://a:1", 100, null);
    expect(pool.status()[0]).toMatchObject({ prompt_tokens: 100, cached_tokens: 0, prefix_hit_rate: null });
    pool.noteCache("http://a:1", 100, 96);
    pool.noteCache("http://a:1", 200, null);
    expect(pool.status()[0]).toMatchObject({ prompt_tokens: 400, cached_tokens: 96, prefix_hit_rate: 0.24 });
  });
});

describe("engine clients send the prefix key", () => {
  test("x-edgeloop-prefix-key from GenerateRequest.prefix_key (vLLM and SGLang); absent when unset", async () => {
    const seen: (string | null)[] = [];
    const fetchFn = async (input: RequestInfo | URL, init?: RequestInit) => {
      seen.push(new Headers(init?.headers).get(PREFIX_KEY_HEADER));
      const app = sim.replicas[0]!.app;
      return app.fetch(new Request(input, init));
    };
    const ids = prompt(SYSTEM, "q");
    const key = prefixKeyOf(ids, tok.turnEndIds);
    await new VllmClient({ url: "http://sim.local", fetch: fetchFn }).generate({ request_id: "r1", routing_key: "t_0_0", prefix_key: key, prompt_ids: ids, sampling_params: sp, max_tokens: 4 });
    await new SglangClient({ url: "http://sim.local", fetch: fetchFn }).generate({ request_id: "r2", routing_key: "t_0_0", prefix_key: key, prompt_ids: ids, sampling_params: sp, max_tokens: 4 });
    await new VllmClient({ url: "http://sim.local", fetch: fetchFn }).generate({ request_id: "r3", routing_key: "t_0_0", prompt_ids: ids, sampling_params: sp, max_tokens: 4 });
    expect(seen).toEqual([key, key, null]);
  });
});

describe("gateway: prefix placement and the per-replica hit rate", () => {
  test("first turns of new sessions sharing a prefix key go to that key's first replica; later turns stick; hit rate matches the replicas' own counts", async () => {
    const gw = createGatewayApp({ replicas: sim.urls, healthIntervalMs: 0, routingState: new MemoryRoutingState(), adminToken: "test-admin-token" });
    const client = new VllmClient({ url: "http://gw.local", fetch: async (input, init) => gw.fetch(new Request(input, init)) });
    const before = sim.replicas.map((r) => ({ ...r.engine.stats }));
    const served: string[] = [];
    const key0 = prefixKeyOf(prompt(SYSTEM, "u0"), tok.turnEndIds);
    const home = rendezvousOrder(key0, sim.urls.map((url) => ({ url })))[0]!.url;
    for (let i = 0; i < 4; i++) {
      // Sequential: no load, so every first turn goes to the prefix key's first replica.
      let ids = prompt(SYSTEM, `user ${i}`);
      const res = await gw.fetch(
        new Request("http://gw.local/v1/completions", {
          method: "POST",
          headers: { "content-type": "application/json", "x-session-id": `p${i}_0_0`, [PREFIX_KEY_HEADER]: key0 },
          body: JSON.stringify({ prompt: ids, max_tokens: 4, return_token_ids: true, stop_token_ids: [151645] }),
        }),
      );
      served.push(res.headers.get(REPLICA_HEADER)!);
      const body = (await res.json()) as { choices: { token_ids: number[] }[] };
      ids = [...ids, ...body.choices[0]!.token_ids, ...tok.encode("\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n")];
      await client.generate({ request_id: `p${i}-2`, routing_key: `p${i}_0_0`, prompt_ids: ids, sampling_params: sp, max_tokens: 4 });
      served.push(sim.urls[sim.replicas.findIndex((r) => r.engine.requests.at(-1)?.request_id === `p${i}-2`)]!);
    }
    expect(served).toEqual(Array(8).fill(home));
    const status = gw.replicas().find((r) => r.url === home)!;
    const idx = sim.urls.indexOf(home);
    const eng = sim.replicas[idx]!.engine.stats;
    expect([status.prompt_tokens, status.cached_tokens]).toEqual([eng.prompt_tokens - before[idx]!.prompt_tokens, eng.cached_tokens - before[idx]!.cached_tokens]);
    expect(status.cached_tokens).toBeGreaterThan(0);
    expect(status.prefix_hit_rate).toBe(status.cached_tokens / status.prompt_tokens);
    const metrics = await (await gw.fetch(new Request("http://gw.local/metrics"))).text();
    expect(metrics).toContain(`edgeloop_gateway_cached_tokens_total{replica="${home}"} ${status.cached_tokens}`);
    expect(metrics).toContain(`edgeloop_gateway_prefix_hit_rate{replica="${home}"} ${status.prefix_hit_rate}`);
    const admin = (await (await gw.fetch(new Request("http://gw.local/admin/replicas", { headers: { authorization: "Bearer test-admin-token" } }))).json()) as { shared_state: unknown; replicas: { url: string; prefix_hit_rate: number | null }[] };
    expect(admin.shared_state).toEqual({ rule: "sticky_bounded_load", epsilon: 0.2, sticky_epsilon: 1, sticky_min_load: 16, errors: 0, inflight: Object.fromEntries(sim.urls.map((u) => [u, 0])) });
    expect(admin.replicas.find((r) => r.url === home)!.prefix_hit_rate).toBe(status.prefix_hit_rate);
  });
});
