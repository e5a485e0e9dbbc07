import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { InteractionClient, InteractionSpec } from "../../shared/tools/interaction-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { config, ctxOf, maskRuns, runSelfCheck, SELF_CHECK, SP } from "./helpers.ts";

// E4 (edge-cases.md): a Qwen3 turn ended by <|endoftext|> (151643), through
// the real sim engine over loopback HTTP, real webhook tools and a real
// simulated-user webhook: 151643 stays (mask 1, its log-prob); the next
// observation first closes the turn (<|im_end|>\n, mask 0).
const IM_END = 151645;
const EOT = 151643;
const E4_TURN1 = [151657, 198, 4913, 606, 788, 330, 26586, 497, 330, 16370, 788, 5212, 28099, 788, 330, 17, 10, 17, 95642, 151658, 151643];
const ROOT = join(import.meta.dir, "..", "..");

let tok: ChatTokenizer;
let sim: RunningSimEngine;
let tools: ToolServer;
let user: ReturnType<typeof Bun.serve>;
const userTurns: Array<{ turn: number; last: ChatMessage }> = [];

beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({
    tokenizer: tok,
    script: {
      seed: 3,
      rules: [
        { when: "What is 2+2?", turns: [{ token_ids: E4_TURN1, finish_reason: "stop" }, "The answer is 4.\n#### 4"] },
        { when: "What is 3+3?", turns: [{ token_ids: [...tok.encode("The answer is 5."), EOT] }, "The answer is 6.\n#### 6"] },
        { when: "Self-check 5+5", turns: [{ token_ids: [...tok.encode("#### 11"), EOT] }, "#### 10"] },
        { when: "Cut short", turns: [{ text: "I will think about", finish_reason: "length" }] },
      ],
      default: ["?"],
    },
  });
  tools = startToolServer({ port: 0 });
  // The simulated user: "Try again." until the answer holds the ground truth.
  user = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const body = (await req.json()) as { turn: number; messages: ChatMessage[]; interaction_kwargs: { ground_truth: string } };
      const last = body.messages.at(-1)!;
      userTurns.push({ turn: body.turn, last });
      const right = String(last.content).includes(`#### ${body.interaction_kwargs.ground_truth}`);
      return Response.json(right ? { terminate: true, content: "Correct.", score: 1 } : { terminate: false, content: "Try again.", score: 0 });
    },
  });
});
afterAll(async () => {
  await sim.stop();
  await tools.stop();
  user.stop(true);
});

function webhookTools(): WebhookToolClient {
  const text = readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8");
  return new WebhookToolClient(parseToolsFile(text, { source: "tools", vars: { port: tools.port } }).tools);
}

const e4Row = (uid: string) => ({
  uid,
  session_id: 0,
  data_source: "edge",
  prompt: [{ role: "user", content: "What is 2+2?" }] as ChatMessage[],
  reward_model: { style: "rule", ground_truth: "4" },
});

describe("E4: a tool_agent turn ended by <|endoftext|>", () => {
  for (const format of ["vllm", "vllm-generate", "sglang"] as const) {
    test(`${format}: 151643 kept with mask 1 and its log-prob; the tool observation starts [151645, 198, 151644, 872, 198, 151665]; reward 1`, async () => {
      const engine = sim.replicas[0]!.engine;
      const before = engine.requests.length;
      const client = createEngineClient({ url: sim.urls[0]!, format });
      const wt = webhookTools();
      const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { tools: wt, reward: {} }));
      const o = await loop.run(SP, e4Row(`e4-${format}`));
      expect(loop.trace).toEqual(["pending", "generating", "processing_tools", "generating", "terminated"]);
      const answer = [...tok.encode("The answer is 4.\n#### 4"), IM_END];
      const obs = [IM_END, 198, 151644, 872, 198, 151665, 198, ...tok.encode("4"), 198, 151666, IM_END, 198, 151644, 77091, 198];
      expect(maskRuns(o)).toEqual([
        [1, E4_TURN1],
        [0, obs],
        [1, answer],
      ]);
      expect(o.response_ids.slice(0, 21).at(-1)).toBe(EOT);
      expect(o.response_ids.slice(21, 27)).toEqual([151645, 198, 151644, 872, 198, 151665]);
      // Log-probs: the engine's, 151643 included; 0 on the observation.
      const prompt = o.prompt_ids;
      const lp1 = engine.logProbs(prompt, E4_TURN1.length).map((v) => Math.fround(v));
      const lp2 = engine.logProbs([...prompt, ...E4_TURN1, ...obs], answer.length).map((v) => Math.fround(v));
      expect(o.response_logprobs).toEqual([...lp1, ...obs.map(() => 0), ...lp2]);
      expect(o.reward_score).toBe(1);
      expect(o.finish_reason).toBe("stop");
      expect(o.num_turns).toBe(4);
      expect(o.extra_fields.tool_calls).toBe(1);
      expect(o.extra_fields.tool_errors).toBe(0);
      // Both engine requests carried the model's stop list.
      expect(engine.requests.slice(before).map((r) => r.stop_token_ids)).toEqual([
        [IM_END, EOT],
        [IM_END, EOT],
      ]);
      // The second request's prompt is the template's render with the turn closed after <|endoftext|>.
      const schemas = [...wt.schemas];
      const conv: ChatMessage[] = [
        { role: "user", content: "What is 2+2?" },
        { role: "assistant", content: tok.decode(E4_TURN1) },
        { role: "tool", content: "4" },
      ];
      expect([...prompt, ...E4_TURN1, ...obs]).toEqual(tok.renderIds(conv, { tools: schemas, addGenerationPrompt: true }));
    });
  }
});

