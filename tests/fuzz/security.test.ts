import { afterAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { createGatewayApp } from "../../functions/gateway.ts";
import { timingSafeEqual } from "../../functions/http-util.ts";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { createToolsApp } from "../../infra/tools/app.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { ConflictError } from "../../shared/errors.ts";
import { planBatch, RolloutRequest } from "../../shared/rollout/batch.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { signatureHeader } from "../../shared/tools/signature.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const TOKEN = "api-token-c0ffee-0123456789";
const SECRET = "webhook-secret-d00d-9876543210";
const ADMIN = "admin-token-beef-5555";

function service() {
  return new RolloutService({
    config: parseAppConfig({}),
    store: new MemoryTransferQueue(),
    executorFor: () => ({ agentNameFor: () => "fake", run: () => Promise.reject(new Error("fake")) }),
  });
}

describe("bearer token", () => {
  test("constant-time compare: equal only for the same string", () => {
    expect(timingSafeEqual(TOKEN, TOKEN)).toBe(true);
    expect(timingSafeEqual(TOKEN, TOKEN.slice(0, -1) + "X")).toBe(false);
    expect(timingSafeEqual(TOKEN, TOKEN + "0")).toBe(false);
    expect(timingSafeEqual(TOKEN, "")).toBe(false);
    expect(timingSafeEqual("é", "e\u0301")).toBe(false);
  });

  test("gateway /admin/* needs the admin token when one is set; proxied calls do not", async () => {
    // The fake replica answers a (minimal) valid completion: the gateway refuses replies off the wire schema.
    const gw = createGatewayApp({ replicas: ["http://r1.test"], healthIntervalMs: 0, adminToken: ADMIN, fetch: async () => Response.json({ choices: [{ token_ids: [1], finish_reason: "stop" }] }) });
    const none = await gw.app.request("/admin/replicas");
    expect(none.status).toBe(401);
    expect(await none.json()).toEqual({ error: { code: "unauthorized", message: "missing or wrong bearer token" } });
    expect((await gw.app.request("/admin/replicas", { headers: { authorization: `Bearer ${ADMIN}x` } })).status).toBe(401);
    const ok = await gw.app.request("/admin/replicas", { headers: { authorization: `Bearer ${ADMIN}` } });
    expect(ok.status).toBe(200);
    const add = await gw.app.request("/admin/replicas", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ url: "http://evil.test" }) });
    expect(add.status).toBe(401);
    expect(gw.replicas().map((r) => r.url)).toEqual(["http://r1.test"]);
    expect((await gw.app.request("/v1/completions", { method: "POST", body: "{}" })).status).toBe(200);
    // Without a configured token the admin API is off (S6), not open.
    const off = createGatewayApp({ replicas: ["http://r1.test"], healthIntervalMs: 0 });
    const refused = await off.app.request("/admin/replicas");
    expect(refused.status).toBe(403);
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe("admin_disabled");
  });
});

