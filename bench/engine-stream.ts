/**
 * Time to first chunk vs time to the whole output of a streaming engine call
 * (issue 30 item 3): the simulated engine at a decode pace (default 5 ms per
 * token, `--pace`), in process (`SimEngineClient`) and over loopback HTTP
 * with each wire format (vLLM completions and generate, SGLang cumulative and
 * incremental), `--calls` sequential calls each (default 20) of a scripted
 * reply of `--tokens` tokens at most (default 64). Prints p50/p90 in ms.
 *
 *   bun bench/engine-stream.ts [--pace 5] [--calls 20] [--tokens 64]
 */
import { SglangClient } from "../shared/inference/sglang-client.ts";
import type { InferenceClient } from "../shared/inference/types.ts";
import { VllmClient } from "../shared/inference/vllm-client.ts";
import { SamplingParams } from "../shared/schema/index.ts";
import { defaultTokenizer } from "../shared/tokens/tokenizer.ts";
import { SimEngineClient } from "../infra/sim-engine/sim-engine-client.ts";
import { startSimEngine } from "../infra/sim-engine/server.ts";
import { arg, printTable } from "./util.ts";

const pace = Number(arg("--pace", "5"));
const calls = Number(arg("--calls", "20"));
const tokens = Number(arg("--tokens", "64"));

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
}

const tok = await defaultTokenizer();
const text = "Streaming lets the gateway forward each token as soon as the engine decodes it, ".repeat(8);
const script = { seed: 1, rules: [], default: [text] };
const latency = { decode_ms_per_token: pace };
const sim = await startSimEngine({ tokenizer: tok, script, latency });
const simInc = await startSimEngine({ tokenizer: tok, script, latency, wire: { sglangIncrementalStreaming: true } });
const prompt = tok.renderIds([{ role: "user", content: "explain streaming" }] as never, { addGenerationPrompt: true });

const cases: [string, InferenceClient][] = [
  ["in-process SimEngineClient", new SimEngineClient(sim.replicas[0]!.engine)],
  ["HTTP vLLM /v1/completions", new VllmClient({ url: sim.urls[0]! })],
  ["HTTP vLLM /inference/v1/generate", new VllmClient({ url: sim.urls[0]!, endpoint: "generate" })],
  ["HTTP SGLang /generate (cumulative)", new SglangClient({ url: sim.urls[0]! })],
  ["HTTP SGLang /generate (incremental)", new SglangClient({ url: simInc.urls[0]! })],
];

const rows: string[][] = [["client", "tokens", "first chunk p50", "p90", "whole output p50", "p90", "chunks/call"]];
try {
  for (const [name, client] of cases) {
    const first: number[] = [];
    const whole: number[] = [];
    let chunks = 0;
    let n = 0;
    for (let i = 0; i < calls; i++) {
      const t0 = performance.now();
      let t1 = -1;
      const out = await client.generate({
        request_id: `bench-${i}`,
        routing_key: `bench_${i}_0`,
        prompt_ids: prompt,
        sampling_params: SamplingParams.parse({}),
        max_tokens: tokens,
        on_tokens: () => {
          chunks++;
          if (t1 < 0) t1 = performance.now();
        },
      });
      whole.push(performance.now() - t0);
      first.push(t1 - t0);
      n = out.token_ids.length;
    }
    rows.push([name, String(n), pct(first, 50).toFixed(1), pct(first, 90).toFixed(1), pct(whole, 50).toFixed(1), pct(whole, 90).toFixed(1), (chunks / calls).toFixed(1)]);
  }
} finally {
  await sim.stop();
  await simInc.stop();
}
printTable(`Engine streaming: time to first chunk vs whole output (ms), decode pace ${pace} ms/token, ${calls} calls each`, rows);
