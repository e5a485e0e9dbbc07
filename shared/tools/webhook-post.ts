import pRetry from "p-retry";
import { ToolError } from "../errors.ts";
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
 * @throws WebhookError (a ToolError) with `status` (the HTTP status, or 504 for a timeout, 502
 *   for a connection error or a non-JSON 2xx) when the last attempt fails.
 */
export async function postWebhook(target: WebhookTarget, body: unknown, opts: WebhookOptions = {}): Promise<WebhookReply> {
  const doFetch = opts.fetch ?? fetch;
  const now = opts.nowSeconds ?? (() => Date.now() / 1000);
  const raw = JSON.stringify(body);
  let attempts = 0;
  const attempt = async (): Promise<WebhookReply> => {
    attempts++;
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (target.secret) headers[SIGNATURE_HEADER] = await signatureHeader(target.secret, raw, now());
    const timeout = AbortSignal.timeout(target.timeout_ms);
    const signal = opts.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    let res: Response;
    let text: string;
    try {
      res = await doFetch(target.url, { method: "POST", headers, body: raw, signal });
      text = await res.text();
    } catch (e) {
      if (opts.signal?.aborted) throw new ToolError(`webhook ${target.url}: aborted`, { status: 499, retryable: false, cause: e });
      if (timeout.aborted) throw new ToolError(`webhook ${target.url}: timed out after ${target.timeout_ms} ms`, { status: 504, retryable: true, cause: e });
      throw new ToolError(`webhook ${target.url}: connection failed (${(e as Error)?.message ?? String(e)})`, { status: 502, retryable: true, cause: e });
    }
    if (res.status >= 500 || RETRY_STATUS.has(res.status)) {
      throw new ToolError(`webhook ${target.url}: HTTP ${res.status}`, { status: res.status, retryable: true });
    }
    if (res.status < 200 || res.status >= 300) {
      throw new ToolError(`webhook ${target.url}: HTTP ${res.status}${text ? ` ${text.slice(0, 200)}` : ""}`, { status: res.status, retryable: false });
    }
    let parsed: unknown;
    try {
      parsed = text === "" ? null : JSON.parse(text);
    } catch (e) {
      throw new ToolError(`webhook ${target.url}: HTTP ${res.status} reply is not JSON`, { status: 502, retryable: false, cause: e });
    }
    return { status: res.status, body: parsed, attempts };
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
    const te = e instanceof ToolError ? e : new ToolError(`webhook ${target.url}: ${(e as Error)?.message ?? String(e)}`, { cause: e });
    throw new WebhookError(te, attempts);
  }
}

/** A webhook that failed for good: the last attempt's {@link ToolError} fields plus the number of attempts made. */
export class WebhookError extends ToolError {
  override name = "WebhookError";
  readonly attempts: number;
  constructor(last: ToolError, attempts: number) {
    super(last.message, { status: last.status, retryable: last.retryable, cause: last.cause ?? last });
    this.attempts = attempts;
  }
}
