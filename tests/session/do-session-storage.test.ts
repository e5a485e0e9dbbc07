import { describe, expect, test } from "bun:test";
import { AGENT_ENTRY_PREFIX, DurableObjectSessionStorage } from "../../infra/cloudflare/do-session-storage.ts";
import { fakeDurableObjectStorage } from "../helpers/durable-object.ts";
import { isStaleStep } from "../../shared/session/session-storage.ts";

describe("DurableObjectSessionStorage: prefixed logs in one object, stepOf", () => {
  test("the trajectory's log and the agent log (prefix a/) share one object without touching each other", async () => {
    const raw = fakeDurableObjectStorage();
    const traj = new DurableObjectSessionStorage(raw);
    const agent = new DurableObjectSessionStorage(raw, { prefix: AGENT_ENTRY_PREFIX });
    expect([await traj.stepOf("k"), await agent.stepOf("agent:k")]).toEqual([null, null]);
    await traj.append("k", 0, '{"t":0}', { input: '{"in":1}' });
    await agent.append("agent:k", 0, '{"e":"open"}', { input: '{"key":"k"}' });
    await agent.append("agent:k", 1, '{"e":"finish"}');
    expect([...raw.m.keys()].sort()).toEqual(["a/i:0", "a/in", "a/n", "a/p:0", "a/p:1", "a/step", "i:0", "in", "n", "p:0", "step"]);
    expect(await traj.get("k")).toEqual({ input: '{"in":1}', deltas: ['{"t":0}'], step: 0 });
    expect(await agent.get("agent:k")).toEqual({ input: '{"key":"k"}', deltas: ['{"e":"open"}', '{"e":"finish"}'], step: 1 });
    expect([await traj.stepOf("k"), await agent.stepOf("agent:k")]).toEqual([0, 1]);
    // Each log is fenced by its own step.
    const err = await agent.append("agent:k", 1, "{}").catch((e) => e);
    expect(isStaleStep(err)).toBe(true);
    await traj.append("k", 1, '{"t":1}');
    await agent.delete("agent:k");
    expect(await agent.get("agent:k")).toBeNull();
    expect(await agent.stepOf("agent:k")).toBeNull();
    expect(await traj.get("k")).toEqual({ input: '{"in":1}', deltas: ['{"t":0}', '{"t":1}'], step: 1 });
  });
});
