import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { SingleTurnAgentLoop } from "../../shared/agent-loop/single-turn-agent.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { createEngineClient } from "../../shared/inference/index.ts";
import type { AgentLoopOutput, ChatMessage, RolloutConfigInput } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { call, config, ctxOf, FakeTools, SP } from "./helpers.ts";

const MOE = { layers: 2, top_k: 2, num_experts: 8 };
const PER = MOE.layers * MOE.top_k;
const SCRIPT = {
  seed: 11,
  rules: [{ when: "2+2", turns: [call("calc", { x: "2+2" }), "The answer is 4."] }],
  default: ["Hello there, friend."],
};

let tok: ChatTokenizer;
let sim: RunningSimEngine;
let engine: SimEngine;
beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({ replicas: 1, script: SCRIPT, tokenizer: tok, moe: MOE });
  engine = sim.replicas[0]!.engine;
});
afterAll(() => sim.stop());

const row = (content: string) => ({ uid: "u1", session_id: 0, data_source: "t", prompt: [{ role: "user", content }] as ChatMessage[] });
const sglang = () => createEngineClient({ url: sim.urls[0]!, format: "sglang", moe: { layers: MOE.layers, top_k: MOE.top_k } });
const cfg = (over: RolloutConfigInput = {}) => config({ return_routed_experts: true, ...over });
const stream = (o: AgentLoopOutput) => [...o.prompt_ids, ...o.response_ids];
/** What the engine routes for the first `covered` positions of the trajectory's stream, then the fill value 0 up to its end. */
const expected = (o: AgentLoopOutput, covered: number) => [...engine.routedExperts(stream(o), covered), ...new Array((stream(o).length - covered) * PER).fill(0)];

describe("tool_agent through the sim engine over HTTP (SGLang /generate)", () => {
  test("routed experts cover prompt ‖ A1 ‖ O1 ‖ A2 except the final sampled token; the observation holds the second call's prefill experts", async () => {
    const tools = new FakeTools(["calc"], () => "4");
    const o = await new ToolAgentLoop(ctxOf(tok, sglang(), cfg(), { tools })).run(SP, row("What is 2+2?"));
    expect(o.num_turns).toBe(4);
    expect(o.routed_experts_shape).toEqual([2, 2]);
    const n = stream(o).length;
    expect(o.routed_experts!.length).toBe(n * PER);
    expect(o.routed_experts).toEqual(expected(o, n - 1));
    // The observation's positions are the ones only the second call covered.
    const obsStart = o.prompt_ids.length + o.response_mask.indexOf(0);
    const obsEnd = o.prompt_ids.length + o.response_mask.lastIndexOf(0) + 1;
    expect(o.routed_experts!.slice(obsStart * PER, obsEnd * PER)).toEqual(Array.from(engine.routedExperts(stream(o), obsEnd).subarray(obsStart * PER)));
    expect(o.routed_experts!.slice((n - 1) * PER)).toEqual([0, 0, 0, 0]);
    // Both requests asked for them.
    expect(engine.requests.slice(-2).map((r) => r.endpoint)).toEqual(["/generate", "/generate"]);
  });

  test("without rollout.return_routed_experts the output has neither field", async () => {
    const tools = new FakeTools(["calc"], () => "4");
    const o = await new ToolAgentLoop(ctxOf(tok, sglang(), config(), { tools })).run(SP, row("What is 2+2?"));
    expect("routed_experts" in o).toBe(false);
    expect("routed_experts_shape" in o).toBe(false);
  });

  test("response_length cuts the second action: the experts are cut with it (every kept position covered)", async () => {
    const tools = new FakeTools(["calc"], () => "4");
    const full = await new ToolAgentLoop(ctxOf(tok, sglang(), cfg(), { tools })).run(SP, row("What is 2+2?"));
    const budget = full.response_ids.length - 3;
    const o = await new ToolAgentLoop(ctxOf(tok, sglang(), cfg({ response_length: budget }), { tools })).run(SP, row("What is 2+2?"));
    expect(o.truncated).toBe(true);
    expect(o.response_ids).toEqual(full.response_ids.slice(0, budget));
    // max_tokens made the engine stop at the budget: its last token is the trajectory's last, never forwarded.
    expect(o.routed_experts).toEqual(expected(o, stream(o).length - 1));
  });

  test("max_model_len and a left-truncated prompt: aligned with the kept prompt ‖ response", async () => {
    const long = "What is 2+2? " + "Please think carefully about it. ".repeat(20);
    const o = await new SingleTurnAgentLoop(ctxOf(tok, sglang(), cfg({ prompt_length: 40, max_model_len: 45 }))).run(SP, row(long));
    expect(o.extra_fields.prompt_truncated).toBe(true);
    expect(o.prompt_ids.length).toBe(40);
    // SGLang serves at most context_len − 1 tokens (it refuses input + max_new_tokens >= context_len).
    expect(o.response_ids.length).toBe(4);
    expect(o.truncated).toBe(true);
    expect(o.routed_experts!.length).toBe(44 * PER);
    expect(o.routed_experts).toEqual(expected(o, 43));
  });
});

