import { beforeAll, describe, expect, test } from "bun:test";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { createSessionExecutor, sessionLoopFactory, type ExecutorDeps } from "../../shared/rollout/executor.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";
import type { SessionInputArg } from "../../shared/session/checkpoint.ts";
import { SessionHost } from "../../shared/session/session-host.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { ToolCallRequest, ToolExecutor, ToolResult } from "../../shared/tools/webhook-tool-client.ts";
import { call, config, FakeTools, IM_END, ScriptedClient, SP } from "../agent-loop/helpers.ts";
import { ManualTimers } from "../helpers/manual-timers.ts";
import { waitFor } from "../helpers/wait.ts";

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const USER: ChatMessage = { role: "user", content: "Add it up." };
const A1 = call("calc", { x: "1" });
const T0 = 1_700_000_000_000;

function inputOf(key: string, deadlineS: number | null): SessionInputArg {
  const [uid, sid] = key.split("_");
  return {
    key,
    agent_name: "tool_agent",
    sampling_params: SP,
    kwargs: { uid: uid!, session_id: Number(sid), key, prompt: [USER] },
    rollout: config({ trajectory_deadline_s: deadlineS }),
    model_version: null,
  };
}

/** A tool whose every call is accepted (202): its result would come by callback, 30 s at most. */
const asyncTool = () => new FakeTools(["calc"], () => ({ ok: false, pending: true, timeout_ms: 30_000, content: "accepted" }));

/** A tool whose calls answer only once their signal aborts (an "aborted" error result, as a webhook's); `started` resolves at the first call. */
function slowTool() {
  let began!: () => void;
  const started = new Promise<void>((r) => (began = r));
  const aborted: boolean[] = [];
  const tool: ToolExecutor = {
    schemas: asyncTool().schemas,
    names: ["calc"],
    async call(req: ToolCallRequest): Promise<ToolResult> {
      began();
      await new Promise<void>((resolve) => req.signal?.addEventListener("abort", () => resolve(), { once: true }));
      aborted.push(req.signal?.aborted === true);
      return { ok: false, call_id: `${req.key}:${req.turn}:${req.index}`, attempts: 1, content: "Error executing tool 'calc': aborted" };
    },
  };
  return { tool, started, aborted };
}

function setup(tools: ToolExecutor, storage: SessionStorage = new MemorySessionStorage()) {
  const timers = new ManualTimers(T0);
  const client = new ScriptedClient(tok, [{ text: A1 }, { text: "never sent" }]);
  const deps: ExecutorDeps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client, maxModelLen: 4096, tools, reward: false, asyncTools: { wallClockMs: timers.wall } };
  const sdeps: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), wallClockMs: timers.wall, timers };
  return { timers, client, sdeps };
}

