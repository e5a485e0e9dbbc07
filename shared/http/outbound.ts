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
 * The URL as it may be shown in records, logs, metrics and traces:
 * `scheme://host[:port]/path`, without userinfo, query string or fragment
 * (where webhook secrets such as `?token=…` live). A string without `?`, `#`
 * or `@` is returned as written; one with them that does not parse as a URL
 * shows as `(invalid URL)`. Secrets placed in the path itself are not
 * recognised: put them in the query, the userinfo or the signature secret.
 */
export function redactUrl(url: string): string {
  // Without '?', '#' or '@' there is no query, fragment or userinfo: shown as written (no parse).
  if (!/[?#@]/.test(url)) return url;
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return "(invalid URL)";
  }
  return `${u.protocol}//${u.host}${u.pathname}`;
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
  } catch {
    // An unparseable URL: nothing more to scrub.
  }
  return out;
}