describe("HMAC signatures and the 5-minute replay window", () => {
  test("tool calls: a replay inside the window is answered from the dedupe cache (executed once); outside it is 401", async () => {
    let now = 1_700_000_000;
    const app = createToolsApp({ secret: SECRET, nowSeconds: () => now });
    const raw = JSON.stringify({ call_id: "k_0_0:1:0", name: "calc", arguments: { expression: "6*7" }, key: "k_0_0", turn: 1 });
    const sig = await signatureHeader(SECRET, raw, now);
    const call = () => app.request("/tools/calc", { method: "POST", headers: { "x-edgeloop-signature": sig }, body: raw });
    expect(await (await call()).json()).toEqual({ content: "42" });
    now += 299;
    expect(await (await call()).json()).toEqual({ content: "42" });
    expect(((await (await app.request("/stats")).json()) as { executions: number }).executions).toBe(1);
    now += 2; // 301 s after signing
    const late = await call();
    expect(late.status).toBe(401);
    // A signature from the future is refused too, and one for another body.
    const future = await signatureHeader(SECRET, raw, now + 301);
    expect((await app.request("/tools/calc", { method: "POST", headers: { "x-edgeloop-signature": future }, body: raw })).status).toBe(401);
    const other = raw.replace("6*7", "6*8");
    const fresh = await signatureHeader(SECRET, raw, now);
    expect((await app.request("/tools/calc", { method: "POST", headers: { "x-edgeloop-signature": fresh }, body: other })).status).toBe(401);
  });

  test("callbacks: a replay inside the window is 409 (already answered), outside it 401; nothing is delivered twice", async () => {
    let now = 1_700_000_000;
    const delivered: string[] = [];
    const app = createSessionsApp({
      secret: SECRET,
      nowSeconds: () => now,
      backend: {
        async deliver(_key, r) {
          if (delivered.includes(r.call_id)) throw new ConflictError(`tool call '${r.call_id}' was already answered`, { field: "call_id" });
          delivered.push(r.call_id);
        },
      },
    });
    const raw = JSON.stringify({ call_id: "k_0_0:1:0", content: "42" });
    const sig = await signatureHeader(SECRET, raw, now);
    const post = () => app.request("/v1/sessions/k_0_0/tool-results", { method: "POST", headers: { "content-type": "application/json", "x-edgeloop-signature": sig }, body: raw });
    expect((await post()).status).toBe(200);
    now += 100;
    const again = await post();
    expect(again.status).toBe(409);
    expect(await again.json()).toEqual({ error: { code: "conflict", message: "tool call 'k_0_0:1:0' was already answered", field: "call_id" } });
    now += 201;
    const stale = await post();
    expect(stale.status).toBe(401);
    expect(await stale.json()).toEqual({ error: { code: "unauthorized", message: "missing, bad or stale x-edgeloop-signature" } });
    expect(delivered).toEqual(["k_0_0:1:0"]);
  });
});

describe("request body size limits", () => {
  const big = "x".repeat(70 * 1024);
  const streamOf = (s: string) =>
    new ReadableStream<Uint8Array>({
      start(c) {
        const b = new TextEncoder().encode(s);
        for (let i = 0; i < b.length; i += 8192) c.enqueue(b.subarray(i, i + 8192));
        c.close();
      },
    });
  const expect413 = async (res: Response) => {
    expect(res.status).toBe(413);
    expect(await res.json()).toEqual({ error: { code: "request_too_large", message: `body: larger than ${64 * 1024} bytes`, field: "body" } });
  };

  test("every endpoint refuses an oversized body, declared or streamed, with 413", async () => {
    const rollouts = createRolloutsApp({ service: service(), apiToken: TOKEN, maxBodyBytes: 64 * 1024 });
    const sessions = createSessionsApp({ backend: { deliver: async () => {} }, maxBodyBytes: 64 * 1024 });
    const gw = createGatewayApp({ replicas: ["http://r1.test"], healthIntervalMs: 0, maxBodyBytes: 64 * 1024, adminToken: ADMIN, fetch: async () => Response.json({}) });
    const auth = { authorization: `Bearer ${TOKEN}` };
    for (const [app, path, headers] of [
      [rollouts, "/v1/rollouts", auth],
      [rollouts, "/v1/groups/ack", auth],
      [rollouts, "/v1/nothing", auth],
      [sessions, "/v1/sessions/k_0_0/tool-results", {}],
      [gw.app, "/v1/completions", {}],
    ] as const) {
      await expect413(await app.request(path, { method: "POST", headers: { ...headers, "content-length": String(big.length) }, body: big }));
      await expect413(await app.request(path, { method: "POST", headers, body: streamOf(big) }));
    }
    const admin = await gw.app.request("/admin/replicas", { method: "POST", headers: { authorization: `Bearer ${ADMIN}` }, body: streamOf("y".repeat(65 * 1024 + 1)) });
    expect(admin.status).toBe(413);
  });
});

