import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { OpenEnvAgentLoop, firstJsonObject, observationText, openEnvSettingsFor } from "../../shared/agent-loop/openenv-agent.ts";
import { OpenEnvError } from "../../shared/agent-loop/openenv-client.ts";
import { runAgentLoop } from "../../shared/agent-loop/registry.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { InputError } from "../../shared/errors.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { BatchRun } from "../../shared/rollout/batch-run.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { OpenEnvSettings, type OpenEnvSettingsInput } from "../../shared/schema/openenv.ts";
import type { AgentLoopOutput, ChatMessage, TokenOutput } from "../../shared/schema/index.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { config, ctxOf, GEN_PROMPT, IM_END, LP, maskRuns, ScriptedClient, SP } from "./helpers.ts";
import { startOpenEnvServer, type OpenEnvTestServer } from "./openenv-server.ts";

let tok: ChatTokenizer;
let servers: OpenEnvTestServer[] = [];
beforeAll(async () => {
  tok = await defaultTokenizer();
});
afterAll(async () => {
  await Promise.all(servers.map((s) => s.stop()));
});

function server(opts: Parameters<typeof startOpenEnvServer>[0] = {}): OpenEnvTestServer {
  const s = startOpenEnvServer(opts);
  servers.push(s);
  return s;
}

const settings = (over: OpenEnvSettingsInput = {}) => ({ settings: OpenEnvSettings.parse(over) });

const USER: ChatMessage = { role: "user", content: "Play the game. Answer with one number." };
const row = (extra: Record<string, unknown> = {}) => ({ uid: "u1", session_id: 0, data_source: "openenv", prompt: [USER], extra_info: { openenv: { reset_kwargs: { seed: 6 } } }, ...extra });

/** The observation tokens after an assistant turn ended by `<|im_end|>`: separator, a user turn with `text`, the generation prompt. */
const userObs = (text: string) => [198, 151644, 872, 198, ...tok.encode(text), IM_END, 198, ...GEN_PROMPT];
const turn = (text: string) => [...tok.encode(text), IM_END];

