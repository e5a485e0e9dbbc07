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

  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const retries = this.opts.retries ?? 3;
    const deadline = this.opts.deadlineMs ? AbortSignal.timeout(this.opts.deadlineMs) : undefined;
    const signal = deadline ? (req.signal ? AbortSignal.any([req.signal, deadline]) : deadline) : req.signal;
    const expired = () => new EngineUnavailableError(`engine call ${req.request_id} got no reply within its ${this.opts.deadlineMs} ms deadline`);
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.inner.generate({ ...req, request_id: attempt === 0 ? req.request_id : `${req.request_id}-r${attempt}`, ...(signal ? { signal } : {}) });
      } catch (e) {
        if (deadline?.aborted && !req.signal?.aborted) throw expired();
        const retryable = e instanceof EngineUnavailableError || (e instanceof BadEngineResponseError && e.retryable);
        if (!retryable || attempt >= retries || req.signal?.aborted) throw e;
        const base = Math.min(this.opts.maxDelayMs ?? 5_000, (this.opts.minDelayMs ?? 200) * 2 ** attempt);
        const ms = base * (0.75 + 0.5 * (this.opts.random ?? Math.random)());
        await sleep(ms, signal);
        if (deadline?.aborted && !req.signal?.aborted) throw expired();
        if (req.signal?.aborted) throw new EngineAbortedError(`engine call ${req.request_id} aborted by the caller`);
      }
    }
  }

  maxModelLen(): Promise<number | undefined> {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
