import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { ConflictError } from "../../shared/errors.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { CheckpointDelta, type SessionCheckpoint } from "../../shared/session/checkpoint.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { DyingStorage } from "../helpers/dying-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { comparable, depsFor, inputFor, sessionLoopFactory } from "./fixtures.ts";

let tools: ToolServer;
beforeAll(() => {
  tools = startToolServer({ port: 0 });
});
afterAll(async () => {
  await tools.stop();
});

async function executions(): Promise<number> {
  return ((await (await fetch(`${tools.url}/stats`)).json()) as { executions: number }).executions;
}


async function runToEnd(deps: SessionDeps, input: ReturnType<typeof inputFor>): Promise<AgentLoopOutput> {
  const s = (await TrajectorySession.open(input.key, deps, input))!;
  const r = await s.run();
  if (r.status !== "finished") throw new Error(`unexpected ${JSON.stringify(r)}`);
  return r.outputs[0]!;
}

describe("TrajectorySession", () => {
  test("runs tool_agent as committed steps; the checkpoint sequence names every state", async () => {
    const { deps } = await depsFor(tools.url);
    const storage = new MemorySessionStorage();
    const commits: SessionCheckpoint[] = [];
    const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), onCommit: (cp) => commits.push(structuredClone(cp)) };
    const out = await runToEnd(sd, inputFor(0));
    expect(out.num_turns).toBe(4);
    expect(out.reward_score).toBe(1);
    expect(commits.map((c) => `${c.step}:${c.phase}:${c.loop_state}`)).toEqual([
      "0:running:generating",
      "1:running:processing_tools",
      "2:running:generating",
      "3:running:terminated",
      "4:finished:terminated",
    ]);
    // Every stored checkpoint passes the schema; the pending tool call is in the one that issued it.
    const stored = await storage.get("u0_0_0");
    // Append-only: one stored delta per commit, each passing the schema; the last is the finished one.
    expect(stored!.deltas.map((d) => CheckpointDelta.parse(JSON.parse(d)).phase)).toEqual(["running", "running", "running", "running", "finished"]);
    expect(commits[1]!.loop!.pending).toEqual([{ index: 0, name: "calc", arguments: { expression: "12*3-5" }, raw: expect.any(String) }]);
    expect(commits[1]!.loop!.assistant_turns).toBe(1);
  });

  test("a kill before each commit resumes to the identical trajectory; no tool call executes twice", async () => {
    const { deps } = await depsFor(tools.url);
    const input = inputFor(3, 1); // the two-tool row: lookup then calc
    const before = await executions();
    const reference = await runToEnd({ storage: new MemorySessionStorage(), createLoop: sessionLoopFactory(deps) }, input);
    const perRun = (await executions()) - before;
    expect(perRun).toBe(2);
    // The tool server remembers call ids: use a fresh uid per kill point so every run really calls it.
    let total = 0;
    for (let killAt = 1; ; killAt++) {
      const inp = { ...inputFor(3, 1, undefined, `k${killAt}`) };
      const mem = new MemorySessionStorage();
      const dying = new DyingStorage(mem, killAt);
      const e0 = await executions();
      const s1 = (await TrajectorySession.open(inp.key, { storage: dying, createLoop: sessionLoopFactory(deps) }, inp))!;
      const killed = await s1.run().then(
        () => false,
        (e) => (e as Error).message === "killed",
      );
      if (!killed) break;
      // A new owner (new process) resumes from what was committed (the rerun passes the same input; a stored one wins).
      const s2 = (await TrajectorySession.open(inp.key, { storage: mem, createLoop: sessionLoopFactory(deps) }, inp))!;
      const r = await s2.run();
      expect(r.status).toBe("finished");
      const out = (r as { outputs: AgentLoopOutput[] }).outputs[0]!;
      expect(comparable(out)).toEqual(comparable({ ...reference }));
      expect((await executions()) - e0).toBe(2);
      total++;
    }
    expect(total).toBe(7);
  });

  test("a second owner's stale commit is refused (step fence)", async () => {
    const { deps } = await depsFor(tools.url);
    const storage = new MemorySessionStorage();
    const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps) };
    const input = inputFor(1, 0, undefined, "fence");
    const a = (await TrajectorySession.open(input.key, sd, input))!;
    const b = (await TrajectorySession.open(input.key, sd, input))!;
    expect((await a.run()).status).toBe("finished");
    await expect(b.run()).rejects.toBeInstanceOf(ConflictError);
  });

  test("single_turn_agent runs whole; a finished session writes once and is done", async () => {
    const { deps } = await depsFor(tools.url);
    const storage = new MemorySessionStorage();
    const written: string[] = [];
    const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps), writeOutputs: async (inp) => void written.push(inp.key) };
    const input = { ...inputFor(2, 0, undefined, "single"), agent_name: "single_turn_agent" };
    const s = (await TrajectorySession.open(input.key, sd, input))!;
    expect(await s.run()).toEqual({ status: "done" });
    const again = (await TrajectorySession.open(input.key, sd, input))!;
    expect(await again.run()).toEqual({ status: "done" });
    expect(written).toEqual(["single_0_0"]);
    expect(JSON.parse((await storage.get("single_0_0"))!.deltas.at(-1)!)).toMatchObject({ phase: "done", loop_state: "whole", outputs: null, step: 1 });
  });

  test("a row with a bad prompt fails once, committed", async () => {
    const { deps } = await depsFor(tools.url);
    const storage = new MemorySessionStorage();
    const input = { ...inputFor(0, 0, undefined, "bad"), kwargs: { uid: "bad", session_id: 0, prompt: [{ role: "robot", content: "x" }] } };
    const s = (await TrajectorySession.open(input.key, { storage, createLoop: sessionLoopFactory(deps) }, input))!;
    const r = await s.run();
    expect(r.status).toBe("failed");
    expect((r as { error: string }).error).toStartWith("InputError: prompt[0].role");
    expect((await storage.get("bad_0_0"))!.step).toBe(0);
  });
});
