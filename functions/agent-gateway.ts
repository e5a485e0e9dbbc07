import { Hono, type Context } from "hono";
import { SessionClosedError, turnOptionsOf, type AgentGateway } from "../shared/agent-gateway/agent-gateway.ts";
import { chatCompletionBody, ignoredChatKeys, modelsBody, parseChatRequest } from "../shared/agent-gateway/openai-wire.ts";
import { prepareResponses } from "../shared/agent-gateway/responses.ts";
import { ignoredResponsesKeys, responseIdOf, responsesBody } from "../shared/agent-gateway/responses-wire.ts";
import { ChatSseWriter, ResponsesSseWriter } from "../shared/agent-gateway/sse-writers.ts";
import { abandonUnlessDelivered, streamTurn } from "./sse-stream.ts";
import { AgentTaskResult } from "../shared/agent-gateway/task.ts";
import { AuthError, InputError, inputErrorFromZod, NotFoundError } from "../shared/errors.ts";
import { errorResponse } from "./rollouts.ts";
import { limitBody, tooLarge } from "./http-util.ts";
import { createMessagesApp } from "./messages-api.ts";

/** Options of {@link createAgentGatewayApp}. */
export interface AgentGatewayAppOptions {
  gateway: AgentGateway;
  /** Largest request body in bytes (default 16 MiB: an agent's whole history travels in every call). */
  maxBodyBytes?: number;
}

/** The session bearer token of a request (`Authorization: Bearer …`), or null. */
function bearer(c: Context): string | null {
  const h = c.req.header("authorization");
  const m = h ? /^Bearer\s+(.+)$/i.exec(h.trim()) : null;
  return m ? m[1]!.trim() : null;
}

async function jsonBody(c: Context, maxBody: number): Promise<unknown> {
  const raw = await c.req.text();
  if (raw.length > maxBody) throw tooLarge(maxBody);
  try {
    return JSON.parse(raw);
  } catch {
    throw new InputError("body", "malformed JSON");
  }
}

/**
 * The agent gateway function (Hono, runtime-neutral), per session `key`,
 * every route authenticated by the session's own bearer token (the task's
 * `api_key`):
 * - `POST /v1/sessions/{key}/openai/v1/chat/completions` — an OpenAI chat
 *   completion (`stream: true`: `text/event-stream` of `chat.completion.chunk`s
 *   sent as the engine samples them, see `streamTurn`; a usage chunk only
 *   with `stream_options.include_usage`; `[DONE]`), recorded token-exact
 *   ({@link AgentGateway.chat});
 * - `POST /v1/sessions/{key}/openai/v1/responses` — the same turn as an OpenAI
 *   Responses call (`stream: true`: the Responses SSE events), see `answerResponses`;
 * - `GET /v1/sessions/{key}/openai/v1/models` — the one model served (the caller's agent role's pool's);
 * - `POST /v1/sessions/{key}/finish` `{reward?, metadata?}` → `{ok, key, outputs}` (idempotent);
 * - `POST /v1/sessions/{key}/anthropic/v1/messages` — Anthropic's Messages API
 *   on the same session ({@link createMessagesApp}; its errors in Anthropic's shape).
 * 401 wrong or missing token, or an unknown session (the same answer, so
 * keys cannot be probed), 400 a request edgeloop
 * cannot answer (names the field: `n`, `messages[1].content[0].type`, …),
 * 409 a closed session (code `session_closed`, with `x-should-retry: false`
 * so the OpenAI SDKs do not retry it), 502/503 engine failures
 * (the OpenAI SDK retries them; a retry — `x-stainless-retry-count` ≥ 1 —
 * or a call with an `Idempotency-Key` already answered gets the stored reply,
 * an equal body without either is sampled again; see {@link turnOptionsOf}),
 * 422 an `Idempotency-Key` reused with another body. Errors are
 * `{error: {code, message, field?, type, param}}`: edgeloop's fields and
 * OpenAI's (`type`, `param`: see {@link openAiErrorShape}).
 */
