/**
 * Agent-loop benchmark (issues 4 and 19): the CPU edgeloop adds around the engine.
 * - hermes parser: one assistant turn (~2 KB, a think block and two calls);
 * - per built-in model family (`--models qwen3,…`, default all): a `tool_agent`
 *   trajectory with one tool round (prompt, engine call, parse, tool call,
 *   observation, engine call, validation) against a scripted zero-latency
 *   engine (the family's own turns, as the sim engine samples them) and an
 *   in-process tool, so every CPU microsecond is edgeloop's. Reported per
 *   engine call (÷ 2), with and without the token core's share metered in
 *   the same runs (CPU inside `ObservationEncoder.encode`, and inside the
 *   tokenizer's `renderText` / `encode` elsewhere: the initial prompt, cached
 *   after the first trajectory as in a batch), and the observation beside its
 *   floor: raw tokenization (`encode`) of the observation's own text.
 * - one webhook tool call to the example tool server over loopback (signed),
 *   and a Qwen3 trajectory with that tool.
 * CPU is `process.cpuUsage()` (user + system) of this process; medians of `--runs`.
 *
 *   bun bench/agent-loop.ts [--runs 5] [--models qwen3,llama3_1,deepseek_v3,gpt_oss,gemma3]
 */
import { ToolAgentLoop } from "../shared/agent-loop/tool-agent.ts";
import type { GenerateRequest, InferenceClient } from "../shared/inference/types.ts";
import { BUILTIN_MODELS, builtinTokenizer } from "../shared/models/index.ts";
import { RolloutConfig, type ChatMessage, type TokenOutput } from "../shared/schema/index.ts";
import type { ChatTokenizer } from "../shared/tokens/tokenizer.ts";
import { HermesToolCallParser } from "../shared/tools/hermes-parser.ts";
import { parseToolsFile } from "../shared/tools/tools-file.ts";
import { WebhookToolClient, type ToolExecutor } from "../shared/tools/webhook-tool-client.ts";
import { SimEngine } from "../infra/sim-engine/sim-engine.ts";
import { startToolServer } from "../infra/tools/server.ts";
import { arg, installTokenCoreMeter, median, printTable } from "./util.ts";

const RUNS = Number(arg("--runs", "5"));
const MODELS = arg("--models", BUILTIN_MODELS.join(",")).split(",");

/** Median over `RUNS` of the CPU µs per call of `f` (`iterations` calls a run). */
function cpu(iterations: number, f: () => unknown): number {
  for (let i = 0; i < Math.min(iterations, 50); i++) f();
  const samples: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < iterations; i++) f();
    const c = process.cpuUsage(c0);
    samples.push((c.user + c.system) / iterations);
  }
  return median(samples);
}

async function cpuAsync(iterations: number, f: () => Promise<unknown>): Promise<number> {
  for (let i = 0; i < Math.min(iterations, 20); i++) await f();
  const samples: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    const c0 = process.cpuUsage();
    for (let i = 0; i < iterations; i++) await f();
    const c = process.cpuUsage(c0);
    samples.push((c.user + c.system) / iterations);
  }
  return median(samples);
}

const f1 = (x: number) => x.toFixed(1);
const f0 = (x: number) => x.toFixed(0);

const turn =
  "<think>\n" + "Let me reason about the problem step by step. ".repeat(30) + "\n</think>\n\n" +
  '<tool_call>\n{"name": "calc", "arguments": {"expression": "(3 + 4) * 6"}}\n</tool_call>\n' +
  '<tool_call>\n{"name": "lookup", "arguments": {"query": "population of paris"}}\n</tool_call>';
const parser = new HermesToolCallParser();
const misc: string[][] = [["what", "median CPU µs/op"]];
misc.push([`hermes extract (${turn.length} chars, 2 calls)`, f1(cpu(5000, () => parser.extract(turn)))]);

/** The policy's two turns, written in Qwen3's format; the sim engine's `familyText` writes them in each family's. */
const TOOL_TURN = '<think>\nI will use the calculator.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call>';
const ANSWER_TURN = "<think>\nThe tool says 4.\n</think>\n\nThe answer is 4.\n#### 4";
const schema = { type: "function" as const, function: { name: "calc", description: "calculator", parameters: { type: "object" as const, properties: { expression: { type: "string" } } } } };
const inProcess: ToolExecutor = { schemas: [schema], names: ["calc"], call: async (r) => ({ ok: true, content: "4", call_id: `${r.key}:${r.turn}:${r.index}`, attempts: 1 }) };
const config = RolloutConfig.parse({ max_model_len: 8192 });
const sp = { temperature: 1, top_p: 1, top_k: -1, logprobs: true };
const prompt: ChatMessage[] = [{ role: "user", content: "What is 2+2?" }];

