import { z } from "zod";

/** The most bytes of one image stored inline in a record (`data`): 64 KiB; larger images are referenced by `sha256` only. */
export const INLINE_IMAGE_MAX_BYTES = 64 * 1024;

/**
 * One image the model saw, as a record stores it (field `multi_modal.images[i]`).
 *
 * - `sha256`: lowercase hex SHA-256 of the encoded file — the image's name
 *   in a blob store and in the row (`prompt[m].content[p].image`) or tool
 *   result it came from;
 * - `mime`, `bytes` (size of the encoded file), `width`/`height` (stored pixels);
 * - `data`: the file as base64, present only when `bytes` ≤
 *   {@link INLINE_IMAGE_MAX_BYTES}; otherwise the bytes are kept where the
 *   image came from (the batch's stored row, or a blob store under `sha256`);
 * - `image_grid_thw`: `[t, h, w]` in patches (`t = 1`), what the trainer's
 *   processor will compute again from the bytes — `pixel_values` has
 *   `t·h·w` rows;
 * - `span`: `[start, end)` positions in `prompt_ids ‖ response_ids` of the
 *   image's pad tokens (`end − start = t·h·w / merge²`); `<|vision_start|>`
 *   is at `start − 1`, `<|vision_end|>` at `end`;
 * - `source`: `prompt` (the row's messages) or `tool` (a tool result,
 *   in the response, mask 0); `field`: where it was, e.g. `prompt[1].content[0].image`
 *   or `turn[2].tool[0].content[1].image`.
 */
export const RecordImage = z.strictObject({
  sha256: z.string().regex(/^[0-9a-f]{64}$/, "sha256 must be 64 lowercase hex digits"),
  mime: z.enum(["image/png", "image/jpeg", "image/webp", "image/gif"]),
  bytes: z.number().int().min(1),
  width: z.number().int().min(1),
  height: z.number().int().min(1),
  data: z.string().optional(),
  image_grid_thw: z.tuple([z.number().int().min(1), z.number().int().min(1), z.number().int().min(1)]),
  span: z.tuple([z.number().int().min(1), z.number().int().min(1)]),
  source: z.enum(["prompt", "tool"]),
  field: z.string().max(256),
});
export type RecordImage = z.infer<typeof RecordImage>;

/**
 * What a trainer needs besides the ids to rebuild the model's vision inputs
 * (record field `multi_modal`, stored in `meta`): the processor settings the
 * placeholder counts came from, the placeholder token ids, and every image
 * in order of appearance. `dropped_images` lists images left truncation
 * removed whole from the prompt (`rollout.image_truncation: drop`), by
 * hash and field; a prompt is never cut inside an image.
 */
export const MultiModal = z.strictObject({
  processor: z.strictObject({
    name: z.literal("qwen_vl"),
    patch_size: z.number().int().min(1),
    merge_size: z.number().int().min(1),
    temporal_patch_size: z.number().int().min(1),
    min_pixels: z.number().int().min(1),
    max_pixels: z.number().int().min(1),
  }),
  image_token_id: z.number().int().min(0),
  vision_start_id: z.number().int().min(0),
  vision_end_id: z.number().int().min(0),
  images: z.array(RecordImage),
  dropped_images: z.array(z.strictObject({ sha256: z.string(), field: z.string() })).optional(),
});
export type MultiModal = z.infer<typeof MultiModal>;
