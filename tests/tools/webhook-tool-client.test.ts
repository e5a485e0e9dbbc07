import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Server } from "bun";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { ToolSpec } from "../../shared/schema/index.ts";

type Seen = { path: string; body: any; raw: string; sig: string | null; ctype: string | null };
const seen: Seen[] = [];
const counters = new Map<string, number>();
let server: Server<undefined>;
let base: string;

beforeAll(() => {
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const url = new URL(req.url);
      const raw = await req.text();
      seen.push({ path: url.pathname, body: JSON.parse(raw), raw, sig: req.headers.get(SIGNATURE_HEADER), ctype: req.headers.get("content-type") });
      const n = (counters.get(url.pathname) ?? 0) + 1;
      counters.set(url.pathname, n);
      switch (url.pathname) {
        case "/flaky":
          return n <= 2 ? new Response("boom", { status: 500 }) : Response.json({ content: "ok after retries", reward: 0.5, metrics: { n } });
        case "/ok":
          return Response.json({ content: "fine" });
        case "/always500":
          return new Response("down", { status: 503 });
        case "/bad400":
          return new Response("nope", { status: 400 });
        case "/async":
          return new Response(null, { status: 202 });
        case "/badbody":
          return Response.json({ text: "wrong field" });
        case "/notjson":
          return new Response("<html>", { status: 200 });
        case "/hang":
          await Bun.sleep(2000);
          return Response.json({ content: "too late" });
      }
      return new Response("?", { status: 404 });
    },
  });
  base = `http://127.0.0.1:${server.port}`;
});
afterAll(() => server.stop(true));

function spec(name: string, path: string, extra: Partial<ToolSpec> = {}) {
  return ToolSpec.parse({
    name,
    url: `${base}${path}`,
    max_retries: 2,
    timeout_ms: 1000,
    schema: { type: "function", function: { name, description: "", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } } },
    ...extra,
  });
}

const fast = { retryMinTimeoutMs: 1, retryMaxTimeoutMs: 5 };

