import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { awaitGroups, awaitRecords, batchRows, checkE4Record, checkRecords, comparableRecord, e4Row, ROOT, RUNTIME_CONFIG, startServices, type Services } from "./harness.ts";
import { bunReference } from "./reference.ts";
import { startAgentServer, type AgentServer } from "../../infra/agent-example/server.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { waitFor } from "../helpers/wait.ts";

// The Deno entry started as `deno task serve` (deno.json), with the deno binary from the npm package,
// against the loopback services; its store is Upstash REST (the bridge), so sessions checkpoint there too.
const redis = await requireRedis();
let s: Services;
let proc: Bun.Subprocess<"ignore", "pipe", "pipe"> | undefined;
let url = "";
let dir = "";
let startMs = 0;
let agent: AgentServer | undefined;
// An OTLP/HTTP collector on loopback: the Deno entry exports its spans here (OTEL_EXPORTER_OTLP_ENDPOINT).
const otlp: { path: string; body: string }[] = [];
let collector: ReturnType<typeof Bun.serve> | undefined;

beforeAll(async () => {
  if (!redis) return;
  s = await startServices("deno");
  // The example agent (openai SDK) behind its task webhook: rows with agent_name openai_agent run through it.
  agent = startAgentServer({ port: 0, secret: "agent-secret" });
  collector = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    async fetch(req) {
      otlp.push({ path: new URL(req.url).pathname, body: await req.text() });
      return Response.json({});
    },
  });
  dir = mkdtempSync(join(tmpdir(), "edgeloop-deno-"));
  writeFileSync(join(dir, "tools.json"), s.toolsJson);
  // The multi-output loop of edge case E1 is registered too (rows pick it by agent_name).
  const loops = join(ROOT, "tests", "agent-loop", "fixtures", "multi-output-loops.yaml");
  writeFileSync(join(dir, "config.json"), JSON.stringify({ ...RUNTIME_CONFIG, rollout: { ...RUNTIME_CONFIG.rollout, agent: { agent_loop_config_path: loops } } }));
  const t0 = performance.now();
  const p = Bun.spawn([join(ROOT, "node_modules", ".bin", "deno"), "task", "serve"], {
    cwd: ROOT,
    env: {
      ...process.env,
      NO_COLOR: "1",
      PORT: "0",
      EDGELOOP_CONFIG: join(dir, "config.json"),
      EDGELOOP_ENGINE: s.engine.urls[0]!,
      EDGELOOP_TOOLS: join(dir, "tools.json"),
      EDGELOOP_TOOLS_SECRET: "runtime-secret",
      EDGELOOP_ALLOW_ANONYMOUS: "1",
      EDGELOOP_STORE: "upstash",
      EDGELOOP_STORE_PREFIX: s.prefix,
      UPSTASH_REDIS_REST_URL: s.bridge.url,
      UPSTASH_REDIS_REST_TOKEN: s.token,
      EDGELOOP_AGENT_URL: `${agent.url}/tasks`,
      EDGELOOP_AGENT_SECRET: "agent-secret",
      EDGELOOP_AGENT_TIMEOUT_MS: "30000",
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${collector.port}`,
      OTEL_SERVICE_NAME: "edgeloop-deno-test",
    },
    stdin: "ignore",
    stdout: "pipe",
    stderr: "pipe",
  });
  proc = p;
  const reader = p.stdout.getReader();
  let out = "";
  const deadline = Date.now() + 45_000;
  while (!/serving on (http:\/\/\S+)/.test(out)) {
    if (Date.now() > deadline) throw new Error(`deno did not start: ${out}${await new Response(p.stderr).text()}`);
    const { value, done } = await reader.read();
    if (done) throw new Error(`deno exited: ${out}${await new Response(p.stderr).text()}`);
    out += new TextDecoder().decode(value);
  }
  reader.releaseLock();
  url = /serving on (http:\/\/\S+)/.exec(out)![1]!;
  startMs = performance.now() - t0;
}, HANG_MS);

afterAll(async () => {
  if (proc) {
    proc.kill("SIGTERM");
    await proc.exited;
  }
  await agent?.stop();
  collector?.stop(true);
  await s?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

describe.skipIf(!redis)("Deno entry (deno task serve)", () => {
  test("POST /v1/rollouts runs the batch as durable sessions; records land in Redis through Upstash REST, identical to Bun's", async () => {
    expect(await (await fetch(`${url}/health`)).json()).toEqual({ ok: true, runtime: "deno" });
    const rows = batchRows("dn");
    const t0 = performance.now();
    const res = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    expect(((await res.json()) as { keys: string[] }).keys).toEqual(["dn0_0_0", "dn0_1_0", "dn1_0_0", "dn1_1_0", "dn2_0_0", "dn2_1_0", "dn3_0_0", "dn3_1_0"]);
    const records = await awaitRecords(s.prefix, ["dn0", "dn1", "dn2", "dn3"], 2);
    const batchMs = performance.now() - t0;
    expect(checkRecords(records)).toBe(10);
    // Checkpoints were in the same Redis: every session is done, and the session endpoint says so.
    expect(await (await fetch(`${url}/v1/sessions/dn0_0_0`)).json()).toMatchObject({ phase: "done", loop_state: "terminated" });
    const reference = await bunReference(s, rows);
    for (const [key, r] of records) expect(comparableRecord(r)).toEqual(comparableRecord(reference.get(key)!));
    console.log(`deno: started in ${Math.round(startMs)} ms, 8 trajectories in ${Math.round(batchMs)} ms`);
  }, HANG_MS);

  test("E1 on Deno: a loop with 2, 3 and 0 outputs per session writes every output; groups complete once their sessions finished", async () => {
    const base = { data_source: "edge", prompt: [{ role: "user", content: "Say hi." }], reward_model: { style: "rule", ground_truth: "1" }, agent_name: "multi_output_agent" };
    const rows = [
      { ...base, uid: "dnm0" },
      { ...base, uid: "dnm3", extra_info: { outputs: 3 } },
      { ...base, uid: "dnm-none", extra_info: { outputs: 0 } },
    ];
    const res = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix: s.prefix });
    try {
      expect(await awaitGroups(s.prefix, rows.map((r) => r.uid))).toEqual([
        ["dnm0", 2, 2, 4, 0],
        ["dnm3", 2, 2, 6, 0],
        ["dnm-none", 2, 2, 0, 0],
      ]);
      expect((await q.sessionRecords("dnm0", 1))!.map((r) => [r.key, r.agent_name, r.error])).toEqual([
        ["dnm0_1_0", "multi_output_agent", null],
        ["dnm0_1_1", "multi_output_agent", null],
      ]);
      expect((await q.sessionRecords("dnm3", 0))!.map((r) => r.key)).toEqual(["dnm3_0_0", "dnm3_0_1", "dnm3_0_2"]);
      expect(await q.sessionRecords("dnm-none", 0)).toEqual([]);
      expect(await (await fetch(`${url}/v1/sessions/dnm3_1_0`)).json()).toMatchObject({ phase: "done" });
    } finally {
      await q.close();
    }
  }, HANG_MS);

  test("E4: a turn ended by <|endoftext|> is kept (mask 1) and closed by the observation (<|im_end|>\\n, mask 0), in durable sessions", async () => {
    const res = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [e4Row("dne4")] }) });
    expect(res.status).toBe(202);
    const records = await awaitRecords(s.prefix, ["dne4"], 2);
    expect([...records.keys()]).toEqual(["dne4_0_0", "dne4_1_0"]);
    for (const r of records.values()) checkE4Record(r);
  }, HANG_MS);

  test("openai_agent on Deno: the example SDK agent's calls are served by the Deno entry; tokens equal tool_agent's", async () => {
    const rows = batchRows("dna").map((r) => ({ ...r, agent_name: "openai_agent" }));
    const res = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows }) });
    expect(res.status).toBe(202);
    const records = await awaitRecords(s.prefix, ["dna0", "dna1", "dna2", "dna3"], 2);
    const reference = await bunReference(s, batchRows("dna"));
    expect([...records.keys()].sort()).toEqual([...reference.keys()].sort());
    for (const [key, r] of records) {
      const ref = reference.get(key)!;
      expect([r.agent_name, r.error]).toEqual(["openai_agent", null]);
      expect(r.prompt_ids).toEqual(ref.prompt_ids);
      expect(r.response_ids).toEqual(ref.response_ids);
      expect(r.response_mask).toEqual(ref.response_mask);
      expect(r.rollout_log_probs).toEqual(ref.rollout_log_probs);
      expect(r.reward_score).toBe(ref.reward_score);
    }
  }, HANG_MS);
  test("tracing: with OTEL_EXPORTER_OTLP_ENDPOINT the Deno entry exports its spans over OTLP/HTTP (JSON)", async () => {
    const res = await fetch(`${url}/v1/rollouts`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: batchRows("dnt").slice(0, 1) }) });
    expect(res.status).toBe(202);
    await awaitRecords(s.prefix, ["dnt0"], 2);
    // The batch span processor exports within its 5 s schedule.
    const names = () => otlp.flatMap((r) => (JSON.parse(r.body).resourceSpans ?? []).flatMap((rs: any) => rs.scopeSpans.flatMap((ss: any) => ss.spans.map((x: { name: string }) => x.name))));
    await waitFor(() => names().includes("inference.generate"), "an inference.generate span exported", HANG_MS, 100);
    expect(otlp.every((r) => r.path === "/v1/traces")).toBe(true);
    for (const n of ["agent_loop.run", "agent_loop.turn", "inference.generate", "tool.call"]) expect(names()).toContain(n);
    expect(otlp.some((r) => r.body.includes('"stringValue":"edgeloop-deno-test"'))).toBe(true);
    // Context propagates across awaits on Deno (AsyncLocalStorage): every engine call's parent is a turn span.
    const spans = otlp.flatMap((r) => (JSON.parse(r.body).resourceSpans ?? []).flatMap((rs: any) => rs.scopeSpans.flatMap((ss: any) => ss.spans))) as { name: string; spanId: string; parentSpanId?: string }[];
    const turns = new Set(spans.filter((x) => x.name === "agent_loop.turn").map((x) => x.spanId));
    const calls = spans.filter((x) => x.name === "inference.generate");
    expect(calls.length).toBeGreaterThan(0);
    expect(calls.filter((c) => !turns.has(c.parentSpanId ?? "")).length).toBe(0);
  }, HANG_MS);
});
