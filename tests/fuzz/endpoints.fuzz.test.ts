import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { createGatewayApp, type Gateway } from "../../functions/gateway.ts";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { createToolsApp } from "../../infra/tools/app.ts";
import { createSandboxProviderApp } from "../../infra/sandbox/app.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { ConflictError, NotFoundError } from "../../shared/errors.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { signatureHeader } from "../../shared/tools/signature.ts";
import { randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { bodies, segment } from "./mutate.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Property: random and mutated bodies sent to every endpoint of every function app never get a
// 5xx, never throw out of the app, and a rejected (4xx) request changes no state.
const TOKEN = "fuzz-api-token-5b1f";
const SECRET = "fuzz-webhook-secret-9c2e";
const ADMIN = "fuzz-admin-token-77aa";
const SEED = Number(process.env.FUZZ_SEED ?? 20240501);
let total = 0;
/** Responses by method, path head and status (printed at the end: shows what the bodies reached). */
const statuses = new Map<string, number>();

const METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"] as const;

/** Counts every mutating call on the transfer queue. */
function countingStore(inner: TransferQueue): { store: TransferQueue; writes: () => number } {
  let n = 0;
  const w =
    <A extends unknown[], R>(f: (...a: A) => Promise<R>) =>
    (...a: A) => {
      n++;
      return f(...a);
    };
  return {
    writes: () => n,
    store: {
      expectGroup: w(inner.expectGroup.bind(inner)),
      put: w(inner.put.bind(inner)),
      markFailed: w(inner.markFailed.bind(inner)),
      finishSession: w(inner.finishSession.bind(inner)),
      sessionRecords: inner.sessionRecords.bind(inner),
      ack: w(inner.ack.bind(inner)),
      get: inner.get.bind(inner),
      groupStatus: inner.groupStatus.bind(inner),
      readCompleteGroups: w(inner.readCompleteGroups.bind(inner)),
      close: inner.close.bind(inner),
    },
  };
}

async function send(app: { request: (path: string, init: RequestInit) => Response | Promise<Response> }, method: string, path: string, body: string | Uint8Array | undefined, headers: Record<string, string>) {
  total++;
  const init: RequestInit = { method, headers };
  if (body !== undefined && method !== "GET" && method !== "HEAD") init.body = body as BodyInit;
  const res = await app.request(path, init);
  const text = await res.text();
  const k = `${method} ${path.split("/").slice(0, 3).join("/")} ${res.status}`;
  statuses.set(k, (statuses.get(k) ?? 0) + 1);
  return { status: res.status, text };
}

function expectErrorShape(status: number, text: string): void {
  expect(status).toBeLessThan(500);
  if (status >= 400) {
    const j = JSON.parse(text) as { error: { code: string; message: string } };
    expect(typeof j.error.code).toBe("string");
    expect(typeof j.error.message).toBe("string");
  }
}

const headerSets = fc.constantFrom<"good" | "none" | "bad">("good", "good", "good", "none", "bad");

describe("rollouts + sessions + viewer API", () => {
  const { store, writes } = countingStore(new MemoryTransferQueue());
  const service = new RolloutService({
    config: parseAppConfig({}),
    store,
    // A cheap fake: every trajectory fails at once (no engine, no tools).
    executorFor: () => ({ agentNameFor: () => "fake", run: async () => Promise.reject(new Error("fake engine")) }),
    maxBatches: 50,
  });
  const delivered: string[] = [];
  const sessions = createSessionsApp({
    secret: SECRET,
    apiToken: TOKEN,
    backend: {
      async deliver(key, r) {
        if (key !== "known_0_0") throw new NotFoundError(`no session '${key}'`);
        if (r.call_id !== "known_0_0:1:0" || delivered.includes(r.call_id)) throw new ConflictError(`no tool call '${r.call_id}'`);
        delivered.push(r.call_id);
      },
      async status(key) {
        return key === "known_0_0" ? { phase: "waiting" } : null;
      },
    },
  });
  const rollouts = createRolloutsApp({ service, apiToken: TOKEN, maxBodyBytes: 256 * 1024 });
  const keys: string[] = [];
  const batches = () => service.batchIds();

  test("10,000+ bodies across every endpoint: no 5xx, no state change when rejected", async () => {
    const validRollout = [
      { rows: [{ prompt: [{ role: "user", content: "What is 2+2?" }], data_source: "gsm8k", reward_model: { style: "rule", ground_truth: "4" } }] },
      { rows: [{ prompt: [{ role: "user", content: "hi" }] }, { prompt: "bad" }], global_steps: 3, model_version: "v1", validate: true, config: { rollout: { n: 2 } } },
      { rows: [{ prompt: [{ role: "user", content: "x" }], uid: "my-uid.1", agent_name: null, extra_info: { index: 4 } }], config: { rollout: { temperature: 0.5 } } },
    ];
    const validAck = [{ delivery_ids: ["0-1"], partition: "train" }, { delivery_ids: ["1-0", "2-0"] }];
    const validCallback = [{ call_id: "known_0_0:1:0", content: "42" }, { call_id: "x", content: "", reward: 1 }];
    const routes = fc.oneof(
      { weight: 6, arbitrary: fc.record({ r: fc.constant("POST /v1/rollouts"), body: bodies(validRollout) }) },
      { weight: 2, arbitrary: fc.record({ r: fc.constant("POST /v1/groups/ack"), body: bodies(validAck) }) },
      { weight: 2, arbitrary: fc.record({ r: fc.constant("POST /v1/model-version"), body: bodies([{ version: "v7" }, { version: 12 }]) }) },
      { weight: 3, arbitrary: fc.record({ r: fc.constant("POST /v1/sessions/:key/tool-results"), body: bodies(validCallback), key: segment(() => ["known_0_0"]) }) },
      { weight: 2, arbitrary: fc.record({ r: fc.constant("GET /v1/rollouts/:id"), id: segment(batches) }) },
      { weight: 1, arbitrary: fc.record({ r: fc.constant("GET /v1/rollouts/:id/trajectories"), id: segment(batches) }) },
      { weight: 2, arbitrary: fc.record({ r: fc.constant("GET /v1/trajectories/:key"), key: segment(() => keys), q: fc.constantFrom("", "?decode=1", "?decode=true", "?decode=%ff") }) },
      { weight: 1, arbitrary: fc.record({ r: fc.constant("GET /v1/sessions/:key"), key: segment(() => ["known_0_0"]) }) },
      {
        weight: 2,
        arbitrary: fc.record({
          r: fc.constant("GET /v1/rollouts/:id/summaries"),
          id: segment(batches),
          q: fc.dictionary(fc.constantFrom("limit", "cursor", "status", "truncated", "reward_min", "reward_max", "uid", "zz"), fc.oneof(fc.string({ maxLength: 12 }), fc.integer().map(String), fc.constantFrom("ok", "failed", "1", "0", "-0.5", "1e3", "1e999"))),
        }),
      },
      { weight: 1, arbitrary: fc.record({ r: fc.constant("GET /v1/rollouts/:id/groups/:uid"), id: segment(batches), uid: segment(() => keys.map((k) => k.split("_")[0]!)), q: fc.constantFrom("", "?decode=1", "?decode=x") }) },
      {
        weight: 2,
        arbitrary: fc.record({
          r: fc.constant("GET /v1/groups"),
          q: fc.dictionary(fc.constantFrom("max", "block_ms", "consumer", "partition", "zz"), fc.oneof(fc.string({ maxLength: 12 }), fc.integer().map(String))),
        }),
      },
      {
        weight: 2,
        arbitrary: fc.record({
          r: fc.constant("ANY"),
          method: fc.constantFrom(...METHODS),
          path: fc.constantFrom("/v1/rollouts", "/v1/queue", "/v1/model-version", "/health", "/metrics", "/openapi.json", "/viewer", "/viewer/viewer.js", "/v1/groups", "/v1/nothing", "/"),
          body: bodies([]),
        }),
      },
    );
    const app = { request: (p: string, init: RequestInit) => (p.startsWith("/v1/sessions/") ? sessions.request(p, init) : rollouts.request(p, init)) };

    await fc.assert(
      fc.asyncProperty(routes, headerSets, fc.constantFrom("application/json", "text/plain", ""), async (route, auth, ctype) => {
        const h: Record<string, string> = {};
        if (ctype) h["content-type"] = ctype;
        if (auth === "good") h.authorization = `Bearer ${TOKEN}`;
        if (auth === "bad") h.authorization = `Bearer ${TOKEN.slice(0, -1)}x`;
        const r = route as Record<string, any>;
        let method = "GET";
        let path: string;
        let body: string | Uint8Array | undefined;
        switch (r.r) {
          case "POST /v1/rollouts":
            [method, path, body] = ["POST", "/v1/rollouts", r.body];
            break;
          case "POST /v1/groups/ack":
            [method, path, body] = ["POST", "/v1/groups/ack", r.body];
            break;
          case "POST /v1/model-version":
            [method, path, body] = ["POST", "/v1/model-version", r.body];
            break;
          case "POST /v1/sessions/:key/tool-results": {
            [method, path, body] = ["POST", `/v1/sessions/${r.key}/tool-results`, r.body];
            const raw = typeof r.body === "string" ? r.body : new TextDecoder().decode(r.body);
            // Sign most callbacks (so the parser and backend are reached), some with a stale or wrong signature.
            if (auth === "good") h["x-edgeloop-signature"] = await signatureHeader(SECRET, raw, Date.now() / 1000);
            if (auth === "bad") h["x-edgeloop-signature"] = await signatureHeader(SECRET, raw, Date.now() / 1000 - 301);
            break;
          }
          case "GET /v1/rollouts/:id":
            path = `/v1/rollouts/${r.id}`;
            break;
          case "GET /v1/rollouts/:id/trajectories":
            path = `/v1/rollouts/${r.id}/trajectories`;
            break;
          case "GET /v1/trajectories/:key":
            path = `/v1/trajectories/${r.key}${r.q}`;
            break;
          case "GET /v1/sessions/:key":
            path = `/v1/sessions/${r.key}`;
            break;
          case "GET /v1/rollouts/:id/summaries":
            path = `/v1/rollouts/${r.id}/summaries?${new URLSearchParams(r.q).toString()}`;
            break;
          case "GET /v1/rollouts/:id/groups/:uid":
            path = `/v1/rollouts/${r.id}/groups/${r.uid}${r.q}`;
            break;
          case "GET /v1/groups":
            path = `/v1/groups?${new URLSearchParams(r.q).toString()}`;
            break;
          default:
            [method, path, body] = [r.method, r.path, r.body];
        }
        const before = { batches: service.batchIds().length, writes: writes(), delivered: delivered.length, policy: await service.policy.current() };
        const res = await send(app, method, path, body, h);
        expectErrorShape(res.status, res.text);
        if (res.status >= 400) {
          expect({ batches: service.batchIds().length, writes: writes(), delivered: delivered.length, policy: await service.policy.current() }).toEqual(before);
        } else if (method === "POST" && path === "/v1/rollouts") {
          const { batch_id, keys: ks } = JSON.parse(res.text) as { batch_id: string; keys: string[] };
          keys.push(...ks.slice(0, 3));
          await service.batch(batch_id).run();
        }
      }),
      { numRuns: 6_500, seed: SEED },
    );
    expect(batches().length).toBeGreaterThan(0);
    expect(delivered.length).toBeLessThanOrEqual(1);
  }, HANG_MS);
});

describe("gateway", () => {
  let gw: Gateway;
  const upstream: string[] = [];
  beforeAll(() => {
    gw = createGatewayApp({
      replicas: ["http://r1.test", "http://r2.test"],
      healthIntervalMs: 0,
      adminToken: ADMIN,
      maxBodyBytes: 64 * 1024,
      // A well-behaved replica: each endpoint's own reply shape (the gateway refuses replies off the wire schema).
      fetch: async (input) => {
        upstream.push(String(input));
        const path = new URL(input instanceof Request ? input.url : String(input)).pathname;
        if (path === "/v1/models") return Response.json({ object: "list", data: [{ id: "m", max_model_len: 4096 }] });
        if (path === "/generate") return Response.json({ output_ids: [1], meta_info: { id: "g", finish_reason: { type: "stop", matched: 1 } } });
        return Response.json({ id: "cmpl", choices: [{ index: 0, text: "", finish_reason: "stop", token_ids: [1] }] });
      },
    });
  });

  test("admin and proxied calls: no 5xx; a rejected admin call leaves the replicas as they were", async () => {
    const validAdmin = [{ url: "http://r3.test" }, { url: "https://r1.test/" }];
    const validCompletion = [{ prompt: [1, 2, 3], max_tokens: 4, logprobs: 0 }];
    const routes = fc.oneof(
      fc.record({ method: fc.constantFrom("GET", "POST", "DELETE", "PUT"), path: fc.constant("/admin/replicas"), body: bodies(validAdmin) }),
      fc.record({ method: fc.constantFrom("POST", "GET"), path: fc.constantFrom("/v1/completions", "/generate", "/health", "/v1/models"), body: bodies(validCompletion) }),
    );
    const urls = () => JSON.stringify(gw.replicas().map((r) => r.url));
    const reset = () => {
      for (const r of gw.replicas()) gw.removeReplica(r.url);
      gw.addReplica("http://r1.test");
      gw.addReplica("http://r2.test");
    };
    await fc.assert(
      fc.asyncProperty(routes, headerSets, fc.option(fc.constantFrom("k1", "k2", "k3")), async (r, auth, key) => {
        const h: Record<string, string> = { "content-type": "application/json" };
        if (auth === "good") h.authorization = `Bearer ${ADMIN}`;
        if (auth === "bad") h.authorization = `Bearer ${TOKEN}`;
        if (key) h["x-session-id"] = key;
        const before = urls();
        const res = await send(gw.app, r.method, r.path, r.body, h);
        expectErrorShape(res.status, res.text);
        if (r.path === "/admin/replicas") {
          if (auth !== "good") expect(res.status).toBe(401);
          if (res.status >= 400) expect(urls()).toBe(before);
          else reset();
        }
      }),
      { numRuns: 1_500, seed: SEED },
    );
    expect(upstream.length).toBeGreaterThan(0);
  }, HANG_MS);
});

describe("example tool server", () => {
  test("signed and unsigned random calls: no 5xx; rejected calls execute nothing", async () => {
    const app = createToolsApp({ secret: SECRET });
    const valid = [
      { call_id: "k_0_0:1:0", name: "calc", arguments: { expression: "2+3" }, key: "k_0_0", turn: 1 },
      { call_id: "k_0_0:1:1", name: "lookup", arguments: { query: "capital of France" }, key: "k_0_0", turn: 1, create_kwargs: {} },
    ];
    const executions = async () => ((await (await app.request("/stats")).json()) as { executions: number }).executions;
    await fc.assert(
      fc.asyncProperty(fc.constantFrom("calc", "lookup", "nope", "%00"), bodies(valid), headerSets, async (tool, body, auth) => {
        const raw = typeof body === "string" ? body : new TextDecoder().decode(body);
        const h: Record<string, string> = { "content-type": "application/json" };
        if (auth === "good") h["x-edgeloop-signature"] = await signatureHeader(SECRET, raw, Date.now() / 1000);
        if (auth === "bad") h["x-edgeloop-signature"] = await signatureHeader("wrong", raw, Date.now() / 1000);
        const before = await executions();
        const res = await send(app, "POST", `/tools/${tool}`, raw, h);
        expectErrorShape(res.status, res.text);
        if (res.status >= 400) expect(await executions()).toBe(before);
        if (auth !== "good") expect(res.status).toBe(401);
      }),
      { numRuns: 1_500, seed: SEED },
    );
  }, HANG_MS);
});

describe("example sandbox provider", () => {
  test("signed and unsigned random bodies to every route: no 5xx; a 400 or 401 changes no count", async () => {
    const { app, pool } = createSandboxProviderApp({ secret: SECRET, idPrefix: "sbx-" });
    const valid = [
      { lease_id: "k_0_0~1", key: "k_0_0", create_kwargs: {}, lifetime_s: 600 },
      { lease_id: "k_0_0~1", sandbox_id: null, key: "k_0_0", reason: "finished" },
      { lease_id: "k_0_0~1", sandbox_id: "sbx-1", lifetime_s: 600 },
      { call_id: "k_0_0:1:0", name: "sbx_write", arguments: { path: "a", content: "b" }, key: "k_0_0", turn: 1, create_kwargs: {}, sandbox_id: "sbx-1", lease_id: "k_0_0~1" },
      { call_id: "k_0_0:1:1", name: "sbx_read", arguments: { path: "a" }, key: "k_0_0", turn: 1, sandbox_id: "sbx-1" },
    ];
    const counts = () => JSON.stringify(pool.stats());
    const paths = fc.constantFrom("/sandboxes/create", "/sandboxes/release", "/sandboxes/heartbeat", "/tools/sbx_write", "/tools/sbx_read", "/tools/nope", "/sandboxes/%00");
    await fc.assert(
      fc.asyncProperty(paths, bodies(valid), headerSets, async (path, body, auth) => {
        const raw = typeof body === "string" ? body : new TextDecoder().decode(body);
        const h: Record<string, string> = { "content-type": "application/json" };
        if (auth === "good") h["x-edgeloop-signature"] = await signatureHeader(SECRET, raw, Date.now() / 1000);
        if (auth === "bad") h["x-edgeloop-signature"] = await signatureHeader("wrong", raw, Date.now() / 1000);
        const before = counts();
        const res = await send(app, "POST", path, raw, h);
        expectErrorShape(res.status, res.text);
        if (res.status === 400 || res.status === 401) expect(counts()).toBe(before);
        if (auth !== "good" && path !== "/sandboxes/%00") expect(res.status).toBe(401);
      }),
      { numRuns: 1_500, seed: SEED },
    );
    pool.close();
  }, HANG_MS);
});

const redis = await requireRedis();
describe.skipIf(!redis)("upstash bridge (loopback HTTP)", () => {
  let bridge: UpstashBridge;
  const prefix = randomPrefix("fuzz-bridge");
  beforeAll(async () => {
    bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token: ADMIN });
  });
  afterAll(async () => {
    await bridge.stop();
  });

  test("random command bodies (read-only command names, keys under a test prefix): no 5xx", async () => {
    // Only read commands and junk names: a mutated body must never become FLUSHALL on the shared Redis.
    const valid = [["GET", `${prefix}a`], ["HGETALL", `${prefix}h`], ["XRANGE", `${prefix}s`, "-", "+"], [["EXISTS", `${prefix}a`], ["TTL", `${prefix}a`]]];
    const SAFE = new Set(["GET", "HGETALL", "XRANGE", "EXISTS", "TTL", "STRLEN", "HLEN", "XLEN", "PING", "ECHO"]);
    const safe = (body: string): boolean => {
      try {
        const j = JSON.parse(body) as unknown;
        const cmds = Array.isArray(j) && Array.isArray(j[0]) ? j : [j];
        return cmds.every((c) => !Array.isArray(c) || typeof c[0] !== "string" || SAFE.has(c[0].toUpperCase()) || /^ZZ/.test(c[0]));
      } catch {
        return true;
      }
    };
    await fc.assert(
      fc.asyncProperty(fc.constantFrom("/", "/pipeline", "/multi-exec", "/x"), bodies(valid), headerSets, async (path, body, auth) => {
        const raw = typeof body === "string" ? body : new TextDecoder().decode(body);
        fc.pre(safe(raw));
        const h: Record<string, string> = { "content-type": "application/json" };
        if (auth === "good") h.authorization = `Bearer ${ADMIN}`;
        if (auth === "bad") h.authorization = `Bearer ${TOKEN}`;
        total++;
        const res = await fetch(bridge.url + path, { method: "POST", headers: h, body: raw });
        const text = await res.text();
        expect(res.status).toBeLessThan(500);
        if (auth !== "good") expect(res.status).toBe(401);
        if (res.status >= 400) expect(typeof (JSON.parse(text) as { error: unknown }).error).toBe("string");
      }),
      { numRuns: 500, seed: SEED },
    );
  }, HANG_MS);
});

afterAll(() => {
  console.log(`fuzz: ${total} requests (seed ${SEED})`);
  if (process.env.FUZZ_VERBOSE) console.log([...statuses].sort().map(([k, n]) => `${k}: ${n}`).join("\n"));
  expect(total).toBeGreaterThanOrEqual(10_000);
});
