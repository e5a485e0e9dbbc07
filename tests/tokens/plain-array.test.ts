import { describe, expect, test } from "bun:test";
import { asPlainArray, toPlainArray } from "../../shared/tokens/plain-array.ts";

describe("toPlainArray / asPlainArray", () => {
  test("the values of Array.from, typed arrays included (float32 entries as the same doubles)", () => {
    const f = new Float32Array([-0.1, -2.5, 0, -1e-8]);
    expect(toPlainArray(f)).toEqual(Array.from(f));
    expect(toPlainArray(f)[0]).toBe(Math.fround(-0.1));
    const ids = new Int32Array([151644, 872, 198, 0, 2147483647]);
    const out = toPlainArray(ids);
    expect(Array.isArray(out)).toBe(true);
    expect(out).toEqual([151644, 872, 198, 0, 2147483647]);
    expect(toPlainArray(new Uint8Array([1, 0, 1]))).toEqual([1, 0, 1]);
    expect(toPlainArray([])).toEqual([]);
    expect(JSON.stringify(toPlainArray(ids.subarray(1, 3)))).toBe("[872,198]");
  });
  test("asPlainArray hands a plain array back as is and copies anything else", () => {
    const plain = [1, 2, 3];
    expect(asPlainArray(plain)).toBe(plain);
    const typed = new Int32Array([4, 5]);
    expect(asPlainArray(typed)).toEqual([4, 5]);
    expect(Array.isArray(asPlainArray(typed))).toBe(true);
  });
});
