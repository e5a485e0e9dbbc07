import { expect, test } from "bun:test";
import { groundTruthField, MAX_RECORDED_GROUND_TRUTH_CHARS } from "../../shared/rollout/batch.ts";

// What a record copies of its row's reward_model.ground_truth (extra_fields.ground_truth, shown by the viewer beside the reward).
test("groundTruthField: any JSON value up to 2,048 characters of JSON is copied; none, null or a longer one is not", () => {
  expect(MAX_RECORDED_GROUND_TRUTH_CHARS).toBe(2048);
  expect(groundTruthField({ reward_model: { style: "rule", ground_truth: "121" } })).toEqual({ ground_truth: "121" });
  expect(groundTruthField({ reward_model: { ground_truth: 0 } })).toEqual({ ground_truth: 0 });
  expect(groundTruthField({ reward_model: { ground_truth: { answers: ["a", "b"], tol: 0.5 } } })).toEqual({ ground_truth: { answers: ["a", "b"], tol: 0.5 } });
  for (const row of [null, undefined, {}, { reward_model: null }, { reward_model: {} }, { reward_model: { ground_truth: null } }]) expect(groundTruthField(row)).toEqual({});
  // The limit is on the JSON text: a string of 2,046 characters is 2,048 with its quotes.
  const fits = "x".repeat(2046);
  expect(groundTruthField({ reward_model: { ground_truth: fits } })).toEqual({ ground_truth: fits });
  expect(groundTruthField({ reward_model: { ground_truth: fits + "x" } })).toEqual({});
});
