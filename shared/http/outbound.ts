/**
 * The one outbound-HTTP path for calls whose peer edgeloop does not control:
 * tool, interaction, reward and agent-task webhooks, engines and teachers.
 * Every call made through {@link outboundRequest}:
 * - never follows a redirect (`redirect: "manual"`; a 3xx is a failed call naming the status);
 * - has a deadline (`AbortSignal.timeout`) covering the reply up to its last byte;
 * - reads the reply under a byte cap counted while the body streams in
 *   ({@link readTextCapped}), never after a full read;
 * - names its peer only by {@link redactUrl} (no userinfo, query or fragment) in every message.
 * Runtime-free: Web `fetch`, `ReadableStream` readers, `AbortSignal`.
 */

/** Default reply cap of webhooks (tools, interactions, rewards, agent tasks): 4 MiB. */
export const DEFAULT_WEBHOOK_MAX_REPLY_BYTES = 4 * 1024 * 1024;

/** Default reply cap of engine and teacher calls: 64 MiB (long generations with log-probs are big). */
export const DEFAULT_ENGINE_MAX_REPLY_BYTES = 64 * 1024 * 1024;

/** A Web-standard `fetch` (injectable: tests, in-process gateways). */
export type OutboundFetch = (input: Request | string | URL, init?: RequestInit) => Promise<Response>;

/** Why an outbound call failed before a usable reply: the `kind` callers map to their own errors. */
export type OutboundFailure = "redirect" | "too_large" | "timeout" | "aborted" | "connection";

/**
 * A failed outbound call. `message` names the peer by {@link redactUrl} only.
 * `status` is the 3xx for `redirect`, else 0; `maxBytes` is the cap for `too_large`.
 */
export class OutboundHttpError extends Error {
  override name = "OutboundHttpError";
  constructor(
    readonly kind: OutboundFailure,
    message: string,
    readonly status = 0,
    readonly maxBytes = 0,
    cause?: unknown,
  ) {
    super(message, cause === undefined ? undefined : { cause });
  }
}

/**
 * Path segments after which every segment is a secret (case-insensitive):
 * webhook services put the credential in the path after these (Slack's
 * `/services/T…/B…/<secret>`, Discord's `/api/webhooks/<id>/<token>`,
 * generic `/hooks/<secret>`), and `…/token/<value>`-style paths do the same.
 */
const SECRET_PATH_MARKERS = new Set([
  "hook", "hooks", "webhook", "webhooks", "services", "token", "tokens", "secret", "secrets",
  "key", "keys", "apikey", "api_key", "api-key", "auth", "sig", "signature", "password", "credential", "credentials",
]);

/** What a secret path segment shows as in {@link redactUrl}. */
export const REDACTED_SEGMENT = "***";

/**
 * Whether one path segment (as written, percent-escapes included) looks like
 * a token: 32 characters or more; or 16 or more from `[A-Za-z0-9._~%+=-]`
 * holding both a letter and a digit (API keys, UUIDs, base64/hex secrets).
 * False positives are accepted: a long versioned name such as
 * `Qwen2.5-7B-Instruct` is hidden too; words without digits are not.
 */
export function isTokenLikeSegment(seg: string): boolean {
  if (seg.length >= 32) return true;
  return seg.length >= 16 && /^[A-Za-z0-9._~%+=-]+$/.test(seg) && /[0-9]/.test(seg) && /[A-Za-z]/.test(seg);
}

/**
 * The segments of `path` (a URL's path, `/a/b`) that {@link redactUrl}
 * hides: every segment after a {@link SECRET_PATH_MARKERS} segment, and
 * every {@link isTokenLikeSegment} segment.
 */
export function secretPathSegments(path: string): string[] {
  const out: string[] = [];
  let afterMarker = false;
  for (const seg of path.split("/")) {
    if (seg === "") continue;
    if (afterMarker || isTokenLikeSegment(seg)) out.push(seg);
    else if (SECRET_PATH_MARKERS.has(seg.toLowerCase())) afterMarker = true;
  }
  return out;
}

/** `path` with its {@link secretPathSegments} replaced by {@link REDACTED_SEGMENT}. */
function redactPath(path: string): string {
  let afterMarker = false;
  return path
    .split("/")
    .map((seg) => {
      if (seg === "") return seg;
      if (afterMarker || isTokenLikeSegment(seg)) return REDACTED_SEGMENT;
      if (SECRET_PATH_MARKERS.has(seg.toLowerCase())) afterMarker = true;
      return seg;
    })
    .join("/");
}

/**
 * The URL as it may be shown in records, logs, metrics and traces:
 * `scheme://host[:port]/path`, without userinfo, query string or fragment
 * (where webhook secrets such as `?token=…` live), and with path segments
 * that hold secrets shown as `***` (issue 26, S13): every segment after a
 * webhook or credential marker (`/hooks/`, `/webhooks/`, `/services/`,
 * `/token/`, `/key/`, … — {@link SECRET_PATH_MARKERS}) and every token-like
 * segment ({@link isTokenLikeSegment}). So in `https://hooks.slack.com/services/T0/B0/XXXX`
 * the three segments after `services` each show as `***`, and
 * `http://h/v1/a1b2c3d4e5f6a7b8c9` shows as `http://h/v1/***`. A string without `?`, `#`, `@` or such a segment is
 * returned as written; one with them that does not parse as a URL shows as
 * `(invalid URL)`.
 */
