import { beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs, foldAgentSession, type TurnEvent } from "../../shared/agent-gateway/agent-session.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { EngineControl, GatedClient, MemoryEngineGate } from "../../shared/inference/engine-control.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { createSimEngineApp } from "../../infra/sim-engine/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { examplePolicy, exampleRow } from "../helpers/examples.ts";
import { AGENT_TOKEN, agentSessionInput, tokenizerAndTools } from "../helpers/agent-session.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";

// openai_agent's per-token policy versions: the agent gateway stores each turn's version segments
// in its TurnEvent and agentOutputs emits extra_fields.token_versions, as tool_agent records them.

const script = examplePolicy();
const row0 = exampleRow(0);
let tok: ChatTokenizer;
let tools: ToolSchema[];
beforeAll(async () => void ({ tok, tools } = await tokenizerAndTools()));

function setup(client: InferenceClient, modelVersion: string | null = null) {
  const storage = new MemorySessionStorage();
  const gw = new AgentGateway({ storage, tokenizer: tok, client, maxModelLen: 4096 });
  const app = createAgentGatewayApp({ gateway: gw });
  const sdk = new OpenAI({ baseURL: "http://edgeloop.local/v1/sessions/u0_0_0/openai/v1", apiKey: AGENT_TOKEN, fetch: async (u, i) => app.fetch(new Request(u as string, i)) });
  const create = () =>
    gw.create(agentSessionInput(tools, { model_version: modelVersion }));
  return { storage, gw, sdk, create };
}

/** The two calls of the example conversation (a calc tool call, then the answer); `between` runs after the first. */
async function converse(sdk: OpenAI, first: (p: Promise<OpenAI.ChatCompletion>) => Promise<OpenAI.ChatCompletion>, between: () => Promise<void> = async () => {}) {
  const messages: OpenAI.ChatCompletionMessageParam[] = [...row0.prompt];
  const r1 = await first(sdk.chat.completions.create({ model: "qwen3", messages, tools: tools as OpenAI.ChatCompletionTool[] }));
  expect(r1.choices[0]!.message.tool_calls![0]!.id).toBe(`call_${sessionTag("u0_0_0")}_0_0_0`);
  await between();
  messages.push(r1.choices[0]!.message, { role: "tool", tool_call_id: `call_${sessionTag("u0_0_0")}_0_0_0`, content: "31" });
  const r2 = await sdk.chat.completions.create({ model: "qwen3", messages, tools: tools as OpenAI.ChatCompletionTool[] });
  expect(r2.choices[0]!.message.content).toBe("The answer is 31.\n#### 31");
  return [r1, r2];
}

const turnsOf = (deltas: string[]) => deltas.map((d) => JSON.parse(d) as TurnEvent).filter((e) => e.e === "turn");

describe("openai_agent token_versions", () => {
  test("a pause (abort) mid-call with a weight update: two segments for that turn, stored in its TurnEvent; fold = live; old events load", async () => {
    // Reference: the same conversation, uninterrupted.
    const plain = setup(new SimEngineClient(new SimEngine({ tokenizer: tok, script })));
    await plain.create();
    await converse(plain.sdk, (p) => p);
    const ref = agentOutputs((await plain.gw.get("u0_0_0"))!, { reward: 1 })[0]!;

    const engine = new SimEngine({ tokenizer: tok, script, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 4 } });
    const simApp = createSimEngineApp(engine);
    const gate = new MemoryEngineGate();
    let version = "v1";
    const control = new EngineControl({ gate, format: "vllm", replicas: () => [{ url: "http://sim.local", fetch: async (i, init) => simApp.fetch(new Request(i, init)) }] });
    const { storage, gw, sdk, create } = setup(new GatedClient(new SimEngineClient(engine), gate, { version: async () => version }));
    await create();
    await converse(sdk, async (p) => {
      // Mid-generation: pause (abort), update, resume; the gateway resumes the call with its tokens kept.
      while (engine.stats.inflight === 0) await Bun.sleep(1);
      await Bun.sleep(40); // ~10 tokens out at 4 ms a token, ~29 to go
      await control.pause({ mode: "abort", clear_cache: false });
      version = "v2";
      await control.resume();
      return p;
    });
    expect(engine.requests.map((l) => l.finish_reason)).toEqual(["abort", "stop", "stop"]);
    const cut = engine.requests[0]!.completion_tokens!;
    expect(cut).toBeGreaterThan(0);
    expect(cut).toBeLessThan(39);

    const live = agentOutputs((await gw.get("u0_0_0"))!, { reward: 1 });
    const out = live[0]!;
    expect(out.response_ids).toEqual(ref.response_ids);
    expect(out.response_mask).toEqual(ref.response_mask);
    expect(out.response_logprobs!.slice(0, cut)).toEqual(ref.response_logprobs!.slice(0, cut));
    expect(out.metrics.num_preempted).toBe(1);
    // Turn 1: `cut` tokens under v1, the rest under v2; turn 2 (and its observation before it) under v2.
    expect(out.extra_fields.token_versions).toEqual([
      [0, "v1"],
      [cut, "v2"],
    ]);
    expect(out.extra_fields.model_versions).toEqual(["v2", "v2"]);
    expect(ref.extra_fields.token_versions).toBeUndefined(); // no version known: no field

    const stored = (await storage.get("agent:u0_0_0"))!;
    const turns = turnsOf(stored.deltas);
    expect(turns.map((t) => t.versions)).toEqual([
      [
        [0, "v1"],
        [cut, "v2"],
      ],
      [[0, "v2"]],
    ]);
    // Fold = live, bit-exact.
    gw.forget("u0_0_0");
    expect(agentOutputs((await gw.get("u0_0_0"))!, { reward: 1 })).toEqual(live);
    // Events written before the field existed fold as one segment per turn (its model_version).
    const old = { ...stored, deltas: stored.deltas.map((d) => JSON.stringify({ ...JSON.parse(d), versions: undefined })) };
    expect(turnsOf(old.deltas).every((t) => !("versions" in t))).toBe(true);
    const [o] = agentOutputs(foldAgentSession("u0_0_0", old), { reward: 1 });
    expect(o!.response_ids).toEqual(out.response_ids);
    expect(o!.extra_fields.token_versions).toEqual([[0, "v2"]]);
  });

  test("a version change between two calls starts a segment at the second action; with no version stamped, the session's batch version", async () => {
    let version = "v1";
    const gate = new MemoryEngineGate();
    const a = setup(new GatedClient(new SimEngineClient(new SimEngine({ tokenizer: tok, script })), gate, { version: async () => version }));
    await a.create();
    await converse(a.sdk, (p) => p, async () => void (version = "v2"));
    const st = (await a.gw.get("u0_0_0"))!;
    const out = agentOutputs(st, { reward: 1 })[0]!;
    // The second action starts after turn 1's tokens and the tool observation (mask 0).
    const second = out.response_mask.indexOf(1, out.response_mask.indexOf(0));
    expect(second).toBeGreaterThan(0);
    expect(out.extra_fields.token_versions).toEqual([
      [0, "v1"],
      [second, "v2"],
    ]);

    // No version from the engine or the gate: the batch's model_version (as tool_agent stamps it).
    const b = setup(new SimEngineClient(new SimEngine({ tokenizer: tok, script })), "b7");
    await b.create();
    await converse(b.sdk, (p) => p);
    const ob = agentOutputs((await b.gw.get("u0_0_0"))!, { reward: 1 })[0]!;
    expect(ob.extra_fields.token_versions).toEqual([[0, "b7"]]);
    expect(ob.extra_fields.model_versions).toEqual(["b7", "b7"]);
  });
});
