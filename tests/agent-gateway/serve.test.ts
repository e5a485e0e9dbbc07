/**
 * The agent gateway at process level: `edgeloop serve` (Redis store, inline
 * jobs, `openai_agent` for every row) with the sim engine and the agents in
 * this process, so engine calls are counted across serve restarts; and a
 * gateway child process killed right after a turn's commit.
 */
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { calcToolContent } from "../../infra/tools/calc.ts";
import { lookupFact } from "../../infra/tools/lookup.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { ChatMessage, ToolSchema, TrajectoryRecord } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { post, progress, spawnCli, spawnServe, until, type CliProc } from "../chaos/store-harness.ts";
import { SP } from "../agent-loop/helpers.ts";
import { sessionTag } from "../../shared/agent-gateway/conversation.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const ROOT = join(import.meta.dir, "..", "..");
const script = JSON.parse(readFileSync(join(ROOT, "examples", "policy.json"), "utf8"));
const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8")
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l) as { prompt: ChatMessage[]; data_source: string; reward_model: unknown });
const IM_END = 151645;
const redis = await requireRedis();
const prefixes: string[] = [];
const procs: CliProc[] = [];
let tok: ChatTokenizer;
let tools: ToolSchema[];

beforeAll(async () => {
  tok = await defaultTokenizer();
  tools = parseToolsFile(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8"), { vars: { port: 1 } }).tools.map((t) => t.schema);
});
afterAll(async () => {
  for (const p of procs) if (p.proc.exitCode === null) p.proc.kill(9);
  for (const p of prefixes) await deleteByPrefix(p);
});

/** What one test agent run did. */
interface AgentRun {
  key: string;
  steps: number;
  answer: string | null;
  /** Fetch attempts of the SDK that failed at the connection (serve down). */
  failedAttempts: number;
  finishStatus: number;
}

/**
 * The test agents: a webhook (`POST /tasks` → 202) that runs one SDK agent
 * per task (the example agent's ReAct loop: calc and lookup answered as the
 * example tool server answers them). `beforeCall(key, step)` may hold a call.
 */
function startAgents(opts: { maxRetries?: number; beforeCall?: (key: string, step: number) => Promise<void>; onTask?: (task: AgentTask) => void } = {}) {
  const runs: Promise<AgentRun>[] = [];
  let failures = 0;
  const done: AgentRun[] = [];
  const run = async (task: AgentTask): Promise<AgentRun> => {
    const r: AgentRun = { key: task.key, steps: 0, answer: null, failedAttempts: 0, finishStatus: 0 };
    const counted = async (u: string | URL | Request, i?: RequestInit) => {
      try {
        return await fetch(u, i);
      } catch (e) {
        r.failedAttempts++;
        failures++;
        throw e;
      }
    };
    const client = new OpenAI({ baseURL: task.base_url, apiKey: task.api_key, maxRetries: opts.maxRetries ?? 2, fetch: counted, timeout: 60_000 });
    const messages = [...task.messages] as OpenAI.ChatCompletionMessageParam[];
    while (r.steps < 8) {
      await opts.beforeCall?.(task.key, r.steps + 1);
      const c = await client.chat.completions.create({ model: task.model, messages, tools: task.tools as OpenAI.ChatCompletionTool[] });
      r.steps++;
      const m = c.choices[0]!.message;
      r.answer = m.content;
      if (!m.tool_calls?.length) break;
      messages.push(m as OpenAI.ChatCompletionMessageParam);
      for (const call of m.tool_calls) {
        if (call.type !== "function") throw new Error("custom tool call");
        const args = JSON.parse(call.function.arguments) as Record<string, unknown>;
        const content = call.function.name === "calc" ? calcToolContent(args) : lookupFact(String(args.query));
        messages.push({ role: "tool", tool_call_id: call.id, content });
      }
    }
    for (let attempt = 0; attempt < 20; attempt++) {
      const res = await counted(task.finish_url, { method: "POST", headers: { authorization: `Bearer ${task.api_key}`, "content-type": "application/json" }, body: "{}" }).catch(() => null);
      if (res) {
        r.finishStatus = res.status;
        await res.text();
        if (res.status < 500) break;
      }
      await Bun.sleep(250);
    }
    done.push(r);
    return r;
  };
  const server = Bun.serve({
    hostname: "127.0.0.1",
    port: 0,
    idleTimeout: 0,
    fetch: async (req) => {
      const task = AgentTask.parse(await req.json());
      opts.onTask?.(task);
      runs.push(run(task));
      return new Response(null, { status: 202 });
    },
  });
  return { url: `http://127.0.0.1:${server.port}/tasks`, runs, done, failures: () => failures, stop: () => server.stop(true) };
}

/** Whether a running agent saw a connection fail. */
function runFailed(agents: ReturnType<typeof startAgents>): boolean {
  return agents.failures() > 0;
}

/** A port free now (bound and released). */
function freePort(): number {
  const s = Bun.serve({ hostname: "127.0.0.1", port: 0, fetch: () => new Response() });
  const p = s.port!;
  s.stop(true);
  return p;
}

/** `edgeloop serve` on a fixed port; resolves once it listens. */
async function serveOn(port: number, args: string[]): Promise<CliProc> {
  const p = spawnCli(["serve", "--port", String(port), ...args]);
  procs.push(p);
  await until(async () => /serving on/.test(p.out()) || (p.proc.exitCode !== null ? Promise.reject(new Error(p.err())) : false), `serve on ${port}`, HANG_MS, 50);
  return p;
}

/** Reads and acks complete groups until `count` arrived (or `timeoutMs`). */
async function drainRecords(base: string, count: number, timeoutMs = 30_000): Promise<Map<string, TrajectoryRecord[]>> {
  const groups = new Map<string, TrajectoryRecord[]>();
  const deadline = Date.now() + timeoutMs;
  while (groups.size < count && Date.now() < deadline) {
    const res = await fetch(`${base}/v1/groups?max=200&block_ms=500&consumer=trainer`);
    expect(res.status).toBe(200);
    const body = (await res.json()) as { groups: { uid: string; delivery_id: string; records: TrajectoryRecord[] }[] };
    for (const g of body.groups) groups.set(g.uid, g.records);
    if (body.groups.length) {
      const ack = await fetch(`${base}/v1/groups/ack`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ delivery_ids: body.groups.map((g) => g.delivery_id) }) });
      expect(ack.status).toBe(200);
    }
  }
  return groups;
}

