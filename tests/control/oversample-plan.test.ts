import { describe, expect, test } from "bun:test";
import { oversamplePlan, type RolloutRequest } from "../../shared/rollout/batch.ts";
import { RolloutConfig } from "../../shared/schema/index.ts";
import { InputError } from "../../shared/errors.ts";

// Which setting decides a batch's target: the request's target_groups wins over rollout.oversample, and the
// plan (reported as oversample.target_from in GET /v1/rollouts/{id}) says which one applied.
const rows = (n: number) => Array.from({ length: n }, (_, i) => ({ prompt: [{ role: "user", content: `q${i}` }] }));
const req = (n: number, extra: Partial<RolloutRequest> = {}) => ({ rows: rows(n), global_steps: 1, model_version: null, validate: false, ...extra }) as unknown as RolloutRequest;
const DAPO = { metric: "reward", drop_if: "all_equal" } as const;

describe("oversamplePlan: target_groups, rollout.oversample, filter_groups", () => {
  test("rollout.oversample alone: ceil(rows / oversample), every row eager", () => {
    expect(oversamplePlan(req(10), RolloutConfig.parse({ oversample: 1.5 }))).toEqual({ target_groups: 7, eager_rows: 10, partial_rollout: "cancel", filter: null, target_from: "rollout.oversample" });
  });
  test("target_groups wins over rollout.oversample, and says so", () => {
    expect(oversamplePlan(req(10, { target_groups: 4 }), RolloutConfig.parse({ oversample: 1.5, partial_rollout: "carry" }))).toEqual({
      target_groups: 4,
      eager_rows: 10,
      partial_rollout: "carry",
      filter: null,
      target_from: "target_groups",
    });
  });
  test("filter_groups alone: every row is the target; with a target the rest is the reserve", () => {
    expect(oversamplePlan(req(6), RolloutConfig.parse({ filter_groups: DAPO }))).toEqual({ target_groups: 6, eager_rows: 6, partial_rollout: "cancel", filter: DAPO, target_from: "filter_groups" });
    expect(oversamplePlan(req(6, { target_groups: 4 }), RolloutConfig.parse({ filter_groups: DAPO }))).toMatchObject({ target_groups: 4, eager_rows: 4, target_from: "target_groups" });
  });
  test("neither: a plain batch; more groups than rows: InputError naming target_groups", () => {
    expect(oversamplePlan(req(6), RolloutConfig.parse({}))).toBeNull();
    const e = (() => {
      try {
        oversamplePlan(req(3, { target_groups: 4 }), RolloutConfig.parse({}));
      } catch (x) {
        return x as InputError;
      }
    })();
    expect(e).toBeInstanceOf(InputError);
    expect(e!.message).toContain("target_groups 4 is more than the batch's 3 rows");
  });
});
