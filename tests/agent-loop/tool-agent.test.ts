import { beforeAll, describe, expect, test } from "bun:test";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { SingleTurnAgentLoop } from "../../shared/agent-loop/single-turn-agent.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";
import { call, config, ctxOf, FakeTools, GEN_PROMPT, IM_END, LP, maskRuns, ScriptedClient, SP, steppingClock } from "./helpers.ts";

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const row = (content = "What is 2+2?", extra: Record<string, unknown> = {}) => ({
  uid: "u1",
  session_id: 0,
  global_steps: 3,
  data_source: "test",
  prompt: [{ role: "user", content }] as ChatMessage[],
  ...extra,
});

describe("tool_agent: turn counts and the exact token stream", () => {
  test("no tool call → 2 turns, one request, mask all ones", async () => {
    const client = new ScriptedClient(tok, [{ text: "4" }]);
    const tools = new FakeTools(["calc"], () => "4");
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { tools }));
    const o = await loop.run(SP, row());
    expect(o.num_turns).toBe(2);
    expect(o.response_ids).toEqual([...tok.encode("4"), IM_END]);
    expect(o.response_mask).toEqual([1, 1]);
    expect(o.response_logprobs).toEqual([LP, LP]);
    expect(o.finish_reason).toBe("stop");
    expect(o.truncated).toBe(false);
    expect(loop.trace).toEqual(["pending", "generating", "terminated"]);
    expect(o.extra_fields).toEqual({ turn_scores: [], tool_rewards: [], dropped_tool_calls: 0, tool_calls: 0, tool_errors: 0, terminated_by: "model" });
    // The prompt carries the tool schemas.
    const user: ChatMessage = { role: "user", content: "What is 2+2?" };
    expect(o.prompt_ids).toEqual(tok.renderIds([user], { tools: tools.schemas, addGenerationPrompt: true }));
  });

  test("one tool round → 4 turns; the second request is the template's render of the conversation", async () => {
    const a1 = call("calc", { x: "2+2" });
    const client = new ScriptedClient(tok, [{ text: a1 }, { text: "The answer is 4." }]);
    const tools = new FakeTools(["calc"], () => "4");
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { tools }));
    const o = await loop.run(SP, row());
    expect(o.num_turns).toBe(4);
    expect(loop.trace).toEqual(["pending", "generating", "processing_tools", "generating", "terminated"]);
    expect(tools.calls).toEqual([{ name: "calc", arguments: { x: "2+2" }, key: "u1_0_0", turn: 1, index: 0, create_kwargs: {}, sandbox_kwargs: {}, sandbox_fresh: true, signal: undefined }]);
    const conv: ChatMessage[] = [
      { role: "user", content: "What is 2+2?" },
      { role: "assistant", content: a1 },
      { role: "tool", content: "4" },
    ];
    const expected = tok.renderIds(conv, { tools: tools.schemas, addGenerationPrompt: true });
    expect(client.requests[1]!.prompt_ids).toEqual(expected);
    expect([...o.prompt_ids, ...o.response_ids]).toEqual([...expected, ...tok.encode("The answer is 4."), IM_END]);
    // Observation (after the model's <|im_end|>): separator, tool turn, generation prompt — all mask 0, log-prob 0.
    const a1ids = [...tok.encode(a1), IM_END];
    const obs = [198, 151644, 872, 198, 151665, 198, ...tok.encode("4"), 198, 151666, 151645, 198, ...GEN_PROMPT];
    expect(maskRuns(o)).toEqual([
      [1, a1ids],
      [0, obs],
      [1, [...tok.encode("The answer is 4."), IM_END]],
    ]);
    expect(o.response_logprobs).toEqual([...a1ids.map(() => LP), ...obs.map(() => 0), ...tok.encode("The answer is 4.").map(() => LP), LP]);
    // Fresh request id per call, trajectory key as routing key, max_tokens from the remaining budget.
    expect(client.requests.map((r) => [r.request_id, r.routing_key, r.max_tokens])).toEqual([
      ["r1", "u1_0_0", 512],
      ["r2", "u1_0_0", 512 - a1ids.length - obs.length],
    ]);
  });

  test("C4: two parallel results are one user turn, each exactly once", async () => {
    const a1 = call("a") + "\n" + call("b");
    const client = new ScriptedClient(tok, [{ text: a1 }, { text: "done" }]);
    const tools = new FakeTools(["a", "b"], (r) => (r.name === "a" ? "AAA" : "BBB"));
    const o = await new ToolAgentLoop(ctxOf(tok, client, config({ multi_turn: { max_parallel_calls: 2 } }), { tools })).run(SP, row());
    const r = maskRuns(o);
    expect(r[1]).toEqual([
      0,
      [198, 151644, 872, 198, 151665, 198, 50107, 198, 151666, 198, 151665, 198, 10098, 33, 198, 151666, 151645, 198, ...GEN_PROMPT],
    ]);
    expect(tools.calls.map((c) => [c.name, c.index, c.turn])).toEqual([
      ["a", 0, 1],
      ["b", 1, 1],
    ]);
    expect(o.num_turns).toBe(4);
  });

  test("C9: a call drafted in <think> is not executed", async () => {
    const a1 = `<think>\nplan: <tool_call>{"name": "A", "arguments": {}}</tool_call>\n</think>\n\n<tool_call>\n{"name": "A", "arguments": {}}\n</tool_call>`;
    const client = new ScriptedClient(tok, [{ text: a1 }, { text: "ok" }]);
    const tools = new FakeTools(["A"], () => "fine");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config({ multi_turn: { max_parallel_calls: 4 } }), { tools })).run(SP, row());
    expect(tools.calls.length).toBe(1);
    expect(o.extra_fields.dropped_tool_calls).toBe(0);
    expect(o.num_turns).toBe(4);
  });
});

