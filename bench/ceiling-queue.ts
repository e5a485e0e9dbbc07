/**
 * Orchestration ceiling in queue mode (issue 32 item 1, the part
 * `bench/ceiling.ts` leaves out): the product's own processes over a real
 * Redis — `edgeloop rollout --jobs queue` enqueues one batch and follows it,
 * W `edgeloop worker` processes (W = 1, then 2) claim its jobs and run
 * durable `tool_agent` sessions (checkpoints in Redis) against the embedded
 * simulated engine (in-process, no socket: its own CPU is in the worker's
 * figure) and the example tool server (loopback HTTP in each worker). Per
 * step it prints:
 * - turns/s of wall time (assistant turns of every record, over the time from
 *   the rollout's spawn to its exit: its ~1–2 s start is in it);
 * - turns/s per core: the same turns over the workers' CPU seconds after
 *   their start (user + system at exit minus at the banner line, from
 *   `/proc/{pid}/stat`: Linux; the model load before it is left out);
 * - the workers' event-loop lag: p99 and max of `edgeloop_event_loop_lag_seconds`
 *   (each worker's newest 20 ms-timer sample) scraped from every worker's
 *   /metrics every 100 ms once it printed its banner (the model load before
 *   it blocks the loop for a second or more and is not the ceiling);
 * - store commands and bytes per turn: Redis's `INFO commandstats` calls and
 *   `total_net_input_bytes + total_net_output_bytes`, after minus before,
 *   over the turns (every process of the step talks to this Redis; another
 *   client of the same server would be counted too: use a private one).
 *
 *   bun bench/ceiling-queue.ts [--rows 240] [--n 4] [--workers 1,2] [--concurrency 64]
 *
 * Needs Redis (REDIS_URL, default redis://127.0.0.1:6379). Each step uses its
 * own key prefix and deletes it after.
 */
import { mkdtempSync, readFileSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Redis from "ioredis";
import { arg, printTable } from "./util.ts";

const REDIS_URL = process.env.REDIS_URL ?? "redis://127.0.0.1:6379";
const ROWS = Number(arg("--rows", "240"));
const N = Number(arg("--n", "4"));
const WORKERS = arg("--workers", "1,2").split(",").map(Number);
const CONCURRENCY = Number(arg("--concurrency", "64"));
const CLI = join(import.meta.dir, "..", "infra", "cli", "main.ts");

const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 });
try {
  await redis.connect();
} catch (e) {
  console.log(`ceiling-queue: no Redis at ${REDIS_URL} (${(e as Error).message}); set REDIS_URL`);
  process.exit(0);
}

// The example rows, repeated to --rows with distinct uids.
const base = readFileSync(join(import.meta.dir, "..", "examples", "gsm8k-tool.jsonl"), "utf8").split("\n").filter(Boolean);
const dir = mkdtempSync(join(tmpdir(), "edgeloop-ceiling-q-"));
const data = join(dir, "rows.jsonl");
writeFileSync(data, Array.from({ length: ROWS }, (_, i) => JSON.stringify({ ...JSON.parse(base[i % base.length]!), uid: `cq${i}` })).join("\n") + "\n");

/** Redis's command count and network bytes so far (server-wide). */
async function redisTotals(): Promise<{ commands: number; bytes: number }> {
  const cs = await redis.info("commandstats");
  let commands = 0;
  for (const m of cs.matchAll(/^cmdstat_[^:]+:calls=(\d+)/gm)) commands += Number(m[1]);
  const st = await redis.info("stats");
  const num = (k: string) => Number(new RegExp(`^${k}:(\\d+)`, "m").exec(st)?.[1] ?? 0);
  return { commands, bytes: num("total_net_input_bytes") + num("total_net_output_bytes") };
}

/** Reads a child's stderr line by line until it closes, calling `on` for each. */
async function lines(stream: ReadableStream<Uint8Array>, on: (line: string) => void): Promise<void> {
  const dec = new TextDecoder();
  let buf = "";
  for await (const chunk of stream) {
    buf += dec.decode(chunk, { stream: true });
    let i: number;
    while ((i = buf.indexOf("\n")) >= 0) {
      on(buf.slice(0, i));
      buf = buf.slice(i + 1);
    }
  }
  if (buf) on(buf);
}

/** A live process's CPU seconds so far (user + system), from `/proc/{pid}/stat` (clock ticks of 1/100 s). */
function procCpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  // Fields after the command's closing parenthesis: state is field 3, utime 14, stime 15.
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100;
}

const cpuSeconds = (p: Bun.Subprocess) => {
  const u = p.resourceUsage();
  return u ? Number(u.cpuTime.user + u.cpuTime.system) / 1e6 : NaN;
};

interface Step {
  workers: number;
  trajectories: number;
  turns: number;
  wallS: number;
  cpuS: number;
  lagP99Ms: number;
  lagMaxMs: number;
  commands: number;
  bytes: number;
}

