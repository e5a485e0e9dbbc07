import { z } from "zod";
import { ChatCompletionRequestSchema } from "../shared/agent-gateway/openai-wire.ts";
import { MessagesRequestSchema } from "../shared/agent-gateway/messages-wire.ts";
import { ResponsesRequestSchema } from "../shared/agent-gateway/responses-wire.ts";
import { AgentTaskResult } from "../shared/agent-gateway/task.ts";

/**
 * The agent gateway's routes ({@link createAgentGatewayApp} in `agent-gateway.ts`) as OpenAPI 3.1 path
 * items, request bodies generated from their zod schemas. Every route is authenticated by the
 * session's own bearer token (the task's `api_key`, security scheme `session_bearer`), never by
 * `EDGELOOP_API_TOKEN`. `err` is the document's error response object.
 */
export function agentGatewayOpenApiPaths(err: Record<string, unknown>): Record<string, unknown> {
  const schema = (s: z.ZodType) => z.toJSONSchema(s, { io: "input", unrepresentable: "any" });
  const key = { name: "key", in: "path", required: true, description: "the trajectory key the task named ({uid}_{session_id}_{output_index})", schema: { type: "string" } };
  const security = [{ session_bearer: [] }];
  // How a turn route tells a retry (replayed from the record) from a resample (a new engine call).
  const retryCount = { name: "x-stainless-retry-count", in: "header", required: false, description: "the SDK's attempt number: ≥ 1 (a retry) replays an equal call the session answered; 0 or absent: an equal body is a new sample", schema: { type: "string" } };
  const idemKey = { name: "Idempotency-Key", in: "header", required: false, description: "1-255 characters: the same key with the same body replays the call, with another body is a 422; a new key is a new call", schema: { type: "string", minLength: 1, maxLength: 255 } };
  const agentRole = { name: "X-Agent-Role", in: "header", required: false, description: "the call's agent role (over the task's agent_role): served by its pool of config agent.roles and recorded as the records' agent_role; a role agent.roles does not list is a 400", schema: { type: "string", minLength: 1, maxLength: 64, pattern: "^[A-Za-z0-9._-]+$" } };
  const turn = [key, retryCount, idemKey, agentRole];
  const reused = { ...err, description: "the Idempotency-Key was used with another request body (code idempotency_key_reused, field Idempotency-Key)" };
  const unauthorized = { ...err, description: "wrong or missing session token, or an unknown session (the same answer, so keys cannot be probed)" };
  const closed = { ...err, description: "the session is closed (code session_closed; x-should-retry: false)" };
  return {
    "/v1/sessions/{key}/openai/v1/chat/completions": {
      post: {
        summary: "OpenAI chat completion for an agent's session, recorded token-exact (stream: true answers text/event-stream)",
        security,
        parameters: turn,
        requestBody: { required: true, content: { "application/json": { schema: schema(ChatCompletionRequestSchema) } } },
        responses: {
          "200": {
            description: "chat.completion (or, stream: true, text/event-stream of chat.completion.chunk sent as the turn is sampled, a usage chunk only with stream_options.include_usage, then [DONE]); x-edgeloop-ignored-keys names accepted-and-ignored keys",
            content: { "application/json": { schema: { type: "object" } }, "text/event-stream": { schema: { type: "string" } } },
          },
          "400": { ...err, description: "a request edgeloop cannot answer (field names it: n, messages[1].content[0].type, …)" },
          "401": unauthorized,
          "409": closed,
          "413": err,
          "422": reused,
          "502": err,
          "503": err,
        },
      },
    },
    "/v1/sessions/{key}/openai/v1/responses": {
      post: {
        summary: "OpenAI Responses call for an agent's session, recorded token-exact like chat completions (previous_response_id: a response of this session)",
        security,
        parameters: turn,
        requestBody: { required: true, content: { "application/json": { schema: schema(ResponsesRequestSchema) } } },
        responses: {
          "200": {
            description: "a Responses response object (or, stream: true, text/event-stream of response.created … response.completed); x-edgeloop-ignored-keys names accepted-and-ignored keys",
            content: { "application/json": { schema: { type: "object" } }, "text/event-stream": { schema: { type: "string" } } },
          },
          "400": { ...err, description: "a request edgeloop cannot answer (field names it: tools[0].type, text.format, previous_response_id, …)" },
          "401": unauthorized,
          "409": closed,
          "413": err,
          "422": reused,
          "502": err,
          "503": err,
        },
      },
    },
    "/v1/sessions/{key}/openai/v1/models": {
      get: {
        summary: "The one model the gateway serves (OpenAI list of models)",
        security,
        parameters: [key],
        responses: { "200": { description: "{object: list, data: [{id, object: model, created, owned_by}]}" }, "401": unauthorized },
      },
    },
    "/v1/sessions/{key}/anthropic/v1/messages": {
      post: {
        summary: "Anthropic Messages call for an agent's session, recorded token-exact like chat completions (token in x-api-key or bearer; errors in Anthropic's shape)",
        security,
        parameters: turn,
        requestBody: { required: true, content: { "application/json": { schema: schema(MessagesRequestSchema) } } },
        responses: {
          "200": {
            description: "a Messages message object (or, stream: true, text/event-stream of message_start … message_stop); x-edgeloop-ignored-keys names accepted-and-unused keys",
            content: { "application/json": { schema: { type: "object" } }, "text/event-stream": { schema: { type: "string" } } },
          },
          "400": { description: "{type: error, error: {type: invalid_request_error, message}}: the message names the field (tool_choice, top_k, messages[0].content[1].type, …)" },
          "401": { description: "authentication_error: wrong or missing session token, or an unknown session (the same answer)" },
          "409": { description: "conflict_error: the session is closed (x-should-retry: false)" },
          "413": { description: "request_too_large" },
          "422": { description: "invalid_request_error: the Idempotency-Key was used with another request body" },
          "500": { description: "api_error" },
          "529": { description: "overloaded_error: the engine or the store cannot answer now (retried by the SDK)" },
        },
      },
    },
    "/v1/sessions/{key}/finish": {
      post: {
        summary: "The agent is done: the session's outputs are recorded (idempotent; an empty body finishes without a reward)",
        security,
        parameters: [key],
        requestBody: { required: false, content: { "application/json": { schema: schema(AgentTaskResult) } } },
        responses: { "200": { description: "{ok: true, key, outputs, finished_by}" }, "400": err, "401": unauthorized, "409": closed, "413": err },
      },
    },
  };
}