describe("abort-resume keeps the experts aligned", () => {
  test("single_turn_agent: an engine abort after 2 tokens is resumed; the resumed call's experts cover the whole stream", async () => {
    const local = new SimEngine({ tokenizer: tok, script: SCRIPT, moe: MOE, fault: { kind: "abort_after", tokens: 2, times: 1 } });
    const o = await new SingleTurnAgentLoop(ctxOf(tok, new SimEngineClient(local), cfg())).run(SP, row("Say hello."));
    expect(o.metrics.num_preempted).toBe(1);
    expect(local.requests.map((r) => r.finish_reason)).toEqual(["abort", "stop"]);
    expect(o.response_ids).toEqual([...tok.encode("Hello there, friend."), 151645]);
    const n = stream(o).length;
    expect(o.routed_experts).toEqual([...local.routedExperts(stream(o), n - 1), 0, 0, 0, 0]);
  });

  test("tool_agent: the second turn aborted twice (pause-style) and resumed: experts of the whole stream stay aligned", async () => {
    const local = new SimEngine({ tokenizer: tok, script: SCRIPT, moe: MOE, fault: { kind: "abort_after", tokens: 2, turn: 1, times: 2 } });
    const tools = new FakeTools(["calc"], () => "4");
    const o = await new ToolAgentLoop(ctxOf(tok, new SimEngineClient(local), cfg(), { tools })).run(SP, row("What is 2+2?"));
    expect(o.finish_reason).toBe("stop");
    expect(o.metrics.num_preempted).toBe(2);
    expect(local.requests.map((r) => r.finish_reason)).toEqual(["stop", "abort", "abort", "stop"]);
    const n = stream(o).length;
    expect(o.routed_experts!.length).toBe(n * PER);
    expect(o.routed_experts).toEqual([...local.routedExperts(stream(o), n - 1), 0, 0, 0, 0]);
  });
});

describe("custom loops' outputs", () => {
  test("routed_experts must be an array when present (named); its values are left to the validator", async () => {
    const { loopOutputs } = await import("../../shared/agent-loop/registry.ts");
    const base = { prompt_ids: [1], response_ids: [2], response_mask: [1], response_logprobs: null, num_turns: 2, metrics: {} };
    expect(() => loopOutputs("mine", { ...base, routed_experts: "AAAA", routed_experts_shape: [1, 1] })).toThrow("agent_loop 'mine' output[0].routed_experts: expected an array of expert ids or absent, got string");
    const [o] = loopOutputs("mine", { ...base, routed_experts: [4, 5], routed_experts_shape: [1, 1] });
    expect([o!.routed_experts, o!.routed_experts_shape]).toEqual([[4, 5], [1, 1]]);
    expect("routed_experts" in loopOutputs("mine", base)[0]!).toBe(false);
  });
});
