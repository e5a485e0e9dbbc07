/**
 * Resolves after `ms` milliseconds, or at once when `signal` aborts (it never
 * rejects: the caller checks `signal.aborted` after it). The timer and the
 * abort listener are both removed when it resolves. Used between retries
 * (engine calls, MCP requests), where an abort must cut the wait short.
 */
export function sleepUnlessAborted(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    if (signal?.aborted) return done();
    signal?.addEventListener("abort", done, { once: true });
  });
}
