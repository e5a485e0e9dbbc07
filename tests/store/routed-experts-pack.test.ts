/**
 * Routed experts packed to their width (issue 31 item 3): the stored bytes of
 * `routed_experts` at each width, `routed_experts_dtype`, −1 through the
 * unsigned widths' all-ones code, and records of older versions (int32, no
 * dtype field) still read.
 */
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { StoreError } from "../../shared/errors.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { decodeRecord, encodedFields, encodeRecord, packRoutedExperts, unpackRoutedExperts, validateAndEncode } from "../../shared/store/record-codec.ts";
import { makeRecord } from "./contract.ts";

/** A record of 1 prompt + 2 response tokens (3 tokens) with `[layers, top_k]` experts. */
function threeTokens(experts: number[], shape: [number, number] = [2, 2]): TrajectoryRecord {
  return makeRecord("pk", 0, { prompt_ids: [151644], response_ids: [9707, 151645], response_mask: [1, 1], rollout_log_probs: null, routed_experts: experts, routed_experts_shape: shape });
}

const bytesOf = (text: string) => Buffer.from(text, "base64");

/** A flat `[tokens, 2, 2]` array of `tokens` rows cycling through `0 … top`, with a −1 at index 1. */
function span(top: number, tokens: number): number[] {
  const out = Array.from({ length: tokens * 4 }, (_, i) => (i === 0 ? top : (i * 7919) % (top + 1)));
  out[1] = -1;
  return out;
}

describe("routed experts packing", () => {
  test("3 tokens × 2 layers × top-2 of 8 experts: 12 bytes, uint8, exact bytes; read back as the same number[]", () => {
    const experts = [0, 7, 3, 4, 5, -1, 1, 2, 6, 6, 0, 1];
    const rec = threeTokens(experts);
    const { encoded } = validateAndEncode(rec);
    expect(encoded.routed_experts_dtype).toBe("uint8");
    expect(bytesOf(encoded.routed_experts!).length).toBe(12);
    expect(bytesOf(encoded.routed_experts!).toString("hex")).toBe("0007030405ff010206060001");
    expect(encoded.routed_experts).toBe("AAcDBAX/AQIGBgAB");
    expect(encoded.routed_experts_shape).toBe("[2,2]");
    const f = encodedFields(encoded);
    expect(f.slice(f.indexOf("routed_experts"), f.indexOf("routed_experts") + 6)).toEqual(["routed_experts", "AAcDBAX/AQIGBgAB", "routed_experts_shape", "[2,2]", "routed_experts_dtype", "uint8"]);
    const back = decodeRecord({ ...encoded });
    expect(back.routed_experts).toEqual(experts);
    expect(JSON.stringify(back)).toBe(JSON.stringify(rec));
    // encodeRecord (the path of already-validated records) stores the same fields.
    expect(encodeRecord(back)).toEqual(encoded);
  });

  // Experts E → ids 0 … E−1; the all-ones code of a width is −1, so the largest id decides.
  const cases: [string, number, "uint8" | "uint16" | "int32", number][] = [
    ["255 experts", 254, "uint8", 1],
    ["256 experts, a record that never routes to expert 255", 254, "uint8", 1],
    ["256 experts (expert 255 = uint8's padding code)", 255, "uint16", 2],
    ["257 experts", 256, "uint16", 2],
    ["65,535 experts", 65534, "uint16", 2],
    ["65,536 experts (expert 65,535 = uint16's padding code)", 65535, "int32", 4],
    ["65,537 experts", 65536, "int32", 4],
    ["int32's largest id", 2 ** 31 - 1, "int32", 4],
  ];
  for (const [name, top, dtype, width] of cases) {
    test(`${name}: largest id ${top} → ${dtype}, ${width} byte(s) a value, −1 survives`, () => {
      const experts = span(top, 3);
      const { encoded } = validateAndEncode(threeTokens(experts));
      expect(encoded.routed_experts_dtype).toBe(dtype);
      const bytes = bytesOf(encoded.routed_experts!);
      expect(bytes.length).toBe(12 * width);
      // Little-endian, the −1 at index 1 as all ones of the width.
      expect(bytes.subarray(width, 2 * width).toString("hex")).toBe("ff".repeat(width));
      const first = width === 1 ? bytes[0] : width === 2 ? bytes.readUInt16LE(0) : bytes.readInt32LE(0);
      expect(first).toBe(top);
      const back = decodeRecord({ ...encoded });
      expect(back.routed_experts).toEqual(experts);
      expect(back.routed_experts![1]).toBe(-1);
    });
  }

  test("only padding and fill (−1 and 0) packs to uint8", () => {
    const { encoded } = validateAndEncode(threeTokens([-1, -1, 0, 0, -1, 0, -1, 0, 0, 0, 0, 0]));
    expect(encoded.routed_experts_dtype).toBe("uint8");
    expect(bytesOf(encoded.routed_experts!).toString("hex")).toBe("ffff0000ff00ff0000000000");
  });

  test("a record of an older version (int32 bytes, no routed_experts_dtype) still reads", () => {
    const experts = [0, 7, 3, 4, 5, -1, 1, 2, 6, 6, 0, 1];
    const { encoded } = validateAndEncode(threeTokens(experts));
    const { routed_experts_dtype: _, ...old } = encoded;
    old.routed_experts = Buffer.from(Int32Array.from(experts).buffer).toString("base64");
    expect(old.routed_experts).toBe("AAAAAAcAAAADAAAABAAAAAUAAAD/////AQAAAAIAAAAGAAAABgAAAAAAAAABAAAA");
    expect("routed_experts_dtype" in old).toBe(false);
    expect(decodeRecord({ ...old } as Record<string, string>).routed_experts).toEqual(experts);
    expect(decodeRecord({ ...old, routed_experts_dtype: "int32" } as Record<string, string>).routed_experts).toEqual(experts);
  });

  test("an unknown dtype or a ragged uint16 field is a StoreError", () => {
    const { encoded } = validateAndEncode(threeTokens([0, 7, 3, 4, 5, -1, 1, 2, 6, 6, 0, 1]));
    expect(() => decodeRecord({ ...encoded, routed_experts_dtype: "int8" } as Record<string, string>)).toThrow(StoreError);
    expect(() => decodeRecord({ ...encoded, routed_experts_dtype: "int8" } as Record<string, string>)).toThrow("stored routed_experts_dtype \"int8\" is not uint8, uint16 or int32");
    expect(() => unpackRoutedExperts("AAAA", "uint16")).toThrow("not a multiple of 2");
  });

  test("property: any ids ≥ −1 round-trip exactly through the narrowest width", () => {
    const id = fc.oneof(fc.integer({ min: -1, max: 300 }), fc.integer({ min: -1, max: 70000 }), fc.integer({ min: -1, max: 2 ** 31 - 1 }));
    fc.assert(
      fc.property(fc.array(id, { maxLength: 64 }), (ids) => {
        const data = Int32Array.from(ids);
        const { text, dtype } = packRoutedExperts(data);
        const max = Math.max(-1, ...ids);
        expect(dtype).toBe(max <= 254 ? "uint8" : max <= 65534 ? "uint16" : "int32");
        expect(bytesOf(text).length).toBe(ids.length * (dtype === "uint8" ? 1 : dtype === "uint16" ? 2 : 4));
        expect(unpackRoutedExperts(text, dtype)).toEqual(ids);
      }),
      { numRuns: 300 },
    );
  });
});