describe.skipIf(!redis)("edgeloop serve with the agent gateway", () => {
  let sim: RunningSimEngine;
  beforeAll(async () => {
    sim = await startSimEngine({ script, tokenizer: tok });
  });
  afterAll(async () => {
    await sim.stop();
  });

  test(
    "1,000 concurrent agent sessions (250 rows × n=4) through one serve: none lost",
    async () => {
      const prefix = randomPrefix("agent-serve");
      prefixes.push(prefix);
      // No agent calls the model before all 1,000 tasks arrived: the sessions are open at once.
      let arrived = 0;
      let allArrived!: () => void;
      const all = new Promise<void>((r) => (allArrived = r));
      const agents = startAgents({
        onTask: () => {
          if (++arrived === 1000) allArrived();
        },
        beforeCall: (_key, step) => (step === 1 ? all : Promise.resolve()),
      });
      const engine = sim.replicas[0]!.engine;
      const before = engine.stats.requests;
      try {
        const s = await spawnServe(["--store", REDIS_URL, "--store-prefix", prefix, "--jobs", "inline", "--engine", sim.urls[0]!, "--default-agent", "openai_agent", "--agent", agents.url, "--concurrency", "1000", "--n", "4", "--max-model-len", "4096"]);
        procs.push(s);
        const batch = rows.length;
        const input = Array.from({ length: 250 }, (_, i) => ({ ...rows[i % batch]!, agent_name: "openai_agent", uid: `c${i}` }));
        const { batch_id, keys } = await post(s.url, input);
        expect(keys.length).toBe(1000);
        const p = await until(async () => {
          const pr = await progress(s.url, batch_id);
          return pr.done ? pr : null;
        }, "the batch", 50_000, 200);
        expect(p.counts).toMatchObject({ total: 1000, finished: 1000, ok: 1000, failed: 0 });
        expect(p.errors).toEqual([]);
        await Promise.all(agents.runs);
        expect(arrived).toBe(1000);
        expect(agents.done.length).toBe(1000);
        expect(new Set(agents.done.map((r) => r.key)).size).toBe(1000);
        expect(agents.done.filter((r) => r.finishStatus !== 200)).toEqual([]);
        expect(agents.done.reduce((a, r) => a + r.failedAttempts, 0)).toBe(0);
        // Every agent call was one engine call (no replays, no retries).
        expect(engine.stats.requests - before).toBe(agents.done.reduce((a, r) => a + r.steps, 0));

        const groups = await drainRecords(s.url, 250);
        expect(groups.size).toBe(250);
        const row0Prompt = tok.renderIds(rows[0]!.prompt, { tools, addGenerationPrompt: true });
        for (let i = 0; i < 250; i++) {
          const recs = groups.get(`c${i}`)!;
          expect(recs.map((r) => r.key).sort()).toEqual([0, 1, 2, 3].map((j) => `c${i}_${j}_0`));
          const row = rows[i % batch]!;
          const prompt = tok.renderIds(row.prompt, { tools, addGenerationPrompt: true });
          for (const r of recs) {
            expect(r.agent_name).toBe("openai_agent");
            expect(r.error).toBe(null);
            expect(r.prompt_ids).toEqual(prompt);
            expect(r.response_mask.length).toBe(r.response_ids.length);
            expect(r.rollout_log_probs!.length).toBe(r.response_ids.length);
            expect(r.response_mask[0]).toBe(1);
            expect(r.response_ids[r.response_ids.length - 1]).toBe(IM_END);
            // The scripted policy is deterministic: the group's four trajectories are the same tokens.
            expect(r.response_ids).toEqual(recs[0]!.response_ids);
          }
        }
        // Row 0 exactly: turn 1 (calc call), the tool observation "31", turn 2.
        const t1 = [...tok.encode(script.rules[0].turns[0]), IM_END];
        const conv = [...rows[0]!.prompt, { role: "assistant" as const, content: script.rules[0].turns[0] }, { role: "tool" as const, content: "31" }];
        const obs = tok.renderIds(conv, { tools, addGenerationPrompt: true }).slice(row0Prompt.length + t1.length);
        const t2 = [...tok.encode(script.rules[0].turns[1]), IM_END];
        const r0 = groups.get("c0")![0]!;
        expect(r0.response_ids).toEqual([...t1, ...obs, ...t2]);
        expect(r0.response_mask as number[]).toEqual([...t1.map(() => 1), ...obs.map(() => 0), ...t2.map(() => 1)]);
        expect(r0.reward_score).toBe(1);
        expect(r0.num_turns).toBe(4);
        s.proc.kill(9);
        await s.proc.exited;
      } finally {
        agents.stop();
      }
    },
    { timeout: HANG_MS },
  );

  test(
    "serve SIGKILLed between two calls of an agent, restarted on the same port: the SDK's retry is answered",
    async () => {
      const prefix = randomPrefix("agent-serve-kill");
      prefixes.push(prefix);
      const engine = sim.replicas[0]!.engine;
      let firstDone!: () => void;
      const firstCallDone = new Promise<void>((r) => (firstDone = r));
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      const agents = startAgents({
        maxRetries: 8,
        beforeCall: async (_key, step) => {
          if (step !== 2) return;
          firstDone();
          await gate;
        },
      });
      const port = freePort();
      const args = ["--store", REDIS_URL, "--store-prefix", prefix, "--jobs", "inline", "--engine", sim.urls[0]!, "--default-agent", "openai_agent", "--agent", agents.url, "--max-model-len", "4096"];
      try {
        const s1 = await serveOn(port, args);
        const before = engine.stats.requests;
        const base = `http://127.0.0.1:${port}`;
        await post(base, [{ ...rows[0]!, agent_name: "openai_agent", uid: "kill0" }]);
        await firstCallDone;
        expect(engine.stats.requests - before).toBe(1);
        s1.proc.kill(9);
        await s1.proc.exited;
        release();
        // The agent's second call now fails to connect and the SDK backs off; serve comes back meanwhile.
        await until(async () => runFailed(agents), "the agent's first failed attempt", HANG_MS, 20);
        const s2 = await serveOn(port, args);
        const [run] = await Promise.all(agents.runs);
        expect(run!.steps).toBe(2);
        expect(run!.answer).toBe("The answer is 31.\n#### 31");
        expect(run!.failedAttempts).toBeGreaterThanOrEqual(1);
        expect(run!.finishStatus).toBe(200);
        expect(engine.stats.requests - before).toBe(2);
        s2.proc.kill(9);
        await s2.proc.exited;
      } finally {
        agents.stop();
      }
    },
    { timeout: HANG_MS },
  );

  test(
    "two serves on one port (--reuse-port), queue mode and a worker: one serve SIGKILLed between two calls of an agent on the SDK's default retries; the other answers, one engine call per turn, one record",
    async () => {
      const prefix = randomPrefix("agent-reuse-port");
      prefixes.push(prefix);
      const engine = sim.replicas[0]!.engine;
      let firstDone!: () => void;
      const firstCallDone = new Promise<void>((r) => (firstDone = r));
      let release!: () => void;
      const gate = new Promise<void>((r) => (release = r));
      // The SDK's defaults: maxRetries 2 (backoff 0.375–0.5 s, then 0.75–1 s).
      const agents = startAgents({
        beforeCall: async (_key, step) => {
          if (step !== 2) return;
          firstDone();
          await gate;
        },
      });
      const port = freePort();
      const base = `http://127.0.0.1:${port}`;
      const store = ["--store", REDIS_URL, "--store-prefix", prefix, "--engine", sim.urls[0]!, "--max-model-len", "4096"];
      try {
        const a = await serveOn(port, [...store, "--jobs", "queue", "--reuse-port"]);
        const b = await serveOn(port, [...store, "--jobs", "queue", "--reuse-port"]);
        const worker = spawnCli(["worker", ...store, "--agent", agents.url, "--public-url", base, "--consumer", "reuse-port-w"]);
        procs.push(worker);
        // This session's engine calls only (the sim is shared with the file's other tests).
        const mine = () => engine.requests.filter((l) => (l.routing_key ?? "").startsWith("reuse0_")).length;
        const { batch_id } = await post(base, [{ ...rows[0]!, agent_name: "openai_agent", uid: "reuse0" }]);
        await Promise.race([firstCallDone, worker.proc.exited.then(() => Promise.reject(new Error(`worker exited: ${worker.err()}`)))]);
        expect(mine()).toBe(1);
        a.proc.kill(9);
        await a.proc.exited;
        release();
        const [run] = await Promise.all(agents.runs);
        expect(run!.steps).toBe(2);
        expect(run!.answer).toBe("The answer is 31.\n#### 31");
        // Within the default budget: at most the two retries failed at the connection (the pooled one to the dead serve).
        expect(run!.failedAttempts).toBeLessThanOrEqual(2);
        expect(run!.finishStatus).toBe(200);
        const p = await until(async () => {
          const pr = await progress(base, batch_id);
          return pr.done ? pr : null;
        }, "the batch", HANG_MS, 100);
        expect(p.counts).toMatchObject({ total: 1, finished: 1, ok: 1, failed: 0 });
        expect(mine()).toBe(2);
        const groups = await drainRecords(base, 1, HANG_MS);
        const recs = groups.get("reuse0")!;
        expect(recs.length).toBe(1);
        expect(recs[0]!.num_turns).toBeGreaterThanOrEqual(4);
        expect(recs[0]!.response_ids.length).toBe(recs[0]!.response_mask.length);
        // A second serve on that port without --reuse-port is refused: the port is in use.
        const plain = spawnCli(["serve", "--port", String(port), ...store, "--jobs", "queue"]);
        procs.push(plain);
        expect(await plain.proc.exited).not.toBe(0);
        expect(plain.err()).toContain(`port ${port} is already in use`);
        worker.proc.kill(15);
        await worker.proc.exited;
        b.proc.kill(9);
        await b.proc.exited;
      } finally {
        agents.stop();
      }
    },
    { timeout: HANG_MS },
  );

  test(
    "a gateway killed right after committing a turn answers the SDK's retry from the checkpoint, with no second engine call",
    async () => {
      const prefix = randomPrefix("agent-gw-crash");
      prefixes.push(prefix);
      const engine = sim.replicas[0]!.engine;
      const port = freePort();
      const token = "tok_crash_0123456789abcdef";
      const now = Date.now();
      const session = { v: 1, key: "crash0_0_0", uid: "crash0", session_id: 0, token, created_ms: now, deadline_ms: now + 120_000, sampling_params: SP, rollout: { prompt_length: 512, response_length: 512, max_model_len: 4096 }, tools, messages: rows[0]!.prompt };
      const child = (exitAt: number | null) => {
        const env: Record<string, string> = { ...(process.env as Record<string, string>), GW_PORT: String(port), GW_PREFIX: prefix, GW_ENGINE: sim.urls[0]!, GW_SESSION: JSON.stringify(session), REDIS_URL };
        if (exitAt !== null) env.GW_EXIT_AT_STEP = String(exitAt);
        const proc = Bun.spawn([process.execPath, join(import.meta.dir, "gateway-crash-child.ts")], { env, stdout: "pipe", stderr: "inherit" });
        return proc;
      };
      const listening = async (proc: ReturnType<typeof child>) => {
        const reader = (proc.stdout as ReadableStream<Uint8Array>).getReader();
        const { value } = await reader.read();
        expect(new TextDecoder().decode(value)).toBe("listening\n");
        reader.releaseLock();
      };
      // open is step 0, the first turn step 1: the child dies once step 2 (the second turn) is committed.
      const c1 = child(2);
      await listening(c1);
      let failed = 0;
      const client = new OpenAI({
        baseURL: `http://127.0.0.1:${port}/v1/sessions/crash0_0_0/openai/v1`,
        apiKey: token,
        maxRetries: 8,
        fetch: async (u, i) => {
          try {
            return await fetch(u, i);
          } catch (e) {
            failed++;
            throw e;
          }
        },
      });
      const before = engine.stats.requests;
      const messages = [...rows[0]!.prompt] as OpenAI.ChatCompletionMessageParam[];
      const r1 = await client.chat.completions.create({ model: "m", messages, tools: tools as OpenAI.ChatCompletionTool[] });
      expect(r1.choices[0]!.message.tool_calls!.map((c) => c.id)).toEqual([`call_${sessionTag("crash0_0_0")}_0_0_0`]);
      messages.push(r1.choices[0]!.message as OpenAI.ChatCompletionMessageParam, { role: "tool", tool_call_id: `call_${sessionTag("crash0_0_0")}_0_0_0`, content: "31" });
      const second = client.chat.completions.create({ model: "m", messages, tools: tools as OpenAI.ChatCompletionTool[] });
      expect(await c1.exited).toBe(137);
      expect(engine.stats.requests - before).toBe(2);
      const c2 = child(null);
      await listening(c2);
      try {
        const r2 = await second;
        expect(r2.choices[0]!.message.content).toBe("The answer is 31.\n#### 31");
        expect(r2.choices[0]!.finish_reason).toBe("stop");
        expect(r2.id.endsWith("-0-2-2")).toBe(true);
        expect(failed).toBeGreaterThanOrEqual(1);
        // The retry was a replay of the committed turn: no second engine call for it.
        expect(engine.stats.requests - before).toBe(2);
      } finally {
        c2.kill(9);
        await c2.exited;
      }
    },
    { timeout: HANG_MS },
  );
});
