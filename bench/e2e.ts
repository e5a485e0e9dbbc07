/**
 * End-to-end benchmark of the main job (issue 6 §7): the example batch
 * (`examples/gsm8k-tool.jsonl`, 60 rows, `n` = 8 → 480 trajectories) run the
 * way `edgeloop rollout` runs it — `buildRuntime(flags)` then
 * `service.submit(...)` — on the zero-latency simulated engine.
 *
 * 1. Throughput (medians of `--runs` batches after one warm-up): trajectories/s,
 *    engine calls (assistant turns)/s and verl `num_turns`/s, for
 *    - the CLI default: in-process engine, example tool server in-process on loopback;
 *    - in-process engine (`SimEngineClient`), tools over loopback in a child process;
 *    - vLLM adapter over loopback HTTP → sim engine (`startSimEngine`, child process);
 *    - vLLM adapter → gateway (`functions/gateway.ts` on Bun.serve) → sim engine (child).
 * 2. Orchestration CPU per engine call (`process.cpuUsage()` of this process):
 *    every engine call (prompt ids, max_tokens, sampling params) and every tool
 *    call of a run is recorded, then replayed directly — engine calls against a
 *    fresh client of the same kind, tool calls against a fresh `WebhookToolClient`,
 *    with the run's concurrency — and the CPU per call is compared.
 * 2b. Orchestration CPU per engine call for every built-in family (`--models`, default
 *    all five), the example batch on the in-process engine: after one real
 *    batch, the same batch again with every engine reply and tool result
 *    replayed from memory (keyed by prompt ids and session; by tool name and
 *    arguments), so the CPU measured (`process.cpuUsage()`) is edgeloop's own.
 *    The token core's share is measured in the same run (CPU inside
 *    `ObservationEncoder.encode`, and inside the tokenizer's `renderText` /
 *    `encode` elsewhere: the initial prompt), and each observation beside its
 *    floor: raw `encode()` of the same observation texts.
 * 3. Scale (a fresh child process, `--trajectories` trajectories at once,
 *    config `concurrency` = trajectories): engine with a fixed latency
 *    per request (`--engine-latency-ms`, a `hang` fault with `ms` on the
 *    in-process sim engine), tools with a fixed latency (`--tool-latency-ms`, the
 *    tool server's `delayMs`, child process). Peak RSS (VmHWM and 100 ms samples),
 *    completion time against the critical-path ideal (assistant turns × engine
 *    latency + tool rounds × tool latency of the longest trajectory), and the
 *    concurrency the engine and the tool server actually saw.
 *
 *   bun bench/e2e.ts [--runs 3] [--n 8] [--only throughput,cost,families,scale] [--models qwen3,llama3_1,…]
 *                    [--trajectories 10000] [--engine-latency-ms 200] [--tool-latency-ms 1000]
 *                    [--tool-timeout-ms 600000] [--max-http-requests default,65535]
 *
 * `--max-http-requests A,B` runs the scale part once per value of
 * `BUN_CONFIG_MAX_HTTP_REQUESTS` (Bun's cap on simultaneous fetches; `default`
 * leaves it unset, i.e. 256); default `default,65535`. Tools in the scale
 * run use `--tool-timeout-ms` (default 600 s) instead of the example tools
 * file's 10 s, since a call queued behind Bun's fetch cap counts against it.
 */
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readRows } from "../infra/cli/files.ts";
import type { ConfigFlags } from "../infra/cli/flags.ts";
import { buildRuntime, DEFAULT_SCRIPT, PACKAGE_ROOT, type Runtime } from "../infra/cli/runtime.ts";
import { SimEngine } from "../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../infra/sim-engine/sim-engine-client.ts";
import { createEngineClient } from "../shared/inference/create-engine-client.ts";
import { hashInt } from "../shared/inference/hash.ts";
import type { GenerateRequest, InferenceClient } from "../shared/inference/types.ts";
import { RolloutRequest } from "../shared/rollout/batch.ts";
import type { TrajectoryRecord } from "../shared/schema/index.ts";
import { BUILTIN_MODELS, builtinTokenizer } from "../shared/models/index.ts";
import { ObservationEncoder } from "../shared/tokens/observation.ts";
import { ChatTokenizer, defaultTokenizer } from "../shared/tokens/tokenizer.ts";
import { parseToolsFile } from "../shared/tools/tools-file.ts";
import { WebhookToolClient, type ToolCallRequest } from "../shared/tools/webhook-tool-client.ts";
import { arg, installTokenCoreMeter, median, printTable } from "./util.ts";

