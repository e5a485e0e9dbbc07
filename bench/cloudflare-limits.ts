// Cloudflare limits, measured on the real bundle in the real workerd (Miniflare):
//   bun bench/cloudflare-limits.ts
// 1. bundle size: `wrangler deploy --dry-run --outdir`, raw and gzipped (Cloudflare counts the compressed size);
// 2. memory: the user Worker isolate's V8 heap (the Worker and its Durable Objects share it), read through
//    workerd's inspector (no forced GC: an upper bound of the live heap), before any request and after trajectories ran (the Qwen3 tokenizer
//    loaded); beside it the RSS of the whole workerd process;
// 3. Durable Object value size: the largest value in any object's SQLite storage (persisted to disk,
//    read with bun:sqlite) after a normal tool trajectory and a long one (one ~20,000-token turn), with the
//    default part size (1 MB) and with EDGELOOP_DO_MAX_VALUE_BYTES=131072 (a KV-backed object's 128 KiB);
// 4. subrequests: every fetch the Worker and its Durable Objects send (Miniflare's outboundService), per
//    trajectory, by destination (engine, tools, Upstash REST).
// Needs Redis (REDIS_URL, default 127.0.0.1:6379) for the Upstash bridge.
import { Database } from "bun:sqlite";
import { mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Miniflare } from "miniflare";
import { readFileSync } from "node:fs";
import { startSimEngine } from "../infra/sim-engine/server.ts";
import { awaitRecords, batchRows, ROOT, RUNTIME_CONFIG, startServices, workerBindings } from "../tests/runtimes/harness.ts";

const POLICY = JSON.parse(readFileSync(join(ROOT, "examples", "policy.json"), "utf8"));

const LONG_UID = "cflong";
const LONG = " a".repeat(20_000) + "\n#### 1";
const longRow = { uid: LONG_UID, data_source: "edge", prompt: [{ role: "user", content: "Say a, many times." }], reward_model: { style: "rule", ground_truth: "1" } };

function bundle(): { dir: string; module: string; raw: number; gzip: number } {
  const dir = join(ROOT, ".wrangler", `cf-limits-${crypto.randomUUID().slice(0, 8)}`);
  const b = Bun.spawnSync(["node", join(ROOT, "node_modules", "wrangler", "bin", "wrangler.js"), "deploy", "--dry-run", "--outdir", dir], { cwd: ROOT, env: { ...process.env, WRANGLER_SEND_METRICS: "false", CI: "true" } });
  if (b.exitCode !== 0) throw new Error(`wrangler failed: ${b.stderr.toString()}`);
  const module = join(dir, "worker.js");
  const bytes = new Uint8Array(readFileSync(module));
  let raw = 0;
  for (const f of readdirSync(dir)) if (!f.endsWith(".map")) raw += statSync(join(dir, f)).size;
  return { dir, module, raw, gzip: Bun.gzipSync(bytes, { level: 9 }).length };
}

/**
 * The user Worker isolate's V8 heap (bytes used, garbage not yet collected included: workerd's
 * inspector does not answer HeapProfiler.collectGarbage) through workerd's inspector (Chrome
 * DevTools protocol, Runtime.getHeapUsage).
 */
async function isolateHeap(port: number): Promise<{ used: number; total: number }> {
  const list = (await (await fetch(`http://127.0.0.1:${port}/json`)).json()) as { id: string; webSocketDebuggerUrl: string }[];
  const target = list.find((t) => t.id === "core:user:");
  if (!target) throw new Error(`no user worker among inspector targets ${list.map((t) => t.id).join(", ")}`);
  const ws = new WebSocket(target.webSocketDebuggerUrl);
  await new Promise((r, j) => ((ws.onopen = r), (ws.onerror = j)));
  let id = 0;
  const waiting = new Map<number, (v: any) => void>();
  ws.onmessage = (e) => {
    const m = JSON.parse(String(e.data));
    waiting.get(m.id)?.(m.result);
  };
  const call = (method: string) => new Promise<any>((r) => (waiting.set(++id, r), ws.send(JSON.stringify({ id, method }))));
  const u = await call("Runtime.getHeapUsage");
  ws.close();
  return { used: u.usedSize + (u.embedderHeapUsedSize ?? 0), total: u.totalSize };
}

/** RSS (bytes) of workerd processes that are children of this process. */
function workerdRss(): number {
  const ps = Bun.spawnSync(["ps", "-o", "rss=,comm=", "--ppid", String(process.pid)]).stdout.toString();
  return ps.split("\n").filter((l) => l.includes("workerd")).reduce((n, l) => n + Number(l.trim().split(/\s+/)[0]) * 1024, 0);
}

function largestValue(dir: string): { bytes: number; key: string; values: number } {
  let best = { bytes: 0, key: "", values: 0 };
  const walk = (d: string) => {
    for (const f of readdirSync(d)) {
      const p = join(d, f);
      if (statSync(p).isDirectory()) walk(p);
      else if (f.endsWith(".sqlite")) {
        const db = new Database(p, { readonly: true });
        try {
          const rows = db.query("SELECT key, length(value) AS n FROM _cf_KV").all() as { key: string; n: number }[];
          best.values += rows.length;
          for (const r of rows) if (r.n > best.bytes) best = { ...best, bytes: r.n, key: r.key };
        } catch {
          // not an object's storage
        } finally {
          db.close();
        }
      }
    }
  };
  walk(dir);
  return best;
}

