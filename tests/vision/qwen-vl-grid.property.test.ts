import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { Qwen2VLImageProcessor } from "@huggingface/transformers";
import { QWEN3_VL_IMAGE_PROCESSOR as P } from "../../shared/models/qwen3-vl.ts";
import { imageGrid, roundHalfEven, smartResize } from "../../shared/vision/qwen-vl-grid.ts";
import { InputError } from "../../shared/errors.ts";

// The reference: transformers.js's Qwen2-VL image processor built from Qwen3-VL's preprocessor_config.json.
const reference = new Qwen2VLImageProcessor({
  size: { shortest_edge: P.min_pixels, longest_edge: P.max_pixels },
  patch_size: P.patch_size,
  merge_size: P.merge_size,
  temporal_patch_size: P.temporal_patch_size,
  image_mean: [...P.image_mean],
  image_std: [...P.image_std],
  do_resize: true,
} as never) as unknown as { get_resize_output_image_size(img: { height: number; width: number }, size: unknown): [number, number] };
const FACTOR = P.patch_size * P.merge_size;

/** transformers.js's [height, width] (it returns [width, height]). */
function jsResize(width: number, height: number): [number, number] {
  const [w, h] = reference.get_resize_output_image_size({ height, width }, undefined);
  return [h, w];
}

/**
 * Where transformers.js's port departs from the Python processor (the one
 * engines and trainers run): it scales a side < factor up first, and
 * `Math.round` sends a tie (`side / factor` = k + 0.5) up where Python's
 * `round` goes to even. Only such sizes are left out of the comparison.
 */
function portDiffers(width: number, height: number): boolean {
  if (width < FACTOR || height < FACTOR) return true;
  const tie = (s: number) => (2 * s) % FACTOR === 0 && s % FACTOR !== 0 && Math.floor(s / FACTOR) % 2 === 0;
  return tie(width) || tie(height);
}

describe("Qwen3-VL placeholder count", () => {
  test("facts: patch 16, merge 2, temporal 2, 256²..4096² pixels (not Qwen2.5-VL's patch 14)", () => {
    expect([P.patch_size, P.merge_size, P.temporal_patch_size, P.min_pixels, P.max_pixels]).toEqual([16, 2, 2, 65536, 16777216]);
  });

  test("worked examples by hand from the Python rule: 640x480 → 300 tokens, 400x300 → 384x288 (12.5 ties to 12) → 108, 1x1 → 256² → 64, 8000x6000 → 4704x3520 → 16170", () => {
    expect(imageGrid(640, 480, P)).toEqual({ grid_thw: [1, 30, 40], resized: [480, 640], tokens: 300 });
    expect(imageGrid(400, 300, P)).toEqual({ grid_thw: [1, 18, 24], resized: [288, 384], tokens: 108 });
    expect(imageGrid(1, 1, P)).toEqual({ grid_thw: [1, 16, 16], resized: [256, 256], tokens: 64 });
    // β = √(48e6 / 2^24) ≈ 1.6914: ⌊6000 / β / 32⌋ = 110, ⌊8000 / β / 32⌋ = 147.
    expect(imageGrid(8000, 6000, P)).toEqual({ grid_thw: [1, 220, 294], resized: [3520, 4704], tokens: 16170 });
  });

  test("equals transformers.js's Qwen2VLImageProcessor on a sweep of sizes 1..8000 with aspect ratios up to 200", () => {
    let compared = 0;
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 8000 }), fc.integer({ min: 1, max: 8000 }), (width, height) => {
        const ratio = Math.max(width, height) / Math.min(width, height);
        if (ratio > 200) {
          expect(() => imageGrid(width, height, P)).toThrow(InputError);
          expect(() => jsResize(width, height)).toThrow(/aspect ratio/);
          return;
        }
        const g = imageGrid(width, height, P);
        expect(g.resized[0] % FACTOR).toBe(0);
        expect(g.resized[1] % FACTOR).toBe(0);
        expect(g.tokens).toBe(g.grid_thw[1] * g.grid_thw[2] / 4);
        expect(g.resized[0] * g.resized[1]).toBeLessThanOrEqual(P.max_pixels);
        if (portDiffers(width, height)) return;
        compared++;
        expect(g.resized).toEqual(jsResize(width, height));
      }),
      { numRuns: 20_000, seed: 33 },
    );
    expect(compared).toBeGreaterThan(14_000);
  });

  test("near-extreme aspect ratios (150..200) and huge sizes agree with the reference", () => {
    fc.assert(
      fc.property(fc.integer({ min: 32, max: 200 }), fc.double({ min: 150, max: 200, noNaN: true }), fc.boolean(), (short, r, wide) => {
        const long = Math.min(8000 * 4, Math.floor(short * r));
        const [w, h] = wide ? [long, short] : [short, long];
        if (portDiffers(w, h) || Math.max(w, h) / Math.min(w, h) > 200) return;
        expect(imageGrid(w, h, P).resized).toEqual(jsResize(w, h));
      }),
      { numRuns: 3_000, seed: 7 },
    );
  });

  test("where transformers.js departs from Python: ties go to even (side 80 → 64, not 96) and small sides are not pre-scaled", () => {
    // Python: round(400 / 32) = round(12.5) = 12 → 384; transformers.js: 416.
    expect(jsResize(400, 300)).toEqual([288, 416]);
    // Python: round(80 / 32) = round(2.5) = 2 → 64; transformers.js: Math.round(2.5) = 3 → 96.
    expect(smartResize(80, 4000, 32, P.min_pixels, P.max_pixels)).toEqual([64, 4000]);
    expect(jsResize(4000, 80)).toEqual([96, 4000]);
    // Python: round(20 / 32) = 1 → 32, round(3000 / 32) = 94 → 3008; transformers.js first scales 20x3000 to 32x4800.
    expect(smartResize(20, 3000, 32, P.min_pixels, P.max_pixels)).toEqual([32, 3008]);
    expect(jsResize(3000, 20)).toEqual([32, 4800]);
    expect([roundHalfEven(0.5), roundHalfEven(1.5), roundHalfEven(2.5), roundHalfEven(2.5000001), roundHalfEven(3.49)]).toEqual([0, 2, 2, 3, 3]);
  });

  test("refuses aspect ratios above 200 and non-integer sides, naming the field", () => {
    expect(() => imageGrid(201, 1, P, "prompt[0].content[1].image")).toThrow("prompt[0].content[1].image: a 201x1 image has aspect ratio 201.0");
    expect(() => imageGrid(0, 10, P)).toThrow(InputError);
    expect(imageGrid(200, 1, P).grid_thw[0]).toBe(1);
  });
});
