/**
 * The setup bench/routing.ts and bench/shared-routing.ts share: the
 * trajectory workload (a weather-tools script, a long system prompt, tool
 * responses of varying length), simulated replicas served in-process, the
 * drive loop that runs every trajectory's turns and measures the ideal hit
 * rate, the per-replica statistics, Redis cleanup and the right-aligned
 * table. Not a benchmark itself (bench/index.ts skips it).
 */
import type IORedis from "ioredis";
import { createSimEngineApp, SimEngine, type SimLatency } from "../infra/sim-engine/index.ts";
import { PrefixKvCache } from "../infra/sim-engine/kv-cache.ts";
import type { FetchLike, InferenceClient } from "../shared/inference/index.ts";
import { SamplingParams } from "../shared/schema/index.ts";
import type { ChatTokenizer } from "../shared/tokens/tokenizer.ts";

/** Simulated replicas behind the gateway(s). */
export const REPLICAS = 4;
/** Trajectories per run. */
export const TRAJECTORIES = 1_000;
/** Engine calls per trajectory. */
export const TURNS = 4;
/** Trajectories in flight at once. */
export const CONCURRENCY = 64;
/** The sim engine's latency model for the routing runs (ms per token), so calls overlap. */
export const LATENCY: SimLatency = { prefill_ms_per_token: 0.01, decode_ms_per_token: 0.1 };

