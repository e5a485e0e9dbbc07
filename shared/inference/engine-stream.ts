import { DEFAULT_ENGINE_MAX_REPLY_BYTES, redactUrl, scrubUrl } from "../http/outbound.ts";
import { BadEngineResponseError, EngineAbortedError, EngineError, EngineUnavailableError } from "../errors.ts";
import type { TokenOutput } from "../schema/index.ts";
import { CONTEXT_OVERFLOW_PATTERN, DEADLINE_HEADER, engineErrorFromReply, postEngineJson, withReplica, type EngineHttpReply, type FetchLike } from "./engine-http.ts";
import type { GenerateRequest } from "./types.ts";

/**
 * How an engine's event stream ended: `done` after `data: [DONE]`, `eof`
 * when the body closed without it, `broken` when reading failed (connection
 * cut, deadline, the caller's signal, the reply cap, or an event the
 * handler refused); `error` is then the typed error a non-streaming call
 * would have thrown for the same failure.
 */
export interface EngineStreamEnd {
  end: "done" | "eof" | "broken";
  error?: EngineError;
  /** The replica that served, when a gateway says so (see `EngineHttpReply.replica`). */
  replica?: string;
}

/** What {@link postEngineStream} got: a whole reply (non-2xx, or a server that answered JSON) or a stream that was read to its end. */
export type EngineStreamReply = { kind: "reply"; reply: EngineHttpReply } | { kind: "stream"; stream: EngineStreamEnd };

/**
 * POSTs `body` and reads the reply as a server-sent event stream
 * (`data: <json>` lines, events separated by a blank line, `data: [DONE]`
 * last — the framing of vLLM's and SGLang's streaming endpoints), calling
 * `onEvent` with each event's parsed JSON in order as it arrives.
 *
 * Bounded and linear: every byte is scanned once, and the stream's bytes
 * count against `maxReplyBytes` (default 64 MiB, as a non-streaming reply;
 * past it the stream is cut as `broken` with a `reply_too_large`
 * {@link BadEngineResponseError}). `timeoutMs` bounds the whole call.
 * A non-2xx status, or a 2xx that is not `text/event-stream` (a server or
 * proxy that ignored `stream`), comes back whole as `kind: "reply"` (read as
 * {@link postEngineJson} reads it). Failures before the reply's headers
 * throw as {@link postEngineJson}'s do. An event that is not JSON, or one
 * `onEvent` throws on, ends the stream as `broken` with that error (a
 * non-JSON event is a retryable {@link BadEngineResponseError} naming `data`).
 * Comment lines (`:`) and other fields (`event:`, `id:`) are ignored.
 * @see docs/engines.md §7 (the engines' stream shapes)
 */