describe("rule reward without ground_truth", () => {
  test("the record says so: reward_score null and extra_fields.reward_error", async () => {
    const client = new ScriptedClient(tok, [{ text: "#### 4" }]);
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { tools: new FakeTools(["calc"], () => "4") }));
    const o = await loop.run(SP, row("What is 2+2?", { reward_model: { style: "rule" } }));
    expect(o.reward_score).toBeNull();
    expect(o.extra_fields.reward_error).toBe("reward_model.ground_truth is missing: the rule reward compares the final answer with it");
    const scored = await new ToolAgentLoop(ctxOf(tok, new ScriptedClient(tok, [{ text: "#### 4" }]), config(), { tools: new FakeTools(["calc"], () => "4") })).run(SP, row("What is 2+2?", { reward_model: { style: "rule", ground_truth: "4" } }));
    expect([scored.reward_score, scored.extra_fields.reward_error]).toEqual([1.0, undefined]);
  });
});

describe("C10: unknown tool, bad JSON → error observations, the loop goes on", () => {
  test("unknown tool", async () => {
    const client = new ScriptedClient(tok, [{ text: call("solve", { x: "1" }) }, { text: "sorry" }]);
    const tools = new FakeTools(["calc"], () => "never");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config(), { tools })).run(SP, row());
    const obs = maskRuns(o)[1]!;
    expect(obs[0]).toBe(0);
    expect(tok.decode(obs[1])).toBe(
      "\n<|im_start|>user\n<tool_response>\nUnknown function 'solve'. Available tools: ['calc']\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    );
    expect(client.requests.length).toBe(2);
    expect(o.extra_fields.tool_errors).toBe(1);
    expect(o.num_turns).toBe(4);
    expect(o.finish_reason).toBe("stop");
  });

  test("bad JSON arguments", async () => {
    const bad = '<tool_call>\n{"name": "calc", "arguments": {"x": 1,}}\n</tool_call>';
    const client = new ScriptedClient(tok, [{ text: bad }, { text: "retrying" }]);
    const tools = new FakeTools(["calc"], () => "never");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config(), { tools })).run(SP, row());
    expect(tools.calls).toEqual([]);
    expect(tok.decode(maskRuns(o)[1]![1])).toContain(
      `<tool_response>\nInvalid JSON in tool call for 'calc'; a tool call must be <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>.\n</tool_response>`,
    );
    expect(o.extra_fields.tool_errors).toBe(1);
    expect(client.requests.length).toBe(2);
  });
});

