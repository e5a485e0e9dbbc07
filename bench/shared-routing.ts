/**
 * Routing across several gateway instances: shared routing state (Redis) vs
 * each instance on its own (issue 17, "Measure").
 *
 * Part 1 (in-process apps through `app.fetch`, a latency model so calls
 * overlap; the shared state in the local Redis over TCP): 4 sim replicas,
 * 1,000 trajectories × 4 turns, 64 in flight; every trajectory's prompt starts
 * with one system+tools block (a prefix all trajectories share) and each turn
 * extends the previous one. Turn t of trajectory i goes through gateway
 * instance (i + t) mod G, as a load balancer without affinity would send it.
 * For G = 1, 2, 4 instances and each mode — `sticky` (per-process
 * least_inflight_sticky, the default), `hash` (per-process bounded_load_hash,
 * stateless), `shared` (RedisRoutingState, prefix keys sent) — prints the prefix
 * hit rate (Σ cached / Σ prompt tokens), the **ideal** hit rate (perfect
 * stickiness, infinite cache: every call looked up in one unbounded prefix cache
 * fed with every call's tokens), their ratio, max/mean requests and prefill
 * tokens per replica, pins that moved, and Redis round trips per call.
 *
 * Part 2 (real HTTP over loopback, latency model off): the added latency per
 * call of the shared state: one gateway with and without it, calls interleaved.
 *
 * Run: ./node_modules/.bin/bun bench/shared-routing.ts [--runs 3]
 */
import { createGatewayApp, type Gateway } from "../functions/gateway.ts";
import { IoRedisCommander } from "../infra/redis/ioredis-commander.ts";
import { createSimEngineApp, SimEngine, type SimLatency } from "../infra/sim-engine/index.ts";
import { PrefixKvCache } from "../infra/sim-engine/kv-cache.ts";
import { prefixKeyOf, RedisRoutingState, VllmClient, type FetchLike } from "../shared/inference/index.ts";
import { SamplingParams } from "../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../shared/tokens/tokenizer.ts";
import IORedis from "ioredis";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const REPLICAS = 4;
const TRAJECTORIES = 1_000;
const TURNS = 4;
const CONCURRENCY = 64;
const RUNS = Number(process.argv[process.argv.indexOf("--runs") + 1]) || 3;
const LATENCY: SimLatency = { prefill_ms_per_token: 0.01, decode_ms_per_token: 0.1 };
const INSTANCES = [1, 2, 4];
type Mode = "sticky" | "hash" | "shared";
const MODES: Mode[] = ["sticky", "hash", "shared"];

const SCRIPT = {
  seed: 1,
  rules: [
    {
      when: "weather",
      turns: [
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "the city"}}\n</tool_call>',
        '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "the city", "days": 3}}\n</tool_call>',
        '<tool_call>\n{"name": "get_alerts", "arguments": {"city": "the city"}}\n</tool_call>',
        "It is sunny today, with light rain expected on the third day and no weather alerts in effect.",
      ],
    },
  ],
  default: ["I cannot help with that."],
};
const SYSTEM =
  "You are a helpful assistant with access to weather tools. Always call a tool before answering. " +
  "Tools: get_weather(city) returns current conditions; get_forecast(city, days) returns a forecast; " +
  "get_alerts(city) returns active alerts. Answer briefly and cite the tool results. ".repeat(4);

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

function firstPrompt(tok: ChatTokenizer, i: number): number[] {
  return tok.renderIds(
    [
      { role: "system", content: SYSTEM },
      { role: "user", content: `Trajectory ${i}: what is the weather like in city number ${i} this week?` },
    ] as never,
    { addGenerationPrompt: true },
  );
}

function toolResponse(tok: ChatTokenizer, i: number, turn: number): number[] {
  const notes = Array.from({ length: (i * 31 + turn * 17) % 80 }, (_, w) => `note${(i + w) % 97}`).join(" ");
  return tok.encode(
    `\n<|im_start|>user\n<tool_response>\n{"city": ${i}, "turn": ${turn}, "temperature_c": ${(i * 7 + turn) % 35}, "conditions": "clear with a light breeze", "notes": "${notes}"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n`,
  );
}

function inProcessFetch(apps: Map<string, { fetch: (r: Request) => Response | Promise<Response> }>): FetchLike {
  return async (input, init) => {
    const req = input instanceof Request ? input : new Request(String(input), init);
    const app = apps.get(new URL(req.url).host);
    if (!app) throw new TypeError(`connection refused: ${req.url}`);
    return app.fetch(req);
  };
}

