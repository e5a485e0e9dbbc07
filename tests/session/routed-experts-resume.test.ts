import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { DEFAULT_SIM_MOE } from "../../infra/sim-engine/sim-engine.ts";
import { packOutput, unpackOutput } from "../../shared/session/checkpoint.ts";
import { decodeInt32 } from "../../shared/schema/typed-base64.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession } from "../../shared/session/trajectory-session.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { comparable, depsFor, inputFor, rolloutConfig, sessionLoopFactory } from "./fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Crash resume with routed experts: a session killed at any commit and resumed from its
// append-only checkpoint (deltas carrying the experts as base64 int32, including positions a later
// call re-covered) produces exactly the record of an uninterrupted run.
let tools: ToolServer;
beforeAll(() => {
  tools = startToolServer({ port: 0 });
});
afterAll(() => tools.stop());

const PER = DEFAULT_SIM_MOE.layers * DEFAULT_SIM_MOE.top_k;
const rollout = rolloutConfig({ return_routed_experts: true });

/** A storage whose `kill`-th append throws (the process died before it was committed). */
function dyingAt(inner: SessionStorage, kill: number): SessionStorage {
  let n = 0;
  return {
    get: (k) => inner.get(k),
    delete: (k) => inner.delete(k),
    append: async (k, step, d, o) => {
      if (++n === kill) throw new Error("killed");
      return inner.append(k, step, d, o);
    },
  };
}

async function runFresh(uid: string, storage: SessionStorage) {
  const { deps, engine } = await depsFor(tools.url);
  const input = inputFor(3, 0, rollout, uid);
  const s = (await TrajectorySession.open(input.key, { storage, createLoop: sessionLoopFactory(deps), commitRetries: 0 }, input))!;
  return { s, input, deps, engine };
}

describe("routed experts survive crash resume (append-only checkpoints)", () => {
  test("the uninterrupted run: experts cover the stream but its last token; deltas carry base64 experts, re-covering observation positions", async () => {
    const mem = new MemorySessionStorage();
    const { s, input, engine } = await runFresh("reref", mem);
    const r = await s.run();
    if (r.status !== "finished") throw new Error(JSON.stringify(r));
    const o = r.outputs[0]!;
    const stream = [...o.prompt_ids, ...o.response_ids];
    expect(o.num_turns).toBeGreaterThanOrEqual(4);
    expect(o.routed_experts_shape).toEqual([DEFAULT_SIM_MOE.layers, DEFAULT_SIM_MOE.top_k]);
    expect(o.routed_experts).toEqual([...engine.routedExperts(stream, stream.length - 1), ...new Array(PER).fill(0)]);
    const deltas = (await mem.get(input.key))!.deltas.map((d) => JSON.parse(d));
    const withExperts = deltas.filter((d) => d.loop?.builder?.routed_experts !== undefined).map((d) => d.loop.builder);
    expect(withExperts.length).toBeGreaterThanOrEqual(2);
    for (const b of withExperts) expect(typeof b.routed_experts).toBe("string");
    // A later delta starts inside what was committed before: the previous last token and the observation,
    // which only the next call's prefill covered (not from 0: unchanged prefix positions are not rewritten).
    const later = withExperts.slice(1);
    for (const b of later) expect(b.routed_experts_from).toBeGreaterThan(0);
    const P = decodeInt32(deltas.find((d) => d.loop?.builder?.prompt_ids)!.loop.builder.prompt_ids).length;
    expect(later.some((b) => b.routed_experts_from < P + b.from)).toBe(true);
    // The finished output is stored packed: experts as base64, not a JSON number array.
    const last = deltas.at(-1)!;
    const stored = (deltas.find((d) => Array.isArray(d.outputs) && d.outputs.length) ?? last).outputs[0];
    expect(typeof stored.routed_experts).toBe("string");
    expect(unpackOutput(stored).routed_experts).toEqual(o.routed_experts!);
  });

  test("killed at every commit in turn, then resumed: each record equals the uninterrupted one (experts bit-exact)", async () => {
    const ref = await runFresh("reref2", new MemorySessionStorage());
    const rr = await ref.s.run();
    if (rr.status !== "finished") throw new Error(JSON.stringify(rr));
    const want = comparable(rr.outputs[0]!);
    const commits = (await (async () => {
      const mem = new MemorySessionStorage();
      const { s, input } = await runFresh("count", mem);
      await s.run();
      return (await mem.get(input.key))!.deltas.length;
    })());
    expect(commits).toBeGreaterThanOrEqual(4);
    for (let kill = 2; kill <= commits; kill++) {
      const inner = new MemorySessionStorage();
      const { s, input, deps } = await runFresh(`kill${kill}`, dyingAt(inner, kill));
      await expect(s.run()).rejects.toThrow("killed");
      const resumed = (await TrajectorySession.open(input.key, { storage: inner, createLoop: sessionLoopFactory(deps) }))!;
      const r = await resumed.run();
      if (r.status !== "finished") throw new Error(`kill ${kill}: ${JSON.stringify(r)}`);
      const got = comparable(r.outputs[0]! as AgentLoopOutput);
      expect(got.routed_experts).toEqual(want.routed_experts);
      expect(got).toEqual(want);
    }
  }, HANG_MS);

  test("packOutput/unpackOutput: experts round-trip bit-exact; an output without them stays without", () => {
    const o: AgentLoopOutput = {
      prompt_ids: [1],
      response_ids: [2],
      response_mask: [1],
      response_logprobs: null,
      reward_score: null,
      num_turns: 2,
      truncated: false,
      finish_reason: "stop",
      metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
      extra_fields: {},
      routed_experts: [2147483647, -1, 0, 7],
      routed_experts_shape: [1, 2],
    };
    const packed = JSON.parse(JSON.stringify(packOutput(o)));
    expect(packed.routed_experts).toBe("////f/////8AAAAABwAAAA==");
    expect(unpackOutput(packed)).toEqual(o);
    const { routed_experts: _a, routed_experts_shape: _b, ...plain } = o;
    const p2 = JSON.parse(JSON.stringify(packOutput(plain)));
    expect("routed_experts" in p2).toBe(false);
    expect("routed_experts" in unpackOutput(p2)).toBe(false);
  });
});