/** The sim engine's script: three tool calls, then an answer, for prompts that mention the weather. */
export const SCRIPT = {
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

/** The system prompt every trajectory starts with (the prefix all trajectories share). */
export const SYSTEM =
  "You are a helpful assistant with access to weather tools. Always call a tool before answering. " +
  "Tools: get_weather(city) returns current conditions; get_forecast(city, days) returns a forecast; " +
  "get_alerts(city) returns active alerts. Answer briefly and cite the tool results. ".repeat(4);

/** Trajectory `i`'s first prompt: system + user, rendered with the generation prompt (token ids). */
export function firstPrompt(tok: ChatTokenizer, i: number): number[] {
  return tok.renderIds(
    [
      { role: "system", content: SYSTEM },
      { role: "user", content: `Trajectory ${i}: what is the weather like in city number ${i} this week?` },
    ] as never,
    { addGenerationPrompt: true },
  );
}

/** A tool response of varying length (0–79 filler words), so calls do not run in lockstep (token ids). */
export function toolResponse(tok: ChatTokenizer, i: number, turn: number): number[] {
  const notes = Array.from({ length: (i * 31 + turn * 17) % 80 }, (_, w) => `note${(i + w) % 97}`).join(" ");
  return tok.encode(
    `\n<|im_start|>user\n<tool_response>\n{"city": ${i}, "turn": ${turn}, "temperature_c": ${(i * 7 + turn) % 35}, "conditions": "clear with a light breeze", "notes": "${notes}"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n`,
  );
}

/** Anything with a fetch handler (a Hono app, a gateway). */
export interface FetchApp {
  fetch: (r: Request) => Response | Promise<Response>;
}

/**
 * Routes `http://<host>/...` to in-process apps (no sockets).
 * @throws TypeError "connection refused: <url>" for a host not in `apps`.
 */
export function inProcessFetch(apps: Map<string, FetchApp>): FetchLike {
  return async (input, init) => {
    const req = input instanceof Request ? input : new Request(String(input), init);
    const app = apps.get(new URL(req.url).host);
    if (!app) throw new TypeError(`connection refused: ${req.url}`);
    return app.fetch(req);
  };
}

/** {@link REPLICAS} sim engines with the latency model, served in-process at `http://replica-<i>.sim`. */
export function simReplicas(tok: ChatTokenizer): { engines: SimEngine[]; apps: Map<string, FetchApp>; urls: string[] } {
  const engines = Array.from({ length: REPLICAS }, (_, i) => new SimEngine({ tokenizer: tok, script: SCRIPT, name: `replica-${i}`, latency: LATENCY }));
  const apps = new Map<string, FetchApp>();
  engines.forEach((e, i) => apps.set(`replica-${i}.sim`, createSimEngineApp(e)));
  return { engines, apps, urls: engines.map((_, i) => `http://replica-${i}.sim`) };
}

/** What {@link driveTrajectories} measured. */
export interface DriveResult {
  /** Σ cached / Σ prompt tokens of one unbounded prefix cache fed with every call's tokens (perfect stickiness). */
  idealRate: number;
  /** Every call's latency, ms. */
  callMs: number[];
  /** Wall time of the whole run, seconds. */
  wallS: number;
}

/**
 * Runs {@link TRAJECTORIES} trajectories × {@link TURNS} turns, {@link CONCURRENCY}
 * in flight; each turn's prompt is the previous prompt ‖ output ‖ a tool
 * response. Turn `t` of trajectory `i` goes to `clientFor(i, t)` with routing
 * key `traj-<i>` and, when `prefixKeyOf` is given, the prefix key of the
 * trajectory's first prompt.
 */
export async function driveTrajectories(
  tok: ChatTokenizer,
  clientFor: (i: number, t: number) => InferenceClient,
  prefixKeyOf?: (prompt: number[]) => string,
): Promise<DriveResult> {
  const sp = SamplingParams.parse({ stop_token_ids: [tok.eosTokenId] });
  const ideal = new PrefixKvCache({ capacityBlocks: Number.MAX_SAFE_INTEGER });
  let idealCached = 0;
  let idealPrompt = 0;
  const callMs: number[] = [];
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    while (next < TRAJECTORIES) {
      const i = next++;
      let prompt = firstPrompt(tok, i);
      const prefix = prefixKeyOf ? { prefix_key: prefixKeyOf(prompt) } : {};
      for (let t = 0; t < TURNS; t++) {
        idealCached += ideal.lookup(prompt);
        idealPrompt += prompt.length;
        const t0 = performance.now();
        const out = await clientFor(i, t).generate({ request_id: crypto.randomUUID(), routing_key: `traj-${i}`, ...prefix, prompt_ids: prompt, sampling_params: sp, max_tokens: 512 });
        callMs.push(performance.now() - t0);
        ideal.insert([...prompt, ...out.token_ids]);
        prompt = [...prompt, ...out.token_ids, ...toolResponse(tok, i, t)];
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return { idealRate: idealCached / idealPrompt, callMs, wallS: (performance.now() - started) / 1000 };
}

/**
 * The replicas' view of a run: prefix hit rate (Σ cached / Σ prompt tokens)
 * and max/mean requests and prefill tokens (prompt − cached) per replica.
 * @throws Error "lost calls" when the replicas saw fewer or more than TRAJECTORIES × TURNS calls.
 */
export function replicaStats(engines: SimEngine[]): { hitRate: number; reqMaxMean: number; prefillMaxMean: number } {
  const reqs = engines.map((e) => e.stats.requests);
  const prefill = engines.map((e) => e.stats.prompt_tokens - e.stats.cached_tokens);
  const prompt = engines.reduce((a, e) => a + e.stats.prompt_tokens, 0);
  const cached = engines.reduce((a, e) => a + e.stats.cached_tokens, 0);
  const maxMean = (xs: number[]) => Math.max(...xs) / (xs.reduce((a, b) => a + b, 0) / xs.length);
  if (reqs.reduce((a, b) => a + b, 0) !== TRAJECTORIES * TURNS) throw new Error("lost calls");
  return { hitRate: cached / prompt, reqMaxMean: maxMean(reqs), prefillMaxMean: maxMean(prefill) };
}

/** Deletes every key under `prefix` (SCAN + UNLINK) through `redis`, which stays open. */
export async function unlinkPrefix(redis: IORedis, prefix: string): Promise<void> {
  let cursor = "0";
  do {
    const [next, keys] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000);
    cursor = next;
    if (keys.length) await redis.unlink(...keys);
  } while (cursor !== "0");
}

/** Prints a table: first column left-aligned, the others right-aligned, a rule under the header row. */
export function printAlignedTable(t: string[][]): void {
  const w = t[0]!.map((_, c) => Math.max(...t.map((r) => r[c]!.length)));
  for (const [i, r] of t.entries()) {
    console.log(r.map((v, c) => (c === 0 ? v.padEnd(w[c]!) : v.padStart(w[c]!))).join("  "));
    if (i === 0) console.log(w.map((n) => "-".repeat(n)).join("  "));
  }
}