describe("WebhookToolClient", () => {
  test("retries reuse the call_id; body, content-type and signature as specified", async () => {
    const client = new WebhookToolClient([spec("flaky", "/flaky")], { ...fast, secret: "k" });
    const r = await client.call({ name: "flaky", arguments: { q: "x" }, key: "uid1_0_0", turn: 2, index: 1, create_kwargs: { seed: 7 } });
    expect(r).toEqual({ ok: true, call_id: "uid1_0_0:2:1", attempts: 3, content: "ok after retries", reward: 0.5, metrics: { n: 3 } });
    const mine = seen.filter((s) => s.path === "/flaky");
    expect(mine.map((s) => s.body.call_id)).toEqual(["uid1_0_0:2:1", "uid1_0_0:2:1", "uid1_0_0:2:1"]);
    expect(mine[0]!.body).toEqual({ call_id: "uid1_0_0:2:1", name: "flaky", arguments: { q: "x" }, key: "uid1_0_0", turn: 2, create_kwargs: { seed: 7 } });
    expect(new Set(mine.map((s) => s.raw)).size).toBe(1);
    expect(mine.every((s) => s.ctype === "application/json")).toBe(true);
    for (const s of mine) expect(await verifySignature("k", s.sig, s.raw, Date.now() / 1000)).toBe(true);
  });

  test("no secret → no signature header", async () => {
    const client = new WebhookToolClient([spec("ok", "/ok")], fast);
    const r = await client.call({ name: "ok", arguments: { q: "x" }, key: "k", turn: 1, index: 0 });
    expect(r).toEqual({ ok: true, call_id: "k:1:0", attempts: 1, content: "fine" });
    const last = seen.filter((s) => s.path === "/ok").at(-1)!;
    expect(last.sig).toBe(null);
    expect(last.body.create_kwargs).toEqual({});
  });

  test("5xx until the retries run out → an error result naming the tool", async () => {
    const before = counters.get("/always500") ?? 0;
    const client = new WebhookToolClient([spec("down", "/always500")], fast);
    const r = await client.call({ name: "down", arguments: { q: "x" }, key: "k", turn: 1, index: 0 });
    expect(r).toEqual({ ok: false, call_id: "k:1:0", attempts: 3, content: "Error executing tool 'down': HTTP 503 (3 attempts)" });
    expect((counters.get("/always500") ?? 0) - before).toBe(3);
  });

  test("4xx is not retried", async () => {
    const client = new WebhookToolClient([spec("four", "/bad400")], fast);
    const r = await client.call({ name: "four", arguments: { q: "x" }, key: "k", turn: 1, index: 0 });
    expect(r).toEqual({ ok: false, call_id: "k:1:0", attempts: 1, content: "Error executing tool 'four': HTTP 400" });
  });

  test("202 is refused with a clear error", async () => {
    const client = new WebhookToolClient([spec("later", "/async")], fast);
    const r = await client.call({ name: "later", arguments: { q: "x" }, key: "k", turn: 1, index: 0 });
    expect(r.ok).toBe(false);
    expect(r.content).toBe(
      "Error executing tool 'later': the tool answered 202 Accepted (asynchronous result), which needs durable sessions; this loop only takes synchronous 200 replies",
    );
  });

  test("a reply without content, or not JSON", async () => {
    const client = new WebhookToolClient([spec("bb", "/badbody"), spec("nj", "/notjson")], fast);
    const a = await client.call({ name: "bb", arguments: { q: "x" }, key: "k", turn: 1, index: 0 });
    expect(a.content).toBe(`Error executing tool 'bb': the tool's reply is not {"content": string | parts, "reward"?: number, "metrics"?: object} (content: expected a string, or a list of at most 64 parts {type: text, text} | {type: image, image: data URI})`);
    const b = await client.call({ name: "nj", arguments: { q: "x" }, key: "k", turn: 1, index: 1 });
    expect(b).toEqual({ ok: false, call_id: "k:1:1", attempts: 1, content: "Error executing tool 'nj': the reply is not JSON" });
  });

  test("a hanging tool times out per attempt and is retried", async () => {
    const before = counters.get("/hang") ?? 0;
    const client = new WebhookToolClient([spec("slow", "/hang", { timeout_ms: 50, max_retries: 1 })], fast);
    const r = await client.call({ name: "slow", arguments: { q: "x" }, key: "k", turn: 1, index: 0 });
    expect(r).toEqual({ ok: false, call_id: "k:1:0", attempts: 2, content: "Error executing tool 'slow': timed out after 50 ms (2 attempts)" });
    expect((counters.get("/hang") ?? 0) - before).toBe(2);
  });

  test("connection refused is retried, then an error result", async () => {
    const dead = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
    const url = `http://127.0.0.1:${dead.port}/x`;
    await dead.stop(true);
    const client = new WebhookToolClient([ToolSpec.parse({ name: "gone", url, max_retries: 1, schema: { function: { name: "gone" } } })], fast);
    const r = await client.call({ name: "gone", arguments: {}, key: "k", turn: 1, index: 0 });
    expect(r).toEqual({ ok: false, call_id: "k:1:0", attempts: 2, content: "Error executing tool 'gone': could not connect (2 attempts)" });
  });

  test("unknown tool and invalid arguments: error results, no request", async () => {
    const n = seen.length;
    const client = new WebhookToolClient([spec("calc", "/ok"), spec("lookup", "/ok")], fast);
    expect(await client.call({ name: "solve", arguments: {}, key: "k", turn: 1, index: 0 })).toEqual({
      ok: false,
      call_id: "",
      attempts: 0,
      content: "Unknown function 'solve'. Available tools: ['calc', 'lookup']",
    });
    expect((await client.call({ name: "calc", arguments: {}, key: "k", turn: 1, index: 0 })).content).toBe("Invalid arguments for 'calc': missing required parameter 'q'");
    expect((await client.call({ name: "calc", arguments: [1], key: "k", turn: 1, index: 0 })).content).toBe("Invalid arguments for 'calc': arguments must be a JSON object");
    expect(seen.length).toBe(n);
  });

  test("select keeps the file order and drops unknown names", () => {
    const client = new WebhookToolClient([spec("a", "/ok"), spec("b", "/ok"), spec("c", "/ok")]);
    expect(client.select(["c", "a", "zzz"]).names).toEqual(["a", "c"]);
    expect(client.schemas.map((s) => s.function.name)).toEqual(["a", "b", "c"]);
  });
});
