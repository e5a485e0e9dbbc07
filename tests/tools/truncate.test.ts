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
  test("equals the Array.from reference on surrogate pairs, lone surrogates and every max (S2: no copy of the whole text)", () => {
    const ref = (text: string, max: number, side: "left" | "right" | "middle") => {
      const cps = Array.from(text);
      if (cps.length <= max) return text;
      if (side === "left") return "(truncated)..." + cps.slice(cps.length - max).join("");
      if (side === "right") return cps.slice(0, max).join("") + "...(truncated)";
      const half = Math.floor(max / 2);
      return cps.slice(0, half).join("") + "...(truncated)..." + (half > 0 ? cps.slice(cps.length - half).join("") : "");
    };
    const texts = ["a😀b\ud800c\udc00d😀😀", "\udc00\ud800", "😀\ud800", "\udc00😀", "xyz", "😀😀😀😀😀😀😀"];
    let checked = 0;
    for (const t of texts) {
      for (let max = 1; max <= t.length + 1; max++) {
        for (const side of ["left", "right", "middle"] as const) {
          expect(truncateToolResponse(t, max, side)).toBe(ref(t, max, side));
          checked++;
        }
      }
    }
    expect(checked).toBe(3 * (13 + 3 + 4 + 4 + 4 + 15));
  });
  test("a 50 MB reply is cut to its first and last code points (pieces exact)", () => {
    const big = "😀" + "x".repeat(50_000_000) + "end";
    expect(truncateToolResponse(big, 4, "right")).toBe("😀xxx...(truncated)");
    expect(truncateToolResponse(big, 4, "left")).toBe("(truncated)...xend");
    expect(truncateToolResponse(big, 4, "middle")).toBe("😀x...(truncated)...nd");
  });
});
