import type { Context, MiddlewareHandler } from "hono";
import { bodyLimit } from "hono/body-limit";
import { AuthError, EdgeloopError, InputError } from "../shared/errors.ts";

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
  // preflight, which stops drive-by form posts. It does not stop a DNS-rebinding page (same origin
  // once rebound): a token-less server also refuses non-loopback Host/Origin (loopbackGuard).
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

/**
 * Whether a host name (no port; IPv6 with or without brackets) is a loopback
 * name: `localhost` (and `*.localhost`, RFC 6761), `127.0.0.0/8`, `::1`.
 */
export function isLoopbackName(name: string): boolean {
  const h = name.toLowerCase().replace(/^\[|\]$/g, "").replace(/\.$/, "");
  if (h === "localhost" || h.endsWith(".localhost")) return true;
  if (h === "::1" || h === "0:0:0:0:0:0:0:1") return true;
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h) && h.split(".").every((p) => Number(p) <= 255);
}

/** The host name of a `Host` header value (`name`, `name:port`, `[v6]:port`); null when malformed. */
function hostNameOf(host: string): string | null {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^:\s\[\]/@]+)(?::\d{1,5})?$/.exec(host.trim());
  return m ? m[1]! : null;
}

/**
 * Middleware for a server running without an API token: only loopback
 * clients may talk to it. A request whose `Host` is not a loopback name
 * (`127.0.0.1`, `localhost`, `[::1]`, any port) or one of `extraHosts`, or
 * that carries an `Origin` other than `http(s)://` such a host, is refused
 * with 403 `{error: {code: "forbidden_host", field: "host"|"origin"}}`. This
 * closes DNS rebinding: a page on `rebind.attacker.example` that resolves to
 * 127.0.0.1 still sends its own name as `Host` and `Origin`.
 * @param extraHosts further accepted host names, lower-case without port (e.g. the host of `agent.public_url`)
 */
export function loopbackGuard(extraHosts: readonly string[] = []): MiddlewareHandler {
  const extra = new Set(extraHosts.map((h) => h.toLowerCase()));
  const ok = (name: string | null) => name !== null && (isLoopbackName(name) || extra.has(name.toLowerCase()));
  const refuse = (field: "host" | "origin", value: string) =>
    new EdgeloopError(
      `${field} '${value.slice(0, 100)}' is not a loopback name: without EDGELOOP_API_TOKEN this server answers only requests to 127.0.0.1, localhost or [::1] (DNS-rebinding guard); set EDGELOOP_API_TOKEN to serve other names`,
      { status: 403, code: "forbidden_host", field },
    );
  return async (c, next) => {
    const host = c.req.header("host") ?? new URL(c.req.url).host;
    if (!ok(hostNameOf(host))) throw refuse("host", host);
    const origin = c.req.header("origin");
    if (origin !== undefined) {
      let name: string | null = null;
      try {
        const u = new URL(origin);
        if (u.protocol === "http:" || u.protocol === "https:") name = u.hostname;
      } catch {
        name = null;
      }
      if (!ok(name)) throw refuse("origin", origin);
    }
    await next();
  };
}

/**
 * The API's auth on a public runtime (the Worker, the Deno entry): bearer
 * `token` when one is set; without one, every request is refused with 403
 * `{error: {code: "auth_not_configured"}}` unless `allowAnonymous` (the
 * operator's explicit `EDGELOOP_ALLOW_ANONYMOUS=1`), so a forgotten secret
 * fails closed.
 * @param where names the runtime in the message (`Worker`, `Deno entry`)
 */
export function apiAuth(token: string | null, allowAnonymous: boolean, where: string): MiddlewareHandler {
  if (token) return bearerAuth(token);
  return async (_c, next) => {
    if (!allowAnonymous) {
      throw new EdgeloopError(`this ${where} has no EDGELOOP_API_TOKEN, so /v1/* is refused: set EDGELOOP_API_TOKEN (a secret), or EDGELOOP_ALLOW_ANONYMOUS=1 to serve without auth`, {
        status: 403,
        code: "auth_not_configured",
      });
    }
    await next();
  };
}

/** Whether `EDGELOOP_ALLOW_ANONYMOUS` says yes: exactly `1` or `true` (anything else, absent included, is no). */
export function allowAnonymous(value: string | undefined): boolean {
  return value === "1" || value === "true";
}

/** The auth line a public runtime prints (as `serve` prints its own): one of three states. */
export function runtimeAuthLine(token: string | null, anonymous: boolean): string {
  if (token) return "auth       bearer token required on /v1/* (EDGELOOP_API_TOKEN)";
  if (anonymous) return "auth       NONE (EDGELOOP_ALLOW_ANONYMOUS=1): anyone who reaches this URL can submit batches and read group status";
  return "auth       no EDGELOOP_API_TOKEN: /v1/* is refused (403 auth_not_configured); set EDGELOOP_API_TOKEN, or EDGELOOP_ALLOW_ANONYMOUS=1 to serve without auth";
}
