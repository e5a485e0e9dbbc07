import { DEFAULT_ENGINE_MAX_REPLY_BYTES, OutboundHttpError, readTextCapped, redactUrl, scrubUrl } from "../http/outbound.ts";
import { fnv1a32 } from "./hash.ts";
import {
  BadEngineResponseError,
  ContextOverflowError,
  EngineAbortedError,
  EngineError,
  EngineUnavailableError,
} from "../errors.ts";

/** A Web-standard `fetch`, injectable so the clients run on Bun, Deno, Node and workerd alike. */
export type FetchLike = (input: Request | string | URL, init?: RequestInit) => Promise<Response>;

/** Default per-request deadline of an engine call, in milliseconds (10 minutes: long generations are slow). */
export const DEFAULT_ENGINE_TIMEOUT_MS = 600_000;

/**
 * Wording of the engines' context-overflow 400s. vLLM, current: "You passed N
 * input tokens and requested M output tokens. However, the model's context
 * length is only L tokens, resulting in a maximum input length of K tokens…"
 * (`TokenizeParams._token_len_check`) and "max_tokens=… cannot be greater than
 * max_model_len=…" (`TokenizeParams.__post_init__`); vLLM, older: "This
 * model's maximum context length is L tokens…", "… is longer than the maximum
 * model length of L"; SGLang: "The input (N tokens) is longer than the model's
 * context length (L tokens)." and "Requested token count exceeds the model's
 * maximum context length of L tokens…" (`TokenizerManager._validate_one_request`).
 * Every alternative is a literal (no quantifier): the scan is linear in the message.
 * @see docs/engines.md §2.7 (vLLM) and §3.3 (SGLang)
 */
export const CONTEXT_OVERFLOW_PATTERN =
  /maximum context length|longer than the maximum model length|longer than the model's context length|context length is only|maximum input length of|cannot be greater than max_model_len/i;

/**
 * Translates verl's `top_k` convention (−1 or 0 = disabled) to an engine's.
 * vLLM wants 0 for disabled (some OpenAI-compatible servers reject −1); SGLang wants −1 (0 is invalid).
 * @see docs/engines.md §2.2 and §3.1
 */
export function engineTopK(topK: number, engine: "vllm" | "sglang"): number {
  if (topK > 0) return topK;
  return engine === "vllm" ? 0 : -1;
}

/**
 * Request header in which the engine clients declare their per-attempt
 * deadline in milliseconds, so a gateway can tell a caller that gave up at its
 * deadline on a silent replica (the replica's failure) from a caller that
 * cancelled early (nobody's).
 * @see Envoy's `x-envoy-expected-rq-timeout-ms`, the same idea towards upstreams
 */
export const DEADLINE_HEADER = "x-edgeloop-timeout-ms";

/**
 * Request header with the prompt's prefix key (`GenerateRequest.prefix_key`):
 * edgeloop's gateway places a key's first call by it (see `functions/gateway.ts`).
 * Other routers ignore it.
 */
export const PREFIX_KEY_HEADER = "x-edgeloop-prefix-key";

/**
 * Headers sent on every engine call: the routing key twice (vllm-router and
 * SGLang's gateway), the request id, the prefix key when there is one, and
 * `Authorization: Bearer <apiKey>` when the engine needs a key (vLLM
 * `--api-key`, SGLang `--api-key`; see docs/engines.md §2.10 and §3.7).
 */
export function engineHeaders(routingKey: string, requestId: string, prefixKey?: string, apiKey?: string | null): Record<string, string> {
  const rk = routingKeyHint(routingKey);
  return {
    ...(prefixKey ? { [PREFIX_KEY_HEADER]: prefixKey } : {}),
    ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}),
    "content-type": "application/json",
    accept: "application/json",
    "x-session-id": rk,
    "x-smg-routing-key": rk,
    // Lower priority than x-session-id in vllm-router, never a key in SMG: safe to carry the per-call id.
    "x-request-id": requestId,
  };
}

/** The longest routing key SGLang's Model Gateway takes (`ROUTING_KEY_HINT_MAX_BYTES`), in UTF-8 bytes. */
export const ROUTING_KEY_MAX_BYTES = 128;

