/**
 * `/metrics` scraped from real processes and parsed as Prometheus text (the operator trial's N9):
 * - queue mode: `edgeloop serve` + `edgeloop worker --metrics-port 0`; the worker exposes its own tool and
 *   engine calls and job counts, serve its followed records; every count is compared with an independent
 *   one (the tool server's call ids, a counting proxy in front of the engine, the stored records);
 * - inline `serve`: `edgeloop_tool_calls_total` equals the latency histogram's `_count`;
 * - every family is a counter, gauge or histogram, and no gauge carries `quantile`/`stat` labels.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { spawnCli, spawnServe, until, type CliProc } from "../chaos/store-harness.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { countingToolServer } from "../session/crash.ts";
import { POLICY, ROOT, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const redis = await requireRedis();

/** One parsed exposition: per family its TYPE and samples (`name{labels}` → value), in order. */
interface Exposition {
  types: Map<string, string>;
  samples: Map<string, number>;
  /** Every sample's family name (the `_bucket`/`_sum`/`_count` suffix stripped for histograms). */
  familyOf: Map<string, string>;
}

/**
 * Parses Prometheus text format 0.0.4 strictly enough to catch a malformed line: every sample line is
 * `name{k="v",…} value` of a family declared by `# TYPE` before it.
 * @see https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format
 */
function parseExposition(text: string): Exposition {
  const types = new Map<string, string>();
  const samples = new Map<string, number>();
  const familyOf = new Map<string, string>();
  expect(text.endsWith("\n")).toBe(true);
  for (const line of text.slice(0, -1).split("\n")) {
    if (line.startsWith("# HELP ")) continue;
    const t = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/.exec(line);
    if (t) {
      expect(types.has(t[1]!)).toBe(false);
      types.set(t[1]!, t[2]!);
      continue;
    }
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not an exposition line: ${line}`);
    const name = m[1]!;
    const base = types.has(name) ? name : name.replace(/_(bucket|sum|count)$/, "");
    const type = types.get(base);
    if (!type) throw new Error(`sample ${name} before its # TYPE`);
    if (base !== name) expect(type).toBe("histogram");
    const key = `${name}${m[2] ?? ""}`;
    expect(samples.has(key)).toBe(false);
    samples.set(key, m[3] === "+Inf" ? Infinity : Number(m[3]));
    familyOf.set(key, base);
  }
  return { types, samples, familyOf };
}

