import { describe, expect, test } from "bun:test";
import { truncateToolResponse } from "../../shared/tools/truncate.ts";

const five = "Search results\nline two\nline three\nline four\nFinal answer: Paris";

describe("truncateToolResponse (verl §5.6)", () => {
  test("short text is unchanged on every side", () => {
    for (const side of ["left", "right", "middle"] as const) expect(truncateToolResponse("abcdef", 6, side)).toBe("abcdef");
  });
  test("left keeps the tail (verl test, M=19)", () => {
    expect(truncateToolResponse(five, 19, "left")).toBe("(truncated)...Final answer: Paris");
  });
  test("right keeps the head (verl test, M=19)", () => {
    const r = truncateToolResponse(five, 19, "right");
    expect(r).toBe("Search results\nline...(truncated)");
    expect(r.includes("Final answer: Paris")).toBe(false);
  });
  test("middle keeps M//2 of head and tail", () => {
    expect(truncateToolResponse("abcdefghij", 4, "middle")).toBe("ab...(truncated)...ij");
    expect(truncateToolResponse("abcdefghij", 5, "middle")).toBe("ab...(truncated)...ij");
  });
  test("middle with M=1 keeps nothing (Python would keep the whole text as the tail)", () => {
    expect(truncateToolResponse("abcdef", 1, "middle")).toBe("...(truncated)...");
  });
  test("counts code points, not UTF-16 units", () => {
    const s = "😀😀😀ab";
    expect(s.length).toBe(8);
    expect(truncateToolResponse(s, 5, "right")).toBe(s);
    expect(truncateToolResponse(s, 2, "right")).toBe("😀😀...(truncated)");
    expect(truncateToolResponse(s, 2, "left")).toBe("(truncated)...ab");
    expect(truncateToolResponse(s, 4, "middle")).toBe("😀😀...(truncated)...ab");
  });
});
