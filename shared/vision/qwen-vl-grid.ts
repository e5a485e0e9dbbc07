import { InputError } from "../errors.ts";
import type { QwenVlProcessorSettings } from "../models/qwen3-vl.ts";

/**
 * Python's `round` on a float: to the nearest integer, ties to even
 * (`round(2.5) == 2`, `round(3.5) == 4`). `Math.round` sends ties up, which
 * gives another grid for sides that are an odd multiple of `factor / 2`.
 */
export function roundHalfEven(x: number): number {
  const f = Math.floor(x);
  const d = x - f;
  if (d < 0.5) return f;
  if (d > 0.5) return f + 1;
  return f % 2 === 0 ? f : f + 1;
}

/** The most `max(h, w) / min(h, w)` the Qwen-VL processors accept (transformers raises above it). */
export const MAX_ASPECT_RATIO = 200;

/**
 * transformers' Qwen2-VL `smart_resize` (which Qwen2.5-VL and Qwen3-VL use
 * with their own `factor = patch_size × merge_size`): the resized
 * `[height, width]` in pixels, both multiples of `factor`, with
 * `min_pixels ≤ h × w ≤ max_pixels` where the rule allows, aspect ratio kept
 * as far as rounding lets. Every operation is the Python one on IEEE doubles
 * (ties to even in `round`, `math.sqrt`, `math.floor`, `math.ceil`), so the
 * result is bit-for-bit the processor's.
 *
 * Rule: `h̄ = round(h / f)·f`, `w̄ = round(w / f)·f`; if `h̄·w̄ > max`:
 * `β = √(h·w / max)`, `h̄ = max(f, ⌊h / β / f⌋·f)` (and w); else if
 * `h̄·w̄ < min`: `β = √(min / (h·w))`, `h̄ = ⌈h·β / f⌉·f` (and w).
 *
 * @param height source image height in pixels (integer ≥ 1)
 * @param width source image width in pixels (integer ≥ 1)
 * @throws InputError (field `field`, default `image`) when a side is not an
 *   integer ≥ 1 or the aspect ratio exceeds {@link MAX_ASPECT_RATIO}
 *   (transformers: "absolute aspect ratio must be smaller than 200").
 * @see transformers `models/qwen2_vl/image_processing_qwen2_vl.py` `smart_resize` (current form: no
 *   small-side check, `max(factor, …)` in the shrink branch; transformers.js's port differs in two ways,
 *   both tested: it rounds ties up and first scales images with a side < factor up to factor)
 */
export function smartResize(height: number, width: number, factor: number, minPixels: number, maxPixels: number, field = "image"): [number, number] {
  if (!Number.isInteger(height) || height < 1 || !Number.isInteger(width) || width < 1) {
    throw new InputError(field, `image dimensions must be integers >= 1, got ${width}x${height}`);
  }
  const ratio = Math.max(height, width) / Math.min(height, width);
  if (ratio > MAX_ASPECT_RATIO) {
    throw new InputError(field, `a ${width}x${height} image has aspect ratio ${ratio.toFixed(1)}; the Qwen-VL processor accepts at most ${MAX_ASPECT_RATIO}`);
  }
  let h = roundHalfEven(height / factor) * factor;
  let w = roundHalfEven(width / factor) * factor;
  if (h * w > maxPixels) {
    const beta = Math.sqrt((height * width) / maxPixels);
    h = Math.max(factor, Math.floor(height / beta / factor) * factor);
    w = Math.max(factor, Math.floor(width / beta / factor) * factor);
  } else if (h * w < minPixels) {
    const beta = Math.sqrt(minPixels / (height * width));
    h = Math.ceil((height * beta) / factor) * factor;
    w = Math.ceil((width * beta) / factor) * factor;
  }
  return [h, w];
}

/** An image's grid and its token count under one processor's settings. */
export interface ImageGrid {
  /** `image_grid_thw`: `[t, h, w]` in patches; `t = 1` for an image (its frame repeated to `temporal_patch_size`). */
  grid_thw: [number, number, number];
  /** The resized image `[height, width]` in pixels. */
  resized: [number, number];
  /** `<|image_pad|>` tokens the image stands for: `t·h·w / merge_size²`. */
  tokens: number;
}

/**
 * The grid and placeholder count of a `width × height` image: `smart_resize`
 * with `factor = patch_size × merge_size`, then `[1, h / patch, w / patch]`
 * and `t·h·w / merge²` tokens (Qwen3-VL: a 400×300 image → 384×288 →
 * `[1, 18, 24]` → 108 tokens).
 * @throws InputError as {@link smartResize}.
 * @see transformers `Qwen2VLImageProcessor._preprocess` (grid) and `Qwen2VLProcessor.__call__`
 *   (`image_grid_thw.prod() // merge_size**2` pad tokens per image)
 */
export function imageGrid(width: number, height: number, s: QwenVlProcessorSettings, field = "image"): ImageGrid {
  const factor = s.patch_size * s.merge_size;
  const [rh, rw] = smartResize(height, width, factor, s.min_pixels, s.max_pixels, field);
  const grid: [number, number, number] = [1, rh / s.patch_size, rw / s.patch_size];
  return { grid_thw: grid, resized: [rh, rw], tokens: (grid[0] * grid[1] * grid[2]) / (s.merge_size * s.merge_size) };
}
