import { expect, test } from "bun:test";
import { sandboxLine, versionStarts, visibleToken } from "../../functions/viewer/client/segments.ts";

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

test("sandboxLine: the batch view's line from GET /v1/sandboxes; nothing without a sandbox lifecycle or for another shape", () => {
  expect(sandboxLine({ enabled: false })).toBeNull();
  expect(sandboxLine(null)).toBeNull();
  expect(sandboxLine({ enabled: true, store: { live: "2" } })).toBeNull();
  expect(
    sandboxLine({
      enabled: true,
      spec: { max_live: 256 },
      store: { live: 2, creating: 1, releasing: 0, tokens: 0.5, counters: { granted: 45, confirmed: 40, create_failed: 3, "released:finished": 35, "released:reaped_ttl": 2, "released:cancelled": 0, "reaped:reaped_ttl": 2 } },
    }),
  ).toBe("sandboxes  2 live · 1 creating · 0 releasing (≤ 256) · 40 created · 3 failed creates · released: finished 35, reaped_ttl 2");
  expect(sandboxLine({ enabled: true, store: { live: 0, creating: 0, releasing: 0, counters: {} } })).toBe("sandboxes  0 live · 0 creating · 0 releasing · 0 created · 0 failed creates");
});
