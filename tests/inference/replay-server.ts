import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

/** A recorded engine reply (tests/fixtures/engines/*.json). */
export interface EngineFixture {
  name: string;
  description: string;
  source: string;
  engine: "vllm" | "vllm-generate" | "sglang";
  reply: { status: number; body?: unknown; raw?: string };
  expect: { output?: Record<string, unknown>; error?: string };
}

/** The request fixture: one GenerateRequest and the exact wire each adapter must send. */
export interface RequestFixture {
  input: {
    request_id: string;
    routing_key: string;
    prompt_ids: number[];
    sampling_params: { temperature: number; top_p: number; top_k: number; seed?: number; stop_token_ids?: number[]; logprobs: boolean };
    max_tokens: number;
  };
  headers: Record<string, string>;
  vllm: { path: string; body: Record<string, unknown> };
  "vllm-generate": { path: string; body: Record<string, unknown> };
  sglang: { path: string; body: Record<string, unknown> };
}

export const FIXTURE_DIR = join(import.meta.dir, "..", "fixtures", "engines");

/** Every reply fixture, by file name without `.json`. */
export function loadReplyFixtures(): EngineFixture[] {
  return readdirSync(FIXTURE_DIR)
    .filter((f) => f.endsWith(".json") && f !== "requests.json")
    .sort()
    .map((f) => ({ name: f.slice(0, -5), ...JSON.parse(readFileSync(join(FIXTURE_DIR, f), "utf8")) }));
}

/** The request fixture. */
export function loadRequestFixture(): RequestFixture {
  return JSON.parse(readFileSync(join(FIXTURE_DIR, "requests.json"), "utf8"));
}

/** What the replay server received. */
export interface Received {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: unknown;
}

/**
 * A tiny Bun.serve that answers every request with the current recorded reply
 * and records what it received. `hang` makes it never answer (for deadlines).
 */
export function startReplayServer() {
  let reply: EngineFixture["reply"] = { status: 200, body: {} };
  let hang = false;
  const received: Received[] = [];
  const server = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    idleTimeout: 0,
    async fetch(req) {
      const text = await req.text();
      const url = new URL(req.url);
      received.push({
        method: req.method,
        path: url.pathname,
        headers: Object.fromEntries(req.headers.entries()),
        body: text ? JSON.parse(text) : undefined,
      });
      if (hang) return new Promise<Response>(() => {});
      const body = reply.raw ?? JSON.stringify(reply.body);
      return new Response(body, { status: reply.status, headers: { "content-type": reply.raw ? "text/html" : "application/json" } });
    },
  });
  return {
    url: `http://127.0.0.1:${server.port}`,
    received,
    setReply(r: EngineFixture["reply"]) {
      reply = r;
      hang = false;
    },
    setHang() {
      hang = true;
    },
    last(): Received {
      return received[received.length - 1];
    },
    stop: () => server.stop(true),
  };
}
