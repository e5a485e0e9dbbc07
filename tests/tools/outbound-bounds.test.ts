import { afterAll, describe, expect, test } from "bun:test";
import { DEFAULT_WEBHOOK_MAX_REPLY_BYTES, OutboundHttpError, outboundRequest, readTextCapped, redactUrl } from "../../shared/http/outbound.ts";
import { ToolError } from "../../shared/errors.ts";
import { ToolSpec } from "../../shared/schema/index.ts";
import { InteractionClient } from "../../shared/tools/interaction-client.ts";
import { postWebhook } from "../../shared/tools/webhook-post.ts";
import { WebhookToolClient } from "../../shared/tools/webhook-tool-client.ts";
import { answering, closedPort, countingTarget, hugeReply, redirecting, silent } from "../helpers/hostile-servers.ts";

// Issue 26 item 1 (S1, S2, S13): every webhook call refuses redirects, reads its reply under a byte cap
// counted while it streams, times out, and names its peer without the URL's query string or userinfo.
const target = countingTarget();
const stops: (() => void)[] = [() => target.stop()];
afterAll(() => {
  for (const s of stops) s();
});

const tool = (url: string, extra: Partial<{ timeout_ms: number; max_retries: number; max_reply_bytes: number }> = {}) =>
  ToolSpec.parse({ name: "calc", url, schema: { type: "function", function: { name: "calc", parameters: { type: "object", properties: {} } } }, max_retries: 0, ...extra });
const call = (client: WebhookToolClient) => client.call({ name: "calc", arguments: {}, key: "u_0_0", turn: 1, index: 0 });

describe("redactUrl", () => {
  test("drops userinfo, query and fragment; keeps scheme, host, port and path; a plain URL stays as written", () => {
    expect(redactUrl("http://user:pw@127.0.0.1:9/tools/calc?token=SECRET&x=1#frag")).toBe("http://127.0.0.1:9/tools/calc");
    expect(redactUrl("https://hooks.example.com?token=SECRET")).toBe("https://hooks.example.com/");
    expect(redactUrl("http://127.0.0.1:33341")).toBe("http://127.0.0.1:33341");
    expect(redactUrl("not a url ?token=SECRET")).toBe("(invalid URL)");
  });
  test("path secrets: every segment after a webhook or credential marker, and token-like segments, show as ***", () => {
    expect(redactUrl("https://hooks.slack.com/services/T0AAA/B0BBB/XXXXsecretXXXX")).toBe("https://hooks.slack.com/services/***/***/***");
    expect(redactUrl("https://discord.com/api/webhooks/123456789012345678/tok_SECRET")).toBe("https://discord.com/api/webhooks/***/***");
    expect(redactUrl("http://127.0.0.1:9/HOOKS/short")).toBe("http://127.0.0.1:9/HOOKS/***");
    expect(redactUrl("http://127.0.0.1:9/v1/key/abc/tools/calc")).toBe("http://127.0.0.1:9/v1/key/***/***/***");
    // Token-like: 16+ characters with letters and digits (a UUID, an API key), or any 32+ characters.
    expect(redactUrl("http://127.0.0.1:9/tools/a1b2c3d4e5f6a7b8/calc")).toBe("http://127.0.0.1:9/tools/***/calc");
    expect(redactUrl("http://h/t/0f8fad5b-d9cb-469f-a165-70867728950e")).toBe("http://h/t/***");
    expect(redactUrl(`http://h/t/${"z".repeat(32)}`)).toBe("http://h/t/***");
    expect(redactUrl("http://h/t/sk-ABCDEFGH12345678?x=1")).toBe("http://h/t/***");
    // Kept: short segments, long words without digits, 15-character mixes.
    for (const u of ["http://127.0.0.1:9/tools/calc", "http://h/latest/meta-data/security-credentials", "http://h/v1/completions", "http://h/abc123def456ghi"]) expect(redactUrl(u)).toBe(u);
    expect(redactUrl("http://h/latest/meta-data/iam/security-credentials/role")).toBe("http://h/latest/meta-data/iam/security-credentials/role");
  });
});

