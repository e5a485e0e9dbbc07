import { beforeAll, describe, expect, test } from "bun:test";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { SingleTurnAgentLoop } from "../../shared/agent-loop/single-turn-agent.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { TrajectoryDeadline, TrajectoryDeadlineError } from "../../shared/agent-loop/trajectory-deadline.ts";
import { parseAppConfig, parseLayeredConfig } from "../../shared/config/app-config.ts";
import { FLAG_OF_PATH, overridesFromFlags } from "../../infra/cli/flags.ts";
import { ConfigError, EngineAbortedError } from "../../shared/errors.ts";
import type { GenerateRequest, InferenceClient } from "../../shared/inference/types.ts";
import { createAgentExecutor, type ExecutorDeps } from "../../shared/rollout/executor.ts";
import { RolloutConfig, type ChatMessage, type TokenOutput, type ToolSchema } from "../../shared/schema/index.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { ToolCallRequest, ToolExecutor, ToolResult } from "../../shared/tools/webhook-tool-client.ts";
import { call, config, ctxOf, GEN_PROMPT, IM_END, LP, maskRuns, ScriptedClient, SP } from "../agent-loop/helpers.ts";
import { ManualTimers } from "../helpers/manual-timers.ts";
import { OpenEnvAgentLoop } from "../../shared/agent-loop/openenv-agent.ts";
import { OpenEnvSettings } from "../../shared/schema/openenv.ts";
import { startOpenEnvServer } from "../agent-loop/openenv-server.ts";

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const SCHEMA: ToolSchema = { type: "function", function: { name: "calc", description: "the calc tool", parameters: { type: "object", properties: { x: { type: "string" } } } } };

/**
 * `calc`: the first call answers "1" at once; every later call is slow — it
 * answers only once its signal aborts (as a webhook does: an "aborted" error
 * result). `started` resolves when the slow call is under way.
 */
class SlowSecondCall implements ToolExecutor {
  readonly schemas = [SCHEMA];
  readonly names = ["calc"];
  readonly calls: Array<{ turn: number; aborted: boolean }> = [];
  private began!: () => void;
  readonly started = new Promise<void>((r) => (this.began = r));
  async call(req: ToolCallRequest): Promise<ToolResult> {
    const call_id = `${req.key}:${req.turn}:${req.index}`;
    if (req.turn === 1) {
      this.calls.push({ turn: req.turn, aborted: false });
      return { ok: true, call_id, attempts: 1, content: "1" };
    }
    this.began();
    await new Promise<void>((resolve) => {
      if (req.signal?.aborted) resolve();
      req.signal?.addEventListener("abort", () => resolve(), { once: true });
    });
    this.calls.push({ turn: req.turn, aborted: req.signal?.aborted === true });
    return { ok: false, call_id, attempts: 1, content: "Error executing tool 'calc': aborted" };
  }
}

const A1 = call("calc", { x: "1" });
const A2 = call("calc", { x: "2" });
const USER: ChatMessage = { role: "user", content: "Add it up." };
const ROW = { uid: "dl", agent_name: "tool_agent", data_source: "test", prompt: [USER] };
/** The observation of the tool result "1" after an assistant turn ended by `<|im_end|>` (Qwen3). */
const obsOf = (content: string) => [198, 151644, 872, 198, 151665, 198, ...tok.encode(content), 198, 151666, 151645, 198, ...GEN_PROMPT];

function serviceFor(deps: ExecutorDeps, rollout: Record<string, unknown>) {
  const cfg = parseAppConfig({ rollout: { n: 1, max_model_len: 4096, ...rollout } });
  return new RolloutService({ config: cfg, store: new MemoryTransferQueue(), executorFor: (r, b) => createAgentExecutor(deps, r, b) });
}

