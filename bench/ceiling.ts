/**
 * Orchestration ceiling, first part (issue 32 item 1): how many concurrent
 * `tool_agent` sessions one process drives when the engine and the tool cost
 * nothing, and what each costs. The engine is a zero-latency stub (replies
 * precomputed, answered on the next macrotask, so sessions interleave as
 * they would on network I/O) that makes each session call its tool
 * `turns − 1` times and then answer; the tool answers in process. Per step
 * (concurrency × turns) it prints:
 * - turns/s (engine calls per second of wall time; one core runs it all);
 * - added latency per engine call, p50/p99: from the stub's reply to the same
 *   session's next engine call (parse, tool, observation encode, checkpoint
 *   of the loop — and the wait for the event loop behind the other sessions);
 * - event-loop lag p99 (a 10 ms timer's lateness, sampled through the step);
 * - heap per live session: heap used with every session held mid-trajectory
 *   (at its engine call `turns / 2`), minus the heap before the step, after a
 *   full GC, divided by the sessions;
 * and where it stops: the first step whose loop lag p99 passes `--lag-ms`
 * (default 50). Then one session of `--long` turns (default 128) alone,
 * timing each turn's edgeloop work (the same span, single session: CPU only),
 * to show whether per-turn cost grows with history (turn 4 vs the last).
 * Then the product path (issue 32 item 4): a batch of `--product` rows × 4
 * turns through `RolloutService` (records built, stored in the memory queue)
 * with `concurrency` = the rows, once without a lag bound and once with
 * `limits.max_event_loop_lag_ms` = `--lag-ms`: loop lag p99, turns/s, the
 * most sessions in flight and how many were held by lag.
 * Then the agent gateway: one session of `--gateway-calls` chat calls (default
 * 128), each carrying the full history as SDKs send it (through the gateway
 * app's `fetch`, memory storage, the zero-latency stub): the gateway's time
 * per call at call 4 vs the last, and the share of it that is the request's
 * JSON (parse of the body the gateway must read whole).
 * The long session runs twice: with one-token tool replies, and with replies
 * of `--obs-tokens` (default 1,000) tokens, so its context reaches ~128K
 * tokens at turn 128.
 * Queue mode with workers over Redis is `bench/ceiling-queue.ts`; the Redis
 * store's commands and bytes of one turn are counted by
 * tests/session/turn-cost.test.ts.
 *
 *   bun bench/ceiling.ts [--concurrency 64,1024,4096] [--turns 4,32] [--long 128] [--lag-ms 50] [--product 4096,16384] [--gateway-calls 128] [--obs-tokens 1000]
 */
import { ToolAgentLoop } from "../shared/agent-loop/tool-agent.ts";
import type { GenerateRequest, InferenceClient } from "../shared/inference/types.ts";
import { RolloutConfig, type ChatMessage, type TokenOutput } from "../shared/schema/index.ts";
import { defaultTokenizer } from "../shared/tokens/tokenizer.ts";
import type { ToolExecutor } from "../shared/tools/webhook-tool-client.ts";
import { SimEngine } from "../infra/sim-engine/sim-engine.ts";
import { arg, printTable } from "./util.ts";
import { defaultAgentLoopRegistry } from "../shared/agent-gateway/builtin-loops.ts";
import { parseAppConfig } from "../shared/config/app-config.ts";
import { RolloutRequest } from "../shared/rollout/batch.ts";
import { createAgentExecutor } from "../shared/rollout/executor.ts";
import { SessionAdmission } from "../shared/rollout/session-admission.ts";
import { RolloutService } from "../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../shared/store/memory-transfer-queue.ts";
import { LoopLagMonitor } from "../shared/telemetry/loop-lag.ts";
import { AgentGateway } from "../shared/agent-gateway/agent-gateway.ts";
import { createAgentGatewayApp } from "../functions/agent-gateway.ts";
import { MemorySessionStorage } from "../shared/session/session-storage.ts";

const CONC = arg("--concurrency", "64,1024,4096").split(",").map(Number);
const TURNS = arg("--turns", "4,32").split(",").map(Number);
const LONG = Number(arg("--long", "128"));
const LAG_MS = Number(arg("--lag-ms", "50"));
const PRODUCT = arg("--product", "4096,16384").split(",").filter(Boolean).map(Number);
const GATEWAY_CALLS = Number(arg("--gateway-calls", "128"));
const OBS_TOKENS = Number(arg("--obs-tokens", "1000"));

