/**
 * How long the agent gateway's address is dark when `serve` dies, against
 * the SDKs' default retry budget (`openai` and `@anthropic-ai/sdk`:
 * `maxRetries: 2`, backoff 0.5 s then 1 s, each less up to 25 % jitter, so a
 * call gives up 1.125–1.5 s after its first connection error).
 *
 * For `--runs N` rounds (default 5): start `serve` (Redis store, queue mode)
 * on a fixed port, SIGKILL it, start it again on that port and time from the
 * kill to the first `GET /health` 200 (a fresh process: bun start, tokenizer,
 * config, store). Then the same with a second `serve --reuse-port` already
 * listening: the time from the kill to the next 200 through the port.
 * Needs Redis at REDIS_URL (default redis://127.0.0.1:6379).
 * Usage: `bun bench/serve-restart.ts [--runs N]`.
 */
import { parseArgs } from "node:util";
import { join } from "node:path";

const { values } = parseArgs({ options: { runs: { type: "string", default: "5" } } });
const runs = Number(values.runs);
const MAIN = join(import.meta.dir, "..", "infra", "cli", "main.ts");
const REDIS = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const SDK_BUDGET_MS = [1125, 1500];

function freePort(): number {
  const s = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response() });
  const p = s.port!;
  s.stop(true);
  return p;
}

function serve(port: number, prefix: string, reuse: boolean) {
  return Bun.spawn([process.execPath, MAIN, "serve", "--port", String(port), "--store", REDIS, "--store-prefix", prefix, "--jobs", "queue", ...(reuse ? ["--reuse-port"] : [])], { stdout: "pipe", stderr: "ignore" });
}

/** Resolves once `p` printed its "serving on" line (it listens). */
async function listening(p: ReturnType<typeof serve>): Promise<void> {
  const dec = new TextDecoder();
  let out = "";
  for await (const chunk of p.stdout as ReadableStream<Uint8Array>) {
    out += dec.decode(chunk, { stream: true });
    if (out.includes("serving on")) return;
  }
  throw new Error("serve exited before listening");
}

/** Polls `GET /health` every 5 ms until a 200; returns the time it came (performance.now()). */
async function healthy(port: number, boundMs = 120_000): Promise<number> {
  const until = performance.now() + boundMs;
  for (;;) {
    const ok = await fetch(`http://127.0.0.1:${port}/health`, { headers: { connection: "close" } }).then((r) => r.status === 200, () => false);
    if (ok) return performance.now();
    if (performance.now() > until) throw new Error(`no healthy serve on ${port} within ${boundMs} ms`);
    await Bun.sleep(5);
  }
}

const pct = (xs: number[], q: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(q * xs.length))]!;
const restart: number[] = [];
const shared: number[] = [];
for (let i = 0; i < runs; i++) {
  const prefix = `bench-restart-${process.pid}-${i}:`;
  const port = freePort();
  const a = serve(port, prefix, false);
  await healthy(port);
  const t0 = performance.now();
  a.kill(9);
  await a.exited;
  const b = serve(port, prefix, false);
  restart.push((await healthy(port)) - t0);
  b.kill(9);
  await b.exited;

  const port2 = freePort();
  const c = serve(port2, prefix, true);
  const d = serve(port2, prefix, true);
  await Promise.all([listening(c), listening(d)]);
  await healthy(port2);
  const t1 = performance.now();
  c.kill(9);
  await c.exited;
  shared.push((await healthy(port2)) - t1);
  d.kill(9);
  await d.exited;
}
console.log(`serve restart on the same port (kill → first /health 200), ${runs} runs: p50 ${pct(restart, 0.5).toFixed(0)} ms, max ${Math.max(...restart).toFixed(0)} ms`);
console.log(`two serves --reuse-port, one killed (kill → next 200 through the port): p50 ${pct(shared, 0.5).toFixed(1)} ms, max ${Math.max(...shared).toFixed(1)} ms`);
console.log(`the SDKs' default retry budget (maxRetries 2): a call gives up ${SDK_BUDGET_MS[0]}–${SDK_BUDGET_MS[1]} ms after its first connection error`);
