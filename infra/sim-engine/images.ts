import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { loadImage } from "../../shared/vision/image-source.ts";
import { imagePadRuns, visionOf } from "../../shared/vision/multimodal-tokens.ts";
import { imageGrid } from "../../shared/vision/qwen-vl-grid.ts";

/**
 * Why SGLang's `/generate` would not run `input_ids` with `image_data` as
 * sent, or null. SGLang decodes the ids, finds one image per
 * `<|vision_start|><|image_pad|>+<|vision_end|>` run and has its processor
 * expand each run again to the image's own token count; so the ids it runs
 * equal the ids sent only when every run already has that count. The
 * simulator refuses what would silently differ: a model without vision, a
 * text prompt with images (the simulator takes pre-expanded `input_ids`
 * only), a run count that is not the number of images, a run whose length is
 * not the image's `t·h·w / merge²` (transformers' Qwen-VL rule with the
 * model's `preprocessor_config.json`), an entry that is not a data URI or
 * base64 image.
 * @see SGLang `multimodal/processors/base_processor.py` (`load_mm_data`), `qwen_vl.py` (`QwenVLImageProcessor`)
 */
export async function sglangImageProblem(tok: ChatTokenizer, ids: readonly number[], given: boolean, images: readonly string[]): Promise<string | null> {
  if (!tok.traits.vision) return `model ${tok.name} is not a multimodal model: image_data is not accepted`;
  if (!given) return "the simulator takes image_data with input_ids (placeholders expanded) only";
  const { traits, ids: v } = visionOf(tok);
  const runs = imagePadRuns(ids, v);
  if (typeof runs === "string") return `input_ids: ${runs}`;
  if (runs.length !== images.length) return `input_ids hold ${runs.length} image placeholder run(s) for ${images.length} image_data entr${images.length === 1 ? "y" : "ies"}`;
  for (let i = 0; i < images.length; i++) {
    const src = images[i]!.startsWith("data:") ? images[i]! : `data:image/*;base64,${images[i]!}`;
    let tokens: number;
    let grid: number[];
    try {
      const img = await loadImage(src, `image_data[${i}]`);
      ({ tokens, grid_thw: grid } = imageGrid(img.width, img.height, traits.settings, `image_data[${i}]`));
    } catch (e) {
      return (e as Error).message;
    }
    const [s, e] = runs[i]!;
    if (e - s !== tokens) return `image_data[${i}]: input_ids hold ${e - s} <|image_pad|> tokens at [${s}, ${e}), its grid [${grid.join(", ")}] makes ${tokens}`;
  }
  return null;
}
