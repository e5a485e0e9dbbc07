import type { Context } from "hono";
import { redactUrl } from "../shared/http/outbound.ts";

// What the inference gateway (gateway.ts) does with the bytes of a call: forwarded headers, replies read
// under the cap, event streams relayed under it, request bodies read under the body limit.

/** Response header naming the replica that served a call. */
export const REPLICA_HEADER = "x-edgeloop-replica";

/** Hop-by-hop and encoding headers that must not be forwarded as they are. */
export const DROP_REQUEST_HEADERS = ["host", "connection", "content-length", "accept-encoding", "keep-alive", "transfer-encoding"];
const DROP_RESPONSE_HEADERS = ["connection", "content-length", "content-encoding", "keep-alive", "transfer-encoding"];

/** A replica's response with the replica header, hop-by-hop headers dropped. */
export function withReplica(res: Response, replica: string, body: BodyInit | null = res.body): Response {
  const headers = new Headers(res.headers);
  for (const h of DROP_RESPONSE_HEADERS) headers.delete(h);
  // The replica as records and spans may show it: no userinfo or query string (issue 26, S13).
  headers.set(REPLICA_HEADER, redactUrl(replica));
  return new Response(body, { status: res.status, statusText: res.statusText, headers });
}

/**
 * Whether a reply is an event stream (relayed chunk by chunk, not read whole).
 * `res.body` is looked at only then: on Bun, touching it makes a stream that
 * slows the whole-body read of every other reply.
 */
export function isEventStream(res: Response): boolean {
  return (res.headers.get("content-type") ?? "").includes("text/event-stream") && res.body !== null;
}

/**
 * The event a relayed stream ends with when the replica sent more than the
 * cap: the gateway's error shape (`{error: {code, type, message}}`) as one
 * SSE `data:` event, as OpenAI-compatible servers report an error inside a
 * stream. Preceded by a blank line when the bytes relayed so far did not end
 * an event, so the cut event is closed (and unparseable) rather than merged.
 */
function tooLargeEvent(maxBytes: number, replica: string, atBoundary: boolean): Uint8Array {
  const error = { error: { code: "reply_too_large", type: "BadGatewayError", message: `engine replica ${redactUrl(replica)} streamed more than ${maxBytes} bytes (the gateway's reply cap); the stream was cut` } };
  return new TextEncoder().encode(`${atBoundary ? "" : "\n\n"}data: ${JSON.stringify(error)}\n\n`);
}

/**
 * The end (exclusive) of the last SSE event in `chunk[0, limit)`: the index
 * after a blank line (`\n\n` or `\r\n\r\n`), or -1 when none ends there.
 * `prevLast` is the byte before the chunk (-1 at the start).
 */
function lastEventEnd(chunk: Uint8Array, limit: number, prevLast: number): number {
  for (let i = Math.min(limit, chunk.length) - 1; i >= 0; i--) {
    if (chunk[i] !== 10) continue;
    const b1 = i >= 1 ? chunk[i - 1] : prevLast;
    if (b1 === 10) return i + 1;
    if (b1 === 13 && i >= 3 && chunk[i - 2] === 10 && chunk[i - 3] === 13) return i + 1;
  }
  return -1;
}

/**
 * Passes a replica's event stream on and ends its call when the stream is
 * done: `done(true)` at its end, `done(false)` on an error or a cancel. At
 * most `maxBytes` of the replica's bytes are relayed, counted as they arrive:
 * of the chunk that would pass the cap only the events ending within the cap
 * are relayed, the replica's stream is cancelled, and the caller gets
 * {@link tooLargeEvent} and the end of the stream (`done(false)`).
 */
export function relayStream(res: Response, replica: string, maxBytes: number, done: (ok: boolean) => void): Response {
  const reader = res.body!.getReader();
  let ended = false;
  let relayed = 0;
  let atBoundary = true;
  let lastByte = -1;
  const once = (ok: boolean) => {
    if (!ended) {
      ended = true;
      done(ok);
    }
  };
  const stream = new ReadableStream<Uint8Array>({
    async pull(ctrl) {
      try {
        const r = await reader.read();
        if (r.done) {
          once(true);
          ctrl.close();
          return;
        }
        const chunk = r.value;
        if (chunk.byteLength === 0) return;
        if (relayed + chunk.byteLength > maxBytes) {
          // Relay the events that end within the cap, then the error: the caller's stream is the
          // longest run of whole events under the cap, however the replica's bytes were chunked.
          const end = lastEventEnd(chunk, maxBytes - relayed, lastByte);
          if (end > 0) ctrl.enqueue(chunk.subarray(0, end));
          once(false);
          await reader.cancel(new Error(`reply larger than ${maxBytes} bytes (the cap)`)).catch(() => undefined);
          ctrl.enqueue(tooLargeEvent(maxBytes, replica, end > 0 || atBoundary));
          ctrl.close();
          return;
        }
        relayed += chunk.byteLength;
        atBoundary = lastEventEnd(chunk, chunk.byteLength, lastByte) === chunk.byteLength;
        lastByte = chunk[chunk.byteLength - 1]!;
        ctrl.enqueue(chunk);
      } catch (e) {
        once(false);
        ctrl.error(e);
      }
    },
    cancel(reason) {
      once(false);
      return reader.cancel(reason);
    },
  });
  return withReplica(res, replica, stream);
}

/**
 * A replica's reply body read whole under `maxBytes` (a declared length
 * without content-encoding is read natively).
 * @throws Error naming the cap when the reply is larger
 */
export async function readReplyLimited(res: Response, maxBytes: number): Promise<ArrayBuffer> {
  const declared = res.headers.get("content-length");
  if (declared !== null && !res.headers.has("content-encoding") && Number(declared) <= maxBytes) return res.arrayBuffer();
  const buf = await readLimited(res, maxBytes);
  if (buf === null) throw new Error(`reply larger than ${maxBytes} bytes (the cap)`);
  return buf;
}

/**
 * A request body read whole, or null as soon as it passes `maxBytes` (the
 * rest is not read), as Hono's body-limit middleware does for a body of
 * undeclared length. A request without a body reads as 0 bytes.
 */
export async function readLimited(req: { body: ReadableStream<Uint8Array> | null }, maxBytes: number): Promise<ArrayBuffer | null> {
  if (!req.body) return new ArrayBuffer(0);
  const reader = req.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => undefined);
      return null;
    }
    chunks.push(value);
  }
  if (chunks.length === 1 && chunks[0]!.byteOffset === 0 && chunks[0]!.byteLength === chunks[0]!.buffer.byteLength) return chunks[0]!.buffer as ArrayBuffer;
  const out = new Uint8Array(size);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out.buffer;
}

/** Keeps a background promise alive on workerd (`executionCtx.waitUntil`); elsewhere it just runs. */
export function waitUntil(c: Context, p: Promise<unknown>): void {
  try {
    c.executionCtx.waitUntil(p);
  } catch {
    // No execution context outside workerd: the event loop keeps the promise alive.
  }
}
