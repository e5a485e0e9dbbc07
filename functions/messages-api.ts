import { Hono, type Context } from "hono";
import { SessionClosedError, turnOptionsOf, type AgentGateway } from "../shared/agent-gateway/agent-gateway.ts";
import { anthropicError, ignoredMessagesKeys, messagesBody, parseMessagesRequest } from "../shared/agent-gateway/messages-wire.ts";
import { MessagesSseWriter } from "../shared/agent-gateway/sse-writers.ts";
import { abandonUnlessDelivered, streamTurn } from "./sse-stream.ts";
import { AuthError, InputError, NotFoundError } from "../shared/errors.ts";
import { errorResponse } from "./rollouts.ts";
import { limitBody, tooLarge } from "./http-util.ts";

/** Options of {@link createMessagesApp}. */
export interface MessagesAppOptions {
  gateway: AgentGateway;
  /** Largest request body in bytes (the chat route's: 16 MiB by default). */
  maxBodyBytes?: number;
}

/**
 * The session token of a Messages request: `x-api-key` (what Anthropic's
 * API reads), else `Authorization: Bearer …` (what `@anthropic-ai/sdk`
 * v1.16.0 sends for both `apiKey` and `authToken`); null when neither.
 */
export function messagesToken(c: Context): string | null {
  const key = c.req.header("x-api-key")?.trim();
  if (key) return key;
  const h = c.req.header("authorization");
  const m = h ? /^Bearer\s+(.+)$/i.exec(h.trim()) : null;
  return m ? m[1]!.trim() : null;
}

/**
 * An error answered in Anthropic's shape ({@link anthropicError}): the status
 * and message of edgeloop's own answer (`errorResponse`: store outages,
 * retry-after), with `x-should-retry: false` on a closed session (the
 * Anthropic SDK retries 409s otherwise).
 */
export async function messagesErrorResponse(err: unknown, c: Context): Promise<Response> {
  const own = errorResponse(err, c);
  const j = (await own.json().catch(() => ({}))) as { error?: { message?: unknown } };
  const { status, body } = anthropicError(own.status, typeof j.error?.message === "string" ? j.error.message : "internal error");
  const headers = new Headers({ "content-type": "application/json" });
  const retryAfter = own.headers.get("retry-after");
  if (retryAfter) headers.set("retry-after", retryAfter);
  if (err instanceof AuthError) headers.set("www-authenticate", 'Bearer realm="edgeloop"');
  if (err instanceof SessionClosedError) headers.set("x-should-retry", "false");
  return new Response(JSON.stringify(body), { status, headers });
}

/**
 * The Anthropic Messages endpoint of an agent session (Hono, runtime-neutral;
 * mount it with `app.route("/", …)`), authenticated by the session's token
 * (`x-api-key` or bearer), errors in Anthropic's shape:
 * - `POST /v1/sessions/{key}/anthropic/v1/messages` — one turn
 *   ({@link AgentGateway.turnAuthorized} on the translated request, so the
 *   same token-exact recording, continuation and replay as chat completions);
 *   `stream: true` answers the Messages SSE events. Keys accepted but unused
 *   are named in `x-edgeloop-ignored-keys`.
 * - any other path under `…/anthropic/` — 404 `not_found_error`.
 * The `@anthropic-ai/sdk` with `baseURL: …/v1/sessions/{key}/anthropic`
 * posts to `{baseURL}/v1/messages`. 401 wrong token or unknown key (alike),
 * 400 naming the field, 409 closed session, 413 body over `maxBodyBytes`,
 * 422 an `Idempotency-Key` reused with another body (replays and resamples as
 * on chat completions: `x-stainless-retry-count` ≥ 1 or a known key replays),
 * 529 engine or store unavailable (retried by the SDK).
 */
export function createMessagesApp(opts: MessagesAppOptions): Hono {
  const app = new Hono();
  const gw = opts.gateway;
  const maxBody = opts.maxBodyBytes ?? 16 * 1024 * 1024;
  app.onError((err, c) => messagesErrorResponse(err, c));
  app.use("/v1/sessions/:key/anthropic/*", limitBody(maxBody));

  app.post("/v1/sessions/:key/anthropic/v1/messages", async (c) => {
    const key = c.req.param("key");
    try {
      await gw.authorize(key, messagesToken(c));
    } catch (e) {
      // An unknown key is the same 401 as a wrong token (no session-existence oracle).
      if (e instanceof NotFoundError) throw new AuthError(`wrong or missing API key for agent session '${key.slice(0, 200)}'`);
      if (e instanceof AuthError) throw new AuthError(`wrong or missing API key for agent session '${key.slice(0, 200)}'`);
      throw e;
    }
    const raw = await c.req.text();
    if (raw.length > maxBody) throw tooLarge(maxBody);
    let body: unknown;
    try {
      body = JSON.parse(raw);
    } catch {
      throw new InputError("body", "malformed JSON");
    }
    const req = parseMessagesRequest(body);
    const opts = turnOptionsOf(c.req.raw.headers);
    const ignored = ignoredMessagesKeys(body);
    const named: Record<string, string> = ignored.length > 0 ? { "x-edgeloop-ignored-keys": ignored.join(",") } : {};
    if (req.stream) return streamTurn((w) => new MessagesSseWriter(w), (sink) => gw.turnAuthorized(key, req, opts, sink), named, (end) => abandonUnlessDelivered(gw, key, end), c.req.raw.signal);
    const reply = await gw.turnAuthorized(key, req, opts);
    // The client went away while the turn was sampled: it never receives this reply.
    abandonUnlessDelivered(gw, key, { delivered: !c.req.raw.signal.aborted, reply });
    return c.json(messagesBody(reply), 200, named);
  });

  app.all("/v1/sessions/:key/anthropic/*", (c) => {
    throw new NotFoundError(`no route ${c.req.method} ${c.req.path.slice(0, 300)}: the Messages endpoint is POST …/anthropic/v1/messages`);
  });
  return app;
}
