import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parse as parseYaml } from "yaml";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { runAgentLoop } from "../../shared/agent-loop/registry.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { visibleText } from "../../shared/agent-loop/openenv-agent.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { parseSimScript } from "../../infra/sim-engine/script.ts";
import { startExampleEnv, type ExampleEnvServer } from "../../infra/openenv/example-env.ts";

// The example environment (infra/openenv) with the example rows, config and sim policy (examples/openenv*),
// on the embedded defaults: the simulated engine with the real tokenizer, the config's openenv section.
const ROOT = join(import.meta.dir, "..", "..");
let tok: ChatTokenizer;
let env: ExampleEnvServer;
beforeAll(async () => {
  tok = await defaultTokenizer();
  env = startExampleEnv({ port: 0 });
});
afterAll(async () => {
  await env.stop();
});

describe("the example OpenEnv environment", () => {
  test("the example rows play guess-the-number through openenv_agent over WebSocket: every reward is the environment's verdict on the actions", async () => {
    const file = parseYaml(readFileSync(join(ROOT, "examples", "openenv.yaml"), "utf8")) as { openenv: Record<string, unknown>; rollout: Record<string, unknown> };
    const config = parseAppConfig({ ...file, openenv: { ...file.openenv, base_url: env.url }, rollout: { ...file.rollout, prompt_length: 512, response_length: 2048, max_model_len: 4096 } });
    expect(config.openenv.transport).toBe("websocket");
    const rows = readFileSync(join(ROOT, "examples", "openenv-guess.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l));
    const engine = new SimEngine({ tokenizer: tok, script: parseSimScript(JSON.parse(readFileSync(join(ROOT, "examples", "policy-openenv.json"), "utf8"))) });
    const registry = defaultAgentLoopRegistry();
    const outs: Array<{ row: (typeof rows)[number]; o: AgentLoopOutput }> = [];
    for (const [i, row] of rows.entries()) {
      for (const s of [0, 1]) {
        const [o] = await runAgentLoop(registry, { tokenizer: tok, client: new SimEngineClient(engine), config: config.rollout, maxModelLen: 4096, openenv: { settings: config.openenv } }, { temperature: 1, top_p: 1, top_k: -1, logprobs: true }, { ...row, uid: `g${i}`, session_id: s });
        outs.push({ row, o: o! });
      }
    }
    let wins = 0;
    for (const { row, o } of outs) {
      const target = ((row.extra_info.openenv.reset_kwargs.seed as number) % 100) + 1;
      // The actions, read back from the recorded tokens (mask-1 runs), replayed against the rules.
      const actions: string[] = [];
      let run: number[] = [];
      o.response_ids.forEach((id, k) => {
        if (o.response_mask[k] === 1) run.push(id);
        if ((o.response_mask[k] === 0 || k === o.response_ids.length - 1) && run.length) {
          actions.push(visibleText(tok.decode(run.slice(0, -1), { skipSpecialTokens: true })));
          run = [];
        }
      });
      const hit = actions.findIndex((a) => Number(a) === target);
      const expected = hit < 0 ? actions.map(() => -0.1) : [...actions.slice(0, hit).map(() => -0.1), 1];
      expect(o.extra_fields.turn_scores).toEqual(expected);
      expect(o.extra_fields.env_steps).toBe(expected.length);
      // A hit, or the environment's 6 guesses used up: the environment ends every episode.
      expect(o.extra_fields.terminated_by).toBe("env_done");
      expect(hit >= 0 || actions.length === 6).toBe(true);
      expect(o.reward_score).toBeCloseTo(expected.reduce((x, y) => x + y, 0), 10);
      if (hit >= 0) wins++;
    }
    // The policy solves some targets and misses others: a batch with mixed rewards.
    expect(wins).toBeGreaterThan(0);
    expect(wins).toBeLessThan(outs.length);
  });

  test("its HTTP routes answer as OpenEnv's server does", async () => {
    const post = (path: string, body: unknown) => fetch(`${env.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    expect(await (await fetch(`${env.url}/health`)).json()).toEqual({ status: "healthy" });
    expect(await (await post("/reset", { seed: 6, max_attempts: 2 })).json()).toEqual({ observation: { prompt: "I picked a number between 1 and 100. You have 2 guesses. Reply with one number.", attempts_left: 2, last_guess: null }, reward: null, done: false });
    expect(await (await post("/step", { action: { message: "3" } })).json()).toEqual({ observation: { prompt: "Higher. 1 guesses left.", attempts_left: 1, last_guess: 3 }, reward: -0.1, done: false });
    const bad = await post("/step", { action: { guess: 7 } });
    expect(bad.status).toBe(422);
    expect((await post("/step", {})).status).toBe(422);
    expect(await (await post("/step", { action: { message: "7" } })).json()).toEqual({ observation: { prompt: "Correct, it was 7!", attempts_left: 0, last_guess: 7 }, reward: 1, done: true });
    expect(await (await fetch(`${env.url}/state`)).json()).toEqual({ episode_id: null, step_count: 2 });
  });
});