/** A zero-latency engine answering with the family's tool-call turn, then its final answer, alternately. */
function scripted(tok: ChatTokenizer): InferenceClient {
  const sim = new SimEngine({ tokenizer: tok, script: { rules: [], default: ["x"] } });
  const a1 = sim.turnTokens(TOOL_TURN).ids;
  const a2 = sim.turnTokens(ANSWER_TURN).ids;
  const replies = [a1, a2].map((ids) => ({ ids, lps: ids.map(() => -0.5) }));
  let i = 0;
  return {
    async generate(_req: GenerateRequest): Promise<TokenOutput> {
      const r = replies[i++ % 2]!;
      return { token_ids: r.ids, log_probs: r.lps, finish_reason: "stop", num_preempted: -1, extra_fields: {} };
    },
  };
}

const fam: string[][] = [
  [
    "family",
    "traj µs",
    "per engine call µs (incl. token core)",
    "token core µs/call",
    "per engine call µs (excl. token core)",
    "observation µs",
    "observation floor µs",
    "observation ÷ floor",
  ],
];
const meter = installTokenCoreMeter();
let qwen: { tok: ChatTokenizer; client: InferenceClient } | undefined;
for (const family of MODELS) {
  const tok = await builtinTokenizer(family);
  const client = scripted(tok);
  if (family === "qwen3") qwen = { tok, client };
  let n = 0;
  const runOne = () => new ToolAgentLoop({ tokenizer: tok, client, config, tools: inProcess }).run(sp, { uid: "bench", session_id: n++, prompt });
  const out = await runOne();
  if (out.num_turns !== 4 || out.extra_fields.tool_calls !== 1 || out.extra_fields.tool_errors !== 0) {
    throw new Error(`${family}: expected one clean tool round, got num_turns ${out.num_turns}, extra_fields ${JSON.stringify(out.extra_fields)}`);
  }
  for (let i = 0; i < 20; i++) await runOne();
  // Whole trajectories, with the token core's CPU (observation encode, prompt render/encode) metered inside the same runs.
  const ITER = 300;
  const traj: number[] = [];
  const core: number[] = [];
  const obs: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    meter.reset();
    meter.on = true;
    const c0 = process.cpuUsage();
    for (let i = 0; i < ITER; i++) await runOne();
    const c = process.cpuUsage(c0);
    meter.on = false;
    traj.push((c.user + c.system) / ITER);
    core.push((meter.obsUs + meter.promptUs) / ITER);
    obs.push(meter.obsUs / Math.max(1, meter.observations));
  }
  const obsText = tok.decode(meter.sample[0]!);
  const floorUs = cpu(3000, () => tok.encode(obsText));
  const t = median(traj);
  const k = median(core);
  const o = median(obs);
  fam.push([family, f0(t), f0(t / 2), f0(k / 2), f0((t - k) / 2), f1(o), f1(floorUs), f1(o / floorUs)]);
}
printTable(
  `tool_agent trajectory, 1 tool round, zero-latency engine: CPU per engine call (2 per trajectory), median of ${RUNS} runs`,
  fam,
);
console.log(
  "token core = CPU inside ObservationEncoder.encode and the tokenizer's renderText/encode elsewhere (the prompt, cached after the first row), metered in the same runs;\n" +
    "floor = encode() of the observation's own text.",
);

if (qwen) {
  const { tok, client } = qwen;
  const server = startToolServer({ secret: "bench" });
  const text = await Bun.file(new URL("../infra/tools/tools.example.json", import.meta.url)).text();
  const webhook = new WebhookToolClient(parseToolsFile(text, { vars: { port: server.port } }).tools, { secret: "bench" });
  let k = 0;
  misc.push([
    "webhook calc call over loopback (signed, deduped server; both ends in this process)",
    f1(await cpuAsync(300, () => webhook.call({ name: "calc", arguments: { expression: "(3 + 4) * 6" }, key: "bench_0_0", turn: 1, index: k++ }))),
  ]);
  let n = 0;
  misc.push([
    "qwen3 tool_agent trajectory with the webhook tool",
    f1(await cpuAsync(100, () => new ToolAgentLoop({ tokenizer: tok, client, config, tools: webhook }).run(sp, { uid: "bench-webhook", session_id: n++, prompt }))),
  ]);
  await server.stop();
}
printTable(`agent loop pieces (median of ${RUNS} runs)`, misc);
