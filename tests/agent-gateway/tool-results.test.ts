/**
 * A tool result must answer a call of the assistant turn before it, on every
 * API (a fresh-user trial found results for unknown call ids rendered as
 * observations of calls the model never made): chat completions'
 * `tool_call_id`, Responses' `function_call_output.call_id` (also against
 * the previous response's calls), Messages' `tool_result.tool_use_id`
 * (tests/agent-gateway/messages-wire.test.ts). Through the SDK: a 400
 * naming the field, no engine call.
 */
import { describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { parseChatRequest } from "../../shared/agent-gateway/openai-wire.ts";
import { parseResponsesRequest, responsesChatRequest } from "../../shared/agent-gateway/responses-wire.ts";
import { unansweredToolResult } from "../../shared/agent-gateway/wire-fields.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";
import { AGENT_TOKEN, agentSessionInput, tokenizerAndTools } from "../helpers/agent-session.ts";

const call = (id: string) => ({ id, type: "function" as const, function: { name: "calc", arguments: "{}" } });
const user: ChatMessage = { role: "user", content: "q" };

describe("unansweredToolResult", () => {
  test("a result answers a call of the assistant message before it, with only results between", () => {
    const a: ChatMessage = { role: "assistant", content: null, tool_calls: [call("c1"), call("c2")] };
    const r = (id: string): ChatMessage => ({ role: "tool", tool_call_id: id, content: "x" });
    expect(unansweredToolResult([user, a, r("c1"), r("c2"), user])).toBeNull();
    expect(unansweredToolResult([user, r("c1")])).toEqual({ index: 1, id: "c1" });
    expect(unansweredToolResult([user, a, r("c3")])).toEqual({ index: 2, id: "c3" });
    expect(unansweredToolResult([user, a, r("c1"), user, r("c2")])).toEqual({ index: 4, id: "c2" });
    expect(unansweredToolResult([user, a, { role: "assistant", content: "no calls" }, r("c1")])).toEqual({ index: 3, id: "c1" });
  });
});

describe("chat completions and Responses", () => {
  test("parsers: 400s naming messages[i].tool_call_id and input[i].call_id; valid pairs pass", () => {
    expect(() => parseChatRequest({ model: "m", messages: [user, { role: "tool", tool_call_id: "call_nope", content: "31" }] })).toThrow(
      'messages[1].tool_call_id: "call_nope" answers no tool call: a tool message must follow the assistant message whose tool_calls hold its id',
    );
    expect(parseChatRequest({ model: "m", messages: [user, { role: "assistant", content: null, tool_calls: [call("c1")] }, { role: "tool", tool_call_id: "c1", content: "31" }] }).messages.length).toBe(3);
    const only = parseResponsesRequest({ model: "m", input: [{ role: "user", content: "q" }, { type: "function_call_output", call_id: "call_nope", output: "31" }] });
    expect(() => responsesChatRequest(only, null)).toThrow('input[1].call_id: no tool call found for function_call_output with call_id "call_nope"');
    const paired = parseResponsesRequest({ model: "m", input: [{ role: "user", content: "q" }, { type: "function_call", call_id: "c1", name: "calc", arguments: "{}" }, { type: "function_call_output", call_id: "c1", output: "31" }] });
    expect(responsesChatRequest(paired, null).messages.map((m) => m.role)).toEqual(["user", "assistant", "tool"]);
    // With previous_response_id the previous reply's calls are answerable; others still are not.
    const prev = { messages: [user, { role: "assistant" as const, content: null, tool_calls: [call("c9")] }], instructions: false };
    expect(responsesChatRequest(parseResponsesRequest({ model: "m", input: [{ type: "function_call_output", call_id: "c9", output: "1" }] }), prev).messages.length).toBe(3);
    expect(() => responsesChatRequest(parseResponsesRequest({ model: "m", input: [{ type: "function_call_output", call_id: "c8", output: "1" }] }), prev)).toThrow("input[0].call_id: no tool call found");
  });

  test("through the openai SDK: 400 with param naming the field, no engine call", async () => {
    const { tok, tools } = await tokenizerAndTools();
    const engine = new SimEngine({ tokenizer: tok, script: { seed: 1, rules: [{ when: "q", turns: ["ok"] }] } });
    const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: new SimEngineClient(engine), maxModelLen: 4096 });
    await gw.create(agentSessionInput(tools));
    const app = createAgentGatewayApp({ gateway: gw });
    const fetchApp = (async (u: string | URL | Request, i?: RequestInit) => app.fetch(u instanceof Request ? u : new Request(String(u), i))) as typeof fetch;
    const client = new OpenAI({ baseURL: "http://edgeloop.local/v1/sessions/u0_0_0/openai/v1", apiKey: AGENT_TOKEN, fetch: fetchApp, maxRetries: 0 });
    const chat = (await client.chat.completions.create({ model: "m", messages: [{ role: "user", content: "q" }, { role: "tool", tool_call_id: "call_nope", content: "31" }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([chat.status, chat.param, chat.type]).toEqual([400, "messages[1].tool_call_id", "invalid_request_error"]);
    const resp = (await client.responses.create({ model: "m", input: [{ type: "function_call_output", call_id: "call_nope", output: "31" }] }).catch((e: unknown) => e)) as InstanceType<typeof OpenAI.APIError>;
    expect([resp.status, resp.param]).toEqual([400, "input[0].call_id"]);
    expect(engine.stats.requests).toBe(0);
  });
});
