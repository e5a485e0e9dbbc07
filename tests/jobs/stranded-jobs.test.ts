import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { freePort } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// N1 (issue 27): a worker SIGKILLed while it holds jobs leaves them pending until its lease expires.
// Real `edgeloop serve --jobs queue` and `edgeloop worker` processes on a random prefix; the victim runs
// a very slow simulated engine (its jobs never finish on their own), the others a fast one. Short lease
// and idle exit by flags; every wait is on a log line, a Redis count or a GET answer.
const redis = await requireRedis();
const MAIN = join(import.meta.dir, "..", "..", "infra", "cli", "main.ts");
/** Seconds (worker --lease); EDGELOOP_N1_LEASE_S overrides it to measure with another lease. */
const LEASE_S = Number(process.env.EDGELOOP_N1_LEASE_S ?? 2);
const dir = mkdtempSync(join(tmpdir(), "edgeloop-stranded-"));
const procs: ReturnType<typeof Bun.spawn>[] = [];
const prefixes: string[] = [];
afterAll(async () => {
  for (const p of procs) p.kill("SIGKILL");
  for (const p of prefixes) await deleteByPrefix(p);
  rmSync(dir, { recursive: true, force: true });
});

const config = (name: string, decodeMs: number) => {
  const f = join(dir, `${name}.yaml`);
  writeFileSync(f, `engine: {sim_latency: {prefill_ms_per_token: 0, decode_ms_per_token: ${decodeMs}}}\nconcurrency: 64\nrollout: {n: 4}\n`);
  return f;
};

/** A process's stderr as lines, with a wait for the first line matching a pattern (and when it arrived). */
function lines(stream: ReadableStream<Uint8Array>) {
  const seen: { line: string; at: number }[] = [];
  const waiters: { re: RegExp; resolve: (l: { line: string; at: number }) => void }[] = [];
  void (async () => {
    let buf = "";
    for await (const chunk of stream) {
      buf += new TextDecoder().decode(chunk);
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        const l = { line: buf.slice(0, i), at: performance.now() };
        buf = buf.slice(i + 1);
        seen.push(l);
        for (const w of waiters.filter((w) => w.re.test(l.line))) {
          waiters.splice(waiters.indexOf(w), 1);
          w.resolve(l);
        }
      }
    }
  })();
  return {
    seen,
    wait(re: RegExp, timeoutMs = 60_000): Promise<{ line: string; at: number }> {
      const hit = seen.find((l) => re.test(l.line));
      if (hit) return Promise.resolve(hit);
      return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error(`no line matching ${re} in ${timeoutMs} ms; saw:\n${seen.map((l) => l.line).join("\n")}`)), timeoutMs);
        waiters.push({ re, resolve: (l) => (clearTimeout(t), resolve(l)) });
      });
    },
  };
}

function worker(prefix: string, name: string, cfg: string, idleExit: string) {
  const p = Bun.spawn([process.execPath, MAIN, "worker", "--store", REDIS_URL, "--store-prefix", prefix, "--config", cfg, "--idle-exit", idleExit, "--lease", String(LEASE_S), "--consumer", name], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, NO_COLOR: "1" },
  });
  procs.push(p);
  return { p, err: lines(p.stderr as ReadableStream<Uint8Array>) };
}

async function serve(prefix: string) {
  const port = await freePort();
  const p = Bun.spawn([process.execPath, MAIN, "serve", "--jobs", "queue", "--port", String(port), "--store", REDIS_URL, "--store-prefix", prefix, "--config", config("serve", 1)], {
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, EDGELOOP_API_TOKEN: "", NO_COLOR: "1" },
  });
  procs.push(p);
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 60_000; // a bound for a hang only (start-up takes seconds; longer on a loaded machine)
  while (!(await fetch(`${url}/health`).then((r) => r.ok, () => false))) {
    if (Date.now() > deadline) throw new Error("serve did not start");
    await Bun.sleep(50);
  }
  return url;
}