describe("tool webhooks: redirects are failed calls (S1)", () => {
  for (const status of [301, 302, 303, 307, 308]) {
    test(`a tool answering ${status} to a loopback target: the call fails naming ${status}, the target is never hit`, async () => {
      const r = redirecting(status, target.url);
      stops.push(r.stop);
      const before = target.hits();
      const res = await call(new WebhookToolClient([tool(`${r.base}/tool`, { max_retries: 2 })], { secret: "s", retryMinTimeoutMs: 1 }));
      expect(res).toEqual({ ok: false, call_id: "u_0_0:1:0", attempts: 1, content: `Error executing tool 'calc': HTTP ${status} (a redirect; redirects are not followed)` });
      expect(target.hits() - before).toBe(0);
    });
  }
  test("postWebhook's error carries the 3xx status, not retryable", async () => {
    const r = redirecting(302, target.url);
    stops.push(r.stop);
    const e = await postWebhook({ url: `${r.base}/x?token=SECRET`, timeout_ms: 2000, max_retries: 3 }, {}, { retryMinTimeoutMs: 1 }).catch((x) => x);
    expect(e).toBeInstanceOf(ToolError);
    expect([e.status, e.retryable, e.attempts, e.message]).toEqual([302, false, 1, `webhook ${r.base}/x: answered HTTP 302 (a redirect; redirects are not followed)`]);
    expect(target.hits()).toBe(0);
  });
});

describe("tool webhooks: reply bodies are capped while they stream (S2)", () => {
  test("a tool answering 300 MB (streamed): an error observation naming the cap; the server stopped well before 300 MB", async () => {
    const huge = hugeReply(300 * 1024 * 1024);
    stops.push(huge.stop);
    const res = await call(new WebhookToolClient([tool(`${huge.base}/calc`, { timeout_ms: 60_000 })]));
    expect(res).toEqual({ ok: false, call_id: "u_0_0:1:0", attempts: 1, content: `Error executing tool 'calc': the reply is larger than ${DEFAULT_WEBHOOK_MAX_REPLY_BYTES} bytes (the tool's max_reply_bytes)` });
    expect(DEFAULT_WEBHOOK_MAX_REPLY_BYTES).toBe(4 * 1024 * 1024);
    // What the server could push into socket buffers before the client hung up: far from 300 MB.
    expect(huge.sent()).toBeLessThan(DEFAULT_WEBHOOK_MAX_REPLY_BYTES + 64 * 1024 * 1024);
  });
  test("the tool's max_reply_bytes sets the cap; a reply at the cap passes", async () => {
    const huge = hugeReply(1024 * 1024);
    stops.push(huge.stop);
    const res = await call(new WebhookToolClient([tool(`${huge.base}/calc`, { max_reply_bytes: 100_000 })]));
    expect(res.content).toBe("Error executing tool 'calc': the reply is larger than 100000 bytes (the tool's max_reply_bytes)");
    const body = JSON.stringify({ content: "x".repeat(1000) });
    const ok = answering(200, JSON.parse(body));
    stops.push(ok.stop);
    const at = await call(new WebhookToolClient([tool(`${ok.base}/calc`, { max_reply_bytes: body.length })]));
    expect([at.ok, at.content.length]).toEqual([true, 1000]);
    const under = await call(new WebhookToolClient([tool(`${ok.base}/calc`, { max_reply_bytes: body.length - 1 })]));
    expect(under.content).toBe(`Error executing tool 'calc': the reply is larger than ${body.length - 1} bytes (the tool's max_reply_bytes)`);
  });
  test("readTextCapped counts streamed bytes (no content-length) and decodes UTF-8 split across chunks", async () => {
    const bytes = new TextEncoder().encode("é😀".repeat(10));
    const stream = () =>
      new ReadableStream<Uint8Array>({
        start(c) {
          for (let i = 0; i < bytes.length; i += 3) c.enqueue(bytes.subarray(i, i + 3));
          c.close();
        },
      });
    expect(await readTextCapped(new Response(stream()), bytes.length, "t")).toBe("é😀".repeat(10));
    const e = await readTextCapped(new Response(stream()), bytes.length - 1, "t").catch((x) => x);
    expect(e).toBeInstanceOf(OutboundHttpError);
    expect([e.kind, e.maxBytes, e.message]).toEqual(["too_large", bytes.length - 1, `t: reply larger than ${bytes.length - 1} bytes (the cap)`]);
  });
  test("a declared content-length over the cap fails before reading the body", async () => {
    let pulled = 0;
    const body = new ReadableStream<Uint8Array>({ pull: (c) => void (pulled++, c.enqueue(new Uint8Array(10))) });
    const e = await readTextCapped(new Response(body, { headers: { "content-length": "1000" } }), 999, "t").catch((x) => x);
    expect([e.kind, pulled]).toEqual(["too_large", 0]);
  });
});