describe("no secrets in logs or error bodies", () => {
  const procs: { kill(): void }[] = [];
  afterAll(() => procs.forEach((p) => p.kill()));

  test("edgeloop serve with a token and a webhook secret: neither appears in its output nor in any error body", async () => {
    const main = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
    const proc = Bun.spawn([process.execPath, main, "serve", "--port", "0", "--tools-secret", SECRET, "--n", "1"], {
      env: { ...process.env, EDGELOOP_API_TOKEN: TOKEN, NO_COLOR: "1" },
      stdout: "pipe",
      stderr: "pipe",
    });
    procs.push(proc);
    const reader = proc.stdout.getReader();
    let out = "";
    while (!/serving on (http:\/\/\S+)/.test(out)) {
      const r = await reader.read();
      if (r.done) break;
      out += new TextDecoder().decode(r.value);
    }
    const base = /serving on (http:\/\/\S+)/.exec(out)![1]!;
    const bodies: string[] = [];
    const hit = async (path: string, init: RequestInit = {}) => {
      const res = await fetch(base + path, init);
      bodies.push(`${res.status} ${[...res.headers].join(";")} ${await res.text()}`);
      return res.status;
    };
    // Wrong tokens that share a prefix with the real one, the secret sent as a token, a token in the query.
    expect(await hit("/v1/rollouts", { headers: { authorization: `Bearer ${TOKEN.slice(0, -2)}` } })).toBe(401);
    expect(await hit("/v1/rollouts", { headers: { authorization: `Bearer ${SECRET}` } })).toBe(401);
    expect(await hit(`/v1/rollouts?token=${TOKEN}`)).toBe(401);
    expect(await hit("/v1/rollouts", { method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: `{"rows": [{"prompt": "${SECRET}"}], "config": {"tools": {"secret": "x"}}}` })).toBe(400);
    expect(await hit("/v1/rollouts", { method: "POST", headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" }, body: "{bad" })).toBe(400);
    expect(await hit("/v1/trajectories/nope", { headers: { authorization: `Bearer ${TOKEN}` } })).toBe(400);
    const ok = await fetch(base + "/v1/rollouts", {
      method: "POST",
      headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ rows: [{ prompt: [{ role: "user", content: "What is 17 * 23? Use the calculator." }] }] }),
    });
    const { batch_id } = (await ok.json()) as { batch_id: string };
    for (let i = 0; i < 100; i++) {
      const s = (await (await fetch(`${base}/v1/rollouts/${batch_id}`, { headers: { authorization: `Bearer ${TOKEN}` } })).json()) as { done: boolean };
      if (s.done) break;
      await Bun.sleep(50);
    }
    await hit(`/v1/rollouts/${batch_id}`, { headers: { authorization: `Bearer ${TOKEN}` } });
    await hit("/metrics");
    proc.kill("SIGTERM");
    await proc.exited;
    for (;;) {
      const r = await reader.read();
      if (r.done) break;
      out += new TextDecoder().decode(r.value);
    }
    const err = await new Response(proc.stderr).text();
    const all = [out, err, ...bodies].join("\n");
    expect(all).toContain("bearer token required");
    expect(all).not.toContain(TOKEN);
    expect(all).not.toContain(TOKEN.slice(0, -2));
    expect(all.split(SECRET).length - 1).toBe(0);
  }, HANG_MS);
});

describe("session keys", () => {
  test("server-chosen uids are random v4 UUIDs, distinct across batches", () => {
    const req = RolloutRequest.parse({ rows: [{ prompt: [{ role: "user", content: "a" }] }, { prompt: [{ role: "user", content: "b" }] }] });
    const cfg = parseAppConfig({ rollout: { n: 2 } }).rollout;
    const a = planBatch(req, cfg);
    const b = planBatch(req, cfg);
    const uids = [...a.groups.keys(), ...b.groups.keys()];
    for (const u of uids) expect(u).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(new Set(uids).size).toBe(4);
    expect(a.batch_id).not.toBe(b.batch_id);
  });
});