const get = async <T>(url: string) => (await (await fetch(url)).json()) as T;
type Stats = { done: boolean; counts: Record<string, number> };
type Queue = { depth: number; in_flight: number; stranded: number; workers: { known: number; busy: number } };

async function post(url: string, rows: number, tag: string): Promise<{ batch_id: string; keys: string[] }> {
  const body = { rows: Array.from({ length: rows }, (_, i) => ({ uid: `${tag}${i}`, prompt: [{ role: "user", content: `question ${i}` }] })) };
  const r = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  expect(r.status).toBe(202);
  return (await r.json()) as { batch_id: string; keys: string[] };
}

/** Polls `fn` (a GET or a Redis count) until `ok`; fails after `ms`. */
async function until<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (ok(v)) return v;
    if (Date.now() > deadline) throw new Error(`timed out; last ${JSON.stringify(v)}`);
    await Bun.sleep(25);
  }
}

async function pendingOf(prefix: string, consumer: string): Promise<number> {
  const r = rawRedis();
  try {
    const [, , , cs] = (await r.xpending(`${prefix}jobs`, "workers")) as [number, string, string, [string, string][] | null];
    return Number((cs ?? []).find(([c]) => c === consumer)?.[1] ?? 0);
  } finally {
    await r.quit();
  }
}

async function doneKeys(prefix: string, batchId: string): Promise<string[]> {
  const r = rawRedis();
  try {
    return (await r.xrange(`${prefix}jobs:batch:${batchId}:done`, "-", "+")).map(([, f]) => f[f.indexOf("key") + 1]!);
  } finally {
    await r.quit();
  }
}

async function consumers(prefix: string): Promise<string[]> {
  const r = rawRedis();
  try {
    return ((await r.xinfo("CONSUMERS", `${prefix}jobs`, "workers")) as unknown[][]).map((c) => String(c[1])).sort();
  } finally {
    await r.quit();
  }
}