export function createAgentGatewayApp(opts: AgentGatewayAppOptions): Hono {
  const app = new Hono();
  const gw = opts.gateway;
  /**
   * The session's state once its token checks out. An unknown key is the same
   * 401 as a wrong token: a 404 would tell whoever guesses keys (rows often
   * carry their own uids) which sessions exist.
   */
  const authorize = async (key: string, token: string | null) => {
    try {
      return await gw.authorize(key, token);
    } catch (e) {
      if (e instanceof NotFoundError) throw new AuthError(`wrong or missing bearer token for agent session '${key.slice(0, 200)}'`);
      throw e;
    }
  };
  const maxBody = opts.maxBodyBytes ?? 16 * 1024 * 1024;
  app.onError(async (err, c) => {
    const res = await openAiErrorShape(errorResponse(err, c));
    // OpenAI SDKs retry every 409 (twice, with backoff) unless told not to; a closed session stays closed.
    if (err instanceof SessionClosedError) res.headers.set("x-should-retry", "false");
    return res;
  });
  app.use("/v1/sessions/:key/openai/*", limitBody(maxBody));
  app.use("/v1/sessions/:key/finish", limitBody(1024 * 1024));
  app.route("/", createMessagesApp({ gateway: gw, maxBodyBytes: maxBody }));

  app.post("/v1/sessions/:key/openai/v1/chat/completions", async (c) => {
    const key = c.req.param("key");
    const token = bearer(c);
    await authorize(key, token);
    const body = await jsonBody(c, maxBody);
    const opts = turnOptionsOf(c.req.raw.headers);
    const req = parseChatRequest(body);
    // Keys accepted but not used are named, so an agent can tell what did not take effect.
    const ignored = ignoredChatKeys(body);
    const named: Record<string, string> = ignored.length > 0 ? { "x-edgeloop-ignored-keys": ignored.join(",") } : {};
    if (req.stream) {
      return streamTurn((w) => new ChatSseWriter(w, { includeUsage: req.include_usage === true }), (sink) => gw.turnAuthorized(key, req, opts, sink), named, (end) => abandonUnlessDelivered(gw, key, end), c.req.raw.signal);
    }
    const reply = await gw.turnAuthorized(key, req, opts);
    // The client went away while the turn was sampled: it never receives this reply.
    abandonUnlessDelivered(gw, key, { delivered: !c.req.raw.signal.aborted, reply });
    return c.json(chatCompletionBody(reply), 200, named);
  });

  app.post("/v1/sessions/:key/openai/v1/responses", async (c) => {
    const key = c.req.param("key");
    await authorize(key, bearer(c));
    const body = await jsonBody(c, maxBody);
    const opts = turnOptionsOf(c.req.raw.headers);
    const p = await prepareResponses(gw, key, body);
    const ignored = ignoredResponsesKeys(body);
    const named: Record<string, string> = ignored.length > 0 ? { "x-edgeloop-ignored-keys": ignored.join(",") } : {};
    if (p.req.stream) {
      const w = { messages: p.req.messages.length, instructions: p.instructions, echo: p.echo };
      return streamTurn((write) => new ResponsesSseWriter(write, w), (sink) => gw.turnAuthorized(key, p.req, opts, sink), named, (end) => abandonUnlessDelivered(gw, key, end), c.req.raw.signal);
    }
    const reply = await gw.turnAuthorized(key, p.req, opts);
    abandonUnlessDelivered(gw, key, { delivered: !c.req.raw.signal.aborted, reply });
    return c.json(responsesBody(reply, responseIdOf(reply, p.req.messages.length, p.instructions), p.echo), 200, named);
  });

  app.get("/v1/sessions/:key/openai/v1/models", async (c) => {
    const st = await authorize(c.req.param("key"), bearer(c));
    // The model of the caller's role (X-Agent-Role, else the session's agent_role), as its replies report it.
    return c.json(modelsBody(gw.modelNameFor(turnOptionsOf(c.req.raw.headers).role ?? st.input.agent_role), Math.floor(st.input.created_ms / 1000)));
  });

  app.post("/v1/sessions/:key/finish", async (c) => {
    const key = c.req.param("key");
    await authorize(key, bearer(c));
    const raw = await c.req.text();
    let json: unknown = {};
    if (raw.trim() !== "") {
      try {
        json = JSON.parse(raw);
      } catch {
        throw new InputError("body", "malformed JSON");
      }
    }
    const r = AgentTaskResult.safeParse(json);
    if (!r.success) throw inputErrorFromZod("", r.error.issues);
    const st = await gw.finish(key, { by: "agent", reward: r.data.reward ?? null, metadata: r.data.metadata ?? null });
    return c.json({ ok: true, key, outputs: st.outputs.length, finished_by: st.finish?.by ?? "agent" });
  });
  return app;
}

/**
 * OpenAI's error object over edgeloop's: `{error: {message, type, param,
 * code}}` as the OpenAI API sends it (the `openai` SDK exposes them as
 * `e.type`, `e.param`, `e.code`), keeping `field`. `type` by status:
 * 400/404/409/413/422 `invalid_request_error`, 401 `authentication_error`,
 * 403 `permission_error`, 429 `rate_limit_error`, 5xx `server_error`;
 * `param` is the field the error names, else null. A body that is not
 * edgeloop's `{error: {...}}` is passed through.
 */
export async function openAiErrorShape(res: Response): Promise<Response> {
  const text = await res.text();
  let body: { error?: Record<string, unknown> } | null = null;
  try {
    body = JSON.parse(text) as { error?: Record<string, unknown> };
  } catch {
    body = null;
  }
  const headers = new Headers(res.headers);
  if (!body || typeof body.error !== "object" || body.error === null) return new Response(text, { status: res.status, headers });
  const s = res.status;
  const type = s === 401 ? "authentication_error" : s === 403 ? "permission_error" : s === 429 ? "rate_limit_error" : s >= 500 ? "server_error" : "invalid_request_error";
  const e = body.error;
  headers.delete("content-length");
  return new Response(JSON.stringify({ error: { ...e, type, param: typeof e.field === "string" ? e.field : null } }), { status: s, headers });
}