async function step(workers: number): Promise<Step> {
  const prefix = `bench-cq-${crypto.randomUUID().slice(0, 8)}:`;
  const out = join(dir, `out-${workers}.jsonl`);
  const before = await redisTotals();
  const ports: number[] = [];
  const lagSamples: number[] = [];
  const procs = Array.from({ length: workers }, (_, w) => {
    const p = Bun.spawn([process.execPath, CLI, "worker", "--store", REDIS_URL, "--store-prefix", prefix, "--concurrency", String(CONCURRENCY), "--idle-exit", "2", "--metrics-port", "0", "--consumer", `bench-w${w}`], { stdout: "ignore", stderr: "pipe" });
    const log: string[] = [];
    const w0 = { cpu: 0, port: 0 };
    const done = lines(p.stderr as ReadableStream<Uint8Array>, (l) => {
      log.push(l);
      const m = /metrics on http:\/\/127\.0\.0\.1:(\d+)\/metrics/.exec(l);
      if (m) w0.port = Number(m[1]);
      if (l.startsWith("worker     bench-w")) {
        w0.cpu = procCpuSeconds(p.pid);
        if (w0.port) ports.push(w0.port);
      }
    });
    return { p, log, done, w0 };
  });
  const scrape = setInterval(() => {
    for (const port of ports) {
      fetch(`http://127.0.0.1:${port}/metrics`)
        .then((r) => r.text())
        .then((t) => {
          const m = /^edgeloop_event_loop_lag_seconds ([0-9.e+-]+)$/m.exec(t);
          if (m) lagSamples.push(Number(m[1]) * 1000);
        })
        .catch(() => {});
    }
  }, 100);
  const t0 = performance.now();
  const roll = Bun.spawn([process.execPath, CLI, "rollout", "--jobs", "queue", "--store", REDIS_URL, "--store-prefix", prefix, "--data", data, "--n", String(N), "--out", out], { stdout: "ignore", stderr: "pipe" });
  const rollLog: string[] = [];
  const rollDone = lines(roll.stderr as ReadableStream<Uint8Array>, (l) => rollLog.push(l));
  const code = await roll.exited;
  const wallS = (performance.now() - t0) / 1000;
  await rollDone;
  if (code !== 0) throw new Error(`rollout exited ${code}:\n${rollLog.slice(-20).join("\n")}`);
  const codes = await Promise.all(procs.map((x) => x.p.exited));
  clearInterval(scrape);
  await Promise.all(procs.map((x) => x.done));
  codes.forEach((c, w) => {
    if (c !== 0) throw new Error(`worker ${w} exited ${c}:\n${procs[w]!.log.slice(-20).join("\n")}`);
  });
  const after = await redisTotals();
  const records = readFileSync(out, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l) as { num_turns: number });
  if (records.length !== ROWS * N) throw new Error(`${records.length} records, expected ${ROWS * N}`);
  // Assistant turns (engine calls): num_turns counts the prompt, every assistant turn and every observation (verl),
  // and a tool_agent conversation is prompt, (assistant, tool)*, then an assistant turn or nothing: half of it, rounded down.
  const turns = records.reduce((a, r) => a + Math.floor(r.num_turns / 2), 0);
  // The step's keys go (SCAN of the prefix, UNLINK in pages) after the totals are read.
  let cursor = "0";
  do {
    const [next, keys] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000);
    if (keys.length) await redis.unlink(...keys);
    cursor = next;
  } while (cursor !== "0");
  const sorted = Float64Array.from(lagSamples).sort();
  const lagP99Ms = sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(0.99 * sorted.length))]! : NaN;
  return { workers, trajectories: records.length, turns, wallS, cpuS: procs.reduce((a, x) => a + cpuSeconds(x.p) - x.w0.cpu, 0), lagP99Ms, lagMaxMs: sorted.length ? sorted[sorted.length - 1]! : NaN, commands: after.commands - before.commands, bytes: after.bytes - before.bytes };
}

try {
  const rows = [["workers", "trajectories", "assistant turns", "wall s", "turns/s", "worker CPU s", "turns/s per core", "worker lag p99 ms", "lag max ms", "store commands/turn", "store bytes/turn"]];
  for (const w of WORKERS) {
    const s = await step(w);
    rows.push([String(w), String(s.trajectories), String(s.turns), s.wallS.toFixed(1), (s.turns / s.wallS).toFixed(0), s.cpuS.toFixed(1), (s.turns / s.cpuS).toFixed(0), s.lagP99Ms.toFixed(1), s.lagMaxMs.toFixed(1), (s.commands / s.turns).toFixed(1), (s.bytes / s.turns).toFixed(0)]);
  }
  printTable(`queue mode: rollout --jobs queue + W workers (concurrency ${CONCURRENCY}), durable tool_agent sessions, embedded simulator and example tools, Redis ${REDIS_URL}`, rows);
} finally {
  await redis.quit();
  rmSync(dir, { recursive: true, force: true });
}
