import { describe, expect, test } from "bun:test";
import { TrajectoryInvariantError } from "../../shared/errors.ts";
import type { RoutedExpertsSpan } from "../../shared/schema/index.ts";
import { decodeInt32 } from "../../shared/schema/typed-base64.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import { validateTrajectory } from "../../shared/tokens/validate.ts";

/** A span over positions `start … start + rows.length − 1`, shape [layers, top_k] = [1, 2]. */
function span(rows: [number, number][], start = 0): RoutedExpertsSpan {
  return { data: Int32Array.from(rows.flat()), shape: [1, 2], start, tokens: rows.length };
}

/** Rows for positions 0..n-1: [base + p, base + 50 + p]. */
function rows(n: number, base: number): [number, number][] {
  return Array.from({ length: n }, (_, p) => [base + p, base + 50 + p] as [number, number]);
}

const metrics = { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 };
const finish = (b: TrajectoryBuilder) => b.finish({ numTurns: 4, rewardScore: null, metrics, extraFields: {}, finishReason: "stop" });

describe("TrajectoryBuilder: routed experts over prompt ‖ response", () => {
  test("alignment: each call's experts overwrite the positions they cover; observations get the next call's prefill; the last sampled token keeps the fill value 0", () => {
    const b = new TrajectoryBuilder({ promptIds: [10, 11, 12], responseLength: 20, maxModelLen: 100, trackLogProbs: false });
    // Call 1: input = prompt (3), output A1 = [20, 21]: SGLang covers 3 + 2 − 1 = 4 positions.
    b.appendAction([20, 21]);
    b.applyRoutedExperts(span(rows(4, 100)));
    expect(Array.from(b.routedExperts()!.data)).toEqual([100, 150, 101, 151, 102, 152, 103, 153, 0, 0]);
    // Observation O1 = [30, 31]: not routed yet.
    b.appendObservation([30, 31]);
    expect(Array.from(b.routedExperts()!.data)).toEqual([100, 150, 101, 151, 102, 152, 103, 153, 0, 0, 0, 0, 0, 0]);
    // Call 2: input = prompt ‖ A1 ‖ O1 (7), output A2 = [40]: covers 7 + 1 − 1 = 7 positions (the prefix-cached ones too).
    b.appendAction([40]);
    b.applyRoutedExperts(span([...rows(4, 100), [104, 154], [105, 155], [106, 156]]));
    const o = finish(b);
    expect(o.routed_experts_shape).toEqual([1, 2]);
    // Positions: prompt 0–2, A1 3–4, O1 5–6 (filled by call 2's prefill), A2 7 (never forwarded: 0).
    expect(o.routed_experts).toEqual([100, 150, 101, 151, 102, 152, 103, 153, 104, 154, 105, 155, 106, 156, 0, 0]);
    expect(o.routed_experts!.length).toBe((o.prompt_ids.length + o.response_ids.length) * 2);
  });

  test("no experts applied → the output has neither field (absent, not null)", () => {
    const b = new TrajectoryBuilder({ promptIds: [1, 2], responseLength: 4, maxModelLen: 100, trackLogProbs: false });
    b.appendAction([3]);
    b.applyRoutedExperts(undefined);
    const o = finish(b);
    expect("routed_experts" in o).toBe(false);
    expect("routed_experts_shape" in o).toBe(false);
    expect(b.snapshot()).not.toHaveProperty("routed_experts");
  });

  test("response_length cut (C8): rows past the kept tokens are dropped with them", () => {
    const b = new TrajectoryBuilder({ promptIds: [10, 11], responseLength: 3, maxModelLen: 100, trackLogProbs: false });
    const r = b.appendAction([20, 21, 22, 23, 24]);
    expect(r).toEqual({ appended: 3, truncated: true });
    b.applyRoutedExperts(span(rows(6, 0)));
    const o = finish(b);
    expect(o.response_ids).toEqual([20, 21, 22]);
    expect(o.routed_experts).toEqual([0, 50, 1, 51, 2, 52, 3, 53, 4, 54]);
  });

  test("max_model_len cut (C12): experts never exceed the context", () => {
    const b = new TrajectoryBuilder({ promptIds: [10, 11, 12], responseLength: 50, maxModelLen: 5, trackLogProbs: false });
    b.appendAction([20, 21, 22, 23]);
    b.applyRoutedExperts(span(rows(6, 7)));
    const o = finish(b);
    expect(o.response_ids).toEqual([20, 21]);
    expect(o.routed_experts).toEqual([7, 57, 8, 58, 9, 59, 10, 60, 11, 61]);
  });

  test("observation cut by the budget (C11): the next call never happens; the trailing observation keeps 0", () => {
    const b = new TrajectoryBuilder({ promptIds: [10], responseLength: 4, maxModelLen: 100, trackLogProbs: false });
    b.appendAction([20, 21]);
    b.applyRoutedExperts(span(rows(2, 1)));
    expect(b.appendObservation([30, 31, 32])).toEqual({ appended: 2, truncated: true });
    const o = finish(b);
    expect(o.routed_experts).toEqual([1, 51, 2, 52, 0, 0, 0, 0, 0, 0]);
  });

  test("a span of another shape is refused naming routed_experts; a span starting past the stream is ignored", () => {
    const b = new TrajectoryBuilder({ promptIds: [10], responseLength: 4, maxModelLen: 100, trackLogProbs: false });
    b.appendAction([20]);
    b.applyRoutedExperts(span(rows(1, 1)));
    b.applyRoutedExperts(span(rows(2, 9), 5));
    expect(Array.from(b.routedExperts()!.data)).toEqual([1, 51, 0, 0]);
    const e = (() => {
      try {
        b.applyRoutedExperts({ data: new Int32Array(4), shape: [2, 2], start: 0, tokens: 1 });
      } catch (err) {
        return err;
      }
    })();
    expect(e).toBeInstanceOf(TrajectoryInvariantError);
    expect((e as TrajectoryInvariantError).invariant).toBe("routed_experts");
  });

  test("snapshot carries them as base64 int32 (not numbers) and restores bit-exact", () => {
    const b = new TrajectoryBuilder({ promptIds: [10, 11], responseLength: 10, maxModelLen: 100, trackLogProbs: false });
    b.appendAction([20, 21]);
    b.applyRoutedExperts(span([[7, -1], [2147483647, 3], [5, 6]]));
    b.appendObservation([30]);
    const snap = b.snapshot();
    expect(typeof snap.routed_experts).toBe("string");
    expect(snap.routed_experts_shape).toEqual([1, 2]);
    expect(Array.from(decodeInt32(snap.routed_experts!))).toEqual([7, -1, 2147483647, 3, 5, 6, 0, 0, 0, 0]);
    const back = TrajectoryBuilder.fromSnapshot(JSON.parse(JSON.stringify(snap)), false);
    expect(Array.from(back.routedExperts()!.data)).toEqual([7, -1, 2147483647, 3, 5, 6, 0, 0, 0, 0]);
    back.appendAction([40]);
    expect(Array.from(back.routedExperts()!.data)).toEqual([7, -1, 2147483647, 3, 5, 6, 0, 0, 0, 0, 0, 0]);
  });

  test("the experts array grows past its first capacity (1,000 tokens) with every value kept", () => {
    const b = new TrajectoryBuilder({ promptIds: [1], responseLength: 2000, maxModelLen: 4000, trackLogProbs: false });
    for (let t = 0; t < 10; t++) {
      b.appendAction(Array.from({ length: 100 }, (_, i) => 1000 + i));
      const n = b.contextLength - 1;
      b.applyRoutedExperts({ data: Int32Array.from({ length: n * 2 }, (_, i) => i), shape: [1, 2], start: 0, tokens: n });
    }
    const re = b.routedExperts()!;
    expect(re.data.length).toBe(1001 * 2);
    expect(re.data[1999]).toBe(1999);
    expect(re.data[2000]).toBe(0);
    expect(re.data[2001]).toBe(0);
  });
});

