import { describe, expect, test } from "bun:test";
import { StoreError } from "../../shared/errors.ts";
import type { SessionInputArg } from "../../shared/session/checkpoint.ts";
import { foldCheckpoint } from "../../shared/session/checkpoint-delta.ts";
import { MemorySessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import { comparable, depsFor, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";

// N2 (issue 27): a checkpoint log is a chain of deltas, each relative to the one before. After a store loss a
// running owner's next commit lands on an empty hash — a log that begins mid-way, without the session's input.
// Such a log is never folded into a session (a resume would continue from an empty prompt and half a history):
// without its input it opens as a fresh session, and a log with its input but without its beginning is refused.
const ROW = { data_source: "edge", prompt: [{ role: "user", content: "Say hi." }], reward_model: { style: "rule", ground_truth: "1" } };
const input: SessionInputArg = {
  key: "gap_0_0",
  agent_name: "tool_agent",
  sampling_params: { temperature: 1, top_p: 1, top_k: -1, logprobs: true, seed: 5 },
  kwargs: { ...ROW, uid: "gap", session_id: 0, global_steps: 0, key: "gap_0_0" },
  rollout: rolloutConfig(),
  model_version: null,
};

describe("checkpoint logs that lost their beginning", async () => {
  const { deps } = await depsFor("http://127.0.0.1:9");
  const storage = new MemorySessionStorage();
  const sd: SessionDeps = { storage, createLoop: sessionLoopFactory(deps) };
  const result = await (await TrajectorySession.open(input.key, sd, input))!.run();
  const stored = (await storage.get(input.key))!;

  test("the whole log folds to the finished session; the log without step 0 is refused with code session_gap", () => {
    expect(result.status).toBe("finished");
    expect(stored.deltas.length).toBeGreaterThanOrEqual(2);
    expect(stored.deltas.map((d) => (JSON.parse(d) as { step: number }).step)).toEqual(stored.deltas.map((_, i) => i));
    expect(foldCheckpoint(stored.deltas, input.key).cp.phase).toBe("finished");
    let err: unknown;
    try {
      foldCheckpoint(stored.deltas.slice(1), input.key);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(StoreError);
    expect((err as StoreError).code).toBe("session_gap");
    expect((err as StoreError).message).toBe("session 'gap_0_0': stored checkpoint begins at step 1, not 0 (its earlier steps are gone)");
  });

  test("a hash recreated by a late commit (no input, one delta) opens as a fresh session, not as its stale state", async () => {
    const lost = new MemorySessionStorage();
    const last = stored.deltas[stored.deltas.length - 1]!;
    await lost.append(input.key, stored.step, last);
    // Without its input nothing can resume it: opening without one finds nothing to run…
    expect(await TrajectorySession.open(input.key, { storage: lost, createLoop: sessionLoopFactory(deps) })).toBeNull();
    // …and with one it starts from the beginning, fenced after the stored step, and samples the same trajectory again.
    const again = await (await TrajectorySession.open(input.key, { storage: lost, createLoop: sessionLoopFactory(deps) }, input))!.run();
    expect(again.status).toBe("finished");
    if (again.status !== "finished" || result.status !== "finished") return;
    expect(again.outputs.map(comparable)).toEqual(result.outputs.map(comparable));
    expect((await lost.get(input.key))!.step).toBeGreaterThan(stored.step);
  });
});