describe.skipIf(!redis)("N1: jobs held by a SIGKILLed worker", () => {
  test("the survivor, idle long before the kill, does not idle-exit: it waits for the lease, reclaims the 64 jobs, and the batch ends 240/240 without a new worker", async () => {
    const prefix = randomPrefix("n1-survivor");
    prefixes.push(prefix);
    const url = await serve(prefix);
    const { batch_id, keys } = await post(url, 60, "sv");
    expect(keys.length).toBe(240);
    // The victim claims 64 jobs (its concurrency) and runs them on an engine too slow to finish any.
    const victim = worker(prefix, "victim", config("slow", 60_000), "0.5");
    await until(() => pendingOf(prefix, "victim"), (n) => n === 64);
    // The survivor runs the other 176, then is idle (far longer than its --idle-exit 0.5 s) while the victim holds its 64.
    const survivor = worker(prefix, "survivor", config("fast", 1), "0.5");
    await until(() => get<Stats>(`${url}/v1/rollouts/${batch_id}`), (s) => s.counts.finished === 176);
    const idle = await survivor.err.wait(/^\[survivor\] idle, but 64 jobs are left in the stream/);
    expect(idle.line).toBe(`[survivor] idle, but 64 jobs are left in the stream (waiting to be claimed or held by other workers): staying to claim them, or reclaim them if their worker stops heart-beating (lease ${LEASE_S * 1000} ms)`);
    expect(await get<Queue>(`${url}/v1/queue`)).toMatchObject({ depth: 0, in_flight: 64, stranded: 0, workers: { known: 2, busy: 1 } });

    victim.p.kill("SIGKILL");
    await victim.p.exited;
    const killedAt = performance.now();
    const reclaim = await survivor.err.wait(/^\[survivor\] reclaimed .* \(delivery 2\)$/);
    const code = await survivor.p.exited;
    const out = (await new Response(survivor.p.stdout as ReadableStream).text()).trim().split("\n").pop()!;
    expect(code).toBe(0);
    expect(JSON.parse(out)).toMatchObject({ consumer: "survivor", claimed: 240, completed: 240, failed: 0, reclaimed: 64, exit: "idle" });
    const final = await until(() => get<Stats>(`${url}/v1/rollouts/${batch_id}`), (s) => s.done);
    expect(final.counts).toMatchObject({ total: 240, pending: 0, running: 0, finished: 240, records: 240, ok: 240, failed: 0 });
    const done = await doneKeys(prefix, batch_id);
    expect(new Set(done).size).toBe(240);
    expect(new Set(done)).toEqual(new Set(keys));
    // No other worker ever claimed: the survivor alone finished the victim's jobs.
    expect((await consumers(prefix)).filter((c) => c !== "victim" && c !== "survivor")).toEqual([]);
    expect(await get<Queue>(`${url}/v1/queue`)).toMatchObject({ depth: 0, in_flight: 0, stranded: 0 });
    console.log(`N1 measure: lease ${LEASE_S} s; death → first reclaim by the surviving worker ${((reclaim.at - killedAt) / 1000).toFixed(2)} s`);
  }, HANG_MS);

  test("with no worker left, GET /v1/queue counts the dead worker's jobs as stranded depth once the lease passes; a worker started then reclaims them all", async () => {
    const prefix = randomPrefix("n1-alone");
    prefixes.push(prefix);
    const url = await serve(prefix);
    const { batch_id, keys } = await post(url, 16, "al");
    expect(keys.length).toBe(64);
    const victim = worker(prefix, "victim", config("slow", 60_000), "0.5");
    await until(() => pendingOf(prefix, "victim"), (n) => n === 64);
    expect(await get<Queue>(`${url}/v1/queue`)).toMatchObject({ depth: 0, in_flight: 64, stranded: 0, workers: { known: 1, busy: 1 } });
    victim.p.kill("SIGKILL");
    await victim.p.exited;
    const killedAt = performance.now();
    // The scaling signal: from in flight (a worker heart-beats them) to depth (nobody does), without a worker running.
    const q = await until(() => get<Queue>(`${url}/v1/queue`), (v) => v.stranded > 0);
    const visibleAt = performance.now();
    expect(q).toMatchObject({ depth: 64, in_flight: 0, stranded: 64, workers: { busy: 0 } });
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics.split("\n").filter((l) => l.startsWith("edgeloop_queue_jobs{"))).toEqual(['edgeloop_queue_jobs{state="waiting"} 0', 'edgeloop_queue_jobs{state="stranded"} 64', 'edgeloop_queue_jobs{state="in_flight"} 0']);
    const rescuer = worker(prefix, "rescuer", config("fast", 1), "0.5");
    const startedAt = performance.now();
    const reclaim = await rescuer.err.wait(/^\[rescuer\] reclaimed .* \(delivery 2\)$/);
    expect(await rescuer.p.exited).toBe(0);
    const out = (await new Response(rescuer.p.stdout as ReadableStream).text()).trim().split("\n").pop()!;
    expect(JSON.parse(out)).toMatchObject({ consumer: "rescuer", claimed: 64, completed: 64, reclaimed: 64, exit: "idle" });
    const final = await until(() => get<Stats>(`${url}/v1/rollouts/${batch_id}`), (s) => s.done);
    expect(final.counts).toMatchObject({ total: 64, finished: 64, records: 64, ok: 64, failed: 0 });
    expect(new Set(await doneKeys(prefix, batch_id))).toEqual(new Set(keys));
    console.log(
      `N1 measure: lease ${LEASE_S} s; death → stranded in GET /v1/queue ${((visibleAt - killedAt) / 1000).toFixed(2)} s; a worker started then → first reclaim ${((reclaim.at - startedAt) / 1000).toFixed(2)} s`,
    );
  }, HANG_MS);
});
