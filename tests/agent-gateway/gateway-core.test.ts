import { beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { agentOutputs } from "../../shared/agent-gateway/agent-session.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { config, ctxOf, FakeTools, SP } from "../agent-loop/helpers.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { ConflictError } from "../../shared/errors.ts";
import { builtinTokenizer, modelIdOf } from "../../shared/models/index.ts";
import { examplePolicy, exampleRow } from "../helpers/examples.ts";
import { agentSessionInput, tokenizerAndTools } from "../helpers/agent-session.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";

const script = examplePolicy();
const row0 = exampleRow(0);
let tok: ChatTokenizer;
let tools: ToolSchema[];
beforeAll(async () => void ({ tok, tools } = await tokenizerAndTools()));

function setup() {
  const engine = new SimEngine({ tokenizer: tok, script });
  const client = new SimEngineClient(engine);
  const storage = new MemorySessionStorage();
  const gw = new AgentGateway({ storage, tokenizer: tok, client, maxModelLen: 4096 });
  const app = createAgentGatewayApp({ gateway: gw });
  return { engine, client, storage, gw, app };
}

async function createSession(gw: AgentGateway, key = "u0_0_0") {
  return gw.create(agentSessionInput(tools, { key }));
}

describe("agent gateway core", () => {
  test("N4: a session names its gateway's model; a gateway of another model refuses its calls (409 model_mismatch) and fails the session", async () => {
    const { gw, storage } = setup();
    const st = await createSession(gw, "mm0_0_0");
    const qwen = await modelIdOf(tok);
    expect(st.input.model).toEqual(qwen);
    const llamaTok = await builtinTokenizer("llama3_1");
    const llama = await modelIdOf(llamaTok);
    const other = new AgentGateway({ storage, tokenizer: llamaTok, client: new SimEngineClient(new SimEngine({ tokenizer: llamaTok, script })), maxModelLen: 4096 });
    const e = await other.chat("mm0_0_0", "tok_0123456789abcdef0123", { model: "x", messages: row0.prompt }).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConflictError);
    expect((e as ConflictError).code).toBe("model_mismatch");
    const why = `agent session 'mm0_0_0' was created with model qwen3 (fingerprint ${qwen.fingerprint}), this gateway runs llama3_1 (fingerprint ${llama.fingerprint}): refused (route agent calls to a process of the session's model)`;
    expect((e as ConflictError).message).toBe(why);
    const after = await gw.waitFinished("mm0_0_0");
    expect(after.finish).toMatchObject({ by: "failed", metadata: { error: why } });
    expect(after.outputs).toEqual([]);
  });

  test("tool-call ids carry the session's tag: two sessions on one script get different ids, a replay the same", async () => {
    const { gw, app } = setup();
    const ids: string[] = [];
    for (const key of ["u0_0_0", "u0_1_0"]) {
      await createSession(gw, key);
      const client = new OpenAI({ baseURL: `http://edgeloop.local/v1/sessions/${key}/openai/v1`, apiKey: "tok_0123456789abcdef0123", fetch: async (u, i) => app.fetch(new Request(u as string, i)) });
      const req = { model: "qwen3", messages: [...row0.prompt] as OpenAI.ChatCompletionMessageParam[], tools: tools as OpenAI.ChatCompletionTool[] };
      const first = (await client.chat.completions.create(req)).choices[0]!.message.tool_calls![0]!.id;
      // The same request retried (x-stainless-retry-count: 1) is answered from the record: the same id.
      expect((await client.chat.completions.create(req, { headers: { "x-stainless-retry-count": "1" } })).choices[0]!.message.tool_calls![0]!.id).toBe(first);
      ids.push(first);
    }
    expect(ids).toEqual([`call_${sessionTag("u0_0_0")}_0_0_0`, `call_${sessionTag("u0_1_0")}_0_0_0`]);
    expect(ids[0]).not.toBe(ids[1]);
    expect(sessionTag("u0_0_0")).toMatch(/^[0-9a-f]{16}$/);
  });

  test("two SDK calls record the same tokens as tool_agent", async () => {
    const { gw, app } = setup();
    await createSession(gw);
    const client = new OpenAI({ baseURL: "http://edgeloop.local/v1/sessions/u0_0_0/openai/v1", apiKey: "tok_0123456789abcdef0123", fetch: async (u, i) => app.fetch(new Request(u as string, i)) });
    const messages: OpenAI.ChatCompletionMessageParam[] = [...row0.prompt];
    const r1 = await client.chat.completions.create({ model: "qwen3", messages, tools: tools as OpenAI.ChatCompletionTool[] });
    const m1 = r1.choices[0]!.message;
    expect(r1.choices[0]!.finish_reason).toBe("tool_calls");
    expect(m1.tool_calls).toEqual([{ id: `call_${sessionTag("u0_0_0")}_0_0_0`, type: "function", function: { name: "calc", arguments: '{"expression":"12*3-5"}' } }]);
    expect((m1 as unknown as { reasoning_content: string }).reasoning_content).toBe("Let me compute 12*3-5.");
    messages.push(m1, { role: "tool", tool_call_id: `call_${sessionTag("u0_0_0")}_0_0_0`, content: "31" });
    const r2 = await client.chat.completions.create({ model: "qwen3", messages, tools: tools as OpenAI.ChatCompletionTool[] });
    expect(r2.choices[0]!.message.content).toBe("The answer is 31.\n#### 31");
    expect(r2.choices[0]!.finish_reason).toBe("stop");
    const st = await gw.finish("u0_0_0", { by: "agent", reward: 1 });
    const [out] = agentOutputs(st, { reward: 1 });

    const sim2 = new SimEngineClient(new SimEngine({ tokenizer: tok, script }));
    const fake = new FakeTools(["calc", "lookup"], () => "31");
    (fake as unknown as { schemas: ToolSchema[] }).schemas = tools;
    const loop = new ToolAgentLoop(ctxOf(tok, sim2, config(), { tools: fake, reward: false }));
    const ref = await loop.run(SP, { uid: "u0", session_id: 0, prompt: row0.prompt });
    expect(out!.prompt_ids).toEqual(ref.prompt_ids);
    expect(out!.response_ids).toEqual(ref.response_ids);
    expect(out!.response_mask).toEqual(ref.response_mask);
    expect(out!.response_logprobs).toEqual(ref.response_logprobs);
    expect(out!.num_turns).toBe(ref.num_turns);

    // Folding the stored events gives the same output.
    gw.forget("u0_0_0");
    const again = agentOutputs((await gw.get("u0_0_0"))!, { reward: 1 });
    expect(again[0]!.response_ids).toEqual(out!.response_ids);
    expect(again[0]!.response_logprobs).toEqual(out!.response_logprobs);
  });

  test("a stop string ends the turn: text cut before it, tokens kept, the next observation closes the turn", async () => {
    const { gw, engine } = setup();
    await createSession(gw, "u1_0_0");
    const token = "tok_0123456789abcdef0123";
    const m1 = [...row0.prompt];
    const r1 = await gw.chat("u1_0_0", token, { model: "qwen3", messages: m1, tools });
    const call = r1.message.tool_calls!;
    const m2 = [...m1, { role: "assistant", content: r1.message.content, tool_calls: call }, { role: "tool", tool_call_id: call[0]!.id, content: "31" }];
    const r2 = await gw.chat("u1_0_0", token, { model: "qwen3", messages: m2, tools, stop: ["####"] });
    expect(r2.message.content).toBe("The answer is 31.");
    expect(r2.finish_reason).toBe("stop");
    expect(engine.requests.at(-1)?.stop).toEqual(["####"]);
    let st = (await gw.get("u1_0_0"))!;
    const ids = Array.from(st.outputs[0]!.lastActionIds!);
    expect(tok.decode(ids)).toBe("<think>\nThe tool says 31.\n</think>\n\nThe answer is 31.\n####");
    const before = st.outputs[0]!.builder.responseLength;
    // The agent goes on with a user turn: the observation starts by closing the turn (<|im_end|> \n).
    const m3 = [...m2, { role: "assistant", content: r2.message.content, reasoning_content: r2.message.reasoning_content }, { role: "user", content: "Thanks. Say it again." }];
    await gw.chat("u1_0_0", token, { model: "qwen3", messages: m3, tools });
    st = (await gw.get("u1_0_0"))!;
    expect(st.outputs.length).toBe(1);
    expect(st.outputs[0]!.builder.responseIds().slice(before, before + 4)).toEqual([151645, 198, 151644, 872]);
  });

  test("a retry of any of the recent calls is answered again (calls in parallel), not sampled into another output", async () => {
    const { gw, engine } = setup();
    await createSession(gw, "u2_0_0");
    const token = "tok_0123456789abcdef0123";
    const a = { model: "qwen3", messages: row0.prompt, tools, seed: 100 };
    const b = { model: "qwen3", messages: row0.prompt, tools, seed: 101 };
    const [ra, rb] = await Promise.all([gw.chat("u2_0_0", token, a), gw.chat("u2_0_0", token, b)]);
    expect(engine.stats.requests).toBe(2);
    expect((await gw.chat("u2_0_0", token, a, { retry: true })).id).toBe(ra.id);
    expect((await gw.chat("u2_0_0", token, b, { retry: true })).id).toBe(rb.id);
    expect(engine.stats.requests).toBe(2);
    expect((await gw.get("u2_0_0"))!.outputs.length).toBe(2);
  });

  test("tool results and a user turn in one request continue the output: one observation, token-exact", async () => {
    const { gw } = setup();
    await createSession(gw, "u3_0_0");
    const token = "tok_0123456789abcdef0123";
    const r1 = await gw.chat("u3_0_0", token, { model: "qwen3", messages: row0.prompt, tools });
    const call = r1.message.tool_calls![0]!;
    let st = (await gw.get("u3_0_0"))!;
    const before = st.outputs[0]!.builder.responseLength;
    await gw.chat("u3_0_0", token, {
      model: "qwen3",
      tools,
      messages: [...row0.prompt, { role: "assistant", content: null, tool_calls: [call] }, { role: "tool", tool_call_id: call.id, content: "31" }, { role: "user", content: "Reply with the number only." }],
    });
    st = (await gw.get("u3_0_0"))!;
    expect(st.outputs.length).toBe(1);
    const out = st.outputs[0]!;
    const mask = out.builder.responseMask().slice(before);
    const obs = out.builder.responseIds().slice(before, before + mask.indexOf(1));
    expect(tok.decode(obs)).toBe("\n<|im_start|>user\n<tool_response>\n31\n</tool_response><|im_end|>\n<|im_start|>user\nReply with the number only.<|im_end|>\n<|im_start|>assistant\n");
  });

  test("a reply cut by the request's max_tokens, sent back with a user turn: the observation closes the turn (<|im_end|>)", async () => {
    const { gw, engine } = setup();
    await createSession(gw, "u4_0_0");
    const token = "tok_0123456789abcdef0123";
    const r1 = await gw.chat("u4_0_0", token, { model: "qwen3", messages: row0.prompt, tools, max_tokens: 5 });
    expect(r1.finish_reason).toBe("length");
    expect(engine.requests.at(-1)?.completion_tokens).toBe(5);
    let st = (await gw.get("u4_0_0"))!;
    const before = st.outputs[0]!.builder.responseLength;
    expect(before).toBe(5);
    await gw.chat("u4_0_0", token, { model: "qwen3", tools, messages: [...row0.prompt, { role: "assistant", content: r1.message.content }, { role: "user", content: "go on" }] });
    st = (await gw.get("u4_0_0"))!;
    expect(st.outputs.length).toBe(1);
    expect(st.outputs[0]!.builder.responseIds().slice(before, before + 4)).toEqual([151645, 198, 151644, 872]);
  });
});

