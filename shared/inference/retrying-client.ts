import { processMetrics } from "../telemetry/process-metrics.ts";
import { sleepUnlessAborted } from "../http/sleep.ts";
import { BadEngineResponseError, EngineAbortedError, EngineUnavailableError } from "../errors.ts";
import type { TokenOutput } from "../schema/index.ts";
import type { GenerateRequest, InferenceClient } from "./types.ts";

/** Options of {@link RetryingClient}. */
export interface RetryOptions {
  /** Retries after the first attempt (default 3). */
  retries?: number;
  /** First backoff in milliseconds (default 200); doubles per retry, with ±25 % jitter, capped by `maxDelayMs` (default 5 000). */
  minDelayMs?: number;
  maxDelayMs?: number;
  /**
   * Deadline of the whole call across attempts and backoff, in milliseconds
   * (default none: each attempt's own deadline, the client's `timeoutMs`, applies).
   */
  deadlineMs?: number;
  /** Random source for the jitter (tests). */
  random?: () => number;
}

/**
 * Retries an engine call that failed before any token came back — a 5xx,
 * 408/429, a refused connection or an attempt past its deadline (all
 * {@link EngineUnavailableError}, `retryable`) or that got a garbled 2xx
 * (a `retryable` {@link BadEngineResponseError}) — with exponential backoff,
 * each retry under a fresh request id (`<id>-r<i>`), within an optional
 * overall deadline. Behind the gateway the retried call lands on another
 * replica when the failed one is marked unhealthy. Context overflows, other
 * bad replies (4xx) and aborts are not retried here (the agent loop resumes aborts).
 * @throws the last EngineUnavailableError; EngineUnavailableError when the overall deadline passes.
 */
export class RetryingClient implements InferenceClient {
  constructor(
    private readonly inner: InferenceClient,
    private readonly opts: RetryOptions = {},
  ) {}

  /**
   * One call, retried as the class says. With `req.on_tokens` the inner
   * client's chunks are forwarded (never after this call settles), and once
   * one was forwarded the call is never retried: an attempt that then
   * throws (an inner client breaking the contract, or the overall deadline)
   * resolves as `finish_reason: "abort"` with exactly the forwarded tokens,
   * so the caller's record and what it streamed agree and the agent loop
   * resumes from them (the `GenerateRequest.on_tokens` contract).
   */
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const sink = req.on_tokens;
    if (!sink) return retryEngineCall(req, this.opts, (request_id, signal) => this.inner.generate({ ...req, request_id, ...(signal ? { signal } : {}) }));
    const ids: number[] = [];
    let lps: number[] | null = [];
    let settled = false;
    const on_tokens = (chunk: number[], chunkLps: number[] | null) => {
      if (settled || chunk.length === 0) return;
      for (const t of chunk) ids.push(t);
      if (lps && chunkLps && chunkLps.length === chunk.length) for (const v of chunkLps) lps.push(v);
      else lps = null;
      sink(chunk, chunkLps);
    };
    try {
      return await retryEngineCall(
        req,
        this.opts,
        (request_id, signal) => this.inner.generate({ ...req, request_id, on_tokens, ...(signal ? { signal } : {}) }),
        () => ids.length === 0,
      );
    } catch (e) {
      if (ids.length === 0) throw e;
      return {
        token_ids: ids,
        ...(req.sampling_params.logprobs && lps ? { log_probs: lps } : {}),
        finish_reason: "abort",
        num_preempted: -1,
        extra_fields: {},
      };
    } finally {
      settled = true;
    }
  }

  maxModelLen(): Promise<number | undefined> {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
  servableLength(contextLen: number): number {
    return this.inner.servableLength ? this.inner.servableLength(contextLen) : contextLen;
  }
}


/**
 * The retry loop of {@link RetryingClient} for any engine call (a generation,
 * a teacher's scoring call): `call(requestId, signal)` is attempted, and
 * retried with exponential backoff under a fresh request id (`<id>-r<i>`)
 * after an {@link EngineUnavailableError} or a `retryable`
 * {@link BadEngineResponseError}, within `opts.deadlineMs` when set, and
 * only while `mayRetry()` says so (default: always; a streaming call stops
 * once a chunk went out).
 * @throws the last error; EngineUnavailableError when the overall deadline passes; EngineAbortedError when `req.signal` aborts during a backoff.
 */
export async function retryEngineCall<T>(
  req: { request_id: string; signal?: AbortSignal },
  opts: RetryOptions,
  call: (requestId: string, signal: AbortSignal | undefined) => Promise<T>,
  mayRetry: () => boolean = () => true,
): Promise<T> {
  const retries = opts.retries ?? 3;
  const deadline = opts.deadlineMs ? AbortSignal.timeout(opts.deadlineMs) : undefined;
  const signal = deadline ? (req.signal ? AbortSignal.any([req.signal, deadline]) : deadline) : req.signal;
  const expired = () => new EngineUnavailableError(`engine call ${req.request_id} got no reply within its ${opts.deadlineMs} ms deadline`);
  for (let attempt = 0; ; attempt++) {
    try {
      return await call(attempt === 0 ? req.request_id : `${req.request_id}-r${attempt}`, signal);
    } catch (e) {
      if (deadline?.aborted && !req.signal?.aborted) throw expired();
      const retryable = e instanceof EngineUnavailableError || (e instanceof BadEngineResponseError && e.retryable);
      if (!retryable || attempt >= retries || req.signal?.aborted || !mayRetry()) throw e;
      processMetrics.observeEngineRetry();
      const base = Math.min(opts.maxDelayMs ?? 5_000, (opts.minDelayMs ?? 200) * 2 ** attempt);
      const ms = base * (0.75 + 0.5 * (opts.random ?? Math.random)());
      await sleepUnlessAborted(ms, signal);
      if (deadline?.aborted && !req.signal?.aborted) throw expired();
      if (req.signal?.aborted) throw new EngineAbortedError(`engine call ${req.request_id} aborted by the caller`);
    }
  }
}
