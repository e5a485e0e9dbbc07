/**
 * Loopback servers that misbehave as a hostile webhook would (issue 26, S1/S2/S13):
 * one that redirects, one that streams an endless (or huge) reply, one that
 * never answers, and a target that counts every request it gets.
 */

/** A loopback server counting its requests (the would-be SSRF target). */
export function countingTarget() {
  let hits = 0;
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => (hits++, Response.json({ content: "INTERNAL-SECRET-DATA", score: 1, terminate: true })) });
  return { url: `http://127.0.0.1:${server.port}/latest/meta-data`, hits: () => hits, stop: () => server.stop(true) };
}

/** A server answering every request with `status` and `Location: location`. */
export function redirecting(status: number, location: string) {
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(null, { status, headers: { location } }) });
  return { base: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) };
}

/**
 * A server answering `200 {"content":"AAAA…` of `totalBytes` (streamed in
 * 64 KiB chunks, never allocated whole); `sent()` is how many bytes it
 * handed to the socket before the client went away.
 */
export function hugeReply(totalBytes: number) {
  let sent = 0;
  const chunk = new Uint8Array(64 * 1024).fill(0x41);
  const head = new TextEncoder().encode('{"content":"');
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 30,
    fetch: () => {
      let first = true;
      return new Response(
        new ReadableStream<Uint8Array>({
          pull(c) {
            if (first) {
              first = false;
              sent += head.byteLength;
              c.enqueue(head);
              return;
            }
            if (sent >= totalBytes) return c.close();
            sent += chunk.byteLength;
            c.enqueue(chunk);
          },
        }),
        { headers: { "content-type": "application/json" } },
      );
    },
  });
  return { base: `http://127.0.0.1:${server.port}`, sent: () => sent, stop: () => server.stop(true) };
}

/** A server that takes every request and never answers it. */
export function silent() {
  let got = 0;
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", idleTimeout: 30, fetch: () => (got++, new Promise<Response>(() => {})) });
  return { base: `http://127.0.0.1:${server.port}`, got: () => got, stop: () => server.stop(true) };
}

/** A server answering every request with `status` and a small JSON body. */
export function answering(status: number, body: unknown = { error: "nope" }) {
  const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => Response.json(body, { status }) });
  return { base: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) };
}

/** A free loopback port with nothing listening (connection refused). */
export function closedPort(): number {
  const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
  const port = s.port!;
  s.stop(true);
  return port;
}
