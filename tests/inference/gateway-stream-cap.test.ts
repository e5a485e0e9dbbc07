import { afterAll, describe, expect, test } from "bun:test";
import { createGatewayApp } from "../../functions/gateway.ts";

// Issue 26 (S2's kind) for the inference gateway's relayed event streams: the reply cap counts the
// stream's bytes as they arrive, over real loopback HTTP (replica -> gateway -> client).

const stops: (() => void)[] = [];
afterAll(() => {
  for (const s of stops) s();
});

/** One fixed-width event: `data: 0007\n\n` (12 bytes). */
const event = (k: number) => `data: ${String(k).padStart(4, "0")}\n\n`;

/**
 * A replica streaming `events` events (forever when null), `perChunk` events per chunk; `cancelled`
 * resolves when the gateway cancels the stream.
 */
function streamingReplica(events: number | null, perChunk: number) {
  let cancelled!: () => void;
  const wasCancelled = new Promise<void>((r) => (cancelled = r));
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch() {
      let k = 0;
      const enc = new TextEncoder();
      const body = new ReadableStream<Uint8Array>({
        pull(ctrl) {
          if (events !== null && k >= events) {
            ctrl.enqueue(enc.encode("data: [DONE]\n\n"));
            ctrl.close();
            return;
          }
          let s = "";
          for (let i = 0; i < perChunk; i++) s += event(k++);
          ctrl.enqueue(enc.encode(s));
        },
        cancel() {
          cancelled();
        },
      });
      return new Response(body, { headers: { "content-type": "text/event-stream" } });
    },
  });
  stops.push(() => server.stop(true));
  return { base: `http://127.0.0.1:${server.port}`, wasCancelled };
}

function gatewayOver(replica: string, maxReplyBytes: number) {
  const gw = createGatewayApp({ replicas: [replica], healthIntervalMs: 0, maxAttempts: 1, maxReplyBytes });
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: gw.fetch });
  stops.push(() => server.stop(true));
  return `http://127.0.0.1:${server.port}`;
}

const chat = (gw: string) =>
  fetch(`${gw}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "m", prompt: [1, 2], max_tokens: 4, stream: true }) });

describe("the gateway's relayed event streams are capped in bytes", () => {
  test("an endless stream is cut at the cap: the whole events under it, one error event naming the cap, no [DONE]; the replica's stream is cancelled", async () => {
    for (const perChunk of [1, 7, 100]) {
      const r = streamingReplica(null, perChunk);
      const gw = gatewayOver(r.base, 1000);
      const res = await chat(gw);
      expect([res.status, res.headers.get("content-type")]).toEqual([200, "text/event-stream"]);
      const text = await res.text();
      await r.wasCancelled;
      // 83 events of 12 bytes are 996 bytes; the 84th would pass 1000.
      let want = "";
      for (let k = 0; k < 83; k++) want += event(k);
      const error = { error: { code: "reply_too_large", type: "BadGatewayError", message: `engine replica ${r.base} streamed more than 1000 bytes (the gateway's reply cap); the stream was cut` } };
      expect(text).toBe(`${want}data: ${JSON.stringify(error)}\n\n`);
    }
  });

  test("a stream under the cap passes unchanged, [DONE] included", async () => {
    const r = streamingReplica(50, 3);
    const gw = gatewayOver(r.base, 1000);
    let want = "";
    for (let k = 0; k < 51; k++) want += event(k);
    // 17 chunks of 3 events: 51 events (612 bytes) and [DONE] (14 bytes).
    expect(await (await chat(gw)).text()).toBe(want + "data: [DONE]\n\n");
  });

  test("a cap inside an event that began in an earlier chunk closes it with a blank line before the error event", async () => {
    // Chunk boundaries over TCP are the kernel's; an in-process replica fetch delivers these two exactly.
    const enc = new TextEncoder();
    const replicaFetch = async () => {
      let step = 0;
      const body = new ReadableStream<Uint8Array>({
        pull(ctrl) {
          ctrl.enqueue(enc.encode(step++ === 0 ? `data: {"x":"${"a".repeat(27)}` : "b".repeat(100)));
        },
      });
      return new Response(body, { headers: { "content-type": "text/event-stream" } });
    };
    const gw = createGatewayApp({ replicas: ["http://replica.local:8000"], healthIntervalMs: 0, maxAttempts: 1, maxReplyBytes: 64, fetch: replicaFetch });
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: gw.fetch });
    stops.push(() => server.stop(true));
    const text = await (await chat(`http://127.0.0.1:${server.port}`)).text();
    const error = { error: { code: "reply_too_large", type: "BadGatewayError", message: "engine replica http://replica.local:8000 streamed more than 64 bytes (the gateway's reply cap); the stream was cut" } };
    expect(text).toBe(`data: {"x":"${"a".repeat(27)}\n\ndata: ${JSON.stringify(error)}\n\n`);
  });

  test("a JSON reply over maxReplyBytes is a failed attempt naming the cap (as before, now configurable)", async () => {
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => Response.json({ text: "x".repeat(2000) }) });
    stops.push(() => server.stop(true));
    const gw = gatewayOver(`http://127.0.0.1:${server.port}`, 1000);
    const res = await chat(gw);
    expect([res.status, await res.json()]).toEqual([
      503,
      { error: { code: "no_available_workers", type: "ServiceUnavailableError", message: `no engine replica could serve the call (http://127.0.0.1:${server.port}: reply larger than 1000 bytes (the cap))` } },
    ]);
  });
});
