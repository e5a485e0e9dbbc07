/**
 * `/openapi.json` of a real `edgeloop serve` lists every route the agent gateway serves (the operator
 * trial's N11), with the request bodies generated from the zod schemas the gateway parses with.
 */
import { afterAll, expect, test } from "bun:test";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { IGNORED_MESSAGES_KEYS, MESSAGES_REQUEST_KEYS, MessagesRequestSchema, parseMessagesRequest } from "../../shared/agent-gateway/messages-wire.ts";
import { CHAT_REQUEST_KEYS, ChatCompletionRequestSchema, IGNORED_CHAT_KEYS, parseChatRequest } from "../../shared/agent-gateway/openai-wire.ts";
import { IGNORED_RESPONSES_KEYS, parseResponsesRequest, RESPONSES_REQUEST_KEYS, ResponsesRequestSchema } from "../../shared/agent-gateway/responses-wire.ts";
import { spawnServe, type CliProc } from "../chaos/store-harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const procs: CliProc[] = [];
afterAll(() => {
  for (const p of procs) if (p.proc.exitCode === null) p.proc.kill(9);
});

test("every route the agent gateway serves is in the served /openapi.json, with its method and the session-token security", async () => {
  const runtime = await buildRuntime({ n: 1 });
  const app = createAgentGatewayApp({ gateway: runtime.agentGateway });
  // Hono's route list: handlers by method; `use` middleware is registered as ALL.
  const served = app.routes.filter((r) => r.method !== "ALL").map((r) => `${r.method.toLowerCase()} ${r.path.replace(/:(\w+)/g, "{$1}")}`);
  expect(served.sort()).toEqual(["get /v1/sessions/{key}/openai/v1/models", "post /v1/sessions/{key}/anthropic/v1/messages", "post /v1/sessions/{key}/finish", "post /v1/sessions/{key}/openai/v1/chat/completions", "post /v1/sessions/{key}/openai/v1/responses"]);

  const serve = await spawnServe(["--store", "memory"]);
  procs.push(serve);
  const res = await fetch(`${serve.url}/openapi.json`, { signal: AbortSignal.timeout(10_000) });
  expect(res.status).toBe(200);
  const doc = (await res.json()) as { paths: Record<string, Record<string, { security: unknown; parameters: { name: string; in: string }[]; requestBody?: { content: Record<string, { schema: { properties: Record<string, unknown>; required?: string[] } }> } }>>; components: { securitySchemes: Record<string, unknown> } };
  const documented = Object.entries(doc.paths).flatMap(([path, item]) => Object.keys(item).map((m) => `${m} ${path}`));
  for (const route of served) expect(documented).toContain(route);
  for (const route of served) {
    const [method, path] = route.split(" ") as [string, string];
    const op = doc.paths[path]![method]!;
    // The turn routes also document the headers that tell a retry (replayed) from a resample, and the call's agent role.
    const turn = method === "post" && !path.endsWith("/finish");
    expect([op.security, op.parameters.map((p) => `${p.in}:${p.name}`)]).toEqual([[{ session_bearer: [] }], turn ? ["path:key", "header:x-stainless-retry-count", "header:Idempotency-Key", "header:X-Agent-Role"] : ["path:key"]]);
  }
  expect(doc.components.securitySchemes.session_bearer).toEqual({ type: "http", scheme: "bearer", description: "an agent session's own token (the task's api_key)" });
  const chat = doc.paths["/v1/sessions/{key}/openai/v1/chat/completions"]!.post!.requestBody!.content["application/json"]!.schema;
  expect(Object.keys(chat.properties).sort()).toEqual([...CHAT_REQUEST_KEYS, ...IGNORED_CHAT_KEYS].sort());
  expect(chat.required).toEqual(["messages"]);
  const messages = doc.paths["/v1/sessions/{key}/anthropic/v1/messages"]!.post!.requestBody!.content["application/json"]!.schema;
  expect(Object.keys(messages.properties).sort()).toEqual([...MESSAGES_REQUEST_KEYS, ...IGNORED_MESSAGES_KEYS].sort());
  expect(messages.required).toEqual(["model", "max_tokens", "messages"]);
  const responses = doc.paths["/v1/sessions/{key}/openai/v1/responses"]!.post!.requestBody!.content["application/json"]!.schema;
  expect(Object.keys(responses.properties).sort()).toEqual([...RESPONSES_REQUEST_KEYS, ...IGNORED_RESPONSES_KEYS].sort());
  const finish = doc.paths["/v1/sessions/{key}/finish"]!.post!.requestBody!.content["application/json"]!.schema;
  expect(Object.keys(finish.properties).sort()).toEqual(["metadata", "reward"]);
  await runtime.close();
}, HANG_MS);

test("the documented chat request schema accepts what the gateway parses and refuses a key it refuses", () => {
  const body = { model: "m", messages: [{ role: "user", content: "hi" }], temperature: 0.5, stop: "x", n: 1, user: "u" };
  expect(ChatCompletionRequestSchema.safeParse(body).success).toBe(true);
  expect(parseChatRequest(body).stop).toEqual(["x"]);
  expect(ChatCompletionRequestSchema.safeParse({ ...body, top_k: 5 }).success).toBe(false);
  expect(() => parseChatRequest({ ...body, top_k: 5 })).toThrow("not supported by edgeloop's agent gateway");
  expect(ChatCompletionRequestSchema.safeParse({ ...body, n: 2 }).success).toBe(false);
  expect(() => parseChatRequest({ ...body, n: 2 })).toThrow("n must be 1");
});

test("the documented Messages request schema accepts what the endpoint parses and refuses what it refuses", () => {
  const body = { model: "m", max_tokens: 64, system: "be brief", messages: [{ role: "user", content: "hi" }], temperature: 0.5, stop_sequences: ["x"], metadata: { user_id: "u" } };
  expect(MessagesRequestSchema.safeParse(body).success).toBe(true);
  expect(parseMessagesRequest(body).stop).toEqual(["x"]);
  for (const [k, v, message] of [
    ["top_k", 5, "top_k: edgeloop samples with the run's top_k"],
    ["tool_choice", { type: "any" }, "tool_choice: edgeloop samples token-in/token-out without guided decoding"],
    ["temperature", 1.5, "temperature: must be <= 1"],
  ] as const) {
    expect(MessagesRequestSchema.safeParse({ ...body, [k]: v }).success).toBe(false);
    expect(() => parseMessagesRequest({ ...body, [k]: v })).toThrow(message);
  }
});

test("the documented Responses request schema accepts what the gateway parses and refuses a key it refuses", () => {
  const body = {
    model: "m",
    instructions: "Be brief.",
    input: [{ role: "user", content: "hi" }, { type: "function_call", call_id: "c1", name: "calc", arguments: "{}" }, { type: "function_call_output", call_id: "c1", output: "3" }],
    tools: [{ type: "function", name: "calc", parameters: { type: "object", properties: {} }, strict: true }],
    truncation: "disabled",
    store: false,
  };
  expect(ResponsesRequestSchema.safeParse(body).success).toBe(true);
  expect(parseResponsesRequest(body).input.map((m) => m.role)).toEqual(["user", "assistant", "tool"]);
  expect(ResponsesRequestSchema.safeParse({ ...body, seed: 5 }).success).toBe(false);
  expect(() => parseResponsesRequest({ ...body, seed: 5 })).toThrow("not supported by edgeloop's agent gateway");
  expect(ResponsesRequestSchema.safeParse({ ...body, truncation: "auto" }).success).toBe(false);
  expect(() => parseResponsesRequest({ ...body, truncation: "auto" })).toThrow("truncation:");
});
