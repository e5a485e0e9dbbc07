/**
 * The agent gateway never cuts an agent's context: a call whose rendered
 * prompt is longer than `rollout.prompt_length` is a 400
 * `context_length_exceeded` naming `messages` on all three APIs (each in its
 * own error shape), before any engine call, and nothing is recorded; the
 * same call under the limit is answered. (A fresh-user trial found the prompt
 * left-truncated with a 200.)
 */
import { beforeAll, describe, expect, test } from "bun:test";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { config } from "../agent-loop/helpers.ts";
import { AGENT_TOKEN, agentSessionInput, tokenizerAndTools } from "../helpers/agent-session.ts";

const BASE = "http://edgeloop.local";
let tok: ChatTokenizer;
let tools: ToolSchema[];
beforeAll(async () => {
  ({ tok, tools } = await tokenizerAndTools());
});

/** A gateway over the sim engine with `prompt_length` 256, one session `u0_0_0`, and the engine's request count. */
async function setup() {
  const engine = new SimEngine({ tokenizer: tok, script: { seed: 1, rules: [{ when: "hi", turns: ["ok"] }] } });
  const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096 });
  await gw.create(agentSessionInput(tools, { rollout: { ...config(), prompt_length: 256 } }));
  const app = createAgentGatewayApp({ gateway: gw });
  const fetchApp = (async (u: string | URL | Request, i?: RequestInit) => app.fetch(u instanceof Request ? u : new Request(String(u), i))) as typeof fetch;
  return { engine, gw, fetchApp };
}

const long = "You are a careful agent. " + Array.from({ length: 120 }, (_, i) => `Rule ${i}: be careful.`).join(" ");
const MESSAGE = "messages: the rendered prompt (messages and tools) is longer than rollout.prompt_length (256 tokens), and the agent gateway never cuts an agent's context: send less, or raise rollout.prompt_length (--prompt-length)";

describe("agent gateway: a prompt over rollout.prompt_length", () => {
  test("chat completions and Responses: 400 context_length_exceeded (OpenAI's type and param), no engine call, nothing recorded; a short prompt is answered", async () => {
    const { engine, gw, fetchApp } = await setup();
    const client = new OpenAI({ baseURL: `${BASE}/v1/sessions/u0_0_0/openai/v1`, apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
    const chat = (await client.chat.completions.create({ model: "m", messages: [{ role: "system", content: long }, { role: "user", content: "hi" }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(chat).toBeInstanceOf(OpenAI.BadRequestError);
    expect(chat.error).toEqual({ code: "context_length_exceeded", field: "messages", message: MESSAGE, type: "invalid_request_error", param: "messages" });
    const resp = (await client.responses.create({ model: "m", instructions: long, input: "hi" }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect(resp).toBeInstanceOf(OpenAI.BadRequestError);
    expect([resp.code, resp.param]).toEqual(["context_length_exceeded", "messages"]);
    expect(engine.stats.requests).toBe(0);
    expect((await gw.get("u0_0_0"))!.outputs.length).toBe(0);
    const ok = await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "hi" }] });
    expect(ok.choices[0]!.message.content).toBe("ok");
    expect(engine.stats.requests).toBe(1);
  });

  test("Messages: 400 invalid_request_error in Anthropic's shape, naming the limit; no engine call", async () => {
    const { engine, fetchApp } = await setup();
    const a = new Anthropic({ baseURL: `${BASE}/v1/sessions/u0_0_0/anthropic`, apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
    const e = (await a.messages.create({ model: "m", max_tokens: 64, system: long, messages: [{ role: "user", content: "hi" }] }).catch((x: unknown) => x)) as InstanceType<typeof Anthropic.APIError>;
    expect(e).toBeInstanceOf(Anthropic.BadRequestError);
    expect(e.error).toEqual({ type: "error", error: { type: "invalid_request_error", message: MESSAGE }, request_id: null });
    expect(engine.stats.requests).toBe(0);
  });
});
