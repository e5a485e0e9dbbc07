import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import type { ExecutorDeps } from "../../shared/rollout/executor.ts";
import type { AgentLoopOutput, ChatMessage } from "../../shared/schema/index.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession } from "../../shared/session/trajectory-session.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { InteractionClient, InteractionSpec } from "../../shared/tools/interaction-client.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { comparable, ROOT, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";
import { join } from "node:path";

// E4 on the durable-session path: a session killed after any commit resumes
// its observation encoder from the checkpoint (the builder's last sampled id),
// so a turn ended by <|endoftext|> is still closed (<|im_end|>\n) after a resume.
const IM_END = 151645;
const EOT = 151643;
const E4_TURN1 = [151657, 198, 4913, 606, 788, 330, 26586, 497, 330, 16370, 788, 5212, 28099, 788, 330, 17, 10, 17, 95642, 151658, 151643];

let tok: ChatTokenizer;
let sim: RunningSimEngine;
let tools: ToolServer;
let user: ReturnType<typeof Bun.serve>;
let deps: ExecutorDeps;

beforeAll(async () => {
  tok = await defaultTokenizer();
  sim = await startSimEngine({
    tokenizer: tok,
    script: {
      rules: [
        { when: "What is 2+2?", turns: [{ token_ids: E4_TURN1, finish_reason: "stop" }, "The answer is 4.\n#### 4"] },
        { when: "What is 3+3?", turns: [{ token_ids: [...tok.encode("The answer is 5."), EOT] }, "The answer is 6.\n#### 6"] },
      ],
    },
  });
  tools = startToolServer({ port: 0 });
  user = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const body = (await req.json()) as { messages: ChatMessage[] };
      const right = String(body.messages.at(-1)!.content).includes("#### 6");
      return Response.json(right ? { terminate: true, content: "Correct.", score: 1 } : { terminate: false, content: "Try again.", score: 0 });
    },
  });
  const file = parseToolsFile(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8"), { source: "tools", vars: { port: tools.port } });
  deps = {
    registry: defaultAgentLoopRegistry(),
    tokenizer: tok,
    client: createEngineClient({ url: sim.urls[0]!, format: "vllm" }),
    maxModelLen: 4096,
    tools: new WebhookToolClient(file.tools, { retryMinTimeoutMs: 5, retryMaxTimeoutMs: 20 }),
    interactions: { sim: new InteractionClient(InteractionSpec.parse({ name: "sim", url: `http://127.0.0.1:${user.port}/` })) },
    reward: {},
  };
});
afterAll(async () => {
  await sim.stop();
  await tools.stop();
  user.stop(true);
});

function input(uid: string, content: string, truth: string, extra: Record<string, unknown> = {}) {
  const key = `${uid}_0_0`;
  return {
    key,
    agent_name: "tool_agent",
    sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true },
    kwargs: { uid, session_id: 0, key, data_source: "edge", prompt: [{ role: "user", content }], reward_model: { style: "rule", ground_truth: truth }, ...extra },
    rollout: rolloutConfig(),
    model_version: "v1",
  };
}

/** Runs a session, "crashing" (throwing) right after its `killAfter`-th commit, then resumes it from storage. */
async function runWithCrash(inp: ReturnType<typeof input>, killAfter: number): Promise<{ out: AgentLoopOutput; crashed: boolean }> {
  const storage = new MemorySessionStorage();
  let commits = 0;
  const s1 = (await TrajectorySession.open(inp.key, {
    storage,
    createLoop: sessionLoopFactory(deps),
    onCommit: () => {
      if (++commits === killAfter) throw new Error("killed");
    },
  }, inp))!;
  const first = await s1.run().then(
    (r) => r,
    (e) => ((e as Error).message === "killed" ? null : Promise.reject(e)),
  );
  const r = first ?? (await (await TrajectorySession.open(inp.key, { storage, createLoop: sessionLoopFactory(deps) }, inp))!.run());
  if (r.status !== "finished") throw new Error(`unexpected ${JSON.stringify(r)}`);
  return { out: r.outputs[0]!, crashed: first === null };
}

describe("E4 on the durable-session path, resumed after every commit", () => {
  test("tool observation: [.., 151643] then [151645, 198, 151644, 872, 198, 151665, ..] (mask 0), reward 1, after any crash", async () => {
    const obs = [IM_END, 198, 151644, 872, 198, 151665, 198, ...tok.encode("4"), 198, 151666, IM_END, 198, 151644, 77091, 198];
    const answer = [...tok.encode("The answer is 4.\n#### 4"), IM_END];
    let crashes = 0;
    for (let k = 1; k <= 8; k++) {
      const { out, crashed } = await runWithCrash(input(`e4s${k}`, "What is 2+2?", "4"), k);
      if (crashed) crashes++;
      expect(out.response_ids).toEqual([...E4_TURN1, ...obs, ...answer]);
      expect(out.response_mask as number[]).toEqual([...E4_TURN1.map(() => 1), ...obs.map(() => 0), ...answer.map(() => 1)]);
      expect(out.response_logprobs![20]).not.toBe(0);
      expect(out.reward_score).toBe(1);
      expect(out.num_turns).toBe(4);
    }
    // Five commits (generating, processing_tools, generating, terminated, finished): a crash after each.
    expect(crashes).toBe(5);
  });

  test("interaction observation after 151643 starts [151645, 198, 151644, 872, 198], identical with and without a crash", async () => {
    const obs = [IM_END, 198, ...tok.encode("<|im_start|>user\nTry again.<|im_end|>\n<|im_start|>assistant\n")];
    const reference = await runWithCrash(input("e4i0", "What is 3+3?", "6", { extra_info: { interaction_kwargs: { name: "sim" } } }), 0);
    const turn1 = [...tok.encode("The answer is 5."), EOT];
    expect(reference.out.response_ids.slice(0, turn1.length + obs.length)).toEqual([...turn1, ...obs]);
    expect(reference.out.reward_score).toBe(1);
    for (let k = 1; k <= 6; k++) {
      const { out } = await runWithCrash(input("e4i0", "What is 3+3?", "6", { extra_info: { interaction_kwargs: { name: "sim" } } }), k);
      expect(comparable(out)).toEqual(comparable(reference.out));
    }
  });
});