describe("compressed replies: the cap counts decoded bytes", () => {
  test("a 50 KB gzip reply that inflates to 50 MB: refused at the cap (the declared length is the compressed one)", async () => {
    const gz = Bun.gzipSync(new Uint8Array(50 * 1024 * 1024).fill(0x41));
    const server = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response(gz, { headers: { "content-encoding": "gzip", "content-type": "application/json" } }) });
    stops.push(() => server.stop(true));
    const res = await call(new WebhookToolClient([tool(`http://127.0.0.1:${server.port}/calc`)]));
    expect(gz.byteLength).toBeLessThan(100_000);
    expect(res.content).toBe(`Error executing tool 'calc': the reply is larger than ${DEFAULT_WEBHOOK_MAX_REPLY_BYTES} bytes (the tool's max_reply_bytes)`);
  });
});

describe("tool webhooks: timeouts (S1)", () => {
  test("a tool that never answers: timed out after its timeout_ms", async () => {
    const s = silent();
    stops.push(s.stop);
    const res = await call(new WebhookToolClient([tool(`${s.base}/calc`, { timeout_ms: 150 })]));
    expect(res).toEqual({ ok: false, call_id: "u_0_0:1:0", attempts: 1, content: "Error executing tool 'calc': timed out after 150 ms (1 attempt)" });
  });
  test("outboundRequest's deadline covers the body: headers then silence is a timeout", async () => {
    const server = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      idleTimeout: 30,
      fetch: () => new Response(new ReadableStream({ start: (c) => c.enqueue(new TextEncoder().encode('{"content":')) })),
    });
    stops.push(() => server.stop(true));
    const e = await outboundRequest(`http://127.0.0.1:${server.port}/x?token=SECRET`, { timeoutMs: 150, maxReplyBytes: 1000 }).catch((x) => x);
    expect([e.kind, e.message]).toEqual(["timeout", `http://127.0.0.1:${server.port}/x: timed out after 150 ms`]);
  });
});

describe("query-string secrets never reach error texts (S13)", () => {
  const port = closedPort();
  const cases: [string, () => { base: string; stop: () => void } | null, string][] = [
    ["connection refused", () => null, "could not connect"],
    ["HTTP 500", () => answering(500), "HTTP 500"],
    ["HTTP 400 with a body", () => answering(400, { error: "bad" }), "HTTP 400"],
    ["a redirect", () => redirecting(302, "http://127.0.0.1:1/?token=SECRET"), "HTTP 302"],
    ["a reply over the cap", () => hugeReply(10 * 1024 * 1024), "larger than"],
    ["silence", () => silent(), "timed out"],
  ];
  for (const [label, make, said] of cases) {
    test(`${label}: tool observation, interaction error and postWebhook error hold no SECRET`, async () => {
      const s = make();
      if (s) stops.push(s.stop);
      const base = s?.base ?? `http://127.0.0.1:${port}`;
      const url = `http://u:SECRETPW@${base.slice("http://".length)}/hook?token=SECRET&sig=SECRET`;
      // Only silence needs a short deadline; the others get room, so a loaded machine still sees their own failure.
      const timeout_ms = said === "timed out" ? 300 : 10_000;
      const res = await call(new WebhookToolClient([tool(url, { timeout_ms })]));
      expect(res.ok).toBe(false);
      expect(res.content).toContain(said);
      const interaction = new InteractionClient({ name: "u", url, timeout_ms, max_retries: 0 });
      const ie = await interaction.respond({ key: "u_0_0", turn: 1, messages: [{ role: "assistant", content: "x" }] }).catch((x) => x);
      expect(ie).toBeInstanceOf(ToolError);
      expect(ie.message.startsWith(`interaction 'u': webhook ${base}/hook: `)).toBe(true);
      const pe = await postWebhook({ url, timeout_ms, max_retries: 0 }, {}).catch((x) => x);
      for (const text of [res.content, ie.message, pe.message, JSON.stringify(res), String(ie.stack)]) expect(text).not.toContain("SECRET");
    });
  }
});
