import { afterAll, describe, expect, test } from "bun:test";
import { connect } from "node:net";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { listen, idleTimeoutFromEnv, DEFAULT_IDLE_TIMEOUT_S } from "../../infra/cli/listen.ts";
import { bodyTimeoutFromEnv, DEFAULT_BODY_TIMEOUT_S, withBodyDeadline } from "../../functions/body-deadline.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 26 S9: every listener times out idle connections, half-sent headers and slow or stalled bodies,
// closes after an early 4xx, and still lets a handler work for minutes and a stream pause.
const ROOT = join(import.meta.dir, "..", "..");
const server = listen({
  port: 0,
  hostname: "127.0.0.1",
  idleTimeoutS: 1,
  bodyTimeoutS: 2,
  async fetch(req) {
    const path = new URL(req.url).pathname;
    if (path === "/401") return new Response("no", { status: 401 });
    if (path === "/stream") {
      let i = 0;
      return new Response(
        new ReadableStream({
          async pull(c) {
            // Pauses longer than the idle timeout between chunks (the stream is not idle: it is working).
            await new Promise((r) => setTimeout(r, 2500));
            c.enqueue(new TextEncoder().encode(`{"i":${i}}\n`));
            if (++i === 2) c.close();
          },
        }),
        { headers: { "content-type": "application/x-ndjson" } },
      );
    }
    const body = req.body ? await req.text() : "";
    // A handler that works longer than the idle timeout (an engine call, a blocking read).
    if (path === "/slow") await new Promise<void>((r) => setTimeout(r, 2500));
    return new Response(`ok ${body.length}`);
  },
});
// The same handler with an idle timeout far above the body deadline: the trickle test then shows the body
// deadline alone, whatever pauses a busy test process puts between the trickled bytes.
const patient = listen({ port: 0, hostname: "127.0.0.1", idleTimeoutS: 30, bodyTimeoutS: 2, fetch: async (req) => new Response(`ok ${(await req.text()).length}`) });
afterAll(() => {
  server.stop(true);
  patient.stop(true);
});

/** Opens a raw connection, writes `chunks`, and resolves with everything read and whether the server closed it. */
function raw(chunks: string[], opts: { endAfter?: RegExp; trickle?: string; maxMs?: number; port?: number } = {}): Promise<{ data: string; closedByServer: boolean; ms: number }> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    let data = "";
    let ended = false;
    const c = connect(opts.port ?? server.port!, "127.0.0.1", () => {
      for (const ch of chunks) c.write(ch);
    });
    const trickle = opts.trickle ? setInterval(() => c.write(opts.trickle!), 300) : undefined;
    // A guard only: the server is expected to close first (asserted through closedByServer).
    const guard = setTimeout(() => ((ended = true), c.destroy()), opts.maxMs ?? 8000);
    c.on("data", (d) => {
      data += String(d);
      if (opts.endAfter?.test(data)) ((ended = true), c.end());
    });
    c.on("error", () => {});
    c.on("close", () => {
      clearInterval(trickle);
      clearTimeout(guard);
      resolve({ data: data.replace(/Date: [^\r]*\r\n/i, ""), closedByServer: !ended, ms: Date.now() - t0 });
    });
  });
}
const status = (data: string) => data.split("\r\n")[0];

describe("listen(): idle, header and body timeouts (S9)", () => {
  test("half-sent headers are closed (Bun's own header timeout, ~10-12 s whatever idleTimeout)", async () => {
    const r = await raw(["GET /x HTTP/1.1\r\nHost: x\r\n"], { maxMs: 20_000 });
    expect([r.data, r.closedByServer]).toEqual(["", true]);
  }, HANG_MS);
  test("a partial body is answered 408 (connection: close) at the body deadline", async () => {
    const r = await raw(["POST /x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"]);
    expect([status(r.data), r.closedByServer, r.data.toLowerCase().includes("connection: close")]).toEqual(["HTTP/1.1 408 Request Timeout", true, true]);
    expect(r.data).toContain('{"error":{"code":"request_timeout","field":"body","message":"the request body did not arrive within 2 s"}}');
  }, HANG_MS);
  test("a body trickled a byte every 300 ms (never idle) still meets the body deadline: 408, closed", async () => {
    const r = await raw(["POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{"], { trickle: " ", port: patient.port! });
    expect([status(r.data), r.closedByServer]).toEqual(["HTTP/1.1 408 Request Timeout", true]);
  }, HANG_MS);
  test("an early 401 with the body unsent closes the connection at once", async () => {
    const r = await raw(["POST /401 HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{"]);
    expect([status(r.data), r.closedByServer, r.data.toLowerCase().includes("connection: close")]).toEqual(["HTTP/1.1 401 Unauthorized", true, true]);
    expect(r.ms).toBeLessThan(1000);
  }, HANG_MS);
  test("a handler working longer than the idle timeout answers; then the keep-alive connection is bounded again", async () => {
    const r = await raw(["POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", "GET /x HTTP/1.1\r\nHost: x\r\n"]);
    expect([status(r.data), r.data.endsWith("ok 2"), r.closedByServer]).toEqual(["HTTP/1.1 200 OK", true, true]);
  }, HANG_MS);
  test("a GET whose handler works longer than the idle timeout is not cut", async () => {
    const r = await raw(["GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"], { endAfter: /ok 0$/ });
    expect([status(r.data), r.data.endsWith("ok 0"), r.closedByServer]).toEqual(["HTTP/1.1 200 OK", true, false]);
  }, HANG_MS);
  test("an NDJSON stream pausing longer than the idle timeout is delivered whole", async () => {
    const r = await raw(["GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"], { endAfter: /0\r\n\r\n$/ });
    expect([status(r.data), r.data.includes('{"i":0}\n'), r.data.includes('{"i":1}\n'), r.closedByServer]).toEqual(["HTTP/1.1 200 OK", true, true, false]);
  }, HANG_MS);
});