describe("durable sessions keep the deadline of their first start", () => {
  test("a session waiting for a callback is resumed before and after its deadline: it is not restarted, and past it the session ends without an engine call", async () => {
    const { timers, client, sdeps } = setup(asyncTool());
    const key = "sd_0_0";
    const s1 = (await TrajectorySession.open(key, sdeps, inputOf(key, 10)))!;
    // The earliest of the call's deadline (T0 + 30 s) and the trajectory's (T0 + 10 s).
    expect(await s1.run()).toEqual({ status: "waiting", deadline_ms: T0 + 10_000 });
    expect(s1.checkpoint.trajectory_deadline_ms).toBe(T0 + 10_000);
    expect(s1.checkpoint.deadline_ms).toBe(T0 + 30_000);
    expect(timers.armed).toEqual([]);
    expect(client.requests.length).toBe(1);

    // Another worker resumes it 9 s later: the deadline is the stored one, not 10 s from now.
    timers.now = T0 + 9_000;
    const s2 = (await TrajectorySession.open(key, sdeps))!;
    expect(s2.trajectoryDeadlineMs).toBe(T0 + 10_000);
    expect(await s2.run()).toEqual({ status: "waiting", deadline_ms: T0 + 10_000 });

    timers.now = T0 + 10_000;
    const s3 = (await TrajectorySession.open(key, sdeps))!;
    const r = await s3.run();
    expect(client.requests.length).toBe(1);
    if (r.status !== "finished") throw new Error(`expected finished, got ${JSON.stringify(r)}`);
    expect(r.outputs.length).toBe(1);
    const o = r.outputs[0]!;
    const t1 = [...tok.encode(A1), IM_END];
    expect(o.response_ids).toEqual(t1);
    expect(o.response_mask).toEqual(t1.map(() => 1));
    expect([o.finish_reason, o.truncated, o.num_turns]).toEqual(["abort", true, 2]);
    expect(o.extra_fields).toMatchObject({ terminated_by: "deadline", tool_calls: 0, tool_errors: 0 });
    expect(s3.awaitedCalls()).toEqual([]);
    expect(s3.checkpoint.phase).toBe("finished");
    expect(s3.checkpoint.trajectory_deadline_ms).toBe(T0 + 10_000);
  });

  test("a host wakes a waiting session at its trajectory deadline (before the call's own) and it ends there", async () => {
    const { timers, client, sdeps } = setup(asyncTool());
    const host = new SessionHost(sdeps);
    const key = "sh_0_0";
    const p = host.run(inputOf(key, 10));
    await waitFor(() => host.timed === 1, "the session to wait with a timer");
    expect(host.timed).toBe(1);
    expect(timers.armed).toEqual([10_000]);
    timers.advance(10_000);
    const r = await p;
    if (r.status !== "finished") throw new Error(`expected finished, got ${JSON.stringify(r)}`);
    expect(client.requests.length).toBe(1);
    expect(r.outputs[0]!.extra_fields.terminated_by).toBe("deadline");
    expect(r.outputs[0]!.response_ids).toEqual([...tok.encode(A1), IM_END]);
    host.close();
  });

  test("the deadline passing during a step's slow tool call aborts the call and ends the session with the turns before", async () => {
    const { tool: slow, started, aborted } = slowTool();
    const { timers, client, sdeps } = setup(slow);
    const key = "ss_0_0";
    const s = (await TrajectorySession.open(key, sdeps, inputOf(key, 10)))!;
    const p = s.run();
    await started;
    expect(timers.armed).toEqual([10_000]);
    timers.advance(10_000);
    const r = await p;
    if (r.status !== "finished") throw new Error(`expected finished, got ${JSON.stringify(r)}`);
    expect(aborted).toEqual([true]);
    expect(client.requests.length).toBe(1);
    const o = r.outputs[0]!;
    expect(o.response_ids).toEqual([...tok.encode(A1), IM_END]);
    expect(o.extra_fields).toMatchObject({ terminated_by: "deadline", tool_calls: 0 });
    expect(timers.armed).toEqual([]);
  });

  test("a checkpoint written before the field existed gets its deadline from its first resume", async () => {
    const inner = new MemorySessionStorage();
    // Reads the deltas as an older edgeloop wrote them: without trajectory_deadline_ms.
    const legacy: SessionStorage = {
      get: async (k) => {
        const e = await inner.get(k);
        if (!e) return e;
        return { ...e, deltas: e.deltas.map((d) => JSON.stringify({ ...JSON.parse(d), trajectory_deadline_ms: undefined })) };
      },
      append: (k, step, delta, opts) => inner.append(k, step, delta, opts),
      delete: (k) => inner.delete(k),
    };
    const { timers, sdeps } = setup(asyncTool(), legacy);
    const key = "sl_0_0";
    const s1 = (await TrajectorySession.open(key, sdeps, inputOf(key, 10)))!;
    expect((await s1.run()).status).toBe("waiting");
    timers.now = T0 + 9_000;
    const s2 = (await TrajectorySession.open(key, sdeps))!;
    expect(s2.trajectoryDeadlineMs).toBe(T0 + 19_000);
  });

  test("rollout.trajectory_deadline_s null: no deadline is stored and none wakes the session", async () => {
    const { sdeps } = setup(asyncTool());
    const key = "sn_0_0";
    const s = (await TrajectorySession.open(key, sdeps, inputOf(key, null)))!;
    expect(await s.run()).toEqual({ status: "waiting", deadline_ms: T0 + 30_000 });
    expect(s.checkpoint.trajectory_deadline_ms).toBeNull();
  });

  test("through the session executor and a batch: the deadline-ended record is stored and the session counted finished", async () => {
    const { tool, started, aborted } = slowTool();
    const timers = new ManualTimers(T0);
    const client = new ScriptedClient(tok, [{ text: A1 }, { text: "never sent" }]);
    const deps: ExecutorDeps = { registry: defaultAgentLoopRegistry(), tokenizer: tok, client, maxModelLen: 4096, tools: tool, reward: false, asyncTools: { wallClockMs: timers.wall } };
    const host = new SessionHost({ storage: new MemorySessionStorage(), createLoop: sessionLoopFactory(deps), wallClockMs: timers.wall, timers });
    const store = new MemoryTransferQueue();
    const cfg = parseAppConfig({ rollout: { n: 1, max_model_len: 4096, trajectory_deadline_s: 10 } });
    const service = new RolloutService({ config: cfg, store, executorFor: (r, b) => createSessionExecutor(deps, host, store, r, b) });
    const { run } = service.submit({ rows: [{ uid: "se", agent_name: "tool_agent", data_source: "test", prompt: [USER] }], global_steps: -1, model_version: null, validate: false });
    const done = run.run();
    await started;
    expect(timers.armed).toEqual([10_000]);
    timers.advance(10_000);
    await done;
    expect(aborted).toEqual([true]);
    expect(client.requests.length).toBe(1);
    const recs = run.records();
    expect(recs.map((r) => [r.key, r.error, r.finish_reason, r.truncated, r.extra_fields.terminated_by])).toEqual([["se_0_0", null, "abort", true, "deadline"]]);
    expect(recs[0]!.response_ids).toEqual([...tok.encode(A1), IM_END]);
    expect(run.stats().counts).toMatchObject({ total: 1, finished: 1, records: 1, ok: 1, failed: 0 });
    expect((await store.sessionRecords("se", 0))?.map((r) => r.extra_fields.terminated_by)).toEqual(["deadline"]);
    host.close();
  });
});
