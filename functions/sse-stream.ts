import type { AgentGateway } from "../shared/agent-gateway/agent-gateway.ts";
import type { ChatReply } from "../shared/agent-gateway/openai-wire.ts";
import type { SseTurnWriter } from "../shared/agent-gateway/sse-writers.ts";
import type { TurnSink } from "../shared/agent-gateway/turn-stream.ts";

/** How a streamed call ended, for {@link streamTurn}'s `onEnd`: `delivered` when the last event was written to an open stream. */
export type StreamEnd = { delivered: boolean; reply: ChatReply | null };

/**
 * The `text/event-stream` answer of one streamed turn (true streaming):
 * `run` answers the turn with a sink that `writer` (one API's events)
 * receives. The HTTP status is decided before any byte is sent: an error
 * thrown before the turn's first token is thrown from here (the caller's
 * error answer: 4xx, 409, 5xx the SDKs retry), a reply whole before then (a
 * replay) is one body; once the first token arrives the response is
 * returned and the events follow as the engine produces them, then the rest
 * of the committed reply, or the API's error event when the turn fails later.
 * `onEnd` is told, once, whether the final event reached an open stream (a
 * client that cancelled the body, or whose request `signal` aborted, before
 * it did not receive the turn: see `AgentGateway.abandon`).
 */
export async function streamTurn(
  makeWriter: (write: (s: string) => void) => SseTurnWriter,
  run: (sink: TurnSink) => Promise<ChatReply>,
  headers: Record<string, string>,
  onEnd?: (end: StreamEnd) => void,
  signal?: AbortSignal,
): Promise<Response> {
  const enc = new TextEncoder();
  let ctrl: ReadableStreamDefaultController<Uint8Array> | null = null;
  let cancelled = false;
  const buffered: string[] = [];
  const write = (s: string) => {
    if (cancelled) return;
    if (ctrl) ctrl.enqueue(enc.encode(s));
    else buffered.push(s);
  };
  const writer = makeWriter(write);
  let onStart!: () => void;
  const started = new Promise<null>((resolve) => (onStart = () => resolve(null)));
  const sink: TurnSink = {
    start(h) {
      writer.start(h);
      onStart();
    },
    reasoning: (t) => writer.reasoning(t),
    content: (d) => writer.content(d),
  };
  const turn = run(sink);
  const whole = await Promise.race([turn.then((r) => ({ r })), started]);
  const h = { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache", ...headers };
  if (whole) {
    writer.finish(whole.r);
    onEnd?.({ delivered: !signal?.aborted, reply: whole.r });
    return new Response(buffered.join(""), { headers: h });
  }
  let ended = false;
  const end = (reply: ChatReply | null) => {
    if (ended) return;
    ended = true;
    onEnd?.({ delivered: !cancelled && !signal?.aborted && reply !== null, reply });
  };
  const body = new ReadableStream<Uint8Array>({
    start(c) {
      ctrl = c;
      for (const s of buffered.splice(0)) c.enqueue(enc.encode(s));
    },
    cancel() {
      cancelled = true;
    },
  });
  const close = () => {
    if (cancelled) return;
    try {
      ctrl!.close();
    } catch {
      // the client went away meanwhile
    }
  };
  turn.then(
    (r) => {
      try {
        writer.finish(r);
      } catch (e) {
        writer.fail(e);
      }
      close();
      end(r);
    },
    (e) => {
      writer.fail(e);
      close();
      end(null);
    },
  );
  return new Response(body, { headers: h });
}

/**
 * Marks reply `replyId` of session `key` abandoned when its client went away
 * before receiving it (`delivered` false; issue 30 item 6). Never throws: a
 * store failure only loses the mark, logged by nothing (the turn stays an
 * ordinary one).
 */
export function abandonUnlessDelivered(gw: AgentGateway, key: string, end: StreamEnd): void {
  if (end.delivered || !end.reply) return;
  void gw.abandon(key, end.reply.id).catch(() => {});
}