describe("settings", () => {
  test("defaults and env parsing name the variable", () => {
    expect([DEFAULT_IDLE_TIMEOUT_S, DEFAULT_BODY_TIMEOUT_S]).toEqual([10, 60]);
    expect(idleTimeoutFromEnv({})).toBe(10);
    expect(idleTimeoutFromEnv({ EDGELOOP_IDLE_TIMEOUT_S: "30" })).toBe(30);
    expect(() => idleTimeoutFromEnv({ EDGELOOP_IDLE_TIMEOUT_S: "0" })).toThrow('EDGELOOP_IDLE_TIMEOUT_S must be a whole number of seconds from 1 to 255 (Bun\'s limit), got "0"');
    expect(() => idleTimeoutFromEnv({ EDGELOOP_IDLE_TIMEOUT_S: "256" })).toThrow("EDGELOOP_IDLE_TIMEOUT_S");
    expect(bodyTimeoutFromEnv(undefined)).toBe(60);
    expect(bodyTimeoutFromEnv("5")).toBe(5);
    expect(() => bodyTimeoutFromEnv("x")).toThrow('EDGELOOP_BODY_TIMEOUT_S must be a whole number of seconds ≥ 1, got "x"');
    expect(() => bodyTimeoutFromEnv("2147484")).toThrow('EDGELOOP_BODY_TIMEOUT_S must be at most 2147483 seconds (setTimeout\'s largest delay), got "2147484"');
    expect(bodyTimeoutFromEnv("2147483")).toBe(2_147_483);
  });
});

describe("withBodyDeadline (the Deno entry's only body timeout), runtime-free", () => {
  test("a body that stalls: 408 whatever the handler does; a body in time passes", async () => {
    const h = withBodyDeadline(async (req: Request) => new Response(`got ${(await req.text()).length}`), 1);
    const stalled = new Request("http://x/", { method: "POST", body: new ReadableStream({ start: (c) => c.enqueue(new Uint8Array(3)) }), duplex: "half" } as RequestInit);
    const res = await h(stalled);
    expect([res.status, res.headers.get("connection"), await res.text()]).toEqual([408, "close", '{"error":{"code":"request_timeout","field":"body","message":"the request body did not arrive within 1 s"}}']);
    const ok = await h(new Request("http://x/", { method: "POST", body: "abc" }));
    expect([ok.status, await ok.text()]).toEqual([200, "got 3"]);
  });
});

describe("every listener goes through listen() (no idleTimeout: 0 left)", () => {
  const files = (d: string): string[] => readdirSync(d).flatMap((f) => (statSync(join(d, f)).isDirectory() ? files(join(d, f)) : f.endsWith(".ts") ? [join(d, f)] : []));
  test("infra/ and functions/ hold no Bun.serve outside listen.ts and no idleTimeout: 0", () => {
    const offenders: string[] = [];
    for (const f of [...files(join(ROOT, "infra")), ...files(join(ROOT, "functions"))]) {
      if (f.endsWith(join("cli", "listen.ts")) || f.includes(`${join("infra", "chaos")}`)) continue;
      readFileSync(f, "utf8").split("\n").forEach((line, i) => {
        if (/^\s*(\*|\/\/)/.test(line)) return;
        if (/Bun\.serve\(|idleTimeout:\s*0\b/.test(line)) offenders.push(`${f.slice(ROOT.length + 1)}:${i + 1}`);
      });
    }
    expect(offenders).toEqual([]);
  });
});
