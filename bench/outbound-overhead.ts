/**
 * What the bounds of issue 26 cost on the hot path: `bun bench/outbound-overhead.ts [--n 3000]`.
 *
 * 1. Engine replies: `postEngineJson` (redirect "manual", reply read under the
 *    64 MiB cap) against the unbounded form it replaced (`fetch` + `res.text()` + `JSON.parse`),
 *    on a loopback server answering a 200 KB JSON body (a long generation with
 *    log-probs), once with `content-length` (read natively) and once chunked
 *    (read through the counting reader).
 * 2. Listeners: a small POST through `listen()` (idle/body timeouts) against a
 *    bare `Bun.serve`.
 * Sequential calls, median and p99 per call in microseconds, same run.
 */
import { postEngineJson } from "../shared/inference/engine-http.ts";
import { listen } from "../infra/cli/listen.ts";
import { arg, median, printTable } from "./util.ts";

const n = Number(arg("--n", "3000"));
const big = JSON.stringify({ choices: [{ token_ids: Array.from({ length: 8000 }, (_, i) => i), logprobs: { token_logprobs: Array.from({ length: 8000 }, (_, i) => -i / 8000) } }] });
const bytes = new TextEncoder().encode(big);
const replica = Bun.serve({
  port: 0,
  hostname: "127.0.0.1",
  fetch: (req) =>
    new URL(req.url).pathname === "/chunked"
      ? new Response(new ReadableStream({ start: (c) => (c.enqueue(bytes.slice(0, 100_000)), c.enqueue(bytes.slice(100_000)), c.close()) }), { headers: { "content-type": "application/json" } })
      : new Response(bytes, { headers: { "content-type": "application/json" } }),
});
const base = `http://127.0.0.1:${replica.port}`;
const f = (input: Request | string | URL, init?: RequestInit) => fetch(input, init);

/** The unbounded form `postEngineJson` had before issue 26 (default redirects, `res.text()`), for comparison. */
async function unboundedPostEngineJson(url: string, body: unknown, timeoutMs: number): Promise<{ status: number; body: unknown; text: string }> {
  const res = await fetch(url, { method: "POST", headers: { "x-edgeloop-timeout-ms": String(timeoutMs) }, body: JSON.stringify(body), signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  let parsed: unknown;
  try {
    parsed = text.length > 0 ? JSON.parse(text) : undefined;
  } catch {
    parsed = undefined;
  }
  return { status: res.status, body: parsed, text };
}

async function time(fn: () => Promise<unknown>): Promise<[number, number]> {
  for (let i = 0; i < 200; i++) await fn();
  const us: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    await fn();
    us.push((performance.now() - t0) * 1000);
  }
  us.sort((a, b) => a - b);
  return [median(us), us[Math.floor(us.length * 0.99)]!];
}

const rows: string[][] = [["path", "median µs", "p99 µs"]];
const add = (name: string, [m, p]: [number, number]) => rows.push([name, m.toFixed(0), p.toFixed(0)]);
for (const path of ["/cl", "/chunked"]) {
  add(`unbounded (before), ${path === "/cl" ? "content-length" : "chunked"} 200 KB`, await time(() => unboundedPostEngineJson(`${base}${path}`, {}, 600_000)));
  add(`postEngineJson (capped), ${path === "/cl" ? "content-length" : "chunked"} 200 KB`, await time(() => postEngineJson(f, `${base}${path}`, {}, {}, { timeoutMs: 600_000 })));
}
const handler = async (req: Request) => new Response(await req.text());
const bare = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: handler });
const bounded = listen({ port: 0, hostname: "127.0.0.1", fetch: handler });
const post = (port: number) => async () => (await fetch(`http://127.0.0.1:${port}/x`, { method: "POST", body: '{"prompt_ids":[1,2,3]}' })).text();
const get = (port: number) => async () => (await fetch(`http://127.0.0.1:${port}/x`)).text();
add("bare Bun.serve, small POST", await time(post(bare.port!)));
add("listen() (idle + body timeouts), small POST", await time(post(bounded.port!)));
add("bare Bun.serve, GET", await time(get(bare.port!)));
add("listen(), GET", await time(get(bounded.port!)));
printTable(`outbound and listener bounds, ${n} sequential calls each`, rows);
replica.stop(true);
bare.stop(true);
bounded.stop(true);