describe("C13: a length stop is a length stop", () => {
  const text = call("calc", { x: "1" }) + '\n<tool_call>\n{"name": "calc", "argu';
  test("no call executed, truncated, one request", async () => {
    const client = new ScriptedClient(tok, [{ text, finish_reason: "length" }]);
    const tools = new FakeTools(["calc"], () => "1");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config(), { tools })).run(SP, row());
    expect(tools.calls).toEqual([]);
    expect(client.requests.length).toBe(1);
    expect(o.truncated).toBe(true);
    expect(o.finish_reason).toBe("length");
    expect(o.extra_fields.terminated_by).toBe("length_stop");
    expect(o.response_ids).toEqual(tok.encode(text));
    expect(o.num_turns).toBe(2);
  });
  test("execute_calls_on_length runs the complete call only", async () => {
    const client = new ScriptedClient(tok, [{ text, finish_reason: "length" }, { text: "ok" }]);
    const tools = new FakeTools(["calc"], () => "1");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config({ multi_turn: { execute_calls_on_length: true } }), { tools })).run(SP, row());
    expect(tools.calls.map((c) => c.arguments)).toEqual([{ x: "1" }]);
    expect(o.extra_fields.tool_errors).toBe(0);
    expect(o.truncated).toBe(false);
    expect(o.num_turns).toBe(4);
    // No turn separator after a turn that did not end with <|im_end|>.
    expect(maskRuns(o)[1]![1].slice(0, 3)).toEqual([151644, 872, 198]);
  });
});

describe("limits", () => {
  test("max_assistant_turns: the turn's call is not executed", async () => {
    const client = new ScriptedClient(tok, [{ text: call("calc") }]);
    const tools = new FakeTools(["calc"], () => "1");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config({ multi_turn: { max_assistant_turns: 1 } }), { tools })).run(SP, row());
    expect(tools.calls).toEqual([]);
    expect(o.num_turns).toBe(2);
    expect([o.finish_reason, o.truncated, o.extra_fields.terminated_by]).toEqual(["stop", false, "max_assistant_turns"]);
  });

  test("max_user_turns: one tool round, then the next call is not executed", async () => {
    const client = new ScriptedClient(tok, [{ text: call("calc") }, { text: call("calc") }]);
    const tools = new FakeTools(["calc"], () => "1");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config({ multi_turn: { max_user_turns: 1 } }), { tools })).run(SP, row());
    expect(tools.calls.length).toBe(1);
    expect(o.num_turns).toBe(4);
    expect(o.extra_fields.terminated_by).toBe("max_user_turns");
  });

  test("max_parallel_calls: extra calls are not executed and are counted", async () => {
    const client = new ScriptedClient(tok, [{ text: [call("calc", { x: "1" }), call("calc", { x: "2" }), call("calc", { x: "3" })].join("\n") }, { text: "ok" }]);
    const tools = new FakeTools(["calc"], (r) => String(r.arguments && (r.arguments as { x: string }).x));
    const o = await new ToolAgentLoop(ctxOf(tok, client, config({ multi_turn: { max_parallel_calls: 2 } }), { tools })).run(SP, row());
    expect(tools.calls.map((c) => c.arguments)).toEqual([{ x: "1" }, { x: "2" }]);
    expect(o.extra_fields.dropped_tool_calls).toBe(1);
  });

  const long = "BEGIN-" + "x".repeat(50) + "-END";
  for (const [side, expected] of [
    ["left", "(truncated)...xxxxx-END"],
    ["right", "BEGIN-xxx...(truncated)"],
    ["middle", "BEGI...(truncated)...-END"],
  ] as const) {
    test(`max_tool_response_length with truncate side ${side}`, async () => {
      const client = new ScriptedClient(tok, [{ text: call("calc") }, { text: "ok" }]);
      const tools = new FakeTools(["calc"], () => long);
      const cfg = config({ multi_turn: { max_tool_response_length: side === "middle" ? 8 : 9, tool_response_truncate_side: side } });
      const o = await new ToolAgentLoop(ctxOf(tok, client, cfg, { tools })).run(SP, row());
      expect(tok.decode(maskRuns(o)[1]![1])).toBe(`\n<|im_start|>user\n<tool_response>\n${expected}\n</tool_response><|im_end|>\n<|im_start|>assistant\n`);
    });
  }

  test("an observation overflowing response_length is cut and ends the trajectory truncated (C8 shape)", async () => {
    const a1 = call("calc");
    const a1ids = [...tok.encode(a1), IM_END];
    const client = new ScriptedClient(tok, [{ text: a1 }, { text: "never" }]);
    const tools = new FakeTools(["calc"], () => "a long tool answer that will not fit");
    const cfg = config({ response_length: a1ids.length + 5 });
    const o = await new ToolAgentLoop(ctxOf(tok, client, cfg, { tools })).run(SP, row());
    expect(client.requests.length).toBe(1);
    expect(o.response_ids.length).toBe(a1ids.length + 5);
    expect(o.response_ids.slice(a1ids.length)).toEqual([198, 151644, 872, 198, 151665]);
    expect(o.response_mask).toEqual([...a1ids.map((): 0 | 1 => 1), 0, 0, 0, 0, 0]);
    expect([o.truncated, o.finish_reason, o.extra_fields.terminated_by, o.num_turns]).toEqual([true, "length", "response_length", 3]);
  });

  test("no room left in the context: no request, truncated (C11/C12)", async () => {
    const a1 = call("calc");
    const client = new ScriptedClient(tok, [{ text: a1 }, { text: "never" }]);
    const tools = new FakeTools(["calc"], () => "1");
    const probe = new ScriptedClient(tok, [{ text: "x" }]);
    await new ToolAgentLoop(ctxOf(tok, probe, config(), { tools })).run(SP, row());
    const promptLen = probe.requests[0]!.prompt_ids.length;
    const a1len = tok.encode(a1).length + 1;
    const obsLen = 13 + tok.encode("1").length;
    const cfg = config({ prompt_length: promptLen, max_model_len: promptLen + a1len + obsLen });
    const o = await new ToolAgentLoop(ctxOf(tok, client, cfg, { tools })).run(SP, row());
    expect(client.requests.map((r) => r.max_tokens)).toEqual([a1len + obsLen]);
    expect([o.truncated, o.finish_reason, o.extra_fields.terminated_by]).toEqual([true, "length", "max_model_len"]);
    expect(o.response_ids.length).toBe(a1len + obsLen);
  });

  test("the response budget used up by an action with pending calls ends truncated", async () => {
    const a1 = call("calc");
    const n = tok.encode(a1).length + 1;
    const client = new ScriptedClient(tok, [{ text: a1 }]);
    const tools = new FakeTools(["calc"], () => "1");
    const o = await new ToolAgentLoop(ctxOf(tok, client, config({ response_length: n }), { tools })).run(SP, row());
    expect(client.requests[0]!.max_tokens).toBe(n);
    expect(tools.calls).toEqual([]);
    expect([o.truncated, o.finish_reason, o.extra_fields.terminated_by]).toEqual([true, "length", "response_length"]);
  });
});