const tok = await defaultTokenizer();
const TOOL_TURN = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call>';
const ANSWER_TURN = "The answer is 4.\n#### 4";
const sim = new SimEngine({ tokenizer: tok, script: { rules: [], default: ["x"] } });
const toolIds = sim.turnTokens(TOOL_TURN).ids;
const answerIds = sim.turnTokens(ANSWER_TURN).ids;
const toolReply = { ids: toolIds, lps: toolIds.map(() => -0.5) };
const answerReply = { ids: answerIds, lps: answerIds.map(() => -0.5) };
const schema = { type: "function" as const, function: { name: "calc", description: "calculator", parameters: { type: "object" as const, properties: { expression: { type: "string" } } } } };
const tools: ToolExecutor = { schemas: [schema], names: ["calc"], call: async (r) => ({ ok: true, content: "4", call_id: `${r.key}:${r.turn}:${r.index}`, attempts: 1 }) };
const sp = { temperature: 1, top_p: 1, top_k: -1, logprobs: true };
const prompt: ChatMessage[] = [{ role: "user", content: "What is 2+2? Use the calculator." }];
const nextTick = () => new Promise<void>((r) => setImmediate(r));

const pct = (xs: number[], p: number) => {
  if (xs.length === 0) return 0;
  const s = Float64Array.from(xs).sort();
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

/** A zero-latency engine stub: per session (routing key), `turns − 1` tool calls then the answer; calls timed; an optional hold at one call index. */
class StubEngine implements InferenceClient {
  readonly calls = new Map<string, number>();
  readonly replied = new Map<string, number>();
  readonly added: number[] = [];
  hold: { at: number; waiting: (() => void)[]; arrived: number; all: Promise<void>; reached: () => void } | null = null;
  constructor(private readonly turns: number) {}

  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const now = performance.now();
    const last = this.replied.get(req.routing_key);
    if (last !== undefined) this.added.push(now - last);
    const n = (this.calls.get(req.routing_key) ?? 0) + 1;
    this.calls.set(req.routing_key, n);
    if (this.hold && n === this.hold.at) {
      const h = this.hold;
      await new Promise<void>((r) => {
        h.waiting.push(r);
        if (++h.arrived === CURRENT) h.reached();
      });
    }
    await nextTick();
    const r = n >= this.turns ? answerReply : toolReply;
    this.replied.set(req.routing_key, performance.now());
    return { token_ids: r.ids, log_probs: r.lps, finish_reason: "stop", num_preempted: -1, extra_fields: {} };
  }
}

let CURRENT = 0;

function heapUsed(): number {
  Bun.gc(true);
  return process.memoryUsage().heapUsed;
}

interface Step {
  sessions: number;
  turns: number;
  turnsPerS: number;
  p50: number;
  p99: number;
  lagP99: number;
  heapPerSession: number;
}

async function step(sessions: number, turns: number): Promise<Step> {
  CURRENT = sessions;
  const engine = new StubEngine(turns);
  const config = RolloutConfig.parse({ max_model_len: 65_536, response_length: 32_768, prompt_length: 1024, multi_turn: { max_assistant_turns: turns + 1 } });
  let reached!: () => void;
  const all = new Promise<void>((r) => (reached = r));
  engine.hold = { at: Math.max(1, Math.floor(turns / 2)), waiting: [], arrived: 0, all, reached };
  const base = heapUsed();
  const lags: number[] = [];
  let expect = performance.now() + 10;
  const sampler = setInterval(() => {
    const t = performance.now();
    lags.push(Math.max(0, t - expect));
    expect = t + 10;
  }, 10);
  const t0 = performance.now();
  const runs = Array.from({ length: sessions }, (_, i) => new ToolAgentLoop({ tokenizer: tok, client: engine, config, tools }).run(sp, { uid: "ceil", session_id: i, prompt }));
  await all;
  const tAll = performance.now();
  const held = heapUsed();
  // The hold's GC and release are not the loop's work: the rate is measured without them.
  const tHold = performance.now();
  const lagsBefore = lags.length;
  for (const w of engine.hold.waiting.splice(0)) w();
  const resumed = performance.now();
  engine.hold = null;
  const outs = await Promise.all(runs);
  const t1 = performance.now();
  clearInterval(sampler);
  for (const o of outs) {
    if (o.num_turns !== 2 * turns || o.extra_fields.tool_calls !== turns - 1) throw new Error(`a session did ${o.num_turns} turns / ${String(o.extra_fields.tool_calls)} tool calls, expected ${2 * turns} / ${turns - 1}`);
  }
  // Lag samples around the hold's GC are dropped (the sampler sees the pause the GC makes, not the loop's work).
  const kept = [...lags.slice(0, Math.max(0, lagsBefore - 2)), ...lags.slice(lagsBefore + 2)];
  const calls = sessions * turns;
  const wall = t1 - t0 - (resumed - tAll);
  return {
    sessions,
    turns,
    turnsPerS: calls / (wall / 1000),
    p50: pct(engine.added, 50),
    p99: pct(engine.added, 99),
    lagP99: pct(kept, 99),
    heapPerSession: (held - base) / sessions,
  };
}

