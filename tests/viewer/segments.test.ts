import { expect, test } from "bun:test";
import { versionStarts, visibleToken } from "../../functions/viewer/client/segments.ts";

test("versionStarts: a label at each token_versions segment start (null → unknown, numbers as JSON); bad shapes and out-of-range starts give nothing", () => {
  expect([
    ...versionStarts(
      [
        [0, "v1"],
        [17, "v2"],
        [30, null],
        [41, 7],
      ],
      50,
    ),
  ]).toEqual([
    [0, "v1"],
    [17, "v2"],
    [30, "unknown"],
    [41, "7"],
  ]);
  expect([...versionStarts([[0, "v1"], [50, "v2"], [-1, "x"], [2.5, "y"], ["3", "z"], [4]], 50)]).toEqual([[0, "v1"]]);
  expect(versionStarts(undefined, 10).size).toBe(0);
  expect(versionStarts({ 0: "v1" }, 10).size).toBe(0);
});

test("visibleToken: newline and tab marks; a spaces-only token as one ␣ per space; other text as it is", () => {
  expect(["\n", "a\tb", " ", "  ", " is", "", "<|im_end|>"].map(visibleToken)).toEqual(["↵", "a⇥b", "␣", "␣␣", " is", "", "<|im_end|>"]);
});
