import { beforeAll, describe, expect, test } from "bun:test";
import { builtinTokenizer } from "../../shared/models/index.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { maskRuns, runSelfCheck, ScriptedClient, SELF_CHECK } from "../agent-loop/helpers.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import { startSimEngine } from "../../infra/sim-engine/server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Load the tokenizers once, with room for a loaded machine (bun's per-test default is 5 s).
beforeAll(async () => {
  await Promise.all(["gemma3"].map((n) => builtinTokenizer(n)));
}, HANG_MS);

// E5 (ISSUE13): Gemma 3's stock template refuses non-alternating roles; the
// observation encoder's synthetic history must have the real conversation's
// shape (…, assistant, user), never `system, user, user`.
const END_OF_TURN = 106;
const EOS = 1;

describe("E5: Gemma 3 stock template (roles must alternate)", () => {
  test("the template itself refuses user, user (what the old synthetic prefix rendered)", async () => {
    const tok = await builtinTokenizer("gemma3");
    expect(() => tok.renderText([{ role: "system", content: "s" }, { role: "user", content: "a" }, { role: "user", content: "b" }])).toThrow(
      "Conversation roles must alternate user/assistant/user/assistant/...",
    );
  });

  test("after sampled \"4\"+<end_of_turn>, a user turn is the template's render after the sampled tokens, mask 0", async () => {
    const tok = await builtinTokenizer("gemma3");
    const enc = new ObservationEncoder(tok);
    const obs = enc.encode([{ role: "user", content: "Check your answer." }], END_OF_TURN);
    expect(tok.decode(obs)).toBe("\n<start_of_turn>user\nCheck your answer.<end_of_turn>\n<start_of_turn>model\n");
    expect(obs).toEqual(tok.encode("\n<start_of_turn>user\nCheck your answer.<end_of_turn>\n<start_of_turn>model\n"));
    // prompt ‖ sampled ‖ observation = the template's own render of the three messages.
    const convo: ChatMessage[] = [{ role: "user", content: "What is 2+2?" }];
    const prompt = tok.renderIds(convo, { addGenerationPrompt: true });
    const sampled = [...tok.encode("4"), END_OF_TURN];
    const full = tok.renderIds([...convo, { role: "assistant", content: "4" }, { role: "user", content: "Check your answer." }], { addGenerationPrompt: true });
    expect([...prompt, ...sampled, ...obs]).toEqual(full);
  });

  test("E4 for Gemma 3: a turn ended by <eos> (1) is closed with <end_of_turn>\\n; the sampled 1 stays", async () => {
    const tok = await builtinTokenizer("gemma3");
    const enc = new ObservationEncoder(tok);
    const obs = enc.encode([{ role: "user", content: "Check your answer." }], EOS);
    expect(obs).toEqual([END_OF_TURN, ...tok.encode("\n<start_of_turn>user\nCheck your answer.<end_of_turn>\n<start_of_turn>model\n")]);
  });

  test("the documented self_check_agent loop runs on Gemma 3", async () => {
    const tok = await builtinTokenizer("gemma3");
    const check = SELF_CHECK;
    const client = new ScriptedClient(tok, [{ ids: [...tok.encode("#### 11"), END_OF_TURN] }, { ids: [...tok.encode("#### 10"), END_OF_TURN] }]);
    const o = await runSelfCheck(tok, client, "e5", "What is 5+5?", "10");
    expect(maskRuns(o!)).toEqual([
      [1, [...tok.encode("#### 11"), END_OF_TURN]],
      [0, tok.encode(`\n<start_of_turn>user\n${check}<end_of_turn>\n<start_of_turn>model\n`)],
      [1, [...tok.encode("#### 10"), END_OF_TURN]],
    ]);
    expect(o!.prompt_ids).toEqual(tok.encode("<bos><start_of_turn>user\nWhat is 5+5?<end_of_turn>\n<start_of_turn>model\n"));
    expect(o!.reward_score).toBe(1);
    // The second request's prompt is the template's own render of the conversation so far.
    expect(client.requests[1]!.prompt_ids).toEqual(
      tok.renderIds(
        [
          { role: "user", content: "What is 5+5?" },
          { role: "assistant", content: "#### 11" },
          { role: "user", content: check },
        ],
        { addGenerationPrompt: true },
      ),
    );
  });

  test("the self_check_agent loop over the real sim engine (loopback HTTP, Gemma 3 tokens): the exact E5 observation", async () => {
    const tok = await builtinTokenizer("gemma3");
    const sim = await startSimEngine({ tokenizer: tok, script: { seed: 1, rules: [{ when: "What is 2+2?", turns: ["4", "4, checked.\n#### 4"] }], default: ["?"] } });
    try {
      const o = await runSelfCheck(tok, createEngineClient({ url: sim.urls[0]!, format: "vllm" }), "e5-sim", "What is 2+2?", "4");
      const check = SELF_CHECK;
      expect(maskRuns(o!)).toEqual([
        [1, [...tok.encode("4"), END_OF_TURN]],
        [0, tok.encode(`\n<start_of_turn>user\n${check}<end_of_turn>\n<start_of_turn>model\n`)],
        [1, [...tok.encode("4, checked.\n#### 4"), END_OF_TURN]],
      ]);
      expect(o!.reward_score).toBe(1);
      expect((o as { error?: unknown }).error ?? null).toBeNull();
    } finally {
      await sim.stop();
    }
  });

  test("tool results render as ONE user turn (Gemma 3 has no tool role), so roles still alternate", async () => {
    const tok = await builtinTokenizer("gemma3");
    const enc = new ObservationEncoder(tok);
    const obs = enc.encode([{ role: "tool", content: "4" }, { role: "tool", content: "9" }], END_OF_TURN);
    expect(tok.decode(obs)).toBe("\n<start_of_turn>user\n```tool_output\n4\n```\n```tool_output\n9\n```<end_of_turn>\n<start_of_turn>model\n");
  });
});