const RUNS = Number(arg("--runs", "3"));
const N = Number(arg("--n", "8"));
const SEED = 1;
const ONLY = arg("--only", "throughput,cost,families,scale").split(",");
const MODELS = arg("--models", BUILTIN_MODELS.join(",")).split(",");
const TRAJECTORIES = Number(arg("--trajectories", "10000"));
const ENGINE_MS = Number(arg("--engine-latency-ms", "200"));
const TOOL_MS = Number(arg("--tool-latency-ms", "1000"));
const TOOL_TIMEOUT_MS = Number(arg("--tool-timeout-ms", "600000"));
const MAX_HTTP = arg("--max-http-requests", "default,65535").split(",");
const DATA = join(PACKAGE_ROOT, "examples", "gsm8k-tool.jsonl");
const HERE = new URL(".", import.meta.url).pathname;

// ---------------------------------------------------------------- helpers

/** The services child process (bench/e2e-servers.ts). */
interface Servers {
  tools_url: string;
  tools_port: number;
  engine_urls: string[];
  gateway_url: string | null;
  stats(url: string): Promise<{ inflight: number; max_inflight: number; requests: number; cpu_us: number }>;
  stop(): Promise<void>;
}

async function startServers(opts: { gateway?: boolean; toolDelayMs?: number; engineLatencyMs?: number } = {}): Promise<Servers> {
  const p = Bun.spawn(
    [
      process.execPath,
      join(HERE, "e2e-servers.ts"),
      "--child",
      "--script",
      DEFAULT_SCRIPT,
      "--seed",
      String(SEED),
      "--tool-delay-ms",
      String(opts.toolDelayMs ?? 0),
      "--engine-latency-ms",
      String(opts.engineLatencyMs ?? 0),
      ...(opts.gateway ? ["--gateway"] : []),
    ],
    { stdin: "pipe", stdout: "pipe", stderr: "inherit" },
  );
  const reader = p.stdout.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const { value, done } = await reader.read();
    if (done) throw new Error("bench/e2e-servers.ts exited before it printed its URLs");
    text += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  const info = JSON.parse(text.slice(0, text.indexOf("\n")));
  return {
    ...info,
    stats: async (url: string) => (await fetch(`${url}/__bench/stats`)).json(),
    async stop() {
      p.stdin.end();
      const t = setTimeout(() => p.kill(), 3000);
      await p.exited;
      clearTimeout(t);
    },
  };
}

