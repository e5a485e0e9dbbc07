import type { Context, MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { AuthError, InputError } from "../shared/errors.ts";

/** The 413 of a request body over `maxBytes`: code `request_too_large`, as the store's request limits say. */
export function tooLarge(maxBytes: number): InputError {
  return new InputError("body", `larger than ${maxBytes} bytes`, { status: 413, code: "request_too_large" });
}

/**
 * Middleware refusing request bodies over `maxBytes` with 413
 * `{error: {code: "request_too_large", field: "body"}}` — by `content-length`
 * when declared, else while the body streams in (never buffering more than
 * the limit), so no endpoint reads an unbounded body.
 */
export function limitBody(maxBytes: number): MiddlewareHandler {
  return bodyLimit({
    maxSize: maxBytes,
    onError: () => {
      throw tooLarge(maxBytes);
    },
  });
}

/** The media type of a request's `content-type` header, lower-cased (`""` when absent). */
function mediaType(c: Context): string {
  return (c.req.header("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
}

/** The 415 of a body not sent as `application/json` (field `content-type`). */
export function notJson(type: string): InputError {
  return new InputError("content-type", `expected application/json, got ${type ? `'${type.slice(0, 100)}'` : "none"}`, { status: 415 });
}

/** Reads at most `maxBytes` of the request body (413 past them, by the declared length first). */
async function readBody(c: Context, maxBytes: number): Promise<ArrayBuffer> {
  const declared = Number(c.req.header("content-length") ?? "0");
  if (declared > maxBytes) throw tooLarge(maxBytes);
  const buf = await c.req.arrayBuffer();
  if (buf.byteLength > maxBytes) throw tooLarge(maxBytes);
  return buf;
}

function parseJson(buf: ArrayBuffer): unknown {
  try {
    return JSON.parse(new TextDecoder().decode(buf));
  } catch {
    throw new InputError("body", "malformed JSON");
  }
}

/**
 * Reads a JSON body of at most `maxBytes` bytes, sent as `application/json`.
 * @throws InputError: 415 (field `content-type`) for another content type; 413 for an
 *   oversized body; 400 (field `body`) for a missing or malformed one.
 */
export async function readJson(c: Context, maxBytes: number): Promise<unknown> {
  // Only JSON bodies: a browser page cannot send application/json cross-origin without a CORS
  // preflight, so this also keeps a token-less local server out of reach of drive-by form posts.
  const type = mediaType(c);
  if (type !== "application/json") throw notJson(type);
  const buf = await readBody(c, maxBytes);
  if (buf.byteLength === 0) throw new InputError("body", "expected a JSON body");
  return parseJson(buf);
}

/**
 * Reads an optional JSON body (routes such as `POST /v1/engine/resume` that
 * take none today): `undefined` for an empty body, whatever its content type;
 * a non-empty one is read as {@link readJson} reads it.
 * @throws InputError: 415 (field `content-type`) for a non-empty body not sent as
 *   `application/json`; 413 for an oversized body; 400 (field `body`) for malformed JSON.
 */
export async function readOptionalJson(c: Context, maxBytes: number): Promise<unknown> {
  const buf = await readBody(c, maxBytes);
  if (buf.byteLength === 0) return undefined;
  const type = mediaType(c);
  if (type !== "application/json") throw notJson(type);
  return parseJson(buf);
}

/**
 * Whether a request's body is declared as `application/json`, for routes that
 * read the raw text themselves (signed callbacks).
 * @throws InputError 415 (field `content-type`) otherwise.
 */
export function requireJsonType(c: Context): void {
  const type = mediaType(c);
  if (type !== "application/json") throw notJson(type);
}

/** Constant-time string comparison (no early exit on the first differing byte). */
export function timingSafeEqual(a: string, b: string): boolean {
  const ea = new TextEncoder().encode(a);
  const eb = new TextEncoder().encode(b);
  let diff = ea.length ^ eb.length;
  for (let i = 0; i < Math.max(ea.length, eb.length); i++) diff |= (ea[i] ?? 0) ^ (eb[i] ?? 0);
  return diff === 0;
}

/** Middleware requiring `Authorization: Bearer <token>` when `token` is set; a no-op otherwise. */
export function bearerAuth(token: string | null): MiddlewareHandler {
  return async (c, next) => {
    if (token) {
      const h = c.req.header("authorization") ?? "";
      const m = /^Bearer\s+(.+)$/i.exec(h);
      if (!m || !timingSafeEqual(m[1]!, token)) throw new AuthError("missing or wrong bearer token");
    }
    await next();
  };
}
