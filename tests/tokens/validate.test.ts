import { describe, expect, test } from "bun:test";
import { validateTrajectory, type TrajectoryShape, type ValidateOptions } from "../../shared/tokens/validate.ts";
import { TrajectoryInvariantError } from "../../shared/errors.ts";

const metrics = { generate_sequences: 0.5, tool_calls: 0.25, compute_score: 0, num_preempted: -1 };
const good = (): TrajectoryShape => ({
  prompt_ids: [1, 2, 3],
  response_ids: [10, 11, 198, 12],
  response_mask: [1, 1, 0, 1],
  logprobs: [-0.5, -1, 0, -9999],
  num_turns: 4,
  metrics: { ...metrics },
});
const opts = { responseLength: 4, promptLength: 3, trackLogProbs: true };

function broken(t: TrajectoryShape, o: ValidateOptions = opts): TrajectoryInvariantError {
  try {
    validateTrajectory(t, o);
  } catch (e) {
    expect(e).toBeInstanceOf(TrajectoryInvariantError);
    return e as TrajectoryInvariantError;
  }
  throw new Error("validator accepted a broken trajectory");
}

describe("validateTrajectory", () => {
  test("accepts a good trajectory", () => {
    expect(() => validateTrajectory(good(), opts)).not.toThrow();
    expect(() => validateTrajectory({ ...good(), logprobs: null }, { ...opts, trackLogProbs: false })).not.toThrow();
  });

  test("token_ids: negative or fractional ids, with the index", () => {
    const e = broken({ ...good(), response_ids: [10, -1, 198, 12] });
    expect([e.invariant, e.index]).toEqual(["token_ids", 1]);
    expect(broken({ ...good(), prompt_ids: [1, 2.5, 3] }).index).toBe(1);
  });

  test("mask_values: only 0 and 1", () => {
    const e = broken({ ...good(), response_mask: [1, 1, 2, 1] });
    expect([e.invariant, e.index]).toEqual(["mask_values", 2]);
  });

  test("aligned_lengths: mask and log-probs match the ids", () => {
    expect(broken({ ...good(), response_mask: [1, 1, 0] }).invariant).toBe("aligned_lengths");
    const e = broken({ ...good(), logprobs: [-0.5, -1, 0] });
    expect([e.invariant, e.index]).toEqual(["aligned_lengths", 3]);
    expect(broken({ ...good(), logprobs: null }).invariant).toBe("aligned_lengths");
    expect(broken(good(), { ...opts, trackLogProbs: false }).invariant).toBe("aligned_lengths");
  });

  test("observation_logprob_zero: mask-0 tokens carry 0.0", () => {
    const e = broken({ ...good(), logprobs: [-0.5, -1, -0.1, -2] });
    expect([e.invariant, e.index]).toEqual(["observation_logprob_zero", 2]);
    expect(e.message).toContain("at index 2");
  });

  test("sampled_logprob_range: finite and <= 0", () => {
    expect(broken({ ...good(), logprobs: [-0.5, 0.5, 0, -2] }).index).toBe(1);
    expect(broken({ ...good(), logprobs: [NaN, -1, 0, -2] }).invariant).toBe("sampled_logprob_range");
    expect(broken({ ...good(), logprobs: [-Infinity, -1, 0, -2] }).index).toBe(0);
  });

  test("response_budget: never longer than response_length", () => {
    const e = broken(good(), { ...opts, responseLength: 3 });
    expect([e.invariant, e.index]).toEqual(["response_budget", 3]);
  });

  test("prompt_length: the initial prompt fits", () => {
    expect(broken(good(), { ...opts, promptLength: 2 }).invariant).toBe("prompt_length");
  });

  test("num_preempted: -1 means unknown, below is an error", () => {
    expect(broken({ ...good(), metrics: { ...metrics, num_preempted: -2 } }).invariant).toBe("num_preempted");
  });

  test("metrics_nonnegative and num_turns", () => {
    expect(broken({ ...good(), metrics: { ...metrics, tool_calls: -1 } }).invariant).toBe("metrics_nonnegative");
    expect(broken({ ...good(), num_turns: 0 }).invariant).toBe("num_turns");
  });
});

describe("context_length", () => {
  test("prompt + response never exceed max_model_len when it is known", () => {
    expect(() => validateTrajectory(good(), { ...opts, maxModelLen: 7 })).not.toThrow();
    const e = broken(good(), { ...opts, maxModelLen: 6 });
    expect([e.invariant, e.index]).toEqual(["context_length", 3]);
  });
});