describe("openenv_agent over HTTP: guess-the-number, token-exact", () => {
  test("reset → prompt; one step per turn; observations mask 0; rewards into turn_scores; ends on done", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "5" }, { text: "8" }, { text: "7" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url, transport: "http", observation: { field: "prompt" } }) }));
    const o = await loop.run(SP, row());

    // The reset observation (its `prompt` field) is a user turn after the row's prompt.
    const conv: ChatMessage[] = [USER, { role: "user", content: "Guess the number (1-10)." }];
    expect(o.prompt_ids).toEqual(tok.renderIds(conv, { addGenerationPrompt: true }));
    expect(maskRuns(o)).toEqual([
      [1, turn("5")],
      [0, userObs("Higher.")],
      [1, turn("8")],
      [0, userObs("Lower.")],
      [1, turn("7")],
    ]);
    const lps = o.response_mask.map((m) => (m === 1 ? LP : 0));
    expect(o.response_logprobs).toEqual(lps);
    // Every engine request is the template's own render of the conversation so far.
    conv.push({ role: "assistant", content: "5" }, { role: "user", content: "Higher." });
    expect(client.requests[1]!.prompt_ids).toEqual(tok.renderIds(conv, { addGenerationPrompt: true }));
    conv.push({ role: "assistant", content: "8" }, { role: "user", content: "Lower." });
    expect(client.requests[2]!.prompt_ids).toEqual(tok.renderIds(conv, { addGenerationPrompt: true }));
    expect([...o.prompt_ids, ...o.response_ids]).toEqual([...tok.renderIds(conv, { addGenerationPrompt: true }), ...turn("7")]);

    expect(o.extra_fields).toEqual({
      turn_scores: [-0.25, -0.25, 1],
      tool_rewards: [],
      env_steps: 3,
      invalid_actions: 0,
      terminated_by: "env_done",
      openenv: { url: env.url, transport: "http" },
    });
    expect(o.reward_score).toBe(0.5);
    expect(o.finish_reason).toBe("stop");
    expect(o.truncated).toBe(false);
    // 3 observations (the final "Correct!" counted, not appended) + 3 assistant turns + 1.
    expect(o.num_turns).toBe(7);
    expect(loop.trace).toEqual(["pending", "generating", "processing_tools", "generating", "processing_tools", "generating", "processing_tools", "terminated"]);
    // Exactly one reset and one step per turn, with the protocol's bodies.
    expect(env.log.http).toEqual([
      { method: "POST", path: "/reset", body: { episode_id: "u1_0_0", seed: 6 } },
      { method: "POST", path: "/step", body: { action: { message: "5" }, request_id: "u1_0_0:1" } },
      { method: "POST", path: "/step", body: { action: { message: "8" }, request_id: "u1_0_0:2" } },
      { method: "POST", path: "/step", body: { action: { message: "7" }, request_id: "u1_0_0:3" } },
    ]);
    expect(env.steps()).toBe(3);
  });

  test("reward: last; JSON observation text by default; max_assistant_turns stops after that turn's step", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "1" }, { text: "2" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config({ multi_turn: { max_assistant_turns: 2 } }), { openenv: settings({ base_url: env.url, transport: "http", reward: "last" }) }));
    const o = await loop.run(SP, row());
    const resetText = JSON.stringify({ prompt: "Guess the number (1-10).", attempts_left: 3 });
    expect(o.prompt_ids).toEqual(tok.renderIds([USER, { role: "user", content: resetText }], { addGenerationPrompt: true }));
    expect(maskRuns(o)).toEqual([
      [1, turn("1")],
      [0, userObs(JSON.stringify({ prompt: "Higher.", attempts_left: 2 }))],
      [1, turn("2")],
    ]);
    expect(env.steps()).toBe(2);
    expect(o.extra_fields.turn_scores).toEqual([-0.25, -0.25]);
    expect(o.extra_fields.terminated_by).toBe("max_assistant_turns");
    expect(o.reward_score).toBe(-0.25);
    expect(o.num_turns).toBe(4);
  });

  test("action format json, the reset merged into the prompt, tool-role observations; an invalid action gets an error turn and no step", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "I think five." }, { text: 'Final: {"message": "7"}' }]);
    const loop = new OpenEnvAgentLoop(
      ctxOf(tok, client, config(), {
        openenv: settings({ base_url: env.url, transport: "http", action: { format: "json" }, observation: { field: "prompt", reset: "merge", role: "tool" } }),
      }),
    );
    const o = await loop.run(SP, row());
    // Merged: one user message holding the row's text and the reset observation.
    expect(o.prompt_ids).toEqual(tok.renderIds([{ role: "user", content: `${USER.content}\n\nGuess the number (1-10).` }], { addGenerationPrompt: true }));
    const err = "Error: no JSON object in the reply; answer with the action as one JSON object.";
    expect(maskRuns(o)).toEqual([
      [1, turn("I think five.")],
      [0, [198, 151644, 872, 198, 151665, ...tok.encode(`\n${err}\n`), 151666, IM_END, 198, ...GEN_PROMPT]],
      [1, turn('Final: {"message": "7"}')],
    ]);
    expect(env.log.http.filter((h) => h.path === "/step").map((h) => h.body)).toEqual([{ action: { message: "7" }, request_id: "u1_0_0:2" }]);
    expect(o.extra_fields).toMatchObject({ turn_scores: [1], env_steps: 1, invalid_actions: 1, terminated_by: "env_done" });
    expect(o.reward_score).toBe(1);
    expect(o.num_turns).toBe(5);
  });

  test("action format json with on_invalid: end stops at the first turn without an action (no step)", async () => {
    const env = server();
    const client = new ScriptedClient(tok, [{ text: "no idea" }]);
    const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { openenv: settings({ base_url: env.url, transport: "http", action: { format: "json", on_invalid: "end" } }) }));
    const o = await loop.run(SP, row());
    expect(o.response_ids).toEqual(turn("no idea"));
    expect(o.extra_fields).toMatchObject({ turn_scores: [], env_steps: 0, invalid_actions: 1, terminated_by: "invalid_action" });
    expect(o.reward_score).toBe(0);
    expect(env.steps()).toBe(0);
  });
});