describe("validateTrajectory: routed_experts", () => {
  const base = { prompt_ids: [1, 2], response_ids: [3], response_mask: [1], logprobs: null, num_turns: 2, metrics };
  const opts = { responseLength: 10, trackLogProbs: false };
  const inv = (t: object) => {
    try {
      validateTrajectory({ ...base, ...t }, opts);
      return null;
    } catch (e) {
      return `${(e as TrajectoryInvariantError).invariant}: ${(e as Error).message}`;
    }
  };
  test("length = (P + R) · layers · top_k; both or neither; ids ≥ −1", () => {
    expect(inv({ routed_experts: [1, 2, 3, 4, 5, 6], routed_experts_shape: [1, 2] })).toBeNull();
    expect(inv({ routed_experts: [1, 2, 3, 4, 5], routed_experts_shape: [1, 2] })).toContain("routed_experts: routed_experts has 5 values, expected (2 + 1) tokens × 1 × 2 = 6");
    expect(inv({ routed_experts: [1, 2, 3, 4, 5, 6] })).toContain("routed_experts: routed_experts and routed_experts_shape go together");
    expect(inv({ routed_experts: [1, 2, 3, 4, 5, -2], routed_experts_shape: [1, 2] })).toContain("routed_experts[5] = -2");
    expect(inv({ routed_experts: [], routed_experts_shape: [0, 2] })).toContain("is not [layers >= 1, top_k >= 1]");
  });
});