// Warm-up (JIT, the prompt's cached render): not reported.
await step(64, 4);
await step(256, 4);

const rows = [["sessions", "turns", "turns/s", "added µs/call p50", "added µs/call p99", "loop lag p99 ms", "heap KB/live session"]];
let stop: string | null = null;
for (const turns of TURNS) {
  for (const c of CONC) {
    const s = await step(c, turns);
    rows.push([String(c), String(turns), s.turnsPerS.toFixed(0), (s.p50 * 1000).toFixed(0), (s.p99 * 1000).toFixed(0), s.lagP99.toFixed(1), (s.heapPerSession / 1024).toFixed(1)]);
    if (!stop && s.lagP99 > LAG_MS) stop = `${c} sessions × ${turns} turns: event-loop lag p99 ${s.lagP99.toFixed(1)} ms > ${LAG_MS} ms`;
  }
}
printTable("tool_agent sessions against a zero-latency engine and tool, one process (inline, memory: no store)", rows);
console.log(stop ? `stops at: ${stop}` : `no step passed the ${LAG_MS} ms loop-lag bound`);

// One long session alone: each turn's edgeloop work, by turn index — with a one-token tool reply, and with a
// reply of ~OBS_TOKENS tokens, so the context reaches ~128K tokens by the last turn.
for (const obs of [0, OBS_TOKENS]) {
  CURRENT = 1;
  const reply = obs ? " word".repeat(obs) : "4";
  const longTools: ToolExecutor = { ...tools, call: async (r) => ({ ok: true, content: reply, call_id: `${r.key}:${r.turn}:${r.index}`, attempts: 1 }) };
  const config = RolloutConfig.parse({ max_model_len: 262_144, response_length: 200_000, prompt_length: 1024, multi_turn: { max_assistant_turns: LONG + 1, max_tool_response_length: Math.max(256, reply.length) } });
  for (let w = 0; w < 2; w++) await new ToolAgentLoop({ tokenizer: tok, client: new StubEngine(LONG), config, tools: longTools }).run(sp, { uid: "warm", session_id: w, prompt });
  const engine = new StubEngine(LONG);
  const out = await new ToolAgentLoop({ tokenizer: tok, client: engine, config, tools: longTools }).run(sp, { uid: "long", session_id: 0, prompt });
  if (out.num_turns !== 2 * LONG) throw new Error(`the long session did ${out.num_turns} turns, expected ${2 * LONG} (${String(out.extra_fields.terminated_by)})`);
  const a = engine.added;
  const at = (k: number) => a.slice(Math.max(0, k - 2), k + 1);
  const mean = (xs: number[]) => xs.reduce((x, y) => x + y, 0) / Math.max(1, xs.length);
  const early = mean(at(3));
  const late = mean(a.slice(-3));
  printTable(`one session of ${LONG} turns alone, tool replies of ${obs ? `~${obs} tokens` : "1 token"} (${out.prompt_ids.length + out.response_ids.length} tokens at the end): edgeloop's work per turn`, [
    ["turn", "µs (mean of 3)"],
    ["4", (early * 1000).toFixed(0)],
    [String(LONG), (late * 1000).toFixed(0)],
    [`${LONG} ÷ 4`, (late / early).toFixed(2)],
  ]);
}

