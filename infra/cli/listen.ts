/**
 * Listeners with idle and header/body timeouts (issue 26, S9), for every
 * `Bun.serve` edgeloop starts.
 *
 * Bun's `idleTimeout` (seconds, at most 255; Bun's default 10) closes a
 * connection on which no byte moved for that long: while its headers or body
 * arrive, while the handler works, between the chunks of a streamed reply and
 * between keep-alive requests. A listener needs it for the first and the last
 * (a slow or stalled client must not hold a descriptor), but not for the
 * middle: an engine call may take minutes before the first byte, a blocking
 * group read waits, an NDJSON or SSE stream may pause. So:
 * - the listener runs with `idleTimeout` = `idleTimeoutS` (default
 *   {@link DEFAULT_IDLE_TIMEOUT_S}): headers and a request body must keep moving;
 * - once the request body has been read to its end (at once for a request
 *   without one), the request's idle timer is switched off (`server.timeout(req, 0)`);
 * - when the reply is handed back (a buffered one), or when a streamed one
 *   ends, the timer is set back, so the keep-alive connection is bounded again
 *   (Bun keeps a per-request timeout for the rest of the connection);
 * - a reply sent before the request body was read (an early 401/413/415) closes
 *   the connection (`connection: close`): a client trickling the rest of a body
 *   cannot keep it open;
 * - a body must arrive whole within `bodyTimeoutS` (default 60 s,
 *   `EDGELOOP_BODY_TIMEOUT_S`), however it trickles: past it the reply is 408.
 */
import type { Server } from "bun";
import { bodyTimeoutFromEnv, DEFAULT_BODY_TIMEOUT_S, withBodyDeadline } from "../../functions/body-deadline.ts";

/** Default idle timeout of a listener, seconds (Bun's own default). */
export const DEFAULT_IDLE_TIMEOUT_S = 10;

/** The handler a listener serves: a Web `fetch`, given the Bun server. */
export type ListenerFetch = (req: Request, server: Server<undefined>) => Response | Promise<Response>;

/**
 * The idle timeout from `EDGELOOP_IDLE_TIMEOUT_S` (whole seconds, 1…255), else the default.
 * @throws Error naming the variable for a value outside 1…255
 */
export function idleTimeoutFromEnv(env: Record<string, string | undefined> = process.env): number {
  const raw = env.EDGELOOP_IDLE_TIMEOUT_S;
  if (raw === undefined || raw === "") return DEFAULT_IDLE_TIMEOUT_S;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > 255) throw new Error(`EDGELOOP_IDLE_TIMEOUT_S must be a whole number of seconds from 1 to 255 (Bun's limit), got ${JSON.stringify(raw)}`);
  return n;
}

/**
 * Wraps `handler` with the timeout rules above (see the module comment);
 * `idleTimeoutS` must equal the listener's `idleTimeout`; a body must also
 * arrive whole within `bodyTimeoutS` ({@link withBodyDeadline}: 408 past it).
 */
export function withRequestTimeouts(handler: ListenerFetch, idleTimeoutS: number, bodyTimeoutS = DEFAULT_BODY_TIMEOUT_S): ListenerFetch {
  const bodyDone = new WeakSet<Request>();
  const inner = withBodyDeadline<[Server<undefined>]>(handler, bodyTimeoutS, (req, server) => ({
    onBodyDone: () => {
      bodyDone.add(req);
      server.timeout(req, 0);
    },
  }));
  return async (req, server) => {
    let res: Response;
    try {
      res = await inner(req, server);
    } catch (e) {
      server.timeout(req, idleTimeoutS);
      throw e;
    }
    if (!bodyDone.has(req)) {
      // Answered before the body was read: do not wait for the rest of it.
      server.timeout(req, idleTimeoutS);
      try {
        res.headers.set("connection", "close");
        return res;
      } catch {
        // Immutable headers (a fetched Response): copy them.
        const headers = new Headers(res.headers);
        headers.set("connection", "close");
        return new Response(res.body, { status: res.status, statusText: res.statusText, headers });
      }
    }
    if (!isStreamed(res)) {
      server.timeout(req, idleTimeoutS);
      return res;
    }
    const restore = () => server.timeout(req, idleTimeoutS);
    const stream = res.body!.pipeThrough(new TransformStream<Uint8Array, Uint8Array>({ flush: restore }));
    return new Response(stream, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
}

/** Replies that stream for as long as they like (NDJSON, SSE): their pauses are not idleness. */
function isStreamed(res: Response): boolean {
  const type = res.headers.get("content-type") ?? "";
  return type.includes("text/event-stream") || type.includes("ndjson");
}

/** Options of {@link listen}: where, what, the idle timeout (default {@link idleTimeoutFromEnv}) and the body deadline (default `EDGELOOP_BODY_TIMEOUT_S` or 60 s). */
export interface ListenOptions {
  port: number;
  hostname: string;
  fetch: ListenerFetch;
  idleTimeoutS?: number;
  bodyTimeoutS?: number;
  /**
   * Bind with `SO_REUSEPORT` (Bun's `reusePort`; Linux balances new
   * connections across the sockets, other systems may not): several processes
   * listen on one port, so one of them dying or restarting leaves the address
   * answering. Default false: a second bind fails with "port in use".
   */
  reusePort?: boolean;
}

/**
 * `Bun.serve` with the idle/header/body timeouts of this module: every
 * listener edgeloop opens goes through here.
 */
export function listen(opts: ListenOptions): Server<undefined> {
  const idle = opts.idleTimeoutS ?? idleTimeoutFromEnv();
  const body = opts.bodyTimeoutS ?? bodyTimeoutFromEnv(process.env.EDGELOOP_BODY_TIMEOUT_S);
  return Bun.serve({ port: opts.port, hostname: opts.hostname, idleTimeout: idle, ...(opts.reusePort ? { reusePort: true } : {}), fetch: withRequestTimeouts(opts.fetch, idle, body) });
}