async function run(maxValueBytes: number | null) {
  const s = await startServices(`cf-limits-${maxValueBytes ?? "default"}`);
  // An engine whose script also answers the long row with LONG, with room for it.
  const engine = await startSimEngine({ script: { ...POLICY, seed: 7, rules: [{ when: "Say a, many times.", turns: [LONG] }, ...POLICY.rules] }, maxModelLen: 40960 });
  const b = bundle();
  const persist = mkdtempSync(join(tmpdir(), "edgeloop-cf-do-"));
  const inspectorPort = 9200 + Math.floor(Math.random() * 700);
  const counts = new Map<string, number>();
  const origin = (u: string) => (u.startsWith(engine.urls[0]!) ? "engine" : u.startsWith(s.bridge.url) ? "upstash" : u.includes(`:${s.tools.port}/`) ? "tools" : "other");
  const mf = new Miniflare({
    modules: [{ type: "ESModule", path: b.module }],
    compatibilityDate: "2026-04-07",
    compatibilityFlags: ["nodejs_compat"],
    durableObjects: { SESSIONS: { className: "TrajectorySessionObject", useSQLite: true } },
    durableObjectsPersist: persist,
    bindings: {
      ...workerBindings(s),
      EDGELOOP_ENGINE_URL: engine.urls[0]!,
      EDGELOOP_CONFIG: JSON.stringify({ rollout: { ...RUNTIME_CONFIG.rollout, n: 1, response_length: 32768, max_model_len: 40960 } }),
      ...(maxValueBytes ? { EDGELOOP_DO_MAX_VALUE_BYTES: String(maxValueBytes) } : {}),
    },
    inspectorPort,
    outboundService: (req: Request) => {
      const k = origin(req.url);
      counts.set(k, (counts.get(k) ?? 0) + 1);
      return fetch(req);
    },
  });
  await mf.ready;
  const rssIdle = workerdRss();
  const heapIdle = await isolateHeap(inspectorPort);
  const rows = batchRows("cfl").slice(0, 4);
  const res = await mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
  if (res.status !== 202) throw new Error(`POST: ${res.status} ${await res.text()}`);
  const recs = await awaitRecords(s.prefix, rows.map((r) => String(r.uid)), 1, 60_000);
  const failed = [...recs.values()].filter((r) => r.error);
  if (failed.length) throw new Error(`trajectories failed: ${failed.map((r) => r.error).join("; ")}`);
  const turns = [...recs.values()].map((r) => r.num_turns);
  const perTrajectory = Object.fromEntries([...counts].map(([k, v]) => [k, v / rows.length]));
  const rssAfter = workerdRss();
  const heapAfter = await isolateHeap(inspectorPort);
  const normal = largestValue(persist);
  counts.clear();
  const res2 = await mf.dispatchFetch("http://localhost/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [longRow] }) });
  if (res2.status !== 202) throw new Error(`POST long: ${res2.status} ${await res2.text()}`);
  const long = await awaitRecords(s.prefix, [LONG_UID], 1, 120_000);
  const longRec = [...long.values()][0]!;
  if (longRec.error) throw new Error(`long trajectory failed: ${longRec.error}`);
  const longCounts = Object.fromEntries(counts);
  const longest = largestValue(persist);
  const heapLong = await isolateHeap(inspectorPort);
  await mf.dispose();
  await s.stop();
  await engine.stop();
  rmSync(b.dir, { recursive: true, force: true });
  rmSync(persist, { recursive: true, force: true });
  return { bundle: { raw: b.raw, gzip: b.gzip }, rssIdle, rssAfter, heapIdle, heapAfter, heapLong, records: recs.size, turns, perTrajectory, normal, long: { tokens: longRec.response_ids.length, largest: longest, subrequests: longCounts } };
}

const mb = (n: number) => `${(n / 1e6).toFixed(2)} MB`;
const a = await run(null);
const k = await run(131_072);
console.log(`bundle (wrangler deploy --dry-run)   ${mb(a.bundle.raw)} raw, ${mb(a.bundle.gzip)} gzipped`);
console.log(`isolate heap (V8, used)               ${mb(a.heapIdle.used)} idle, ${mb(a.heapAfter.used)} after ${a.records} tool trajectories, ${mb(a.heapLong.used)} after the ${a.long.tokens}-token one (heap size ${mb(a.heapLong.total)})`);
console.log(`workerd RSS                           ${mb(a.rssIdle)} idle, ${mb(a.rssAfter)} after ${a.records} tool trajectories (tokenizer loaded)`);
console.log(`subrequests per tool trajectory       ${JSON.stringify(a.perTrajectory)} (num_turns ${JSON.stringify(a.turns)})`);
console.log(`subrequests, one ${a.long.tokens}-token trajectory ${JSON.stringify(a.long.subrequests)}`);
for (const [name, r] of [["default (1 MB parts)", a], ["EDGELOOP_DO_MAX_VALUE_BYTES=131072", k]] as const) {
  console.log(`DO largest value, ${name}: tool trajectories ${r.normal.bytes} B (${r.normal.key}); + ${r.long.tokens}-token trajectory ${r.long.largest.bytes} B (${r.long.largest.key}), ${r.long.largest.values} values stored`);
}