interface Result {
  hit: number;
  ideal: number;
  ratio: number;
  reqMaxMean: number;
  prefillMaxMean: number;
  repins: number;
  rtPerCall: number;
  callMs: number;
}

async function run(tok: ChatTokenizer, mode: Mode, instances: number): Promise<Result> {
  const engines = Array.from({ length: REPLICAS }, (_, i) => new SimEngine({ tokenizer: tok, script: SCRIPT, name: `replica-${i}`, latency: LATENCY }));
  const apps = new Map<string, { fetch: (r: Request) => Response | Promise<Response> }>();
  engines.forEach((e, i) => apps.set(`replica-${i}.sim`, createSimEngineApp(e)));
  const urls = engines.map((_, i) => `http://replica-${i}.sim`);
  const prefix = `bench:shared-routing:${crypto.randomUUID().slice(0, 8)}:`;
  const states: RedisRoutingState[] = [];
  const commanders: IoRedisCommander[] = [];
  const gws: Gateway[] = [];
  for (let g = 0; g < instances; g++) {
    let routingState: RedisRoutingState | undefined;
    if (mode === "shared") {
      const c = new IoRedisCommander(REDIS_URL);
      commanders.push(c);
      routingState = new RedisRoutingState(c, { prefix });
      states.push(routingState);
    }
    gws.push(createGatewayApp({ replicas: urls, policy: mode === "hash" ? "bounded_load_hash" : "least_inflight_sticky", healthIntervalMs: 0, fetch: inProcessFetch(apps), routingState }));
  }
  const clients = gws.map((gw) => new VllmClient({ url: "http://gateway.sim", fetch: inProcessFetch(new Map([["gateway.sim", gw]])) }));
  const sp = SamplingParams.parse({ stop_token_ids: [tok.eosTokenId] });
  const ideal = new PrefixKvCache({ capacityBlocks: Number.MAX_SAFE_INTEGER });
  let idealCached = 0;
  let idealPrompt = 0;
  const callMs: number[] = [];
  let next = 0;
  const worker = async () => {
    while (next < TRAJECTORIES) {
      const i = next++;
      let prompt = firstPrompt(tok, i);
      const prefixKey = prefixKeyOf(prompt, tok.turnEndIds);
      for (let t = 0; t < TURNS; t++) {
        idealCached += ideal.lookup(prompt);
        idealPrompt += prompt.length;
        const t0 = performance.now();
        const out = await clients[(i + t) % instances].generate({ request_id: crypto.randomUUID(), routing_key: `traj-${i}`, prefix_key: prefixKey, prompt_ids: prompt, sampling_params: sp, max_tokens: 512 });
        callMs.push(performance.now() - t0);
        ideal.insert([...prompt, ...out.token_ids]);
        prompt = [...prompt, ...out.token_ids, ...toolResponse(tok, i, t)];
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const reqs = engines.map((e) => e.stats.requests);
  const prefill = engines.map((e) => e.stats.prompt_tokens - e.stats.cached_tokens);
  const prompt = engines.reduce((a, e) => a + e.stats.prompt_tokens, 0);
  const cached = engines.reduce((a, e) => a + e.stats.cached_tokens, 0);
  const maxMean = (xs: number[]) => Math.max(...xs) / (xs.reduce((a, b) => a + b, 0) / xs.length);
  if (reqs.reduce((a, b) => a + b, 0) !== TRAJECTORIES * TURNS) throw new Error("lost calls");
  // Re-pins as the instances counted them: keys that moved between replicas (a key first seen by an instance counts nothing there).
  let repins = 0;
  for (const gw of gws) repins += gw.pool.repins;
  const rt = states.reduce((a, s) => a + s.roundTrips, 0);
  for (const s of states) await s.close();
  for (const c of commanders) await c.close();
  if (mode === "shared") await cleanup(prefix);
  const hit = cached / prompt;
  const idealRate = idealCached / idealPrompt;
  return { hit, ideal: idealRate, ratio: hit / idealRate, reqMaxMean: maxMean(reqs), prefillMaxMean: maxMean(prefill), repins, rtPerCall: rt / (TRAJECTORIES * TURNS), callMs: median(callMs) };
}

async function cleanup(prefix: string): Promise<void> {
  const r = new IORedis(REDIS_URL);
  let cursor = "0";
  do {
    const [nextCursor, keys] = await r.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000);
    cursor = nextCursor;
    if (keys.length) await r.unlink(...keys);
  } while (cursor !== "0");
  await r.quit();
}

/** Added latency of the shared state per call: one loopback gateway with and without it, interleaved. */
async function overhead(tok: ChatTokenizer): Promise<{ plainMs: number; sharedMs: number; rtPerCall: number }> {
  const engine = new SimEngine({ tokenizer: tok, script: SCRIPT });
  const replica = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createSimEngineApp(engine).fetch });
  const urls = [`http://127.0.0.1:${replica.port}`];
  const prefix = `bench:shared-routing:${crypto.randomUUID().slice(0, 8)}:`;
  const c = new IoRedisCommander(REDIS_URL);
  const state = new RedisRoutingState(c, { prefix });
  const plain = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createGatewayApp({ replicas: urls, healthIntervalMs: 0 }).fetch });
  const shared = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createGatewayApp({ replicas: urls, healthIntervalMs: 0, routingState: state }).fetch });
  const clients = { plain: new VllmClient({ url: `http://127.0.0.1:${plain.port}` }), shared: new VllmClient({ url: `http://127.0.0.1:${shared.port}` }) };
  const sp = SamplingParams.parse({});
  const prompt = firstPrompt(tok, 7);
  const times = { plain: [] as number[], shared: [] as number[] };
  let rt0 = 0;
  for (let i = 0; i < 1_200; i++) {
    if (i === 200) rt0 = state.roundTrips;
    for (const k of ["plain", "shared"] as const) {
      const t0 = performance.now();
      await clients[k].generate({ request_id: `o-${i}-${k}`, routing_key: `overhead-${i % 50}`, prompt_ids: prompt, sampling_params: sp, max_tokens: 16 });
      if (i >= 200) times[k].push(performance.now() - t0);
    }
  }
  await Bun.sleep(50);
  const rtPerCall = (state.roundTrips - rt0) / 1_000;
  await state.close();
  await c.close();
  await plain.stop(true);
  await shared.stop(true);
  await replica.stop(true);
  await cleanup(prefix);
  return { plainMs: median(times.plain), sharedMs: median(times.shared), rtPerCall };
}

