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
import { createSimEngineApp, SimEngine } from "../infra/sim-engine/index.ts";
import { prefixKeyOf, RedisRoutingState, VllmClient } from "../shared/inference/index.ts";
import { SamplingParams } from "../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../shared/tokens/tokenizer.ts";
import IORedis from "ioredis";
import { CONCURRENCY, driveTrajectories, firstPrompt, inProcessFetch, LATENCY, printAlignedTable, replicaStats, REPLICAS, SCRIPT, simReplicas, TRAJECTORIES, TURNS, unlinkPrefix } from "./routing-setup.ts";
import { median } from "./util.ts";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const RUNS = Number(process.argv[process.argv.indexOf("--runs") + 1]) || 3;
const INSTANCES = [1, 2, 4];
type Mode = "sticky" | "hash" | "shared";
const MODES: Mode[] = ["sticky", "hash", "shared"];

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
  const { engines, apps, urls } = simReplicas(tok);
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
  const drive = await driveTrajectories(tok, (i, t) => clients[(i + t) % instances]!, (prompt) => prefixKeyOf(prompt, tok.turnEndIds));
  const { hitRate: hit, reqMaxMean, prefillMaxMean } = replicaStats(engines);
  // Re-pins as the instances counted them: keys that moved between replicas (a key first seen by an instance counts nothing there).
  let repins = 0;
  for (const gw of gws) repins += gw.pool.repins;
  const rt = states.reduce((a, s) => a + s.roundTrips, 0);
  for (const s of states) await s.close();
  for (const c of commanders) await c.close();
  if (mode === "shared") await cleanup(prefix);
  const idealRate = drive.idealRate;
  return { hit, ideal: idealRate, ratio: hit / idealRate, reqMaxMean, prefillMaxMean, repins, rtPerCall: rt / (TRAJECTORIES * TURNS), callMs: median(drive.callMs) };
}

async function cleanup(prefix: string): Promise<void> {
  const r = new IORedis(REDIS_URL);
  await unlinkPrefix(r, prefix);
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
printAlignedTable(rows);

const o = await overhead(tok);
console.log(`\nadded latency of the shared state (loopback HTTP, one gateway, 1,000 calls each, interleaved, median; 16 generated tokens):\n`);
printAlignedTable([
  ["gateway", "median ms", "Redis trips/call"],
  ["per-process state", f(o.plainMs), "0"],
  ["shared state (Redis TCP)", f(o.sharedMs), f(o.rtPerCall, 2)],
  ["added", f(o.sharedMs - o.plainMs), ""],
]);
