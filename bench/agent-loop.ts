/**
 * Agent-loop benchmark (issue 4): the cost edgeloop adds around the engine.
 * - hermes parser: one assistant turn (~2 KB, a think block and two calls);
 * - tool_agent overhead per trajectory (one tool round: prompt render,
 *   parse, incremental observation encoding, validation) with a scripted
 *   engine and an in-process tool, so engine time is zero;
 * - one webhook tool call to the example tool server over loopback (signed).
 *
 *   bun bench/agent-loop.ts [--runs 5]
 */
import { ToolAgentLoop } from "../shared/agent-loop/tool-agent.ts";
import type { GenerateRequest, InferenceClient } from "../shared/inference/types.ts";
import { RolloutConfig, type TokenOutput } from "../shared/schema/index.ts";
import { defaultTokenizer } from "../shared/tokens/tokenizer.ts";
import { HermesToolCallParser } from "../shared/tools/hermes-parser.ts";
import { parseToolsFile } from "../shared/tools/tools-file.ts";
import { WebhookToolClient, type ToolExecutor } from "../shared/tools/webhook-tool-client.ts";
import { startToolServer } from "../infra/tools/server.ts";
import { arg, median, printTable } from "./util.ts";

const RUNS = Number(arg("--runs", "5"));
const tok = await defaultTokenizer();

function time(iterations: number, f: () => unknown): number {
  const samples: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    const t0 = performance.now();
    for (let i = 0; i < iterations; i++) f();
    samples.push(((performance.now() - t0) * 1000) / iterations);
  }
  return median(samples);
}

async function timeAsync(iterations: number, f: () => Promise<unknown>): Promise<number> {
  const samples: number[] = [];
  for (let r = 0; r < RUNS; r++) {
    const t0 = performance.now();
    for (let i = 0; i < iterations; i++) await f();
    samples.push(((performance.now() - t0) * 1000) / iterations);
  }
  return median(samples);
}

const rows: string[][] = [["what", "median µs/op"]];

const turn =
  "<think>\n" + "Let me reason about the problem step by step. ".repeat(30) + "\n</think>\n\n" +
  '<tool_call>\n{"name": "calc", "arguments": {"expression": "(3 + 4) * 6"}}\n</tool_call>\n' +
  '<tool_call>\n{"name": "lookup", "arguments": {"query": "population of paris"}}\n</tool_call>';
const parser = new HermesToolCallParser();
rows.push([`hermes extract (${turn.length} chars, 2 calls)`, time(5000, () => parser.extract(turn)).toFixed(1)]);

const a1 = [...tok.encode('<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call>'), 151645];
const a2 = [...tok.encode("The answer is 4."), 151645];
class Scripted implements InferenceClient {
  private i = 0;
  async generate(_req: GenerateRequest): Promise<TokenOutput> {
    const ids = this.i++ % 2 === 0 ? a1 : a2;
    return { token_ids: ids, log_probs: ids.map(() => -0.5), finish_reason: "stop", num_preempted: -1, extra_fields: {} };
  }
}
const schema = { type: "function" as const, function: { name: "calc", description: "calculator", parameters: { type: "object" as const, properties: { expression: { type: "string" } } } } };
const inProcess: ToolExecutor = { schemas: [schema], names: ["calc"], call: async (r) => ({ ok: true, content: "4", call_id: `${r.key}:${r.turn}:${r.index}`, attempts: 1 }) };
const config = RolloutConfig.parse({ max_model_len: 8192 });
const client = new Scripted();
const sp = { temperature: 1, top_p: 1, top_k: -1, logprobs: true };
let n = 0;
const runOne = (tools: ToolExecutor) =>
  new ToolAgentLoop({ tokenizer: tok, client, config, tools }).run(sp, { uid: "bench", session_id: n++, prompt: [{ role: "user", content: "What is 2+2?" }] });
await runOne(inProcess);
rows.push(["tool_agent trajectory, 1 tool round, engine time 0", (await timeAsync(200, () => runOne(inProcess))).toFixed(1)]);

const server = startToolServer({ secret: "bench" });
const text = await Bun.file(new URL("../infra/tools/tools.example.json", import.meta.url)).text();
const webhook = new WebhookToolClient(parseToolsFile(text, { vars: { port: server.port } }).tools, { secret: "bench" });
let k = 0;
rows.push([
  "webhook calc call over loopback (signed, deduped server)",
  (await timeAsync(300, () => webhook.call({ name: "calc", arguments: { expression: "(3 + 4) * 6" }, key: "bench_0_0", turn: 1, index: k++ }))).toFixed(1),
]);
rows.push(["tool_agent trajectory with the webhook tool", (await timeAsync(100, () => runOne(webhook))).toFixed(1)]);
await server.stop();

printTable(`agent loop (median of ${RUNS} runs)`, rows);