describe("rollout.trajectory_deadline_s (config)", () => {
  test("default 3600; null turns it off; out-of-range values are refused naming the field", () => {
    expect(RolloutConfig.parse({}).trajectory_deadline_s).toBe(3600);
    expect(RolloutConfig.parse({ trajectory_deadline_s: null }).trajectory_deadline_s).toBeNull();
    expect(RolloutConfig.parse({ trajectory_deadline_s: 2_147_483 }).trajectory_deadline_s).toBe(2_147_483);
    const bad = (v: unknown) => {
      try {
        parseAppConfig({ rollout: { trajectory_deadline_s: v } });
      } catch (e) {
        expect(e).toBeInstanceOf(ConfigError);
        return [(e as ConfigError).field, (e as Error).message];
      }
      throw new Error(`accepted ${JSON.stringify(v)}`);
    };
    expect(bad(0)).toEqual(["rollout.trajectory_deadline_s", "config rollout.trajectory_deadline_s: rollout.trajectory_deadline_s must be >= 1 (seconds) or null (no deadline) (in config)"]);
    expect(bad(1.5)).toEqual(["rollout.trajectory_deadline_s", "config rollout.trajectory_deadline_s: rollout.trajectory_deadline_s must be a whole number of seconds (or null: no deadline) (in config)"]);
    expect(bad(2_147_484)).toEqual(["rollout.trajectory_deadline_s", "config rollout.trajectory_deadline_s: rollout.trajectory_deadline_s must be <= 2147483 (seconds; setTimeout's largest delay) (in config)"]);
    expect(bad("60")[0]).toBe("rollout.trajectory_deadline_s");
  });

  test("--trajectory-deadline sets it (the flag wins over the file; a bad value names the flag)", () => {
    expect(parseLayeredConfig({ rollout: { trajectory_deadline_s: 600 } }, overridesFromFlags({ trajectoryDeadline: 60 }, {}), "flags").rollout.trajectory_deadline_s).toBe(60);
    expect(parseLayeredConfig({ rollout: { trajectory_deadline_s: null } }, overridesFromFlags({}, {}), "flags").rollout.trajectory_deadline_s).toBeNull();
    expect(FLAG_OF_PATH["rollout.trajectory_deadline_s"]).toEqual({ flag: "--trajectory-deadline", key: "trajectoryDeadline" });
  });
});

describe("TrajectoryDeadline", () => {
  test("aborts at the deadline with TrajectoryDeadlineError; a parent's abort keeps its own reason; an early timer re-arms", () => {
    const timers = new ManualTimers();
    const d = new TrajectoryDeadline({ key: "k_0_0", atMs: timers.now + 5_000, wallClockMs: timers.wall, timers });
    d.start();
    expect(timers.armed).toEqual([5_000]);
    timers.advance(4_000); // fired early: re-armed for the rest
    expect(d.signal.aborted).toBe(false);
    expect(timers.armed).toEqual([1_000]);
    timers.advance(1_000);
    expect(d.passed).toBe(true);
    expect(d.signal.reason).toBeInstanceOf(TrajectoryDeadlineError);
    expect((d.signal.reason as TrajectoryDeadlineError).deadline_ms).toBe(1_700_000_005_000);
    expect((d.signal.reason as Error).message).toBe("trajectory 'k_0_0' passed its deadline (rollout.trajectory_deadline_s) at 2023-11-14T22:13:25.000Z");

    const parent = new AbortController();
    const c = new TrajectoryDeadline({ key: "k_1_0", atMs: timers.now + 5_000, parent: parent.signal, wallClockMs: timers.wall, timers });
    c.start();
    const why = new Error("batch cancelled");
    parent.abort(why);
    expect(c.signal.reason).toBe(why);
    expect(c.passed).toBe(false);
    c.dispose();
    expect(timers.armed).toEqual([]);
  });
});

