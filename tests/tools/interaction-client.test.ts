import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Server } from "bun";
import { ToolError } from "../../shared/errors.ts";
import { InteractionClient, InteractionSpec } from "../../shared/tools/interaction-client.ts";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";

const bodies: any[] = [];
let server: Server<undefined>;
let base: string;
let flaky = 0;

beforeAll(() => {
  server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      const raw = await req.text();
      const path = new URL(req.url).pathname;
      if (!(await verifySignature("sim", req.headers.get(SIGNATURE_HEADER), raw, Date.now() / 1000))) return new Response("", { status: 401 });
      const body = JSON.parse(raw);
      bodies.push(body);
      if (path === "/flaky" && flaky++ < 1) return new Response("", { status: 502 });
      if (path === "/bad") return Response.json({ terminate: "yes", content: "x" });
      const last = body.messages.at(-1).content as string;
      const right = last.includes(String(body.interaction_kwargs.ground_truth));
      return Response.json({ terminate: right, content: right ? "Correct!" : "Try again.", score: right ? 1 : 0 });
    },
  });
  base = `http://127.0.0.1:${server.port}`;
});
afterAll(() => server.stop(true));

describe("InteractionClient", () => {
  test("posts key, turn, messages (signed) and validates the reply", async () => {
    const c = new InteractionClient(InteractionSpec.parse({ name: "gsm8k", url: `${base}/sim` }), { secret: "sim", retryMinTimeoutMs: 1 });
    const messages = [
      { role: "user" as const, content: "2+2?" },
      { role: "assistant" as const, content: "#### 5" },
    ];
    expect(await c.respond({ key: "u_0_0", turn: 1, messages, interaction_kwargs: { ground_truth: 4 } })).toEqual({ terminate: false, content: "Try again.", score: 0 });
    expect(bodies.at(-1)).toEqual({ key: "u_0_0", turn: 1, messages, interaction_kwargs: { ground_truth: 4 } });
    expect(await c.respond({ key: "u_0_0", turn: 2, messages: [...messages, { role: "assistant", content: "#### 4" }], interaction_kwargs: { ground_truth: 4 } })).toEqual({
      terminate: true,
      content: "Correct!",
      score: 1,
    });
  });

  test("retries a 502", async () => {
    const c = new InteractionClient(InteractionSpec.parse({ url: `${base}/flaky` }), { secret: "sim", retryMinTimeoutMs: 1 });
    const r = await c.respond({ key: "k", turn: 1, messages: [{ role: "assistant", content: "7" }], interaction_kwargs: { ground_truth: 7 } });
    expect(r.terminate).toBe(true);
    expect(flaky).toBe(2);
  });

  test("a bad reply or a bad secret is a ToolError", async () => {
    const bad = new InteractionClient(InteractionSpec.parse({ url: `${base}/bad` }), { secret: "sim" });
    const e1 = await bad.respond({ key: "k", turn: 1, messages: [] }).catch((e) => e);
    expect(e1).toBeInstanceOf(ToolError);
    expect(e1.message).toBe("interaction 'interaction': bad reply (terminate: Invalid input: expected boolean, received string)");
    const unsigned = new InteractionClient(InteractionSpec.parse({ url: `${base}/sim` }), { secret: "wrong" });
    const e2 = await unsigned.respond({ key: "k", turn: 1, messages: [] }).catch((e) => e);
    expect(e2).toBeInstanceOf(ToolError);
    expect(e2.status).toBe(401);
  });
});
