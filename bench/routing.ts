/**
 * Routing quality and gateway overhead on the simulated engine.
 *
 * Part 1 (in-process, apps called through `app.fetch`, with a latency model so
 * calls overlap): 4 sim replicas behind the gateway, 1,000 trajectories × 4
 * turns, 64 trajectories in flight; each turn's prompt extends the previous
 * one (prompt ‖ output ‖ tool response). For each policy: prefix-cache hit rate
 * (Σ cached / Σ prompt tokens) beside the **ideal** hit rate (perfect
 * stickiness, infinite cache: every call looked up in one unbounded prefix
 * cache fed with every call's tokens), max/mean requests per replica, max/mean
 * prefill tokens computed per replica, and the run's wall time. Medians of 3 runs.
 *
 * Part 2, the gateway hop (latency model off), for each wire format (vLLM
 * `/v1/completions`, vLLM `/inference/v1/generate`, SGLang `/generate`): the
 * same call straight to one replica over loopback HTTP (the floor), through a
 * bare HTTP relay (what any extra hop costs on this machine), through the
 * gateway with its own routing state and with the shared Redis state (when
 * REDIS_URL / 127.0.0.1:6379 answers); and in-process (app.fetch, no sockets)
 * direct vs gateway. Median latency of each, the gateway's ratio to the floor
 * and the added ms, all measured in one interleaved run.
 *
 * Run: ./node_modules/.bin/bun bench/routing.ts   (`--hop-only`: part 2 only)
 */
import { createGatewayApp } from "../functions/gateway.ts";
import { createSimEngineApp, SimEngine } from "../infra/sim-engine/index.ts";
import IORedis from "ioredis";
import { IoRedisCommander } from "../infra/redis/ioredis-commander.ts";
import { RedisRoutingState, SglangClient, VllmClient, type FetchLike, type InferenceClient, type RoutingPolicyName } from "../shared/inference/index.ts";
import { SamplingParams } from "../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../shared/tokens/tokenizer.ts";
import { CONCURRENCY, driveTrajectories, firstPrompt, inProcessFetch, LATENCY, printAlignedTable, replicaStats, REPLICAS, SCRIPT, simReplicas, TRAJECTORIES, TURNS, unlinkPrefix } from "./routing-setup.ts";
import { median } from "./util.ts";

const RUNS = 3;
const POLICIES: RoutingPolicyName[] = ["round_robin", "least_inflight_sticky", "bounded_load_hash"];

interface RoutingResult {
  hitRate: number;
  ideal: number;
  reqMaxMean: number;
  prefillMaxMean: number;
  wallS: number;
  callMs: number;
}

async function routingRun(tok: ChatTokenizer, policy: RoutingPolicyName): Promise<RoutingResult> {
  const { engines, apps, urls } = simReplicas(tok);
  const gw = createGatewayApp({ replicas: urls, policy, healthIntervalMs: 0, fetch: inProcessFetch(apps) });
  const client = new VllmClient({ url: "http://gateway.sim", fetch: inProcessFetch(new Map([["gateway.sim", gw]])) });
  const run = await driveTrajectories(tok, () => client);
  const stats = replicaStats(engines);
  return { ...stats, ideal: run.idealRate, wallS: run.wallS, callMs: median(run.callMs) };
}

type Format = "vLLM /v1/completions" | "vLLM /inference/v1/generate" | "SGLang /generate";
const FORMATS: [Format, (url: string, fetch?: FetchLike) => InferenceClient][] = [
  ["vLLM /v1/completions", (url, fetch) => new VllmClient({ url, fetch })],
  ["vLLM /inference/v1/generate", (url, fetch) => new VllmClient({ url, fetch, endpoint: "generate" })],
  ["SGLang /generate", (url, fetch) => new SglangClient({ url, fetch })],
];
type Hop = "direct" | "relay" | "gateway" | "gatewayShared" | "inDirect" | "inGateway";
const OVERHEAD_CALLS = 1_000;
const OVERHEAD_WARMUP = 200;

/** The local Redis for the shared-state row, or null (row skipped) when it does not answer within 500 ms. */
async function sharedState(): Promise<{ state: RedisRoutingState; close(): Promise<void> } | null> {
  const url = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
  const probe = new IORedis(url, { lazyConnect: true, connectTimeout: 500, maxRetriesPerRequest: 0, retryStrategy: () => null });
  try {
    await probe.connect();
    await probe.ping();
  } catch {
    probe.disconnect();
    return null;
  }
  const prefix = `bench:routing:${crypto.randomUUID().slice(0, 8)}:`;
  const commander = new IoRedisCommander(url);
  const state = new RedisRoutingState(commander, { prefix });
  return {
    state,
    async close() {
      await state.close();
      await commander.close();
      await unlinkPrefix(probe, prefix);
      await probe.quit();
    },
  };
}

/**
 * Median latency of one call per hop, for one wire format: straight to the
 * replica (the floor), through a bare relay (`fetch` of the request's bytes to
 * the replica, its reply passed back: what any HTTP hop costs here), through
 * the gateway (its own routing state; the shared Redis state when Redis
 * answers), and the same pair in-process (app.fetch, no sockets: the
 * gateway's own CPU). Interleaved, in a rotating order, so every hop sees the
 * same machine state.
 */