export function redactUrl(url: string): string {
  // Without '?', '#' or '@' there is no query, fragment or userinfo: shown as written (no parse) unless the path holds a secret.
  const plain = !/[?#@]/.test(url);
  if (plain && secretPathSegments(url.replace(/^[a-z][a-z0-9+.-]*:\/\/[^/]*/i, "")).length === 0) return url;
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return "(invalid URL)";
  }
  return `${u.protocol}//${u.host}${redactPath(u.pathname)}`;
}

/**
 * Reads a reply body as UTF-8 text, refusing it as soon as more than
 * `maxBytes` bytes have arrived: the reader is cancelled (the connection is
 * not drained) and at most `maxBytes` plus one chunk is ever held. A declared
 * `content-length` over the cap fails before reading; a body with a declared
 * length within the cap and no `content-encoding` (whose length the transport
 * enforces) is read by the runtime's native `text()`.
 * @throws OutboundHttpError `too_large` naming `maxBytes` and `what`
 */
export async function readTextCapped(res: Response, maxBytes: number, what: string): Promise<string> {
  const tooLarge = () => new OutboundHttpError("too_large", `${what}: reply larger than ${maxBytes} bytes (the cap)`, 0, maxBytes);
  const declared = res.headers.get("content-length");
  const encoded = res.headers.has("content-encoding");
  if (declared !== null && /^\d+$/.test(declared)) {
    const n = Number(declared);
    if (n > maxBytes && !encoded) {
      await res.body?.cancel().catch(() => undefined);
      throw tooLarge();
    }
    if (!encoded) return res.text();
  }
  if (res.body === null) return "";
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const parts: string[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined);
      throw tooLarge();
    }
    parts.push(decoder.decode(value, { stream: true }));
  }
  parts.push(decoder.decode());
  return parts.length === 1 ? parts[0]! : parts.join("");
}

/** One outbound call: method (default POST), headers, body, deadline, reply cap, caller's signal. */
export interface OutboundRequest {
  method?: string;
  headers?: Record<string, string>;
  body?: BodyInit | null;
  /** Deadline of the whole call (connect, headers, body), milliseconds. */
  timeoutMs: number;
  /** Reply body cap, bytes. */
  maxReplyBytes: number;
  /** The caller's cancellation (distinguished from the deadline in the error's `kind`). */
  signal?: AbortSignal;
  /** Defaults to the global `fetch`. */
  fetch?: OutboundFetch;
  /** How messages name the peer (default `redactUrl(url)`); must not contain secrets. */
  what?: string;
}

/** A reply read whole under the cap: status, headers and body text. */
export interface OutboundReply {
  status: number;
  headers: Headers;
  text: string;
}

/**
 * Sends one request under the rules of this module and reads its reply.
 * Non-2xx statuses other than 3xx are returned (the caller decides).
 * @throws OutboundHttpError: `redirect` (any 3xx, `status` set; the Location is never fetched),
 *   `too_large`, `timeout` (after `timeoutMs`), `aborted` (the caller's signal), `connection`
 */
export async function outboundRequest(url: string, req: OutboundRequest): Promise<OutboundReply> {
  const what = req.what ?? redactUrl(url);
  const deadline = AbortSignal.timeout(req.timeoutMs);
  // Our own controller so that a refused body (a redirect, the cap) also closes the connection.
  const own = new AbortController();
  const signals = [deadline, own.signal];
  if (req.signal) signals.push(req.signal);
  const signal = AbortSignal.any(signals);
  const doFetch = req.fetch ?? fetch;
  let res: Response;
  try {
    res = await doFetch(url, { method: req.method ?? "POST", headers: req.headers, body: req.body ?? null, signal, redirect: "manual" });
    if ((res.status >= 300 && res.status < 400) || res.type === "opaqueredirect") {
      own.abort();
      await res.body?.cancel().catch(() => undefined);
      throw new OutboundHttpError("redirect", `${what}: answered HTTP ${res.status} (a redirect; redirects are not followed)`, res.status);
    }
    const text = await readTextCapped(res, req.maxReplyBytes, what);
    return { status: res.status, headers: res.headers, text };
  } catch (e) {
    if (e instanceof OutboundHttpError) {
      own.abort();
      throw e;
    }
    if (req.signal?.aborted) throw new OutboundHttpError("aborted", `${what}: aborted`, 0, 0, e);
    if (deadline.aborted) throw new OutboundHttpError("timeout", `${what}: timed out after ${req.timeoutMs} ms`, 0, 0, e);
    throw new OutboundHttpError("connection", `${what}: connection failed (${scrubUrl((e as Error)?.message ?? String(e), url)})`, 0, 0, e);
  }
}

/**
 * A runtime's error text with `url` (query and userinfo included) replaced by
 * its {@link redactUrl} form, for messages that quote a transport error.
 */
export function scrubUrl(message: string, url: string): string {
  let out = message.split(url).join(redactUrl(url));
  try {
    const u = new URL(url);
    if (u.search) out = out.split(u.search).join("");
    if (u.username || u.password) out = out.split(`${u.username}:${u.password}@`).join("");
    for (const seg of secretPathSegments(u.pathname)) out = out.split(seg).join(REDACTED_SEGMENT);
  } catch {
    // An unparseable URL: nothing more to scrub.
  }
  return out;
}
