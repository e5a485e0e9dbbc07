import { describe, expect, test } from "bun:test";
import { BadEngineResponseError } from "../../shared/errors.ts";
import { finishOutput, type RawEngineOutput } from "../../shared/inference/finish-output.ts";
import { TokenOutput } from "../../shared/schema/index.ts";

const URL_ = "http://engine.test/v1/completions";

/** What finishOutput returned before its fast path: the same fields through TokenOutput's zod schema. */
function viaZod(raw: RawEngineOutput): TokenOutput {
  return TokenOutput.parse({
    token_ids: raw.ids,
    ...(raw.wantLogprobs ? { log_probs: raw.logProbs ?? (raw.ids.length === 0 ? [] : undefined) } : {}),
    finish_reason: raw.finishReason ?? raw.defaultFinish,
    ...(raw.stopReason !== undefined ? { stop_reason: raw.stopReason } : {}),
    num_preempted: -1,
    ...(raw.cachedTokens !== undefined ? { cached_tokens: raw.cachedTokens } : {}),
    extra_fields: {},
  });
}

function errorOf(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    expect(e).toBeInstanceOf(BadEngineResponseError);
    return (e as Error).message;
  }
  throw new Error("no error");
}

describe("finishOutput: per-token arrays checked without zod, same output and errors", () => {
  const cases: Array<[string, RawEngineOutput]> = [
    ["ids and log-probs, stop id as stop_reason, cached tokens", { ids: [151657, 198, 151645], logProbs: [-0.5, -0.25, 0], wantLogprobs: true, finishReason: "stop", stopReason: 151645, cachedTokens: 16 }],
    ["no log-probs asked, stop string, length", { ids: [1, 2], logProbs: [-1, -2], wantLogprobs: false, finishReason: "length", stopReason: "####" }],
    ["null stop_reason, default finish, empty output", { ids: [], wantLogprobs: true, finishReason: null, stopReason: null, defaultFinish: "stop" }],
  ];
  for (const [name, raw] of cases) {
    test(name, () => {
      const got = finishOutput(URL_, raw);
      const want = viaZod(raw);
      expect(got).toEqual(want);
      expect(Object.keys(got)).toEqual(Object.keys(want));
    });
  }

  test("a bad id still gets zod's message naming the field and index", () => {
    expect(errorOf(() => finishOutput(URL_, { ids: [5, -1], wantLogprobs: false, finishReason: "stop" }))).toBe(
      `engine at ${URL_} sent an unusable reply: token_ids.1: Too small: expected number to be >=0`,
    );
    expect(errorOf(() => finishOutput(URL_, { ids: [5, 1.5], wantLogprobs: false, finishReason: "stop" }))).toBe(
      `engine at ${URL_} sent an unusable reply: token_ids.1: Invalid input: expected int, received number`,
    );
    expect(errorOf(() => finishOutput(URL_, { ids: [5], wantLogprobs: false, finishReason: "stop", cachedTokens: -3 }))).toBe(
      `engine at ${URL_} sent an unusable reply: cached_tokens: Too small: expected number to be >=0`,
    );
  });
});
