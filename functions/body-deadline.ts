/**
 * A deadline on receiving a request body (issue 26, S9), runtime-free: a
 * client that trickles a body (a byte every few seconds, which resets any
 * idle timer) or stops halfway is answered `408` with `connection: close`
 * once the deadline passes, and the body stream is cancelled. Bun listeners
 * add it to their idle timeout (`infra/cli/listen.ts`); the Deno entry, whose
 * `Deno.serve` has no idle or body timeout, relies on it alone — there the
 * handler is freed and the 408 sent, but Deno keeps the socket open until the
 * client closes it (`connection: close` is not honoured with an unread body;
 * measured on Deno 2.9), so a Deno server reachable by others needs a proxy
 * with timeouts in front.
 */

/** Default time a request body may take to arrive, seconds. */
export const DEFAULT_BODY_TIMEOUT_S = 60;

/** The largest body deadline, seconds: setTimeout's largest delay (2147483647 ms) in whole seconds. */
const MAX_BODY_TIMEOUT_S = 2_147_483;

/**
 * The body deadline from `EDGELOOP_BODY_TIMEOUT_S` (whole seconds, 1..2147483: it becomes a timer
 * in ms), else {@link DEFAULT_BODY_TIMEOUT_S}.
 * @throws Error naming the variable for another value
 */
export function bodyTimeoutFromEnv(raw: string | undefined): number {
  if (raw === undefined || raw === "") return DEFAULT_BODY_TIMEOUT_S;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1) throw new Error(`EDGELOOP_BODY_TIMEOUT_S must be a whole number of seconds ≥ 1, got ${JSON.stringify(raw)}`);
  if (n > MAX_BODY_TIMEOUT_S) throw new Error(`EDGELOOP_BODY_TIMEOUT_S must be at most ${MAX_BODY_TIMEOUT_S} seconds (setTimeout's largest delay), got ${JSON.stringify(raw)}`);
  return n;
}

/** Hooks of {@link withBodyDeadline}: `onBodyDone` runs once the body has been read to its end. */
export interface BodyDeadlineHooks {
  onBodyDone?: () => void;
}

/** The reply when the deadline passed before the body was in: 408, `connection: close`. */
function bodyTimeoutResponse(seconds: number): Response {
  return new Response(JSON.stringify({ error: { code: "request_timeout", field: "body", message: `the request body did not arrive within ${seconds} s` } }), {
    status: 408,
    headers: { "content-type": "application/json", connection: "close" },
  });
}

/**
 * Wraps `handler` so that a request's body must be read to its end within
 * `seconds` of the request's arrival; past it the body stream fails, the
 * source is cancelled and the reply is {@link bodyTimeoutResponse} (whatever
 * the handler answered). Requests without a body pass unchanged.
 */
export function withBodyDeadline<A extends unknown[]>(
  handler: (req: Request, ...rest: A) => Response | Promise<Response>,
  seconds: number,
  hooks: (req: Request, ...rest: A) => BodyDeadlineHooks = () => ({}),
): (req: Request, ...rest: A) => Promise<Response> {
  return async (req, ...rest) => {
    const { onBodyDone } = hooks(req, ...rest);
    if (req.body === null) {
      onBodyDone?.();
      return handler(req, ...rest);
    }
    const src = req.body.getReader();
    let timedOut = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const expired = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        timedOut = true;
        reject(new Error(`request body not received within ${seconds} s`));
      }, seconds * 1000);
    });
    expired.catch(() => undefined);
    const body = new ReadableStream<Uint8Array>({
      async pull(c) {
        let r: Awaited<ReturnType<typeof src.read>>;
        try {
          r = await Promise.race([src.read(), expired]);
        } catch (e) {
          if (timedOut) await src.cancel(e).catch(() => undefined);
          throw e;
        }
        if (r.done) {
          clearTimeout(timer);
          c.close();
          onBodyDone?.();
        } else c.enqueue(r.value);
      },
      cancel(reason) {
        clearTimeout(timer);
        return src.cancel(reason);
      },
    });
    const inner = new Request(req, { body, duplex: "half" } as RequestInit);
    try {
      const res = await handler(inner, ...rest);
      if (timedOut) {
        await res.body?.cancel().catch(() => undefined);
        return bodyTimeoutResponse(seconds);
      }
      return res;
    } catch (e) {
      if (timedOut) return bodyTimeoutResponse(seconds);
      throw e;
    } finally {
      clearTimeout(timer);
    }
  };
}