/**
 * The routing key as sent in the headers: unchanged when it fits in
 * {@link ROUTING_KEY_MAX_BYTES} UTF-8 bytes (every trajectory key of a uid up
 * to ~100 characters), else `edgeloop~` and a 64-bit hash of it in hex (25
 * bytes): a longer key would not pin at SMG, and stickiness only needs the
 * same key on every turn, which the hash keeps. Linear in the key.
 * @see docs/engines.md §4 (SMG's routing-key hint)
 */
export function routingKeyHint(key: string): string {
  if (key.length * 3 <= ROUTING_KEY_MAX_BYTES || new TextEncoder().encode(key).length <= ROUTING_KEY_MAX_BYTES) return key;
  const hex = (n: number) => n.toString(16).padStart(8, "0");
  return `edgeloop~${hex(fnv1a32(key))}${hex(fnv1a32(key, 0x9e3779b9))}`;
}

/** What {@link postEngineJson} hands back: the status and the parsed JSON body (`undefined` when not JSON). */
export interface EngineHttpReply {
  status: number;
  body: unknown;
  /** Raw text of the body, for error messages. */
  text: string;
  /** The replica that served, when a gateway says so (`x-edgeloop-replica`, SGLang gateway's `x-smg-routed-worker-id`). */
  replica?: string;
}

/** Records the serving replica (when known) in `extra_fields.replica`, where traces and records pick it up. */
export function withReplica<T extends { extra_fields: Record<string, unknown> }>(out: T, reply: EngineHttpReply): T {
  return reply.replica === undefined ? out : { ...out, extra_fields: { ...out.extra_fields, replica: reply.replica } };
}

/**
 * POSTs `body` as JSON with a per-request deadline (declared to gateways in
 * {@link DEADLINE_HEADER}) and returns status + parsed body.
 * Redirects are not followed (`redirect: "manual"`), and the reply is read
 * under `maxReplyBytes` (default {@link DEFAULT_ENGINE_MAX_REPLY_BYTES}, 64 MiB)
 * counted while it streams ({@link readTextCapped}; a declared length within
 * the cap is read natively, so the hot path pays nothing).
 * Transport failures become typed errors: connection refused and the deadline →
 * {@link EngineUnavailableError}; the caller's own `signal` → {@link EngineAbortedError};
 * a 3xx or a reply over the cap → {@link BadEngineResponseError} naming the status or the cap.
 * Messages name the engine by {@link redactUrl} (no query string, no userinfo).
 * Non-2xx statuses are *not* thrown here (the caller decides with {@link engineErrorFromReply}).
 */