describe("metrics, rewards, versions, interactions", () => {
  test("seconds accumulated over turns; num_preempted summed; model versions; tool rewards; rule reward", async () => {
    const client = new ScriptedClient(tok, [
      { text: call("calc"), num_preempted: -1, extra_fields: { model_version: 7 } },
      { text: "#### 4", num_preempted: 2, extra_fields: { model_version: 8 } },
    ]);
    const tools = new FakeTools(["calc"], () => ({ content: "4", reward: 0.5 }));
    const o = await new ToolAgentLoop(ctxOf(tok, client, config(), { tools, nowMs: steppingClock(500) })).run(
      SP,
      row("2+2?", { reward_model: { style: "rule", ground_truth: "4" } }),
    );
    expect(o.metrics).toEqual({ generate_sequences: 1, tool_calls: 0.5, compute_score: 0.5, num_preempted: 2 });
    expect(o.reward_score).toBe(1);
    expect(o.extra_fields.model_versions).toEqual([7, 8]);
    expect(o.extra_fields.tool_rewards).toEqual([0.5]);
  });

  test("a tool reply's metrics land in extra_fields.tool_metrics, per call in order; absent when no reply has any", async () => {
    const client = new ScriptedClient(tok, [{ text: call("calc") + call("lookup") }, { text: call("calc") }, { text: "done" }]);
    let n = 0;
    const tools = new FakeTools(["calc", "lookup"], (req) => (req.name === "calc" ? { content: "4", metrics: { n: ++n, sandbox: "py" } } : "no metrics"));
    const cfg = config({ multi_turn: { max_parallel_calls: 2 } });
    const o = await new ToolAgentLoop(ctxOf(tok, client, cfg, { tools })).run(SP, row());
    expect(o.extra_fields.tool_metrics).toEqual([
      { turn: 1, name: "calc", metrics: { n: 1, sandbox: "py" } },
      { turn: 2, name: "calc", metrics: { n: 2, sandbox: "py" } },
    ]);
    const plain = await new ToolAgentLoop(ctxOf(tok, new ScriptedClient(tok, [{ text: call("calc") }, { text: "x" }]), config(), { tools: new FakeTools(["calc"], () => "1") })).run(SP, row());
    expect("tool_metrics" in plain.extra_fields).toBe(false);
  });

  test("num_preempted stays -1 when no call reports it", async () => {
    const client = new ScriptedClient(tok, [{ text: call("calc") }, { text: "x" }]);
    const o = await new ToolAgentLoop(ctxOf(tok, client, config(), { tools: new FakeTools(["calc"], () => "1") })).run(SP, row());
    expect(o.metrics.num_preempted).toBe(-1);
  });

  test("create_kwargs come from extra_info.tools_kwargs; tool_selection narrows the prompt's tools", async () => {
    const client = new ScriptedClient(tok, [{ text: call("b") }, { text: "x" }]);
    const tools = new FakeTools(["a", "b"], () => "ok");
    (tools as any).select = (names: string[]) => {
      const t = new FakeTools(["a", "b"].filter((n) => names.includes(n)), () => "ok");
      (tools as any).selected = t;
      return t;
    };
    await new ToolAgentLoop(ctxOf(tok, client, config(), { tools })).run(SP, row("hi", { extra_info: { tools_kwargs: { b: { create_kwargs: { seed: 1 } } }, tool_selection: ["b"] } }));
    expect((tools as any).selected.calls.map((c: any) => [c.name, c.create_kwargs])).toEqual([["b", { seed: 1 }]]);
    expect(client.requests[0]!.prompt_ids).toEqual(tok.renderIds([{ role: "user", content: "hi" }], { tools: [tools.schemas[1]!], addGenerationPrompt: true }));
  });

  test("interaction: the user's reply is an observation (C3 ids), scores go to turn_scores, terminate ends", async () => {
    const replies = [
      { terminate: false, content: "Q2", score: 0 },
      { terminate: true, content: "bye", score: 1 },
    ];
    const seen: any[] = [];
    const interaction = { spec: { name: "sim" }, respond: async (r: any) => (seen.push(structuredClone({ turn: r.turn, n: r.messages.length, ik: r.interaction_kwargs })), replies.shift()!) } as any;
    const a1 = "<think>\nr1\n</think>\n\nA1";
    const client = new ScriptedClient(tok, [{ text: a1 }, { text: "A2" }]);
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { interactions: { sim: interaction } }));
    const o = await loop.run(SP, { uid: "u1", session_id: 0, prompt: [{ role: "user", content: "Q1" }], extra_info: { interaction_kwargs: { name: "sim", ground_truth: 2 } } });
    expect(o.prompt_ids).toEqual([151644, 872, 198, 48, 16, 151645, 198, 151644, 77091, 198]);
    expect(maskRuns(o)).toEqual([
      [1, [151667, 198, 81, 16, 198, 151668, 271, 32, 16, 151645]],
      [0, [198, 151644, 872, 198, 48, 17, 151645, 198, 151644, 77091, 198]],
      [1, [...tok.encode("A2"), IM_END]],
    ]);
    expect(o.extra_fields.turn_scores).toEqual([0, 1]);
    expect(o.num_turns).toBe(5);
    expect(o.extra_fields.terminated_by).toBe("interaction");
    expect(loop.trace).toEqual(["pending", "generating", "interacting", "generating", "interacting", "terminated"]);
    expect(seen).toEqual([
      { turn: 1, n: 2, ik: { name: "sim", ground_truth: 2 } },
      { turn: 2, n: 4, ik: { name: "sim", ground_truth: 2 } },
    ]);
  });

  test("an unknown interaction name fails the row before any request", async () => {
    const client = new ScriptedClient(tok, []);
    const p = new ToolAgentLoop(ctxOf(tok, client, config(), { interactions: {} })).run(SP, { ...row(), extra_info: { interaction_kwargs: { name: "nope" } } });
    await expect(p).rejects.toThrow("extra_info.interaction_kwargs.name: unknown interaction 'nope'; configured interactions: []");
    // Names of Object.prototype's own properties name no interaction either.
    for (const name of ["__proto__", "constructor", "toString"]) {
      const q = new ToolAgentLoop(ctxOf(tok, client, config(), { interactions: {} })).run(SP, { ...row(), extra_info: { interaction_kwargs: { name } } });
      await expect(q).rejects.toThrow(`extra_info.interaction_kwargs.name: unknown interaction '${name}'; configured interactions: []`);
    }
    expect(client.requests.length).toBe(0);
  });

  test("no interaction_kwargs.name: the first configured interaction; none configured, or a non-string name: the row fails before any request", async () => {
    const asked: string[] = [];
    const user = (name: string) => ({ spec: { name }, respond: async () => (asked.push(name), { terminate: true, content: "ok", score: 1 }) }) as any;
    const client = new ScriptedClient(tok, [{ text: "A1" }]);
    const o = await new ToolAgentLoop(ctxOf(tok, client, config(), { interactions: { first: user("first"), second: user("second") } })).run(SP, {
      ...row(),
      extra_info: { interaction_kwargs: { ground_truth: 1 } },
    });
    expect([asked, o.extra_fields.turn_scores, o.extra_fields.terminated_by]).toEqual([["first"], [1], "interaction"]);
    const none = new ScriptedClient(tok, []);
    await expect(new ToolAgentLoop(ctxOf(tok, none, config(), { interactions: {} })).run(SP, { ...row(), extra_info: { interaction_kwargs: {} } })).rejects.toThrow(
      "extra_info.interaction_kwargs: the row asks for a simulated user but none is configured (add `interactions: [{name, url}]` to the tools file)",
    );
    await expect(new ToolAgentLoop(ctxOf(tok, none, config(), { interactions: { first: user("first") } })).run(SP, { ...row(), extra_info: { interaction_kwargs: { name: 3 } } })).rejects.toThrow(
      "extra_info.interaction_kwargs.name: must be a string naming one of the configured interactions ['first']",
    );
    expect(none.requests.length).toBe(0);
  });
});

