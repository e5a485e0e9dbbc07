import pRetry from "p-retry";
import { ToolError } from "../errors.ts";
import { DEFAULT_WEBHOOK_MAX_REPLY_BYTES, OutboundHttpError, outboundRequest, redactUrl } from "../http/outbound.ts";
import { SIGNATURE_HEADER, signatureHeader } from "./signature.ts";

/** Where and how to POST one webhook. */
export interface WebhookTarget {
  url: string;
  /** HMAC secret; when set, every attempt carries a fresh `x-edgeloop-signature`. */
  secret?: string;
  /** Per-attempt timeout, milliseconds (covers reading the reply body). */
  timeout_ms: number;
  /** Retries after the first attempt, on 5xx, 408, 429, timeouts and connection errors. */
  max_retries: number;
  /** Reply body cap in bytes, counted while it streams (default {@link DEFAULT_WEBHOOK_MAX_REPLY_BYTES}, 4 MiB). */
  max_reply_bytes?: number;
}

/** Capabilities and tuning for webhook calls (tests inject a fast backoff and a fixed clock). */
export interface WebhookOptions {
  /** Defaults to the global `fetch`. */
  fetch?: typeof fetch;
  /** Unix seconds for signatures; defaults to `Date.now() / 1000`. */
  nowSeconds?: () => number;
  /** First retry delay, milliseconds (default 250); doubles each retry, capped by `retryMaxTimeoutMs` (default 5000). */
  retryMinTimeoutMs?: number;
  retryMaxTimeoutMs?: number;
  /** Aborts the whole call (no further retries). */
  signal?: AbortSignal;
}

/** A webhook's reply: status, parsed JSON body, and how many attempts it took. */
export interface WebhookReply {
  status: number;
  body: unknown;
  attempts: number;
}

const RETRY_STATUS = new Set([408, 429]);

/**
 * POSTs `body` as JSON to `target.url`, signing each attempt when a secret is
 * set, retrying with exponential backoff (p-retry) on 5xx, 408, 429, timeouts
 * and connection errors. The raw body is serialised once, so every retry sends
 * identical bytes (the idempotency key inside stays the same).
 * Any 2xx with a JSON body is returned; the caller interprets the status.
 * Goes through {@link outboundRequest}: a redirect is never followed (a 3xx
 * fails the call, not retried), the reply is read under `max_reply_bytes`, and
 * messages name the webhook by {@link redactUrl} (no query string, no userinfo).
 * @throws WebhookError (a ToolError) with `status` (the HTTP status — the 3xx of a
 *   redirect too —, 504 for a timeout, 502 for a connection error or a non-JSON 2xx,
 *   413 for a reply over the cap, 499 when aborted) when the last attempt fails.
 */
export async function postWebhook(target: WebhookTarget, body: unknown, opts: WebhookOptions = {}): Promise<WebhookReply> {
  const now = opts.nowSeconds ?? (() => Date.now() / 1000);
  const raw = JSON.stringify(body);
  const where = `webhook ${redactUrl(target.url)}`;
  const maxBytes = target.max_reply_bytes ?? DEFAULT_WEBHOOK_MAX_REPLY_BYTES;
  let attempts = 0;
  const attempt = async (): Promise<WebhookReply> => {
    attempts++;
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (target.secret) headers[SIGNATURE_HEADER] = await signatureHeader(target.secret, raw, now());
    let reply;
    try {
      reply = await outboundRequest(target.url, {
        headers,
        body: raw,
        timeoutMs: target.timeout_ms,
        maxReplyBytes: maxBytes,
        what: where,
        ...(opts.fetch ? { fetch: opts.fetch } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
    } catch (e) {
      if (!(e instanceof OutboundHttpError)) throw new ToolError(`${where}: ${(e as Error)?.message ?? String(e)}`, { status: 502, retryable: true, cause: e });
      const status = { redirect: e.status, too_large: 413, timeout: 504, aborted: 499, connection: 502 }[e.kind];
      const retryable = e.kind === "timeout" || e.kind === "connection";
      throw new ToolError(e.message, { status, retryable, cause: e, ...(e.kind === "too_large" ? { code: "reply_too_large" } : {}) });
    }
    const { status, text } = reply;
    if (status >= 500 || RETRY_STATUS.has(status)) {
      throw new ToolError(`${where}: HTTP ${status}`, { status, retryable: true });
    }
    if (status < 200 || status >= 300) {
      throw new ToolError(`${where}: HTTP ${status}${text ? ` ${text.slice(0, 200)}` : ""}`, { status, retryable: false });
    }
    let parsed: unknown;
    try {
      parsed = text === "" ? null : JSON.parse(text);
    } catch (e) {
      throw new ToolError(`${where}: HTTP ${status} reply is not JSON`, { status: 502, retryable: false, cause: e });
    }
    return { status, body: parsed, attempts };
  };
  try {
    return await pRetry(attempt, {
    retries: target.max_retries,
    factor: 2,
    minTimeout: opts.retryMinTimeoutMs ?? 250,
    maxTimeout: opts.retryMaxTimeoutMs ?? 5000,
    randomize: false,
    signal: opts.signal,
      shouldRetry: ({ error }) => error instanceof ToolError && error.retryable,
    });
  } catch (e) {
    const te = e instanceof ToolError ? e : new ToolError(`${where}: ${(e as Error)?.message ?? String(e)}`, { cause: e });
    throw new WebhookError(te, attempts);
  }
}

/** A webhook that failed for good: the last attempt's {@link ToolError} fields plus the number of attempts made. */
export class WebhookError extends ToolError {
  override name = "WebhookError";
  readonly attempts: number;
  constructor(last: ToolError, attempts: number) {
    super(last.message, { status: last.status, retryable: last.retryable, cause: last.cause ?? last, code: last.code });
    this.attempts = attempts;
  }
}
