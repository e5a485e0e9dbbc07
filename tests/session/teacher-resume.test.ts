import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { AgentLoopOutput, TeacherConfig } from "../../shared/schema/index.ts";
import { sessionOutputFinisher } from "../../shared/rollout/executor.ts";
import { cachedTeacherClients } from "../../shared/rollout/teacher-scoring.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { createSimEngineApp } from "../../infra/sim-engine/app.ts";
import { simPromptLogProbs } from "../../infra/sim-engine/prompt-logprobs.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { depsFor, inputFor, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";

// Durable sessions and the teacher: the call happens after the loop's last step and before the
// `finished` commit, whose checkpoint holds the teacher's log-probs. A crash before that commit
// (the call not made, or made but not checkpointed) calls the teacher on resume; a crash after it
// never calls it again.

let tools: ToolServer;
beforeAll(() => {
  tools = startToolServer({ port: 0 });
});
afterAll(async () => {
  await tools.stop();
});

const TEACHER: TeacherConfig = { url: "http://teacher.local", format: "sglang", model: null, timeout_ms: 10_000, on_error: "fail" };

async function setup() {
  const { deps, tok, engine } = await depsFor(tools.url);
  const teacherEngine = new SimEngine({ tokenizer: tok, scoreSeed: 3 });
  const app = createSimEngineApp(teacherEngine);
  const calls: number[] = [];
  deps.teacher = cachedTeacherClients((cfg) => ({
    url: cfg.url!,
    format: cfg.format,
    retry: { retries: 0 },
    fetch: async (input, init) => {
      calls.push(Date.now());
      return app.fetch(new Request(input, init));
    },
  }));
  const expected = (o: AgentLoopOutput) => {
    const lp = simPromptLogProbs(teacherEngine, [...o.prompt_ids, ...o.response_ids]);
    return o.response_mask.map((m, i) => (m === 1 ? Math.fround(lp[o.prompt_ids.length + i]!) : 0));
  };
  return { deps, engine, calls, expected };
}

describe("teacher log-probs in durable sessions", () => {
  test("a tool trajectory's finished checkpoint holds teacher_log_probs; reopening it (crash after the commit) calls no teacher", async () => {
    const { deps, engine, calls, expected } = await setup();
    const storage = new MemorySessionStorage();
    const input = inputFor(0, 0, rolloutConfig({ teacher: TEACHER }));
    const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), finishOutputs: sessionOutputFinisher(deps) };
    const r = await (await TrajectorySession.open(input.key, sd, input))!.run();
    if (r.status !== "finished") throw new Error(JSON.stringify(r));
    const out = r.outputs[0]!;
    expect(out.response_mask).toContain(0);
    expect(out.teacher_log_probs).toEqual(expected(out));
    expect(out.teacher_log_probs!.filter((v, i) => out.response_mask[i] === 0 && v !== 0)).toEqual([]);
    expect(calls).toHaveLength(1);
    const generations = engine.stats.requests;
    // A new owner opens the same key: finished, resumed, the same teacher log-probs, bit for bit, no call.
    const again = await (await TrajectorySession.open(input.key, sd))!.run();
    if (again.status !== "finished") throw new Error(JSON.stringify(again));
    expect(again.resumed).toBe(true);
    expect(again.outputs[0]!.teacher_log_probs).toEqual(out.teacher_log_probs!);
    expect(calls).toHaveLength(1);
    expect(engine.stats.requests).toBe(generations);
  });

  test("a crash after the loop but before the teacher call: the resumed session calls the teacher once, without generating again", async () => {
    const { deps, engine, calls, expected } = await setup();
    const storage = new MemorySessionStorage();
    const input = inputFor(1, 0, rolloutConfig({ teacher: TEACHER }));
    // The first owner "dies" while its teacher call is pending: the call never returns and nothing more is committed.
    let reached!: () => void;
    const atTeacher = new Promise<void>((r) => (reached = r));
    const dying: SessionDeps = {
      storage,
      createLoop: sessionLoopFactory(deps),
      finishOutputs: () => {
        reached();
        return new Promise<never>(() => {});
      },
    };
    void (await TrajectorySession.open(input.key, dying, input))!.run();
    await atTeacher;
    const stored = await storage.get(input.key);
    expect(JSON.parse(stored!.deltas.at(-1)!).loop_state).toBe("terminated");
    const generations = engine.stats.requests;
    expect(calls).toHaveLength(0);
    const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), finishOutputs: sessionOutputFinisher(deps) };
    const r = await (await TrajectorySession.open(input.key, sd))!.run();
    if (r.status !== "finished") throw new Error(JSON.stringify(r));
    expect(calls).toHaveLength(1);
    expect(engine.stats.requests).toBe(generations);
    expect(r.outputs[0]!.teacher_log_probs).toEqual(expected(r.outputs[0]!));
  });

  test("a teacher that fails (on_error fail) fails the session with the teacher named; keep finishes it without teacher_log_probs", async () => {
    const { deps } = await setup();
    const down: TeacherConfig = { ...TEACHER, url: "http://127.0.0.1:9" };
    deps.teacher = cachedTeacherClients((cfg) => ({ url: cfg.url!, format: cfg.format, retry: { retries: 0 }, fetch: async () => new Response('{"detail":"down"}', { status: 503 }) }));
    const storage = new MemorySessionStorage();
    const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), finishOutputs: sessionOutputFinisher(deps) };
    const failing = inputFor(2, 0, rolloutConfig({ teacher: down }));
    const r = await (await TrajectorySession.open(failing.key, sd, failing))!.run();
    expect(r).toEqual({
      status: "failed",
      error: "TeacherError: rollout.teacher (sglang at http://127.0.0.1:9) could not score output 0: engine at http://127.0.0.1:9/generate answered HTTP 503: down",
    });
    const kept = inputFor(2, 1, rolloutConfig({ teacher: { ...down, on_error: "keep" } }));
    const k = await (await TrajectorySession.open(kept.key, sd, kept))!.run();
    if (k.status !== "finished") throw new Error(JSON.stringify(k));
    expect("teacher_log_probs" in k.outputs[0]!).toBe(false);
    expect(k.outputs[0]!.extra_fields.teacher_error).toBe("rollout.teacher (sglang at http://127.0.0.1:9) could not score output 0: engine at http://127.0.0.1:9/generate answered HTTP 503: down");
  });
});