async function overhead(tok: ChatTokenizer, make: (url: string, fetch?: FetchLike) => InferenceClient): Promise<Partial<Record<Hop, number>>> {
  const app = createSimEngineApp(new SimEngine({ tokenizer: tok, script: SCRIPT }));
  const replica = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
  const replicaUrl = `http://127.0.0.1:${replica.port}`;
  const relay = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: async (req) => {
      const u = new URL(req.url);
      return fetch(replicaUrl + u.pathname + u.search, { method: req.method, headers: req.headers, body: await req.arrayBuffer() });
    },
  });
  const gateway = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createGatewayApp({ replicas: [replicaUrl], healthIntervalMs: 0 }).fetch });
  const shared = await sharedState();
  const gatewayShared = shared
    ? Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: createGatewayApp({ replicas: [replicaUrl], healthIntervalMs: 0, routingState: shared.state }).fetch })
    : undefined;
  const gwInProc = createGatewayApp({ replicas: ["http://replica.sim"], healthIntervalMs: 0, fetch: inProcessFetch(new Map([["replica.sim", app]])) });
  const clients: Partial<Record<Hop, InferenceClient>> = {
    direct: make(replicaUrl),
    relay: make(`http://127.0.0.1:${relay.port}`),
    gateway: make(`http://127.0.0.1:${gateway.port}`),
    ...(gatewayShared ? { gatewayShared: make(`http://127.0.0.1:${gatewayShared.port}`) } : {}),
    inDirect: make("http://replica.sim", inProcessFetch(new Map([["replica.sim", app]]))),
    inGateway: make("http://gw.sim", inProcessFetch(new Map([["gw.sim", gwInProc]]))),
  };
  const hops = Object.keys(clients) as Hop[];
  const sp = SamplingParams.parse({});
  const prompt = firstPrompt(tok, 7);
  const times = Object.fromEntries(hops.map((h) => [h, [] as number[]])) as Record<Hop, number[]>;
  for (let i = 0; i < OVERHEAD_WARMUP + OVERHEAD_CALLS; i++) {
    for (let j = 0; j < hops.length; j++) {
      const hop = hops[(i + j) % hops.length]!;
      const t0 = performance.now();
      await clients[hop]!.generate({ request_id: `o-${i}-${hop}`, routing_key: "overhead", prompt_ids: prompt, sampling_params: sp, max_tokens: 16 });
      if (i >= OVERHEAD_WARMUP) times[hop].push(performance.now() - t0);
    }
  }
  for (const server of [gatewayShared, gateway, relay, replica]) await server?.stop(true);
  await shared?.close();
  return Object.fromEntries(hops.map((h) => [h, median(times[h])]));
}

const tok = await defaultTokenizer();
const f = (x: number, d = 3) => x.toFixed(d);

if (!process.argv.includes("--hop-only")) await routingQuality();

async function routingQuality(): Promise<void> {
  console.log(`routing quality: ${REPLICAS} sim replicas (in-process app.fetch), ${TRAJECTORIES} trajectories × ${TURNS} turns, ${CONCURRENCY} in flight,`);
  console.log(`latency model prefill ${LATENCY.prefill_ms_per_token} ms/uncached token, decode ${LATENCY.decode_ms_per_token} ms/token; KV cache 16,384 blocks × 16 tokens per replica; medians of ${RUNS} runs\n`);
  const rows: string[][] = [["policy", "prefix hit rate", "ideal", "hit/ideal", "max/mean requests", "max/mean prefill tokens", "wall s", "median call ms"]];
  for (const policy of POLICIES) {
    const runs: RoutingResult[] = [];
    for (let r = 0; r < RUNS; r++) runs.push(await routingRun(tok, policy));
    const m = (k: keyof RoutingResult) => median(runs.map((x) => x[k]));
    rows.push([policy, f(m("hitRate")), f(m("ideal")), f(median(runs.map((x) => x.hitRate / x.ideal))), f(m("reqMaxMean")), f(m("prefillMaxMean")), f(m("wallS"), 2), f(m("callMs"), 2)]);
  }
  printAlignedTable(rows);
}

console.log(`\ngateway hop per call (${OVERHEAD_CALLS.toLocaleString("en")} calls per hop after ${OVERHEAD_WARMUP} warm-up, interleaved, median ms; sim latency model off; 16 generated tokens):`);
console.log("floor = the direct call; relay = a bare HTTP relay (fetch of the request's bytes, reply passed back), what any extra HTTP hop costs here\n");
const hopRows: string[][] = [["wire format", "hop", "floor ms", "relay ms", "gateway ms", "gateway/floor", "relay/floor", "added ms"]];
for (const [format, make] of FORMATS) {
  const o = await overhead(tok, make);
  const row = (hop: string, floor: number, gw: number | undefined, relay?: number) =>
    hopRows.push([format, hop, f(floor), relay === undefined ? "" : f(relay), gw === undefined ? "(no Redis)" : f(gw), gw === undefined ? "" : f(gw / floor, 2), relay === undefined ? "" : f(relay / floor, 2), gw === undefined ? "" : f(gw - floor)]);
  row("loopback HTTP, own state", o.direct!, o.gateway, o.relay);
  row("loopback HTTP, Redis state", o.direct!, o.gatewayShared);
  row("in-process (app.fetch)", o.inDirect!, o.inGateway);
}
printAlignedTable(hopRows);
