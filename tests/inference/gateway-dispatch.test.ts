import { afterAll, describe, expect, test } from "bun:test";
import { createGatewayApp, REPLICA_HEADER } from "../../functions/gateway.ts";

// Gateway.fetch sends engine POSTs straight to the proxy (body size checked by the declared length, else
// while read) and everything else through the Hono app. These pin down that both ways answer alike: the body limit, a streamed
// (chunked) request body, the admin routes and their auth, and the bytes that reach the replica.

const ADMIN = "dispatch-admin-token";
const REPLY = {
  choices: [{ index: 0, text: "", token_ids: [7, 8], finish_reason: "stop", logprobs: { token_logprobs: [-0.5, -0.25], tokens: ["token_id:7", "token_id:8"] } }],
  usage: { prompt_tokens: 3, completion_tokens: 2 },
};

interface Seen {
  path: string;
  body: string;
  headers: Record<string, string>;
}

/** A gateway over one fake replica that records what reaches it. */
function gateway(maxBodyBytes = 1024) {
  const seen: Seen[] = [];
  const gw = createGatewayApp({
    replicas: ["http://r1.test"],
    healthIntervalMs: 0,
    adminToken: ADMIN,
    maxBodyBytes,
    fetch: async (input, init) => {
      const req = new Request(input, init);
      seen.push({ path: new URL(req.url).pathname + new URL(req.url).search, body: await req.text(), headers: Object.fromEntries(req.headers) });
      return Response.json(REPLY);
    },
  });
  return { gw, seen };
}

const post = (path: string, body: string, headers: Record<string, string> = {}) =>
  new Request(`http://gw.test${path}`, { method: "POST", body, headers: { "content-type": "application/json", "content-length": String(new TextEncoder().encode(body).length), ...headers } });

describe("Gateway.fetch dispatch", () => {
  test("an engine POST reaches the replica byte for byte, hop-by-hop headers dropped, the replica named", async () => {
    const { gw, seen } = gateway();
    const body = '{"prompt":[1,2,3],"max_tokens":2,"logprobs":0,"return_token_ids":true,"note":"é ✓"}';
    const res = await gw.fetch(post("/v1/completions?x=1", body, { "x-session-id": "s1", connection: "keep-alive", "accept-encoding": "gzip" }));
    expect(res.status).toBe(200);
    expect(res.headers.get(REPLICA_HEADER)).toBe("http://r1.test");
    expect(await res.json()).toEqual(REPLY);
    expect(seen).toHaveLength(1);
    expect(seen[0]!.path).toBe("/v1/completions?x=1");
    expect(seen[0]!.body).toBe(body);
    expect(seen[0]!.headers["x-session-id"]).toBe("s1");
    expect(seen[0]!.headers["accept-encoding"]).toBeUndefined();
    expect(seen[0]!.headers.connection).toBeUndefined();
  });

  test("a declared length over maxBodyBytes: 413 request_too_large, as from the Hono app, nothing sent", async () => {
    const { gw, seen } = gateway(64);
    const big = JSON.stringify({ prompt: Array.from({ length: 40 }, (_, i) => i) });
    const viaFetch = await gw.fetch(post("/v1/completions", big));
    const viaApp = await gw.app.fetch(post("/v1/completions", big));
    expect(viaFetch.status).toBe(413);
    const bodyFetch = await viaFetch.json();
    expect(bodyFetch).toEqual(await viaApp.json());
    expect((bodyFetch as { error: { code: string } }).error.code).toBe("request_too_large");
    expect(seen).toHaveLength(0);
  });

  test("an in-process Request without a declared length: read under the limit, proxied whole or 413", async () => {
    const { gw, seen } = gateway(64);
    const small = '{"prompt":[1,2,3],"max_tokens":2}';
    const ok = await gw.fetch(new Request("http://gw.test/v1/completions", { method: "POST", body: small }));
    expect(ok.status).toBe(200);
    expect(seen.map((s) => s.body)).toEqual([small]);
    const big = await gw.fetch(new Request("http://gw.test/v1/completions", { method: "POST", body: JSON.stringify({ prompt: Array.from({ length: 40 }, (_, i) => i) }) }));
    expect(big.status).toBe(413);
    expect(((await big.json()) as { error: { code: string } }).error.code).toBe("request_too_large");
    expect(seen).toHaveLength(1);
  });

  test("admin routes keep their auth through Gateway.fetch, percent-encoded paths included", async () => {
    const { gw, seen } = gateway();
    const add = JSON.stringify({ url: "http://evil.test" });
    expect((await gw.fetch(post("/admin/replicas", add))).status).toBe(401);
    // Hono decodes %61 to "a" before matching: still the admin route, still 401, never proxied.
    expect((await gw.fetch(post("/%61dmin/replicas", add))).status).toBe(401);
    expect((await gw.fetch(post("/admin/replicas", add, { authorization: `Bearer ${ADMIN}` }))).status).toBe(201);
    expect(gw.replicas().map((r) => r.url)).toEqual(["http://r1.test", "http://evil.test"]);
    expect(seen).toHaveLength(0);
  });

  describe("over loopback HTTP", () => {
    const { gw, seen } = gateway(256);
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: gw.fetch });
    afterAll(() => server.stop(true));
    const url = `http://127.0.0.1:${server.port}`;
    const streamed = (chunks: string[]) =>
      new ReadableStream<Uint8Array>({
        start(ctrl) {
          for (const c of chunks) ctrl.enqueue(new TextEncoder().encode(c));
          ctrl.close();
        },
      });

    test("a streamed (chunked) request body is proxied whole", async () => {
      seen.length = 0;
      const chunks = ['{"prompt":[1,2,3],', '"max_tokens":2,', '"logprobs":0,"return_token_ids":true}'];
      const res = await fetch(`${url}/v1/completions`, { method: "POST", body: streamed(chunks), headers: { "x-session-id": "s2" } });
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual(REPLY);
      expect(seen.map((s) => s.body)).toEqual([chunks.join("")]);
    });

    test("a streamed body past maxBodyBytes: 413 while it streams in, nothing sent", async () => {
      seen.length = 0;
      const res = await fetch(`${url}/v1/completions`, { method: "POST", body: streamed(['{"prompt":[', "1,".repeat(200), "1]}"]) });
      expect(res.status).toBe(413);
      expect(((await res.json()) as { error: { code: string } }).error.code).toBe("request_too_large");
      expect(seen).toHaveLength(0);
    });
  });
});