describe("E4 for the other observations", () => {
  test("interaction: the simulated user's turn after 151643 starts [151645, 198, 151644, 872, 198]", async () => {
    const client = createEngineClient({ url: sim.urls[0]!, format: "vllm" });
    const interaction = new InteractionClient(InteractionSpec.parse({ name: "sim", url: `http://127.0.0.1:${user.port}/` }));
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { interactions: { sim: interaction }, reward: {} }));
    userTurns.length = 0;
    const o = await loop.run(SP, {
      uid: "e4-int",
      session_id: 0,
      data_source: "edge",
      prompt: [{ role: "user", content: "What is 3+3?" }],
      reward_model: { style: "rule", ground_truth: "6" },
      extra_info: { interaction_kwargs: { name: "sim", ground_truth: "6" } },
    });
    const turn1 = [...tok.encode("The answer is 5."), EOT];
    const obs = [IM_END, 198, 151644, 872, 198, ...tok.encode("Try again."), IM_END, 198, 151644, 77091, 198];
    expect(maskRuns(o)).toEqual([
      [1, turn1],
      [0, obs],
      [1, [...tok.encode("The answer is 6.\n#### 6"), IM_END]],
    ]);
    // The simulated user saw the turn's text without the stop token.
    expect(userTurns.map((u) => [u.turn, u.last.content])).toEqual([
      [1, "The answer is 5."],
      [2, "The answer is 6.\n#### 6"],
    ]);
    expect(o.extra_fields.turn_scores).toEqual([0, 1]);
    expect(o.extra_fields.terminated_by).toBe("interaction");
    expect(o.reward_score).toBe(1);
  });

  test("a custom loop (the documented self_check_agent) gets the close from ObservationEncoder", async () => {
    const client = createEngineClient({ url: sim.urls[0]!, format: "sglang" });
    const o = await runSelfCheck(tok, client, "e4-custom", "Self-check 5+5", "10");
    const check = SELF_CHECK;
    expect(maskRuns(o!)).toEqual([
      [1, [...tok.encode("#### 11"), EOT]],
      [0, [IM_END, 198, ...tok.encode(`<|im_start|>user\n${check}<|im_end|>\n<|im_start|>assistant\n`)]],
      [1, [...tok.encode("#### 10"), IM_END]],
    ]);
    expect(o!.reward_score).toBe(1);
  });

  test("a turn cut by length (no stop id) is handled as before: no close, truncated, length_stop", async () => {
    const client = createEngineClient({ url: sim.urls[0]!, format: "vllm" });
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { tools: webhookTools() }));
    const o = await loop.run(SP, { uid: "e4-len", session_id: 0, prompt: [{ role: "user", content: "Cut short" }] });
    expect(o.response_ids).toEqual(tok.encode("I will think about"));
    expect(o.response_mask.every((m) => m === 1)).toBe(true);
    expect(o.finish_reason).toBe("length");
    expect(o.truncated).toBe(true);
    expect(o.extra_fields.terminated_by).toBe("length_stop");
  });
});
