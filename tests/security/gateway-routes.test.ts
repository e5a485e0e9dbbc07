import { afterAll, describe, expect, test } from "bun:test";
import { createGatewayApp, PROXIED_ROUTES } from "../../functions/gateway.ts";

// S6 (security audit): the inference gateway forwards only the engine routes edgeloop's clients and
// teacher use; engine control (vLLM /pause, /resume, SGLang /pause_generation, weight updates, …) is
// never proxied (it goes through edgeloop's own authenticated /v1/engine/*), and /admin/* is off without
// an admin token.

const REPLY = {
  choices: [{ index: 0, text: "", token_ids: [7], finish_reason: "stop", logprobs: { token_logprobs: [-0.5], tokens: ["token_id:7"] } }],
  usage: { prompt_tokens: 1, completion_tokens: 1 },
};

function gateway(adminToken: string | null = null) {
  const seen: string[] = [];
  const gw = createGatewayApp({
    replicas: ["http://r1.test"],
    healthIntervalMs: 0,
    maxAttempts: 1,
    adminToken,
    fetch: async (input, init) => {
      const u = new URL(new Request(input, init).url);
      seen.push(`${init?.method ?? "GET"} ${u.pathname}${u.search}`);
      return Response.json(REPLY);
    },
  });
  return { gw, seen };
}

const refusedBody = (method: string, path: string) => ({
  error: {
    code: "not_found",
    type: "NotFoundError",
    message: `the gateway does not forward ${method} ${path}: it forwards only POST /v1/completions, POST /inference/v1/generate, POST /generate, POST /tokenize, POST /v1/tokenize, GET /v1/models (engine control goes through edgeloop's /v1/engine/*)`,
  },
});

/** Engine control and other engine routes a caller could try through the gateway (method, path as sent, path as Hono reports it). */
const REFUSED: [string, string, string][] = [
  ["POST", "/pause?mode=keep", "/pause"],
  ["POST", "/resume", "/resume"],
  ["GET", "/is_paused", "/is_paused"],
  ["POST", "/pause_generation", "/pause_generation"],
  ["POST", "/continue_generation", "/continue_generation"],
  ["GET", "/flush_cache", "/flush_cache"],
  ["POST", "/flush_cache", "/flush_cache"],
  ["POST", "/update_weight_version", "/update_weight_version"],
  ["POST", "/update_weights_from_disk", "/update_weights_from_disk"],
  ["POST", "/update_weights_from_distributed", "/update_weights_from_distributed"],
  ["POST", "/abort_request", "/abort_request"],
  ["POST", "/collective_rpc", "/collective_rpc"],
  ["POST", "/v1/load_lora_adapter", "/v1/load_lora_adapter"],
  ["GET", "/get_server_info", "/get_server_info"],
  ["POST", "/v1/chat/completions", "/v1/chat/completions"],
  ["GET", "/v1/completions", "/v1/completions"],
  ["POST", "/v1/models", "/v1/models"],
  // Near misses of allowed routes: exact paths only, nothing decoded or normalised into one.
  ["POST", "/v1/completions/", "/v1/completions/"],
  ["POST", "/V1/completions", "/V1/completions"],
  ["POST", "/v1/%63ompletions", "/v1/%63ompletions"],
  ["POST", "/%70ause", "/%70ause"],
  ["POST", "/v1/completions;x", "/v1/completions;x"],
];

describe("S6: the gateway forwards only the generation routes", () => {
  test("every allowed route reaches the replica, with its query string", async () => {
    expect(PROXIED_ROUTES).toEqual(["POST /v1/completions", "POST /inference/v1/generate", "POST /generate", "POST /tokenize", "POST /v1/tokenize", "GET /v1/models"]);
    const { gw, seen } = gateway();
    for (const route of PROXIED_ROUTES) {
      const [method, path] = route.split(" ") as [string, string];
      const res = await gw.fetch(new Request(`http://gw.test${path}?x=1`, method === "GET" ? {} : { method, body: "{}", headers: { "content-type": "application/json" } }));
      await res.arrayBuffer();
    }
    expect(seen).toEqual(PROXIED_ROUTES.map((r) => `${r}?x=1`));
  });

  test("engine control and every other path: 404 naming the forwarded routes, never forwarded (Gateway.fetch and app)", async () => {
    const { gw, seen } = gateway("adm");
    for (const [method, path, reported] of REFUSED) {
      for (const f of [gw.fetch, (r: Request) => gw.app.fetch(r)]) {
        const res = await f(new Request(`http://gw.test${path}`, method === "GET" ? {} : { method, body: '{"mode":"keep"}', headers: { "content-type": "application/json" } }));
        expect([path, res.status, await res.json()]).toEqual([path, 404, refusedBody(method, reported)]);
      }
    }
    expect(seen).toEqual([]);
  });

  test("the audit's repro over HTTP: POST /pause?mode=keep with the admin token set is refused, the replica never paused", async () => {
    let paused = false;
    const replica = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      fetch: (req) => {
        const p = new URL(req.url).pathname;
        if (p === "/pause") paused = true;
        return p === "/is_paused" ? Response.json({ is_paused: paused }) : Response.json({ status: "paused" });
      },
    });
    const gw = createGatewayApp({ replicas: [`http://127.0.0.1:${replica.port}`], healthIntervalMs: 0, adminToken: "adminTOK999" });
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: gw.fetch });
    afterAll(() => {
      server.stop(true);
      replica.stop(true);
    });
    const url = `http://127.0.0.1:${server.port}`;
    const pause = await fetch(`${url}/pause?mode=keep`, { method: "POST" });
    expect([pause.status, pause.headers.get("x-edgeloop-replica"), await pause.json()]).toEqual([404, null, refusedBody("POST", "/pause")]);
    const isPaused = await fetch(`${url}/is_paused`);
    expect([isPaused.status, await isPaused.json()]).toEqual([404, refusedBody("GET", "/is_paused")]);
    expect(paused).toBe(false);
  });
});

describe("S6: /admin/* without an admin token is off, not open", () => {
  test("every admin request is 403 admin_disabled; the replicas stay as they are", async () => {
    const { gw } = gateway(null);
    const body = { error: { code: "admin_disabled", message: "the gateway's admin API is off: start it with EDGELOOP_ADMIN_TOKEN set to enable /admin/* behind that bearer token" } };
    for (const [method, path] of [["GET", "/admin/replicas"], ["POST", "/admin/replicas"], ["DELETE", "/admin/replicas"], ["GET", "/admin/nothing"], ["POST", "/%61dmin/replicas"]] as const) {
      const res = await gw.fetch(
        new Request(`http://gw.test${path}`, method === "GET" ? {} : { method, body: JSON.stringify({ url: "http://evil.test" }), headers: { "content-type": "application/json", authorization: "Bearer x" } }),
      );
      expect([path, method, res.status, await res.json()]).toEqual([path, method, 403, body]);
    }
    expect(gw.replicas().map((r) => r.url)).toEqual(["http://r1.test"]);
    // An empty token is no token.
    const empty = createGatewayApp({ replicas: ["http://r1.test"], healthIntervalMs: 0, adminToken: "" });
    expect((await empty.app.request("/admin/replicas", { headers: { authorization: "Bearer " } })).status).toBe(403);
  });
});