// The product path: one batch through RolloutService, all rows admitted at once (concurrency = rows), with and without back-pressure.
if (PRODUCT.length) {
  const out = [["sessions", "lag bound", "loop lag p99 ms", "loop lag max ms", "turns/s", "most in flight", "held by lag"]];
  for (const n of PRODUCT) {
    for (const bound of [null, LAG_MS] as const) {
      CURRENT = 0;
      const turns = 4;
      const engine = new StubEngine(turns);
      const monitor = new LoopLagMonitor(10, 50).start();
      const config = parseAppConfig({ rollout: { n: 1, max_model_len: 65_536, response_length: 32_768, prompt_length: 1024, multi_turn: { max_assistant_turns: turns + 1 } }, concurrency: n, limits: { max_event_loop_lag_ms: bound } });
      const admission = new SessionAdmission({ maxInFlight: n, maxLagMs: bound, lag: monitor });
      let most = 0;
      const off = monitor.onSample(() => (most = Math.max(most, admission.inFlight)));
      const deps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client: engine, maxModelLen: 65_536, tools, reward: {} };
      const service = new RolloutService({ config, store: new MemoryTransferQueue(), admission, executorFor: (r, b) => createAgentExecutor(deps as never, r, b) });
      const rowsN = Array.from({ length: n }, (_, i) => ({ prompt, uid: `p${i}`, agent_name: "tool_agent" }));
      const lags: number[] = [];
      const offLag = monitor.onSample(() => lags.push(monitor.lastMs()));
      const t0 = performance.now();
      const { run } = service.submit(RolloutRequest.parse({ rows: rowsN }));
      await run.run();
      const wall = performance.now() - t0;
      off();
      offLag();
      monitor.stop();
      const st = run.stats();
      if (st.counts.ok !== n) throw new Error(`product path: ${st.counts.ok} of ${n} trajectories ok`);
      const held = (admission.families().find((f) => f.name === "edgeloop_sessions_held_total")!.samples.find((x) => x.labels?.reason === "loop_lag")!.value as number);
      out.push([String(n), bound === null ? "none" : `${bound} ms`, pct(lags, 99).toFixed(1), Math.max(0, ...lags).toFixed(1), ((n * turns) / (wall / 1000)).toFixed(0), String(most), String(held)]);
      admission.close();
    }
  }
  printTable("the product path: one batch, every row admitted at once (RolloutService, memory store), 4-turn tool_agent sessions", out);
}

// The agent gateway: one long session, the full history in every call.
if (GATEWAY_CALLS > 0) {
  const L = GATEWAY_CALLS;
  const T0 = Date.now();
  const TOKEN = "tok-ceiling-bench-0001";
  const config = RolloutConfig.parse({ max_model_len: 262_144, response_length: 131_072, prompt_length: 1024, multi_turn: { max_assistant_turns: L + 1 } });
  const run = async (key: string, record: boolean) => {
    const engine = new StubEngine(L);
    const gw = new AgentGateway({ storage: new MemorySessionStorage(), tokenizer: tok, client: engine, maxModelLen: 262_144, wallClockMs: () => T0 });
    const app = createAgentGatewayApp({ gateway: gw });
    await gw.create({ v: 1, key, uid: "gw", session_id: 0, token: TOKEN, created_ms: T0, deadline_ms: T0 + 3_600_000, sampling_params: sp, rollout: config, tools: [schema], messages: prompt });
    const messages: unknown[] = [...prompt];
    const per: number[] = [];
    const parse: number[] = [];
    for (let call = 0; call < L; call++) {
      const body = JSON.stringify({ model: "qwen3", messages, tools: [schema] });
      const p0 = performance.now();
      JSON.parse(body);
      const p1 = performance.now();
      const t0 = performance.now();
      const res = await app.fetch(new Request(`http://edgeloop.local/v1/sessions/${key}/openai/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` }, body }));
      const reply = (await res.json()) as { choices: { message: Record<string, unknown> & { tool_calls?: { id: string; function: { name: string } }[] }; finish_reason: string }[] };
      const t1 = performance.now();
      if (res.status !== 200) throw new Error(`gateway call ${call}: HTTP ${res.status}`);
      per.push(t1 - t0);
      parse.push(p1 - p0);
      const { message, finish_reason } = reply.choices[0]!;
      if (finish_reason !== "tool_calls") break;
      messages.push(message);
      for (const c of message.tool_calls ?? []) messages.push({ role: "tool", tool_call_id: c.id, name: c.function.name, content: "4" });
    }
    if (record && per.length !== L) throw new Error(`gateway session ended after ${per.length} of ${L} calls`);
    return { per, parse, bytes: JSON.stringify({ model: "qwen3", messages, tools: [schema] }).length };
  };
  for (let w = 0; w < 3; w++) await run(`warm${w}`, false);
  const { per, parse, bytes } = await run("gwlong", true);
  const mean = (xs: number[]) => xs.reduce((x, y) => x + y, 0) / Math.max(1, xs.length);
  const early = mean(per.slice(2, 5));
  const late = mean(per.slice(-3));
  printTable(`the agent gateway: one session of ${L} chat calls, full history each (last body ${(bytes / 1024).toFixed(0)} KiB): the gateway's time per call`, [
    ["call", "µs (mean of 3)", "of it: JSON.parse of the body, µs"],
    ["4", (early * 1000).toFixed(0), (mean(parse.slice(2, 5)) * 1000).toFixed(0)],
    [String(L), (late * 1000).toFixed(0), (mean(parse.slice(-3)) * 1000).toFixed(0)],
    [`${L} ÷ 4`, (late / early).toFixed(2), ""],
  ]);
}