describe("single_turn_agent", () => {
  test("no tools in the prompt, one generation, mask all ones, 2 turns, rule reward", async () => {
    const client = new ScriptedClient(tok, [{ text: "It is #### 72", num_preempted: 0, extra_fields: { model_version: 3 } }]);
    const o = await new SingleTurnAgentLoop(ctxOf(tok, client, config(), { tools: new FakeTools(["calc"], () => "") })).run(
      SP,
      row("q", { reward_model: { style: "rule", ground_truth: 72 } }),
    );
    expect(o.prompt_ids).toEqual(tok.renderIds([{ role: "user", content: "q" }], { addGenerationPrompt: true }));
    expect(o.response_ids).toEqual([...tok.encode("It is #### 72"), IM_END]);
    expect(o.response_mask.every((m) => m === 1)).toBe(true);
    expect([o.num_turns, o.reward_score, o.finish_reason, o.truncated, o.metrics.num_preempted]).toEqual([2, 1, "stop", false, 0]);
    expect(o.extra_fields).toEqual({ turn_scores: [], tool_rewards: [], model_versions: [3], token_versions: [[0, 3]] });
    expect(client.requests[0]!.max_tokens).toBe(512);
  });

  test("length stop → truncated; no room → no request", async () => {
    const c1 = new ScriptedClient(tok, [{ text: "abc", finish_reason: "length" }]);
    const o1 = await new SingleTurnAgentLoop(ctxOf(tok, c1, config())).run(SP, row());
    expect([o1.truncated, o1.finish_reason]).toEqual([true, "length"]);
    const promptLen = tok.renderIds(row().prompt, { addGenerationPrompt: true }).length;
    const c2 = new ScriptedClient(tok, []);
    const o2 = await new SingleTurnAgentLoop(ctxOf(tok, c2, config({ max_model_len: promptLen + 1, prompt_length: promptLen }), { maxModelLen: promptLen })).run(SP, row());
    expect(c2.requests.length).toBe(0);
    expect([o2.truncated, o2.finish_reason, o2.response_ids, o2.num_turns]).toEqual([true, "length", [], 2]);
  });

  test("without log-probs the output has none", async () => {
    const client = new ScriptedClient(tok, [{ text: "x" }]);
    const o = await new SingleTurnAgentLoop(ctxOf(tok, client, config())).run({ ...SP, logprobs: false }, row());
    expect(o.response_logprobs).toBe(null);
  });
});