export async function postEngineJson(
  fetchFn: FetchLike,
  url: string,
  body: unknown,
  headers: Record<string, string>,
  opts: { timeoutMs: number; signal?: AbortSignal; maxReplyBytes?: number },
): Promise<EngineHttpReply> {
  const deadline = AbortSignal.timeout(opts.timeoutMs);
  const signal = opts.signal ? AbortSignal.any([opts.signal, deadline]) : deadline;
  let res: Response;
  let text: string;
  try {
    res = await fetchFn(url, { method: "POST", headers: { ...headers, [DEADLINE_HEADER]: String(opts.timeoutMs) }, body: JSON.stringify(body), signal, redirect: "manual" });
    if (res.status >= 300 && res.status < 400) {
      await res.body?.cancel().catch(() => undefined);
      throw new BadEngineResponseError(`engine at ${redactUrl(url)} answered HTTP ${res.status} (a redirect; redirects are not followed)`, { status: 502 });
    }
    text = await readTextCapped(res, opts.maxReplyBytes ?? DEFAULT_ENGINE_MAX_REPLY_BYTES, `engine at ${redactUrl(url)}`);
  } catch (e) {
    if (e instanceof BadEngineResponseError) throw e;
    if (e instanceof OutboundHttpError) throw new BadEngineResponseError(e.message, { status: 502, code: "reply_too_large", cause: e });
    if (opts.signal?.aborted) throw new EngineAbortedError(`request to ${redactUrl(url)} aborted by the caller`, { cause: e });
    if (deadline.aborted) {
      throw new EngineUnavailableError(`engine at ${redactUrl(url)} did not answer within ${opts.timeoutMs} ms`, { cause: e });
    }
    throw new EngineUnavailableError(`engine at ${redactUrl(url)} unreachable: ${scrubUrl((e as Error)?.message ?? String(e), url)}`, { cause: e });
  }
  let parsed: unknown;
  try {
    parsed = text.length > 0 ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  const replica = res.headers.get("x-edgeloop-replica") ?? res.headers.get("x-smg-routed-worker-id") ?? undefined;
  return { status: res.status, body: parsed, text, ...(replica ? { replica } : {}) };
}

/**
 * The human message inside any of the engines' error bodies: vLLM nested
 * `{error:{message}}`, old flat `{object:"error",message}`, FastAPI `{detail}`
 * (string or validation list), SMG `{error:{code,message}}`, `{error:"..."}`.
 * @see docs/engines.md §1.3
 */
export function engineErrorMessage(body: unknown, text: string): string {
  if (body && typeof body === "object") {
    const b = body as Record<string, unknown>;
    const err = b.error;
    if (typeof err === "string") return err;
    if (err && typeof err === "object") {
      const e = err as Record<string, unknown>;
      if (typeof e.message === "string") return e.message;
      if (typeof e.code === "string") return e.code;
    }
    if (typeof b.message === "string") return b.message;
    if (typeof b.detail === "string") return b.detail;
    if (Array.isArray(b.detail)) return JSON.stringify(b.detail);
  }
  return text.slice(0, 500) || "(empty body)";
}

/**
 * Maps a non-2xx engine reply to a typed error, deciding by status first:
 * 400 with context-length wording → {@link ContextOverflowError}; 408/429/5xx →
 * {@link EngineUnavailableError} (vLLM answers 500 when the engine is dead, SGLang
 * 503 while starting); 499 → {@link EngineAbortedError} (SGLang/SMG client abort);
 * anything else → {@link BadEngineResponseError}.
 */
export function engineErrorFromReply(url: string, reply: EngineHttpReply): EngineError {
  const message = engineErrorMessage(reply.body, reply.text);
  const what = `engine at ${redactUrl(url)} answered HTTP ${reply.status}: ${message}`;
  if (reply.status === 400 && CONTEXT_OVERFLOW_PATTERN.test(message)) return new ContextOverflowError(what, { status: 400 });
  if (reply.status === 401 || reply.status === 403) return new BadEngineResponseError(`${what} (${ENGINE_AUTH_HINT})`);
  if (reply.status === 404 && url.endsWith(VLLM_GENERATE_PATH)) return new BadEngineResponseError(`${what} (${VLLM_GENERATE_HINT})`);
  if (reply.status === 499) return new EngineAbortedError(what);
  if (reply.status === 408 || reply.status === 429 || reply.status >= 500) return new EngineUnavailableError(what);
  return new BadEngineResponseError(what);
}

/** What a 401/403 from an engine means and how to fix it. */
export const ENGINE_AUTH_HINT =
  "the engine wants an API key: set engine.api_key (--engine-api-key, env EDGELOOP_ENGINE_API_KEY) to the server's --api-key; SGLang's control routes take --admin-api-key when the server has one (engine.admin_api_key, --engine-admin-api-key, env EDGELOOP_ENGINE_ADMIN_API_KEY)";

/** vLLM's tokens-only endpoint (`engine.format: vllm-generate`). */
export const VLLM_GENERATE_PATH = "/inference/v1/generate";

/**
 * Why `POST /inference/v1/generate` answers 404 and how to switch it on: the
 * server mounts it only with `--enable-scale-out` (vLLM main, PR #55176) or
 * `VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1` (vLLM 0.2x), or with `--tokens-only`.
 * @see docs/engines.md §2.5
 */
export const VLLM_GENERATE_HINT =
  "vLLM serves /inference/v1/generate only when switched on: start it with --enable-scale-out (vLLM main) or VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1 (vLLM 0.2x), or use engine.format vllm (/v1/completions)";

/** A retryable {@link BadEngineResponseError} naming the URL and what was wrong with a 2xx body. */
export function badReply(url: string, problem: string, cause?: unknown): BadEngineResponseError {
  // A garbled 2xx is the replica's fault (a broken or misconfigured replica behind a balancer), so
  // it is retryable: another attempt may land elsewhere and get a good reply.
  return new BadEngineResponseError(`engine at ${redactUrl(url)} sent an unusable reply: ${problem}`, { retryable: true, ...(cause === undefined ? {} : { cause }) });
}

/** Joins a base URL and a path without doubling slashes. */
export function joinUrl(base: string, path: string): string {
  return base.replace(/\/+$/, "") + path;
}