export async function postEngineStream(
  fetchFn: FetchLike,
  url: string,
  body: unknown,
  headers: Record<string, string>,
  opts: { timeoutMs: number; signal?: AbortSignal; maxReplyBytes?: number },
  onEvent: (data: unknown) => void,
): Promise<EngineStreamReply> {
  const deadline = AbortSignal.timeout(opts.timeoutMs);
  const signal = opts.signal ? AbortSignal.any([opts.signal, deadline]) : deadline;
  const where = redactUrl(url);
  const cap = opts.maxReplyBytes ?? DEFAULT_ENGINE_MAX_REPLY_BYTES;
  const transportError = (e: unknown): EngineError => {
    if (e instanceof EngineError) return e;
    if (opts.signal?.aborted) return new EngineAbortedError(`request to ${where} aborted by the caller`, { cause: e });
    if (deadline.aborted) return new EngineUnavailableError(`engine at ${where} did not finish its stream within ${opts.timeoutMs} ms`, { cause: e });
    return new EngineUnavailableError(`engine at ${where}: stream broken: ${scrubUrl((e as Error)?.message ?? String(e), url)}`, { cause: e });
  };
  let res: Response;
  try {
    res = await fetchFn(url, {
      method: "POST",
      headers: { ...headers, accept: "text/event-stream", [DEADLINE_HEADER]: String(opts.timeoutMs) },
      body: JSON.stringify(body),
      signal,
      redirect: "manual",
    });
  } catch (e) {
    throw transportError(e);
  }
  const replica = res.headers.get("x-edgeloop-replica") ?? res.headers.get("x-smg-routed-worker-id") ?? undefined;
  const type = res.headers.get("content-type") ?? "";
  if (res.status < 200 || res.status >= 300 || !/^text\/event-stream/i.test(type)) {
    // Read exactly as a non-streaming reply: hand the Response back through postEngineJson's reader.
    const reply = await postEngineJson(() => Promise.resolve(res), url, undefined, {}, { timeoutMs: opts.timeoutMs, ...(opts.signal ? { signal: opts.signal } : {}), maxReplyBytes: cap });
    return { kind: "reply", reply };
  }
  const out = (end: EngineStreamEnd["end"], error?: EngineError): EngineStreamReply => ({
    kind: "stream",
    stream: { end, ...(error ? { error } : {}), ...(replica ? { replica } : {}) },
  });
  if (res.body === null) return out("eof");
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  const stop = async (end: EngineStreamEnd["end"], error?: EngineError) => {
    await reader.cancel().catch(() => undefined);
    return out(end, error);
  };
  let buf = "";
  let scan = 0;
  let data: string[] = [];
  let size = 0;
  let events = 0;
  // Returns true at `data: [DONE]`; throws what onEvent throws.
  const dispatch = (): boolean => {
    if (data.length === 0) return false;
    const text = data.length === 1 ? data[0]! : data.join("\n");
    data = [];
    if (text === "[DONE]") return true;
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (e) {
      throw new BadEngineResponseError(`engine at ${where} sent an unusable reply: stream event ${events} has a data field that is not JSON`, { retryable: true, cause: e });
    }
    events++;
    onEvent(parsed);
    return false;
  };
  for (;;) {
    let chunk: Awaited<ReturnType<typeof reader.read>>;
    try {
      chunk = await reader.read();
    } catch (e) {
      return out("broken", transportError(e));
    }
    if (chunk.done) break;
    // Past the cap only the bytes within it are read: their events count, then the stream is cut.
    const over = size + chunk.value.byteLength > cap;
    const bytes = over ? chunk.value.subarray(0, cap - size) : chunk.value;
    size += bytes.byteLength;
    buf += decoder.decode(bytes, { stream: true });
    let lineStart = 0;
    for (let nl = buf.indexOf("\n", scan); nl >= 0; nl = buf.indexOf("\n", lineStart)) {
      const line = buf.charCodeAt(nl - 1) === 13 && nl > lineStart ? buf.slice(lineStart, nl - 1) : buf.slice(lineStart, nl);
      lineStart = nl + 1;
      try {
        if (line === "") {
          if (dispatch()) return stop("done");
        } else if (line.startsWith("data:")) data.push(line.charCodeAt(5) === 32 ? line.slice(6) : line.slice(5));
      } catch (e) {
        return stop("broken", e instanceof EngineError ? e : transportError(e));
      }
    }
    if (lineStart > 0) buf = buf.slice(lineStart);
    scan = buf.length;
    if (over) return stop("broken", new BadEngineResponseError(`engine at ${where}: reply larger than ${cap} bytes (the cap)`, { status: 502, code: "reply_too_large" }));
  }
  // The body ended: a last event without its blank line still counts.
  buf += decoder.decode();
  try {
    if (buf.startsWith("data:")) data.push(buf.charCodeAt(5) === 32 ? buf.slice(6) : buf.slice(5));
    if (dispatch()) return out("done");
  } catch (e) {
    return out("broken", e instanceof EngineError ? e : transportError(e));
  }
  return out("eof");
}

/**
 * The typed error of an `{"error": …}` event inside a 200 stream (vLLM's
 * `create_streaming_error_response`, SGLang's `stream_results` on a
 * `ValueError`): its `code` when it is an HTTP status, else 400 when the
 * message has context-overflow wording (SGLang's validation errors carry no
 * code), else 500 — then mapped as a non-streaming reply with that status
 * ({@link engineErrorFromReply}).
 */
export function streamEventError(url: string, event: { error: unknown }): EngineError {
  const e = event.error;
  const err = e && typeof e === "object" ? (e as Record<string, unknown>) : {};
  const message = typeof e === "string" ? e : typeof err.message === "string" ? err.message : JSON.stringify(e);
  const code = typeof err.code === "number" && Number.isInteger(err.code) && err.code >= 400 && err.code < 600 ? err.code : CONTEXT_OVERFLOW_PATTERN.test(message) ? 400 : 500;
  return engineErrorFromReply(url, { status: code, body: event, text: message });
}

/**
 * The tokens of one streaming call, as they arrive: appended in order and
 * handed to the request's sink (`GenerateRequest.on_tokens`, log-probs only
 * when `sampling_params.logprobs`), never after {@link close}.
 */
export class StreamedTokens {
  readonly ids: number[] = [];
  readonly logProbs: number[] = [];
  private closed = false;

