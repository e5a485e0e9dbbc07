import { afterAll, describe, expect, test } from "bun:test";
import { BadEngineResponseError, EngineUnavailableError } from "../../shared/errors.ts";
import { DEFAULT_ENGINE_MAX_REPLY_BYTES } from "../../shared/http/outbound.ts";
import { createEngineClient } from "../../shared/inference/create-engine-client.ts";
import { postEngineJson } from "../../shared/inference/engine-http.ts";
import { createTeacherClient } from "../../shared/inference/teacher-client.ts";
import { createGatewayApp } from "../../functions/gateway.ts";
import { answering, countingTarget, hugeReply, redirecting, silent } from "../helpers/hostile-servers.ts";

// Issue 26 item 1 for engine and teacher calls: no redirect followed, replies capped (64 MiB default:
// long generations with log-probs are big), a deadline, and messages without the URL's userinfo or query.
const target = countingTarget();
const stops: (() => void)[] = [() => target.stop()];
afterAll(() => {
  for (const s of stops) s();
});
const f = (input: Request | string | URL, init?: RequestInit) => fetch(input, init);
const withCreds = (base: string) => base.replace("http://", "http://user:SECRET@");

describe("teacher calls", () => {
  test("a teacher answering 302: BadEngineResponseError naming 302, the target never hit, no secret in the message or describe", async () => {
    const r = redirecting(302, target.url);
    stops.push(r.stop);
    const t = createTeacherClient({ url: withCreds(r.base), format: "vllm", retry: { retries: 0 } });
    expect(t.describe).toBe(`vllm at ${r.base}/`);
    const e = await t.score({ request_id: "q", routing_key: "u_0_0", prompt_ids: [1, 2], response_ids: [3] }).catch((x) => x);
    expect(e).toBeInstanceOf(BadEngineResponseError);
    expect(e.message).toBe(`engine at ${r.base}/v1/completions answered HTTP 302 (a redirect; redirects are not followed)`);
    expect(target.hits()).toBe(0);
  });
  test("a teacher answering 300 MB: refused at the 64 MiB default cap; maxReplyBytes sets it", async () => {
    const huge = hugeReply(300 * 1024 * 1024);
    stops.push(huge.stop);
    const t = createTeacherClient({ url: withCreds(huge.base), format: "sglang", retry: { retries: 0 } });
    const e = await t.score({ request_id: "q", routing_key: "u_0_0", prompt_ids: [1, 2], response_ids: [3] }).catch((x) => x);
    expect(e).toBeInstanceOf(BadEngineResponseError);
    expect(e.message).toBe(`engine at ${huge.base}/generate: reply larger than ${DEFAULT_ENGINE_MAX_REPLY_BYTES} bytes (the cap)`);
    expect(DEFAULT_ENGINE_MAX_REPLY_BYTES).toBe(64 * 1024 * 1024);
    const small = createTeacherClient({ url: huge.base, format: "sglang", retry: { retries: 0 }, maxReplyBytes: 5000 });
    const e2 = await small.tokenize("hi").catch((x) => x);
    expect(e2.message).toBe(`engine at ${huge.base}/v1/tokenize: reply larger than 5000 bytes (the cap)`);
  });
  test("a teacher that never answers: EngineUnavailableError after timeoutMs", async () => {
    const s = silent();
    stops.push(s.stop);
    const t = createTeacherClient({ url: withCreds(s.base), format: "vllm", retry: { retries: 0 }, timeoutMs: 100 });
    const e = await t.score({ request_id: "q", routing_key: "u_0_0", prompt_ids: [1, 2], response_ids: [3] }).catch((x) => x);
    expect(e).toBeInstanceOf(EngineUnavailableError);
    expect(e.message).toBe(`engine at ${s.base}/v1/completions did not answer within 100 ms`);
  });
});

describe("policy engine calls", () => {
  for (const format of ["vllm", "vllm-generate", "sglang"] as const) {
    test(`${format}: a 307 is a failed call naming 307; a reply over maxReplyBytes names the cap`, async () => {
      const r = redirecting(307, target.url);
      const huge = hugeReply(10 * 1024 * 1024);
      stops.push(r.stop, huge.stop);
      const req = { request_id: "q", routing_key: "u_0_0", prompt_ids: [1, 2, 3], sampling_params: { temperature: 1, top_p: 1, top_k: -1, max_tokens: 4, logprobs: true } };
      const e = await createEngineClient({ url: r.base, format }).generate(req as never).catch((x) => x);
      expect(e).toBeInstanceOf(BadEngineResponseError);
      expect(e.message).toMatch(new RegExp(`^engine at ${r.base}/[a-z/0-9]+ answered HTTP 307 \\(a redirect; redirects are not followed\\)$`));
      const e2 = await createEngineClient({ url: huge.base, format, maxReplyBytes: 100_000 }).generate(req as never).catch((x) => x);
      expect(e2.message).toMatch(new RegExp(`^engine at ${huge.base}/[a-z/0-9]+: reply larger than 100000 bytes \\(the cap\\)$`));
      expect(target.hits()).toBe(0);
    });
  }
  test("postEngineJson: a connection failure names the URL without userinfo or query", async () => {
    const s = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response() });
    const port = s.port;
    s.stop(true);
    const e = await postEngineJson(f, `http://user:SECRET@127.0.0.1:${port}/generate?token=SECRET`, {}, {}, { timeoutMs: 2000 }).catch((x) => x);
    expect(e).toBeInstanceOf(EngineUnavailableError);
    expect(e.message.startsWith(`engine at http://127.0.0.1:${port}/generate unreachable: `)).toBe(true);
    expect(e.message).not.toContain("SECRET");
  });
});

describe("gateway replicas with credentials in their URL", () => {
  test("a failing replica's error, the replica header and /metrics name it without userinfo", async () => {
    const bad = answering(500, { error: "down" });
    const r = redirecting(302, target.url);
    stops.push(bad.stop, r.stop);
    const gw = createGatewayApp({ replicas: [withCreds(bad.base), withCreds(r.base)], healthIntervalMs: 0, maxAttempts: 2 });
    const res = await gw.fetch(new Request("http://gw/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: [1], max_tokens: 1 }) }));
    const text = await res.text();
    const metrics = await (await gw.fetch(new Request("http://gw/metrics"))).text();
    expect(metrics).toContain(`edgeloop_gateway_failures_total{replica="${bad.base}/",kind="http_5xx"} 1`);
    for (const body of [text, metrics, JSON.stringify([...res.headers])]) expect(body).not.toContain("SECRET");
    // The redirecting replica's 302 is relayed, never followed.
    expect(target.hits()).toBe(0);
  });
});
