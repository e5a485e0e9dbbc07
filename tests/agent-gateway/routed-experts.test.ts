import { beforeAll, describe, expect, test } from "bun:test";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { DEFAULT_SIM_MOE, SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { config, ctxOf, FakeTools, SP } from "../agent-loop/helpers.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { examplePolicy, exampleRow } from "../helpers/examples.ts";
import { AGENT_TOKEN, agentSessionInput, tokenizerAndTools } from "../helpers/agent-session.ts";

// The agent gateway's sessions feed the builder from engine replies too: with
// rollout.return_routed_experts an OpenAI-style conversation records the same
// routed experts as tool_agent, stored in its turn events and folded back bit-exact.
const script = examplePolicy();
const row0 = exampleRow(0);
let tok: ChatTokenizer;
let tools: ToolSchema[];
beforeAll(async () => void ({ tok, tools } = await tokenizerAndTools()));

describe("agent gateway: routed experts", () => {
  test("two chat calls record the experts tool_agent records; events carry only what changed; the fold is bit-exact", async () => {
    const engine = new SimEngine({ tokenizer: tok, script });
    const storage = new MemorySessionStorage();
    const gw = new AgentGateway({ storage, tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096 });
    const rollout = config({ return_routed_experts: true });
    await gw.create(agentSessionInput(tools, { rollout }));
    const m1 = [...row0.prompt];
    const r1 = await gw.chat("u0_0_0", AGENT_TOKEN, { model: "qwen3", messages: m1, tools });
    const call = r1.message.tool_calls!;
    const m2 = [...m1, { role: "assistant", content: r1.message.content, reasoning_content: r1.message.reasoning_content, tool_calls: call }, { role: "tool", tool_call_id: call[0]!.id, content: "31" }];
    await gw.chat("u0_0_0", AGENT_TOKEN, { model: "qwen3", messages: m2, tools });
    const st = await gw.finish("u0_0_0", { by: "agent", reward: 1 });
    const [out] = agentOutputs(st, { reward: 1 });

    const fake = new FakeTools(["calc", "lookup"], () => "31");
    (fake as unknown as { schemas: ToolSchema[] }).schemas = tools;
    const ref = await new ToolAgentLoop(ctxOf(tok, new SimEngineClient(new SimEngine({ tokenizer: tok, script })), rollout, { tools: fake, reward: false })).run(SP, { uid: "u0", session_id: 0, prompt: row0.prompt });
    expect(out!.response_ids).toEqual(ref.response_ids);
    expect(out!.routed_experts_shape).toEqual([DEFAULT_SIM_MOE.layers, DEFAULT_SIM_MOE.top_k]);
    expect(out!.routed_experts).toEqual(ref.routed_experts!);
    const stream = [...out!.prompt_ids, ...out!.response_ids];
    const per = DEFAULT_SIM_MOE.layers * DEFAULT_SIM_MOE.top_k;
    expect(out!.routed_experts).toEqual([...engine.routedExperts(stream, stream.length - 1), ...new Array(per).fill(0)]);

    // Stored turn events: the first covers from 0; the second only from the first reply's last token on.
    const events = (await storage.get(AgentGateway.storageKey("u0_0_0")))!.deltas.map((d) => JSON.parse(d)).filter((e) => e.e === "turn");
    const firstLen = r1.usage.prompt_tokens + r1.usage.completion_tokens;
    expect(events.map((e) => e.experts?.from)).toEqual([0, firstLen - 1]);
    for (const e of events) expect(typeof e.experts.data).toBe("string");

    gw.forget("u0_0_0");
    const again = agentOutputs((await gw.get("u0_0_0"))!, { reward: 1 });
    expect(again[0]!.routed_experts).toEqual(out!.routed_experts!);
  });
});