describe("tool_agent past its deadline (in-process executor, BatchRun)", () => {
  test("the deadline passes during a slow tool call: the record holds the turns before, is stored, and the batch counts it finished", async () => {
    const timers = new ManualTimers();
    const client = new ScriptedClient(tok, [{ text: A1 }, { text: A2 }, { text: "never sent" }]);
    const tools = new SlowSecondCall();
    const deps: ExecutorDeps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client, maxModelLen: 4096, tools, reward: false, timers, wallClockMs: timers.wall };
    const service = serviceFor(deps, { trajectory_deadline_s: 5 });
    const { run } = service.submit({ rows: [ROW], global_steps: -1, model_version: null, validate: false });
    const done = run.run();
    await tools.started;
    expect(timers.armed).toEqual([5_000]);
    timers.advance(5_000);
    await done;

    expect(client.requests.length).toBe(2);
    expect(tools.calls).toEqual([
      { turn: 1, aborted: false },
      { turn: 2, aborted: true },
    ]);
    const recs = run.records();
    expect(recs.length).toBe(1);
    const r = recs[0]!;
    const t1 = [...tok.encode(A1), IM_END];
    const t2 = [...tok.encode(A2), IM_END];
    expect(r.error).toBeNull();
    expect(r.prompt_ids).toEqual(tok.renderIds([USER], { tools: [SCHEMA], addGenerationPrompt: true }));
    expect(maskRuns({ ...r, response_logprobs: r.rollout_log_probs, metrics: r.metrics } as never)).toEqual([
      [1, t1],
      [0, obsOf("1")],
      [1, t2],
    ]);
    expect(r.response_ids).toEqual([...t1, ...obsOf("1"), ...t2]);
    expect(r.rollout_log_probs).toEqual([...t1.map(() => LP), ...obsOf("1").map(() => 0), ...t2.map(() => LP)]);
    expect(r.finish_reason).toBe("abort");
    expect(r.truncated).toBe(true);
    expect(r.num_turns).toBe(4);
    expect(r.extra_fields).toMatchObject({ terminated_by: "deadline", tool_calls: 1, tool_errors: 0, dropped_tool_calls: 0 });
    const s = run.stats();
    expect(s.counts).toMatchObject({ total: 1, finished: 1, records: 1, ok: 1, failed: 0, running: 0, pending: 0 });
    expect(s.cancelled ?? null).toBeNull();
    // The trajectory's timer is gone with it.
    expect(timers.armed).toEqual([]);
  });

  test("a batch cancel during the same slow call still stores nothing (the deadline timer is cleared)", async () => {
    const timers = new ManualTimers();
    const client = new ScriptedClient(tok, [{ text: A1 }, { text: A2 }, { text: "never sent" }]);
    const tools = new SlowSecondCall();
    const deps: ExecutorDeps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client, maxModelLen: 4096, tools, reward: false, timers, wallClockMs: timers.wall };
    const service = serviceFor(deps, { trajectory_deadline_s: 5 });
    const { run } = service.submit({ rows: [ROW], global_steps: -1, model_version: null, validate: false });
    const done = run.run();
    await tools.started;
    expect(run.cancel()).toBe(true);
    await done;
    expect(tools.calls).toEqual([
      { turn: 1, aborted: false },
      { turn: 2, aborted: true },
    ]);
    expect(run.records()).toEqual([]);
    expect(run.stats().counts).toMatchObject({ total: 1, finished: 0, records: 0 });
    expect(run.stats().cancelled?.sessions).toBe(1);
    expect(timers.armed).toEqual([]);
    expect(timers.cleared).toBe(1);
  });

  test("null: no deadline timer is armed and the trajectory runs to its end", async () => {
    const timers = new ManualTimers();
    const client = new ScriptedClient(tok, [{ text: "4" }]);
    const deps: ExecutorDeps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client, maxModelLen: 4096, reward: false, timers, wallClockMs: timers.wall };
    const { run } = serviceFor(deps, { trajectory_deadline_s: null }).submit({ rows: [ROW], global_steps: -1, model_version: null, validate: false });
    await run.run();
    expect(timers.requested).toEqual([]);
    expect(run.records()[0]!.extra_fields.terminated_by).toBe("model");
  });
});

/** Replies with `first` (a preempted partial turn), then waits on the request's signal and throws as an HTTP engine does. */
class PartialThenHang implements InferenceClient {
  readonly requests: GenerateRequest[] = [];
  private began!: () => void;
  readonly hanging = new Promise<void>((r) => (this.began = r));
  constructor(private readonly first: TokenOutput) {}
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    this.requests.push(req);
    if (this.requests.length === 1) return this.first;
    this.began();
    await new Promise<void>((resolve) => req.signal?.addEventListener("abort", () => resolve(), { once: true }));
    throw new EngineAbortedError("request aborted by the caller");
  }
}