/** Each family is a counter, gauge or histogram; no gauge encodes statistics in `quantile`/`stat` labels; histograms are cumulative. */
function conventional(e: Exposition): void {
  for (const [name, type] of e.types) {
    expect([name, ["counter", "gauge", "histogram"].includes(type)]).toEqual([name, true]);
    if (type === "counter") expect([name, name.endsWith("_total")]).toEqual([name, true]);
  }
  for (const [key, fam] of e.familyOf) {
    if (e.types.get(fam) === "gauge") expect([key, /[{,](quantile|stat)="/.test(key)]).toEqual([key, false]);
  }
  for (const [fam, type] of e.types) {
    if (type !== "histogram") continue;
    // Within each label set, bucket counts never go down and +Inf equals _count.
    const byLabels = new Map<string, number[]>();
    for (const [key, v] of e.samples) {
      if (!key.startsWith(`${fam}_bucket{`)) continue;
      const rest = key.slice(`${fam}_bucket{`.length, -1).replace(/,?le="[^"]*"/, "");
      byLabels.set(rest, [...(byLabels.get(rest) ?? []), v]);
      if (key.includes('le="+Inf"')) expect(v).toBe(e.samples.get(`${fam}_count${rest ? `{${rest}}` : ""}`)!);
    }
    for (const counts of byLabels.values()) expect(counts).toEqual([...counts].sort((a, b) => a - b));
  }
}

const scrape = async (url: string) => {
  const res = await fetch(url, { signal: AbortSignal.timeout(10_000) });
  expect([res.status, res.headers.get("content-type")]).toEqual([200, "text/plain; version=0.0.4; charset=utf-8"]);
  return parseExposition(await res.text());
};

describe.skipIf(!redis)("/metrics of real processes", () => {
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-metrics-"));
  const prefixes: string[] = [];
  const procs: CliProc[] = [];
  let engine: RunningSimEngine;
  let proxy: ReturnType<typeof Bun.serve>;
  let engineCalls = 0;
  let engineUrl: string;
  let tools: ReturnType<typeof countingToolServer>;
  let toolsFile: string;

  beforeAll(async () => {
    engine = await startSimEngine({ script: { ...POLICY, seed: 7 }, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 0 } });
    // Counts the generate calls that reach the engine (vLLM's completions route), whoever makes them.
    proxy = Bun.serve({
      port: 0,
      hostname: "127.0.0.1",
      async fetch(req) {
        const u = new URL(req.url);
        if (req.method === "POST" && u.pathname === "/v1/completions") engineCalls++;
        const body = req.method === "GET" || req.method === "HEAD" ? undefined : await req.arrayBuffer();
        return fetch(`${engine.urls[0]}${u.pathname}${u.search}`, { method: req.method, headers: req.headers, body, signal: AbortSignal.timeout(30_000) });
      },
    });
    engineUrl = `http://127.0.0.1:${proxy.port}`;
    tools = countingToolServer();
    toolsFile = join(dir, "tools.json");
    writeFileSync(toolsFile, readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8").replaceAll("{port}", new URL(tools.url).port));
  });
  afterAll(async () => {
    for (const p of procs) if (p.proc.exitCode === null) p.proc.kill(9);
    proxy.stop(true);
    await engine.stop();
    tools.stop();
    for (const p of prefixes) await deleteByPrefix(p);
    rmSync(dir, { recursive: true, force: true });
  });

  // Distinct uids per test: the tool server counts calls by call id, and call ids derive from the key.
  const submit = async (url: string, uid: string) => {
    const rows = ROWS.slice(0, 6).map((r, i) => ({ ...r, uid: `${uid}${i}` }));
    const res = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, config: { rollout: { n: 2 } } }), signal: AbortSignal.timeout(10_000) });
    expect(res.status).toBe(202);
    const { batch_id, keys } = (await res.json()) as { batch_id: string; keys: string[] };
    expect(keys.length).toBe(12);
    await until(async () => ((await (await fetch(`${url}/v1/rollouts/${batch_id}`)).json()) as { done: boolean }).done, "the batch done", HANG_MS);
    const records = await Promise.all(keys.map(async (k) => (await (await fetch(`${url}/v1/trajectories/${k}`)).json()) as TrajectoryRecord));
    return { batch_id, records };
  };
  const recordToolCalls = (records: TrajectoryRecord[]) => records.reduce((n, r) => n + Number((r.extra_fields as { tool_calls?: number }).tool_calls ?? 0), 0);

  test("queue mode: the worker's --metrics-port serves its tool and engine calls and job counts; serve's its followed records", async () => {
    const prefix = randomPrefix("metrics-q");
    prefixes.push(prefix);
    const common = ["--store", REDIS_URL, "--store-prefix", prefix, "--engine", engineUrl, "--tools", toolsFile, "--max-model-len", "4096"];
    const serve = await spawnServe([...common, "--jobs", "queue", "--seed", "7"]);
    procs.push(serve);
    const worker = spawnCli(["worker", ...common, "--metrics-port", "0", "--concurrency", "4"]);
    procs.push(worker);
    const metricsUrl = await until(async () => /worker {5}metrics on (http:\/\/\S+\/metrics)/.exec(worker.err())?.[1], "the worker's metrics line", HANG_MS);
    const before = await scrape(metricsUrl);
    expect(before.samples.get("edgeloop_tool_calls_total")).toBe(0);
    expect(before.samples.get('edgeloop_worker_jobs_total{event="claimed"}')).toBe(0);
    const callsBefore = engineCalls;

    const { records } = await submit(serve.url, "q");
    expect(records.every((r) => r.error === null)).toBe(true);
    const toolCalls = recordToolCalls(records);
    // The example policy on these rows: 18 tool calls parsed, 2 of them error observations edgeloop answered
    // itself (never sent); the other 16 reached the tool server once each (its call ids).
    const recordErrors = records.reduce((n, r) => n + Number((r.extra_fields as { tool_errors?: number }).tool_errors ?? 0), 0);
    expect([toolCalls, recordErrors, tools.requests.size]).toEqual([18, 2, 16]);

    // A job counts as completed once acknowledged, just after its record is stored (which ended the batch).
    const w = await until(async () => {
      const e = await scrape(metricsUrl);
      return e.samples.get('edgeloop_worker_jobs_total{event="completed"}') === 12 && e.samples.get("edgeloop_worker_jobs_running") === 0 ? e : null;
    }, "the worker's 12 completed jobs, none running", 30_000);
    conventional(w);
    expect(w.samples.get("edgeloop_tool_calls_total")).toBe(16);
    expect(w.samples.get("edgeloop_tool_call_duration_seconds_count")).toBe(16);
    expect(w.samples.get('edgeloop_tool_call_duration_seconds_bucket{le="+Inf"}')).toBe(16);
    expect(w.samples.get("edgeloop_tool_call_errors_total")).toBe(0);
    // 30 generate calls reached the engine (the counting proxy), all from the worker.
    expect([engineCalls - callsBefore, w.samples.get('edgeloop_engine_request_duration_seconds_count{outcome="ok"}')]).toEqual([30, 30]);
    expect(w.samples.get('edgeloop_engine_request_duration_seconds_count{outcome="error"}')).toBe(0);
    // Every generated token is an action token of some record (mask 1); no call was retried.
    const actions = records.reduce((n, r) => n + r.response_mask.filter((m) => m === 1).length, 0);
    expect([w.samples.get("edgeloop_engine_generated_tokens_total"), w.samples.get("edgeloop_engine_retries_total")]).toEqual([actions, 0]);
    expect(w.samples.get("edgeloop_engine_prompt_tokens_total")).toBeGreaterThan(records.reduce((n, r) => n + r.prompt_ids.length, 0));
    expect(["claimed", "completed", "failed", "reclaimed", "refused"].map((e) => w.samples.get(`edgeloop_worker_jobs_total{event="${e}"}`))).toEqual([12, 12, 0, 0, 0]);
    expect([w.samples.get("edgeloop_worker_jobs_running"), w.samples.get("edgeloop_worker_concurrency")]).toEqual([0, 4]);
    // Only /metrics is served there.
    expect((await fetch(metricsUrl.replace("/metrics", "/v1/rollouts"))).status).toBe(404);

    // serve made no tool call (the worker did): its two tool counts agree at 0; its record families count the batch.
    const s = await scrape(`${serve.url}/metrics`);
    conventional(s);
    expect([s.samples.get("edgeloop_tool_calls_total"), s.samples.get("edgeloop_tool_call_duration_seconds_count")]).toEqual([0, 0]);
    expect([s.samples.get("edgeloop_engine_paused"), s.samples.get("edgeloop_engine_inflight"), s.samples.get("edgeloop_engine_generated_tokens_total")]).toEqual([0, 0, 0]);
    expect([s.samples.get('edgeloop_trajectories_total{outcome="ok"}'), s.samples.get("edgeloop_tool_errors_total")]).toEqual([12, 2]);
    for (const field of ["generate_sequences", "tool_calls", "compute_score"]) expect(s.samples.get(`edgeloop_agent_loop_seconds_count{field="${field}"}`)).toBe(12);
    expect(s.samples.get("edgeloop_agent_loop_num_preempted_count")).toBe(12);
    const toolSeconds = records.reduce((n, r) => n + r.metrics.tool_calls, 0);
    expect(s.samples.get('edgeloop_agent_loop_seconds_sum{field="tool_calls"}')).toBeCloseTo(toolSeconds, 9);

    worker.proc.kill("SIGTERM");
    expect(await worker.proc.exited).toBe(0);
  }, HANG_MS);

  test("inline serve: edgeloop_tool_calls_total equals the latency histogram's count and the tool server's calls", async () => {
    const prefix = randomPrefix("metrics-i");
    prefixes.push(prefix);
    const before = tools.requests.size;
    const serve = await spawnServe(["--store", REDIS_URL, "--store-prefix", prefix, "--jobs", "inline", "--engine", engineUrl, "--tools", toolsFile, "--max-model-len", "4096", "--seed", "7"]);
    procs.push(serve);
    const { records } = await submit(serve.url, "i");
    expect([recordToolCalls(records), tools.requests.size - before]).toEqual([18, 16]);
    const s = await scrape(`${serve.url}/metrics`);
    conventional(s);
    expect([s.samples.get("edgeloop_tool_calls_total"), s.samples.get("edgeloop_tool_call_duration_seconds_count"), s.samples.get("edgeloop_tool_errors_total")]).toEqual([16, 16, 2]);
    expect(s.samples.get('edgeloop_trajectories_total{outcome="ok"}')).toBe(12);
    expect(s.types.get("edgeloop_agent_loop_seconds")).toBe("histogram");
    expect([...s.types.keys()].some((n) => n === "edgeloop_agent_loop_tool_call_latency_seconds")).toBe(false);
  }, HANG_MS);
});
