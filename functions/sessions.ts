import { Hono } from "hono";
import { NotFoundError } from "../shared/errors.ts";
import { parseToolResultCallback } from "../shared/session/tool-result-callback.ts";
import type { ToolResultDelivery } from "../shared/session/trajectory-session.ts";
import { SIGNATURE_HEADER } from "../shared/tools/signature.ts";
import { errorResponse } from "./rollouts.ts";
import { bearerAuth, limitBody, tooLarge } from "./http-util.ts";

/** What the sessions function needs from a session host (in-process {@link SessionHost}, or a Durable Object namespace). */
export interface SessionsBackend {
  /**
   * Commits an awaited tool call's result and lets the session go on (here,
   * or — queue mode — by waking the worker that runs it).
   * @throws NotFoundError (404) for an unknown key; ConflictError (409) for an unknown or already-answered call_id.
   */
  deliver(key: string, result: ToolResultDelivery): Promise<void>;
  /** A session's stored state, or null when the key has none. */
  status?(key: string): Promise<unknown | null>;
}

/** Options of {@link createSessionsApp}. */
export interface SessionsAppOptions {
  backend: SessionsBackend;
  /** Webhook secret (`tools.secret`): callbacks must be signed with it; without one every callback is refused (403). */
  secret?: string | null;
  /** Bearer token for `GET /v1/sessions/{key}` (`EDGELOOP_API_TOKEN`); callbacks are authenticated by signature instead. */
  apiToken?: string | null;
  /** Unix seconds for signature freshness (tests). */
  nowSeconds?: () => number;
  /** Largest callback body in bytes (default 4 MiB). */
  maxBodyBytes?: number;
}

/**
 * The sessions function (Hono, runtime-neutral):
 * - `POST /v1/sessions/{key}/tool-results` `{call_id, content, reward?, ok?, metrics?}`
 *   as `application/json`, signed with `x-edgeloop-signature` → `200 {ok, key, call_id}`;
 *   403 when no secret is configured (call ids are predictable, so unsigned
 *   callbacks are never accepted), 401 bad/missing/stale signature (both
 *   judged first), 415 another content type, 400 bad body (names the field;
 *   an unknown key is refused), 404 unknown session, 409 unknown or
 *   already-answered `call_id`.
 * - `GET /v1/sessions/{key}` → the session's phase, step and awaited calls (404 when none).
 * Errors are `{error: {code, message, field?}}`.
 */
export function createSessionsApp(opts: SessionsAppOptions): Hono {
  const app = new Hono();
  const maxBody = opts.maxBodyBytes ?? 4 * 1024 * 1024;
  app.onError((err, c) => errorResponse(err, c));
  app.notFound((c) => c.json({ error: { code: "not_found", message: `no route ${c.req.method} ${c.req.path.slice(0, 200)}` } }, 404));
  app.use("/v1/sessions/*", limitBody(maxBody));

  app.post("/v1/sessions/:key/tool-results", async (c) => {
    const key = c.req.param("key");
    const raw = await c.req.text();
    if (new TextEncoder().encode(raw).byteLength > maxBody) throw tooLarge(maxBody);
    const result = await parseToolResultCallback(raw, c.req.header(SIGNATURE_HEADER), {
      secret: opts.secret,
      nowSeconds: (opts.nowSeconds ?? (() => Date.now() / 1000))(),
      contentType: c.req.header("content-type") ?? null,
    });
    await opts.backend.deliver(key, result);
    return c.json({ ok: true, key, call_id: result.call_id });
  });

  app.get("/v1/sessions/:key", bearerAuth(opts.apiToken ?? null), async (c) => {
    const key = c.req.param("key");
    const s = opts.backend.status ? await opts.backend.status(key) : null;
    if (s === null) throw new NotFoundError(`no session '${key.slice(0, 200)}'`, { field: "key" });
    return c.json(s);
  });
  return app;
}