describe("loops that are mid-call when the deadline passes", () => {
  test("single_turn_agent: the tokens the engine returned are kept as the abort path keeps them; terminated_by deadline; no call after it", async () => {
    const d = new TrajectoryDeadline({ key: "st_0_0", atMs: 1 });
    const first: TokenOutput = { token_ids: [100, 101], log_probs: [-0.25, -0.75], finish_reason: "abort", num_preempted: -1, extra_fields: {} };
    const client = new PartialThenHang(first);
    const loop = new SingleTurnAgentLoop(ctxOf(tok, client, config(), { signal: d.signal, reward: false }));
    const p = loop.run(SP, { uid: "st", session_id: 0, prompt: [USER] });
    await client.hanging;
    d.start(); // atMs 1 is long past: aborts at once
    const o = await p;
    expect(client.requests.length).toBe(2);
    expect(o.response_ids).toEqual([100, 101]);
    expect(o.response_mask).toEqual([1, 1]);
    expect(o.response_logprobs).toEqual([-0.25, -0.75]);
    expect(o.finish_reason).toBe("abort");
    expect(o.truncated).toBe(true);
    // The preemption and the aborted resume, counted as the abort path counts them.
    expect(o.metrics.num_preempted).toBe(2);
    expect(o.extra_fields).toEqual({ turn_scores: [], tool_rewards: [], terminated_by: "deadline" });
  });

  test("tool_agent: a turn the deadline cut keeps its partial tokens (mask 1) and ends the trajectory", async () => {
    const d = new TrajectoryDeadline({ key: "ta_0_0", atMs: 1 });
    const first: TokenOutput = { token_ids: [100, 101, 102], log_probs: [-0.5, -0.5, -0.5], finish_reason: "abort", num_preempted: -1, extra_fields: {} };
    const client = new PartialThenHang(first);
    const loop = new ToolAgentLoop(ctxOf(tok, client, config(), { signal: d.signal, reward: false }));
    const p = loop.run(SP, { uid: "ta", session_id: 0, prompt: [USER] });
    await client.hanging;
    d.start();
    const o = await p;
    expect(client.requests.length).toBe(2);
    expect(o.response_ids).toEqual([100, 101, 102]);
    expect(o.response_mask).toEqual([1, 1, 1]);
    expect(o.finish_reason).toBe("abort");
    expect(o.truncated).toBe(true);
    expect(o.num_turns).toBe(2);
    expect(o.extra_fields.terminated_by).toBe("deadline");
    expect(loop.trace).toEqual(["pending", "generating", "terminated"]);
  });

  test("a loop whose deadline passed before it started sends nothing: the record is the prompt alone", async () => {
    const d = new TrajectoryDeadline({ key: "ta_1_0", atMs: 1 });
    d.start();
    const client = new ScriptedClient(tok, [{ text: "4" }]);
    const o = await new ToolAgentLoop(ctxOf(tok, client, config(), { signal: d.signal, reward: false })).run(SP, { uid: "ta", session_id: 1, prompt: [USER] });
    expect(client.requests.length).toBe(0);
    expect(o.prompt_ids).toEqual(tok.renderIds([USER], { addGenerationPrompt: true }));
    expect(o.response_ids).toEqual([]);
    expect([o.finish_reason, o.truncated, o.num_turns, o.extra_fields.terminated_by]).toEqual(["abort", true, 1, "deadline"]);
  });
});

describe("openenv_agent past its deadline", () => {
  for (const transport of ["http", "websocket"] as const) {
    test(`${transport}: a step the environment never answers is aborted by the deadline; the record holds the turn before it`, async () => {
      const env = startOpenEnvServer({ hangStep: true });
      try {
        const d = new TrajectoryDeadline({ key: `oe_${transport}_0`, atMs: 1 });
        const client = new ScriptedClient(tok, [{ text: "5" }, { text: "never sent" }]);
        const settings = OpenEnvSettings.parse({ base_url: env.url, transport, observation: { field: "prompt" }, timeout_ms: 600_000 });
        const loop = new OpenEnvAgentLoop(ctxOf(tok, client, config(), { signal: d.signal, reward: false, openenv: { settings } }));
        const p = loop.run(SP, { uid: "oe", session_id: 0, data_source: "openenv", prompt: [USER] });
        await env.until((log) => log.http.some((h) => h.path === "/step") || log.ws.some((m) => (m.msg as { type?: string }).type === "step"));
        d.start();
        const o = await p;
        expect(client.requests.length).toBe(1);
        expect(o.response_ids).toEqual([...tok.encode("5"), IM_END]);
        expect(o.response_mask).toEqual([1, 1]);
        expect([o.finish_reason, o.truncated, o.num_turns]).toEqual(["abort", true, 2]);
        expect(o.extra_fields).toMatchObject({ terminated_by: "deadline", env_steps: 0, turn_scores: [] });
        expect(loop.trace).toEqual(["pending", "generating", "processing_tools", "terminated"]);
      } finally {
        await env.stop();
      }
    });
  }
});