/** A tools file pointing at the child's tool server (the example file with its port filled in). */
function toolsFile(dir: string, port: number, timeoutMs?: number): string {
  const raw = JSON.parse(readFileSync(join(PACKAGE_ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", String(port)));
  if (timeoutMs !== undefined) for (const t of raw.tools) t.timeout_ms = timeoutMs;
  const path = join(dir, `tools-${port}-${timeoutMs ?? "default"}.json`);
  writeFileSync(path, JSON.stringify(raw));
  return path;
}

/** Counts (and optionally records) every engine call the runtime's executor makes. */
function instrument(rt: Runtime): { calls: () => number; recorded: GenerateRequest[]; record: (on: boolean) => void } {
  const client = rt.client as InferenceClient & { generate: InferenceClient["generate"] };
  const inner = client.generate.bind(client);
  let n = 0;
  let on = false;
  const recorded: GenerateRequest[] = [];
  // The executor holds this very object, so patching the instance sees every call.
  client.generate = (req) => {
    n++;
    if (on) recorded.push(req);
    return inner(req);
  };
  return { calls: () => n, recorded, record: (v) => (on = v) };
}

/** Records every webhook tool call (the runtime's WebhookToolClient is not exposed, so its prototype is wrapped). */
const toolCalls: ToolCallRequest[] = [];
let recordTools = false;
{
  const proto = WebhookToolClient.prototype;
  const inner = proto.call;
  proto.call = function (this: WebhookToolClient, req: ToolCallRequest) {
    if (recordTools) toolCalls.push(req);
    return inner.call(this, req);
  };
}

const tokenCore = installTokenCoreMeter();

interface BatchResult {
  wall_s: number;
  cpu_us: number;
  trajectories: number;
  ok: number;
  failed: number;
  num_turns: number;
  engine_calls: number;
  tool_calls: number;
}

async function runBatch(rt: Runtime, rows: unknown[], counter: { calls: () => number }): Promise<BatchResult> {
  const req = RolloutRequest.parse({ rows });
  const calls0 = counter.calls();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const { run } = rt.service.submit(req);
  await run.run();
  const wall_s = (performance.now() - t0) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const s = run.stats();
  return {
    wall_s,
    cpu_us: cpu.user + cpu.system,
    trajectories: s.counts.total,
    ok: s.counts.ok,
    failed: s.counts.failed,
    num_turns: s.turns,
    engine_calls: counter.calls() - calls0,
    tool_calls: s.tool_calls,
  };
}

/** Runs `items` through `f` with at most `concurrency` at once, in order. */
async function pool<T>(items: readonly T[], concurrency: number, f: (x: T, i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < items.length; i = next++) await f(items[i]!, i);
  };
  await Promise.all(Array.from({ length: Math.min(concurrency, items.length) }, worker));
}

async function cpuOf(f: () => Promise<unknown>): Promise<number> {
  const c0 = process.cpuUsage();
  await f();
  const c = process.cpuUsage(c0);
  return c.user + c.system;
}

/** Assistant turns (runs of mask 1) and tool rounds (runs of mask 0) of a record. */
function turnShape(r: TrajectoryRecord): { turns: number; rounds: number } {
  let turns = 0;
  let rounds = 0;
  const m = r.response_mask;
  for (let i = 0; i < m.length; i++) {
    if (i > 0 && m[i] === m[i - 1]) continue;
    if (m[i] === 1) turns++;
    else rounds++;
  }
  return { turns, rounds };
}

const f1 = (x: number) => x.toFixed(1);
const f0 = (x: number) => x.toFixed(0);
const f2 = (x: number) => x.toFixed(2);
const mib = (bytes: number) => (bytes / 2 ** 20).toFixed(0);

// ---------------------------------------------------------------- scale child

/** What one scale run (a child process) reports. Sizes in bytes, times in seconds. */
interface ScaleResult {
  trajectories: number;
  ok: number;
  failed: number;
  errors: { key: string; error: string }[];
  engine_calls: number;
  tool_calls: number;
  tool_errors: number;
  wall_s: number;
  cpu_s: number;
  ideal_s: number;
  longest: { turns: number; rounds: number };
  first_s: number;
  p50_s: number;
  p90_s: number;
  rss_start: number;
  rss_before: number;
  rss_peak_sampled: number;
  rss_hwm: number;
  rss_after_gc: number;
  heap_after_gc: number;
  engine_max_inflight: number;
  tools_max_inflight: number;
  tools_requests: number;
  max_http_requests: string;
}

if (process.argv.includes("--scale-child")) {
  await scaleChild();
  process.exit(0);
}

async function scaleChild(): Promise<void> {
  const rssSamples: number[] = [];
  const rss0 = process.memoryUsage().rss;
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-bench-e2e-"));
  const servers = await startServers({ toolDelayMs: TOOL_MS });
  try {
    const base = await readRows(DATA);
    const rowsNeeded = Math.ceil(TRAJECTORIES / N);
    const rows = Array.from({ length: rowsNeeded }, (_, i) => base[i % base.length]);
    const rt = await buildRuntime({ n: N, seed: SEED, tools: toolsFile(dir, servers.tools_port, TOOL_TIMEOUT_MS), concurrency: rows.length * N });
    const engine = (rt.client as SimEngineClient).engine;
    if (ENGINE_MS > 0) engine.setFault({ kind: "hang", ms: ENGINE_MS });
    const counter = instrument(rt);
    await fetch(`${servers.tools_url}/__bench/reset`, { method: "POST" });
    const rssBefore = process.memoryUsage().rss;
    let peakSampled = rssBefore;
    const sampler = setInterval(() => {
      const r = process.memoryUsage().rss;
      rssSamples.push(r);
      if (r > peakSampled) peakSampled = r;
    }, 100);
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    const { run } = rt.service.submit(RolloutRequest.parse({ rows }));
    const doneAt: number[] = [];
    const records: TrajectoryRecord[] = [];
    for await (const r of run.stream()) {
      doneAt.push(performance.now() - t0);
      records.push(r);
    }
    await run.run();
    const wall = (performance.now() - t0) / 1000;
    const cpu = process.cpuUsage(cpu0);
    clearInterval(sampler);
    const status = readFileSync("/proc/self/status", "utf8");
    const hwm = Number(/VmHWM:\s+(\d+) kB/.exec(status)?.[1] ?? 0) * 1024;
    const toolStats = await servers.stats(servers.tools_url);
    const s = run.stats();
    let ideal = 0;
    let longest = { turns: 0, rounds: 0 };
    for (const r of records) {
      if (r.error !== null) continue;
      const sh = turnShape(r);
      const ms = sh.turns * ENGINE_MS + sh.rounds * TOOL_MS;
      if (ms > ideal) {
        ideal = ms;
        longest = sh;
      }
    }
    const sorted = [...doneAt].sort((a, b) => a - b);
    Bun.gc(true);
    const mem = process.memoryUsage();
    const q = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]! / 1000;
    const result: ScaleResult = {
        trajectories: s.counts.total,
        ok: s.counts.ok,
        failed: s.counts.failed,
        errors: s.errors.slice(0, 3),
        engine_calls: counter.calls(),
        tool_calls: s.tool_calls,
        tool_errors: s.tool_errors,
        wall_s: wall,
        cpu_s: (cpu.user + cpu.system) / 1e6,
        ideal_s: ideal / 1000,
        longest,
        first_s: q(0),
        p50_s: q(0.5),
        p90_s: q(0.9),
        rss_start: rss0,
        rss_before: rssBefore,
        rss_peak_sampled: peakSampled,
        rss_hwm: hwm,
        rss_after_gc: mem.rss,
        heap_after_gc: mem.heapUsed,
        engine_max_inflight: engine.stats.max_inflight,
        tools_max_inflight: toolStats.max_inflight,
        tools_requests: toolStats.requests,
        max_http_requests: process.env.BUN_CONFIG_MAX_HTTP_REQUESTS ?? "default",
    };
    // `records` stays referenced until here, so the post-GC figures hold every record (as a trainer-less run would).
    console.log(JSON.stringify({ ...result, kept: records.length }));
    await rt.close();
  } finally {
    await servers.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- main

const rows = await readRows(DATA);
const dir = mkdtempSync(join(tmpdir(), "edgeloop-bench-e2e-"));
console.log(`edgeloop end-to-end benchmark: ${rows.length} rows × n=${N} = ${rows.length * N} trajectories per batch, seed ${SEED}, ${RUNS} runs (medians)`);

try {
  if (ONLY.includes("throughput") || ONLY.includes("cost")) await throughputAndCost();
  if (ONLY.includes("cost")) await tokenWork();
  if (ONLY.includes("families")) await familyCost();
  if (ONLY.includes("scale")) await scale();
} finally {
  rmSync(dir, { recursive: true, force: true });
}

async function throughputAndCost(): Promise<void> {
  const servers = await startServers();
  const gwServers = await startServers({ gateway: true });
  const tools = toolsFile(dir, servers.tools_port);
  const configs: { name: string; flags: ConfigFlags; kind: "inproc" | "http"; cost: boolean; url?: string }[] = [
    { name: "CLI default: in-process engine, in-process tool server (loopback)", flags: {}, kind: "inproc", cost: false },
    { name: "in-process engine, tools over loopback (child process)", flags: { tools }, kind: "inproc", cost: true },
    { name: "vLLM adapter → sim engine over loopback HTTP (child)", flags: { tools, engine: servers.engine_urls[0], engineFormat: "vllm" }, kind: "http", cost: true, url: servers.engine_urls[0] },
    {
      name: "vLLM adapter → gateway (Bun.serve) → sim engine (child)",
      flags: { tools: toolsFile(dir, gwServers.tools_port), engine: gwServers.gateway_url!, engineFormat: "vllm" },
      kind: "http",
      cost: false,
    },
  ];
  const tp: string[][] = [["configuration", "traj/s", "engine calls/s", "verl num_turns/s", "CPU ms/traj (this proc)", "wall s", "failed"]];
  const cost: string[][] = [["configuration", "run CPU µs/call", "engine direct µs/call", "tools direct µs/call", "edgeloop µs/call (run − engine)", "÷ engine", "loop µs/call (run − engine − tools)", "÷ engine"]];
  let shape = "";
  try {
    for (const c of configs) {
      const rt = await buildRuntime({ n: N, seed: SEED, ...c.flags });
      try {
        const counter = instrument(rt);
        await runBatch(rt, rows, counter); // warm-up (JIT, connection pools, engine prefix cache)
        const results: BatchResult[] = [];
        for (let r = 0; r < RUNS; r++) results.push(await runBatch(rt, rows, counter));
        const last = results[results.length - 1]!;
        shape = `${last.trajectories} trajectories, ${last.engine_calls} engine calls (assistant turns), ${last.tool_calls} tool calls, verl num_turns ${last.num_turns}`;
        tp.push([
          c.name,
          f0(median(results.map((x) => x.trajectories / x.wall_s))),
          f0(median(results.map((x) => x.engine_calls / x.wall_s))),
          f0(median(results.map((x) => x.num_turns / x.wall_s))),
          f2(median(results.map((x) => x.cpu_us / x.trajectories / 1000))),
          f2(median(results.map((x) => x.wall_s))),
          String(last.failed),
        ]);
        if (!c.cost || !ONLY.includes("cost")) continue;

        // One recorded run, then replays of exactly its engine and tool calls.
        const runCpu: number[] = [];
        let calls: GenerateRequest[] = [];
        let tcalls: ToolCallRequest[] = [];
        for (let r = 0; r < RUNS; r++) {
          counter.recorded.length = 0;
          toolCalls.length = 0;
          counter.record(true);
          recordTools = true;
          const res = await runBatch(rt, rows, counter);
          counter.record(false);
          recordTools = false;
          runCpu.push(res.cpu_us / res.engine_calls);
          calls = [...counter.recorded];
          tcalls = [...toolCalls];
        }
        const concurrency = rt.config.concurrency;
        const tok = await defaultTokenizer();
        const script = { ...JSON.parse(readFileSync(DEFAULT_SCRIPT, "utf8")), seed: SEED };
        const engineCpu: number[] = [];
        const toolCpu: number[] = [];
        const toolClient = new WebhookToolClient(parseToolsFile(readFileSync(tools, "utf8")).tools);
        for (let r = 0; r < RUNS + 1; r++) {
          // A fresh engine (cold prefix cache, like the first turns of a batch) or a fresh HTTP client.
          const direct: InferenceClient =
            c.kind === "inproc" ? new SimEngineClient(new SimEngine({ tokenizer: tok, script })) : createEngineClient({ url: c.url!, format: "vllm" });
          const e = await cpuOf(() => pool(calls, concurrency, (q) => direct.generate({ ...q, request_id: crypto.randomUUID() })));
          const t = await cpuOf(() => pool(tcalls, concurrency, (q) => toolClient.call({ ...q, key: `${q.key}r${r}` })));
          if (r > 0) {
            engineCpu.push(e / calls.length);
            toolCpu.push(t / calls.length);
          }
        }
        const run = median(runCpu);
        const eng = median(engineCpu);
        const tl = median(toolCpu);
        cost.push([c.name, f0(run), f0(eng), f0(tl), f0(run - eng), f2((run - eng) / eng), f0(run - eng - tl), f2((run - eng - tl) / eng)]);
      } finally {
        await rt.close();
      }
    }
  } finally {
    await servers.stop();
    await gwServers.stop();
  }
  console.log(`per batch: ${shape}`);
  if (ONLY.includes("throughput")) printTable(`End-to-end throughput, zero-latency sim engine, n=${N} (medians of ${RUNS} batches)`, tp);
  if (ONLY.includes("cost")) {
    printTable("Orchestration CPU per engine call (this process; tool server and HTTP engine run in a child process)", cost);
    console.log(
      "run = whole batch's CPU ÷ engine calls; engine direct = the run's recorded engine calls replayed on a fresh client (in-process: includes\n" +
        "the sim engine's own work; HTTP: client side only); tools direct = the run's tool calls replayed on a WebhookToolClient, per engine call.",
    );
  }
}

/**
 * Where a trajectory's CPU goes outside the engine: the tokenizer work the
 * tool agent does per trajectory (first prompt) and per tool round (the
 * observation), against encoding just the observation's own text.
 */
async function tokenWork(): Promise<void> {
  const tok = await defaultTokenizer();
  const schemas = parseToolsFile(readFileSync(join(PACKAGE_ROOT, "infra", "tools", "tools.example.json"), "utf8"), { vars: { port: 1 } }).tools.map((t) => t.schema);
  const enc = new ObservationEncoder(tok, { tools: schemas });
  const obs = [{ role: "tool" as const, content: "31" }];
  const prompt = (rows[0] as { prompt: Parameters<typeof tok.renderIds>[0] }).prompt;
  const obsText = tok.decode(enc.encode(obs, tok.eosTokenId));
  const micro = (iters: number, f: () => unknown) => {
    f();
    const samples: number[] = [];
    for (let r = 0; r < Math.max(RUNS, 3); r++) {
      const c0 = process.cpuUsage();
      for (let i = 0; i < iters; i++) f();
      const c = process.cpuUsage(c0);
      samples.push((c.user + c.system) / iters);
    }
    return median(samples);
  };
  const t: string[][] = [["tokenizer work", "CPU µs", "when"]];
  t.push(["first prompt: renderIds(prompt, tools, generation prompt)", f0(micro(300, () => tok.renderIds(prompt, { tools: schemas, addGenerationPrompt: true }))), "once per trajectory (same for the n sessions of a row)"]);
  t.push(["observation: ObservationEncoder.encode(1 tool message)", f0(micro(300, () => enc.encode(obs, tok.eosTokenId))), "once per tool round"]);
  t.push([`  encode() of the observation's own text (${JSON.stringify(obsText).length} chars)`, f0(micro(3000, () => tok.encode(obsText))), "what the tokens alone cost"]);
  printTable("Tokenizer work inside the tool agent (Qwen3 tokenizer, the example tools' schemas)", t);
}

/** A cheap key for a prompt (length and two 32-bit hashes): the replay's lookup should cost next to nothing. */
function idsKey(ids: ArrayLike<number>): string {
  let a = 0x2f6b9c1d;
  let b = 0x63d2a5e7;
  for (let i = 0; i < ids.length; i++) {
    a = hashInt(a, ids[i]!);
    b = hashInt(b, ids[i]! + 0x9e3779b9);
  }
  return `${ids.length}-${a}-${b}`;
}

/**
 * Part 2b: per family, edgeloop's own CPU per engine call on the example
 * batch (engine replies and tool results replayed from memory after a real
 * batch), with the token core's share and the observation floor measured in
 * the same run.
 */
async function familyCost(): Promise<void> {
  const table: string[][] = [
    [
      "family",
      "engine calls",
      "replayed (engine / tools)",
      "µs/call incl. token core",
      "token core µs/call",
      "µs/call excl. token core",
      "observations/call",
      "observation µs",
      "observation floor µs",
      "÷ floor",
    ],
  ];
  for (const model of MODELS) {
    const rt = await buildRuntime({ n: N, seed: SEED, model });
    try {
      const client = rt.client as InferenceClient & { generate: InferenceClient["generate"] };
      const inner = client.generate.bind(client);
      const replies = new Map<string, Awaited<ReturnType<InferenceClient["generate"]>>>();
      let replay = false;
      let calls = 0;
      let engineHits = 0;
      client.generate = async (q) => {
        calls++;
        // The session index (not the random uid) and the prompt ids decide the sim engine's reply.
        const k = `${q.routing_key?.replace(/^.*_(\d+)_\d+$/, "$1")}|${idsKey(q.prompt_ids)}`;
        const hit = replay ? replies.get(k) : undefined;
        if (hit) {
          engineHits++;
          return { ...hit, extra_fields: { ...hit.extra_fields } };
        }
        const out = await inner(q);
        replies.set(k, out);
        return out;
      };
      const results = new Map<string, Awaited<ReturnType<WebhookToolClient["call"]>>>();
      let toolHits = 0;
      let toolCalls = 0;
      const proto = WebhookToolClient.prototype;
      const innerCall = proto.call;
      proto.call = async function (this: WebhookToolClient, req: ToolCallRequest) {
        toolCalls++;
        const k = `${req.name}|${JSON.stringify(req.arguments)}`;
        const hit = replay ? results.get(k) : undefined;
        if (hit) {
          toolHits++;
          return { ...hit, call_id: `${req.key}:${req.turn}:${req.index}` };
        }
        const r = await innerCall.call(this, req);
        results.set(k, r);
        return r;
      };
      try {
        await rt.service.submit(RolloutRequest.parse({ rows })).run.run(); // real engine and tools; fills the replay maps
        replay = true;
        await rt.service.submit(RolloutRequest.parse({ rows })).run.run(); // warm-up of the replayed path
        const perCall: number[] = [];
        const corePerCall: number[] = [];
        let c0 = { calls: 0, engineHits: 0, toolCalls: 0, toolHits: 0 };
        let obsPer = 0;
        let obsUs = 0;
        for (let r = 0; r < RUNS; r++) {
          c0 = { calls, engineHits, toolCalls, toolHits };
          tokenCore.reset();
          tokenCore.on = true;
          const cpu0 = process.cpuUsage();
          await rt.service.submit(RolloutRequest.parse({ rows })).run.run();
          const cpu = process.cpuUsage(cpu0);
          tokenCore.on = false;
          const n = calls - c0.calls;
          perCall.push((cpu.user + cpu.system) / n);
          corePerCall.push((tokenCore.obsUs + tokenCore.promptUs) / n);
          obsPer = tokenCore.observations / n;
          obsUs = tokenCore.obsUs / Math.max(1, tokenCore.observations);
        }
        const tok = await builtinTokenizer(model);
        const texts = tokenCore.sample.map((ids) => tok.decode(ids));
        const floor = median(
          Array.from({ length: Math.max(RUNS, 3) }, () => {
            const f0 = process.cpuUsage();
            for (let i = 0; i < 5; i++) for (const t of texts) tok.encode(t);
            const f = process.cpuUsage(f0);
            return (f.user + f.system) / (5 * texts.length);
          }),
        );
        const n = calls - c0.calls;
        const all = median(perCall);
        const core = median(corePerCall);
        table.push([
          model,
          String(n),
          `${engineHits - c0.engineHits}/${n} / ${toolHits - c0.toolHits}/${toolCalls - c0.toolCalls}`,
          f0(all),
          f0(core),
          f0(all - core),
          f2(obsPer),
          f0(obsUs),
          f1(floor),
          f1(obsUs / floor),
        ]);
      } finally {
        proto.call = innerCall;
        client.generate = inner;
      }
    } finally {
      await rt.close();
    }
  }
  printTable(`Orchestration CPU per engine call by family: the example batch, n=${N}, engine replies and tool results replayed from memory (medians of ${RUNS} batches)`, table);
  console.log(
    "token core = CPU inside ObservationEncoder.encode and the tokenizer's renderText/encode elsewhere (the initial prompt), measured in the same batches;\n" +
      "observation floor = encode() of the same observations' text (up to 500 of them), in this process.",
  );
}

async function scale(): Promise<void> {
  const results: ScaleResult[] = [];
  for (const cap of MAX_HTTP) {
    const env: Record<string, string> = { ...(process.env as Record<string, string>) };
    if (cap === "default") delete env.BUN_CONFIG_MAX_HTTP_REQUESTS;
    else env.BUN_CONFIG_MAX_HTTP_REQUESTS = cap;
    const p = Bun.spawn([process.execPath, import.meta.path, "--scale-child", ...process.argv.slice(2)], { stdout: "pipe", stderr: "inherit", env });
    const out = await new Response(p.stdout).text();
    if ((await p.exited) !== 0) throw new Error(`scale run exited with ${p.exitCode}`);
    results.push(JSON.parse(out.trim().split("\n").pop()!));
  }
  const row = (name: string, f: (r: ScaleResult) => string) => [name, ...results.map(f)];
  const table: string[][] = [
    row("Bun fetch cap (BUN_CONFIG_MAX_HTTP_REQUESTS)", (r) => (r.max_http_requests === "default" ? "default (256)" : r.max_http_requests)),
    row("trajectories (ok / failed)", (r) => `${r.trajectories} (${r.ok} / ${r.failed})`),
    row("engine calls / tool calls (tool errors)", (r) => `${r.engine_calls} / ${r.tool_calls} (${r.tool_errors})`),
    row("max in flight: engine / tool server", (r) => `${r.engine_max_inflight} / ${r.tools_max_inflight}`),
    row("critical-path ideal (longest trajectory)", (r) => `${f2(r.ideal_s)} s = ${r.longest.turns}×${ENGINE_MS} ms + ${r.longest.rounds}×${TOOL_MS} ms`),
    row("completion time (last record)", (r) => `${f1(r.wall_s)} s = ${f1(r.wall_s / r.ideal_s)} × ideal`),
    row("first / median / p90 record at", (r) => `${f1(r.first_s)} / ${f1(r.p50_s)} / ${f1(r.p90_s)} s`),
    row("CPU of the edgeloop process", (r) => `${f1(r.cpu_s)} s (${f0((r.cpu_s * 1e6) / r.trajectories)} µs/traj)`),
    row("RSS at start / before submit", (r) => `${mib(r.rss_start)} / ${mib(r.rss_before)} MiB`),
    row("peak RSS: VmHWM / max of 100 ms samples", (r) => `${mib(r.rss_hwm)} / ${mib(r.rss_peak_sampled)} MiB`),
    row("peak − before submit, per trajectory", (r) => `${f1((r.rss_hwm - r.rss_before) / r.trajectories / 1024)} KiB`),
    row("after the run + full GC: RSS / JS heap", (r) => `${mib(r.rss_after_gc)} / ${mib(r.heap_after_gc)} MiB`),
  ];
  table.unshift(["measure", ...results.map((_, i) => `run ${i + 1}`)]);
  printTable(`Scale: ${results[0]!.trajectories} trajectories at once (concurrency ${results[0]!.trajectories}), in-process engine ${ENGINE_MS} ms/request, tools over loopback ${TOOL_MS} ms/call (tool timeout ${TOOL_TIMEOUT_MS} ms)`, table);
  for (const [i, r] of results.entries()) {
    if (r.errors.length) console.log(`run ${i + 1} first errors: ${r.errors.map((e) => `${e.key}: ${e.error.slice(0, 160)}`).join(" | ")}`);
  }
}