  constructor(
    private readonly sink: NonNullable<GenerateRequest["on_tokens"]>,
    private readonly wantLogprobs: boolean,
  ) {}

  /** Appends a run of new tokens and their log-probs (already checked: one finite number per id when log-probs are wanted) and passes it on. */
  push(ids: number[], logProbs: number[] | null): void {
    if (ids.length === 0) return;
    for (const t of ids) this.ids.push(t);
    if (logProbs) for (const v of logProbs) this.logProbs.push(v);
    if (!this.closed) this.sink(ids, this.wantLogprobs ? logProbs : null);
  }

  /** No more calls to the sink (the call settles). */
  close(): void {
    this.closed = true;
  }
}

/**
 * Settles a streaming call from how its stream ended. `build(finish)` makes
 * the {@link TokenOutput} from everything received, as the engine's
 * non-streaming reply would give it; `finish` null = as the stream said.
 * - `done` with a final event (`finished`): `build(null)`;
 * - otherwise (`eof`, `broken`, or `[DONE]` with no finish reason, as vLLM's
 *   tokens endpoint ends an aborted request) with ≥ 1 token received:
 *   `build("abort")` — the tokens received, `finish_reason: "abort"`;
 * - with no token: the stream's error (as a non-streaming call throws it), or
 *   `EngineAbortedError` when `[DONE]` came without any token or finish
 *   (an abort before any token), or a retryable `EngineUnavailableError`
 *   when the stream closed early.
 * A `build(null)` that throws after tokens were passed on falls back to
 * `build("abort")` (what was streamed stays the output).
 */
export function settleStream(url: string, end: EngineStreamEnd, finished: boolean, received: number, build: (finish: "abort" | null) => TokenOutput): TokenOutput {
  const where = redactUrl(url);
  if (end.end === "done" && finished) {
    try {
      return build(null);
    } catch (e) {
      if (received === 0) throw e;
      return build("abort");
    }
  }
  if (received > 0) return build("abort");
  if (end.error) throw end.error;
  if (end.end === "done") throw new EngineAbortedError(`engine at ${where} aborted the request before any token`);
  throw new EngineUnavailableError(`engine at ${where}: the stream closed before any token`);
}

/**
 * One engine's stream reader for {@link generateStreamed}: `event` reads one
 * event (`have`: the ids received so far) and returns its new tokens (or
 * nothing), throwing on an event that breaks the engine's stream contract;
 * `finished` once the event carrying the finish reason came; `build` makes
 * the output from everything received (see {@link settleStream}).
 */
export interface EngineStreamParser {
  readonly finished: boolean;
  event(data: unknown, have: readonly number[]): { ids: number[]; logProbs: number[] | null } | undefined;
  build(acc: StreamedTokens, finish: "abort" | null): TokenOutput;
}

/**
 * A streaming generate call, the same for every engine client: POSTs `body`
 * ({@link postEngineStream}), hands each event's tokens to
 * `req.on_tokens` as they arrive ({@link StreamedTokens}), and settles from
 * how the stream ended ({@link settleStream}). A server that answered the
 * whole reply at once (`kind: "reply"`) is read by `wholeReply` and passed on
 * as one chunk. Returns the output, with the replica a gateway named.
 * Nothing reaches `on_tokens` after this settles.
 * @throws what {@link postEngineStream}, `wholeReply` and {@link settleStream} throw.
 */
export async function generateStreamed(
  fetchFn: FetchLike,
  url: string,
  body: unknown,
  headers: Record<string, string>,
  opts: { timeoutMs: number; signal?: AbortSignal; maxReplyBytes?: number },
  req: GenerateRequest,
  parser: EngineStreamParser,
  wholeReply: (reply: EngineHttpReply) => TokenOutput,
): Promise<TokenOutput> {
  const acc = new StreamedTokens(req.on_tokens!, req.sampling_params.logprobs);
  try {
    const r = await postEngineStream(fetchFn, url, body, headers, opts, (data) => {
      const d = parser.event(data, acc.ids);
      if (d) acc.push(d.ids, d.logProbs);
    });
    if (r.kind === "reply") {
      const out = wholeReply(r.reply);
      acc.push(out.token_ids, out.log_probs ?? null);
      return out;
    }
    const out = settleStream(url, r.stream, parser.finished, acc.ids.length, (finish) => parser.build(acc, finish));
    return withReplica(out, { status: 200, body: undefined, text: "", ...(r.stream.replica ? { replica: r.stream.replica } : {}) });
  } finally {
    acc.close();
  }
}