function printTable(t: string[][]): void {
  const w = t[0].map((_, c) => Math.max(...t.map((r) => r[c].length)));
  for (const [i, r] of t.entries()) {
    console.log(r.map((v, c) => (c === 0 ? v.padEnd(w[c]) : v.padStart(w[c]))).join("  "));
    if (i === 0) console.log(w.map((n) => "-".repeat(n)).join("  "));
  }
}

const tok = await defaultTokenizer();
const f = (x: number, d = 3) => x.toFixed(d);
console.log(`shared routing: ${REPLICAS} sim replicas (in-process app.fetch), ${TRAJECTORIES} trajectories × ${TURNS} turns, ${CONCURRENCY} in flight, turn t of trajectory i through instance (i+t) mod G;`);
console.log(`latency model prefill ${LATENCY.prefill_ms_per_token} ms/uncached token, decode ${LATENCY.decode_ms_per_token} ms/token; KV cache 16,384 blocks × 16 tokens per replica; shared state in ${REDIS_URL}; medians of ${RUNS} runs\n`);
const rows: string[][] = [["instances", "mode", "hit rate", "ideal", "hit/ideal", "max/mean requests", "max/mean prefill", "re-pins", "Redis trips/call", "median call ms"]];
for (const g of INSTANCES) {
  for (const mode of MODES) {
    const runs: Result[] = [];
    for (let r = 0; r < RUNS; r++) runs.push(await run(tok, mode, g));
    const m = (k: keyof Result) => median(runs.map((x) => x[k]));
    rows.push([String(g), mode, f(m("hit")), f(m("ideal")), f(m("ratio")), f(m("reqMaxMean")), f(m("prefillMaxMean")), String(m("repins")), f(m("rtPerCall"), 2), f(m("callMs"), 2)]);
  }
}
printTable(rows);

const o = await overhead(tok);
console.log(`\nadded latency of the shared state (loopback HTTP, one gateway, 1,000 calls each, interleaved, median; 16 generated tokens):\n`);
printTable([
  ["gateway", "median ms", "Redis trips/call"],
  ["per-process state", f(o.plainMs), "0"],
  ["shared state (Redis TCP)", f(o.sharedMs), f(o.rtPerCall, 2)],
  ["added", f(o.sharedMs - o.plainMs), ""],
]);
