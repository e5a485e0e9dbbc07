import { beforeAll, describe, expect, test } from "bun:test";
import { builderPrefixKey, pushVersion, withStopIds, type TokenVersions } from "../../shared/agent-loop/agent-loop.ts";
import { ToolAgentLoop, type ToolAgentState } from "../../shared/agent-loop/tool-agent.ts";
import { prefixKeyOf } from "../../shared/inference/prefix-key.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { call, config, ctxOf, FakeTools, IM_END, ScriptedClient, SP } from "./helpers.ts";
import { HANG_MS } from "../helpers/bounds.ts";

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
}, HANG_MS);

const builder = (promptIds: number[]) => new TrajectoryBuilder({ promptIds, responseLength: 64, maxModelLen: 4096, trackLogProbs: false });

describe("builderPrefixKey: the prompt's prefix key once per trajectory, equal to prefixKeyOf on every turn", () => {
  test("block ends at a turn end inside the prompt: same key on every later context", () => {
    const prompt = [151644, 8948, 198, 1, 2, IM_END, 198, 151644, 872, 198, 3, IM_END, 198, 151644, 77091, 198];
    const b = builder(prompt);
    const k1 = builderPrefixKey(b, prompt, [IM_END]);
    expect(k1).toBe(prefixKeyOf(prompt, [IM_END]));
    expect(k1.startsWith("6-")).toBe(true);
    b.appendAction([5, 6, IM_END]);
    const ctx2 = b.contextIds();
    expect(builderPrefixKey(b, ctx2, [IM_END])).toBe(prefixKeyOf(ctx2, [IM_END]));
    expect(builderPrefixKey(b, ctx2, [IM_END])).toBe(k1);
  });

  test("a prompt with no turn end: keyed afresh each turn (its block runs into the response)", () => {
    const prompt = [1, 2, 3];
    const b = builder(prompt);
    const k1 = builderPrefixKey(b, prompt, [IM_END]);
    expect(k1).toBe(prefixKeyOf(prompt, [IM_END]));
    expect(k1.startsWith("3-")).toBe(true);
    b.appendAction([4, IM_END, 7]);
    const ctx2 = b.contextIds();
    const k2 = builderPrefixKey(b, ctx2, [IM_END]);
    expect(k2).toBe(prefixKeyOf(ctx2, [IM_END]));
    expect(k2.startsWith("5-")).toBe(true);
  });
});

describe("withStopIds: memoised per params object, same values", () => {
  test("adds the model's ids after the row's own; the same object back on the next turn; a different list is not confused", () => {
    const sp = { ...SP, stop_token_ids: [7] };
    const stops = [IM_END, 151643];
    const a = withStopIds(sp, stops);
    expect(a.stop_token_ids).toEqual([7, IM_END, 151643]);
    expect(withStopIds(sp, stops)).toBe(a);
    expect(sp.stop_token_ids).toEqual([7]);
    const list = [IM_END];
    const b = withStopIds(sp, list);
    expect(b.stop_token_ids).toEqual([7, IM_END]);
    expect(withStopIds(sp, list)).toBe(b);
    const plain = { ...SP, stop_token_ids: [IM_END] };
    expect(withStopIds(plain, list)).toBe(plain);
  });
});

describe("tool_agent: the last assistant turn's text is decoded when read", () => {
  test("reads give the last turn's text (special tokens skipped), after every turn; a set value wins", async () => {
    const tools = new FakeTools(["calc"], () => "4");
    const client = new ScriptedClient(tok, [{ text: call("calc", { x: "2+2" }) }, { text: "The answer is 4.\n#### 4" }]);
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { tools, reward: false }));
    const d = loop.initData(SP, { uid: "u", session_id: 0, prompt: [{ role: "user", content: "2+2?" }] });
    expect(d.lastAssistantText).toBe("");
    let state: ToolAgentState = "pending";
    const texts: string[] = [];
    while (state !== "terminated") {
      const was = state;
      state = await loop.advance(state, d);
      if (was === "generating") texts.push(d.lastAssistantText);
    }
    expect(texts).toEqual(['<tool_call>\n{"name": "calc", "arguments": {"x": "2+2"}}\n</tool_call>', "The answer is 4.\n#### 4"]);
    expect({ ...d }.lastAssistantText).toBe("The answer is 4.\n#### 4");
    d.lastAssistantText = "restored";
    expect(d.lastAssistantText).toBe("restored");
  });
});

describe("pushVersion compares versions by their JSON, primitives without serialising", () => {
  test("same values merge (7 and \"7\" too); different ones start segments; null, undefined and non-finite numbers are one version (JSON null)", () => {
    const segs: TokenVersions = [];
    pushVersion(segs, 0, 7);
    pushVersion(segs, 5, 7);
    // A number and its decimal string are one version (versionKey); another string is another.
    pushVersion(segs, 9, "7");
    pushVersion(segs, 10, "07");
    pushVersion(segs, 12, { v: 1 });
    pushVersion(segs, 14, { v: 1 });
    pushVersion(segs, 20, null);
    pushVersion(segs, 22, undefined);
    pushVersion(segs, 23, Number.NaN);
    pushVersion(segs, 30, 8);
    expect(segs).toEqual([[0, 7], [10, "07"], [12, { v: 1 }], [20, null], [30, 8]]);
  });
});

describe("tool_agent decodes the reward text once, and only when a reward reads it", () => {
  const runCounting = async (reward: false | undefined, rewardModel: unknown) => {
    const skips: number[][] = [];
    const counting = Object.create(tok) as ChatTokenizer;
    counting.decode = (ids, opts) => {
      if (opts?.skipSpecialTokens) skips.push(Array.from(ids));
      return tok.decode(ids, opts);
    };
    const tools = new FakeTools(["calc"], () => "4");
    const client = new ScriptedClient(tok, [{ text: call("calc", { x: "2+2" }) }, { text: "The answer is 4.\n#### 4" }]);
    const out = await new ToolAgentLoop(ctxOf(counting, client, config(), { tools, ...(reward === false ? { reward: false as const } : {}) })).run(SP, {
      uid: "u",
      session_id: 0,
      prompt: [{ role: "user", content: "2+2?" }],
      ...(rewardModel ? { reward_model: rewardModel as { style: string; ground_truth: string }, data_source: "gsm8k" } : {}),
    });
    return { skips, out, last: client.outputs[1]!.token_ids };
  };
  test("rule reward: one decode of the last turn (not one per turn); score from its text", async () => {
    const r = await runCounting(undefined, { style: "rule", ground_truth: "4" });
    expect(r.skips).toEqual([r.last]);
    expect(r.out.reward_score).toBe(1);
  });
  test("rewards off, or a row without reward_model: no reward decode at all", async () => {
    expect((await runCounting(false, { style: "rule", ground_truth: "4" })).skips).toEqual([]);
    const none = await runCounting(undefined, undefined);
    expect(none.skips).toEqual([]);
    expect(none.out.reward_score).toBeNull();
  });
});
