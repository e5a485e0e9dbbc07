import type { ChatMessage, MultiModal, ToolSchema } from "../schema/index.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import { bytesToBase64 } from "../vision/image-source.ts";
import { buildMultimodalPromptIds, multiModalField, resolveImages, type ResolvedImage } from "../vision/multimodal-tokens.ts";

/** A prompt with images for a vision-language family, as the loops start a trajectory from it. */
export interface VisionPrompt {
  /** Token ids with expanded placeholders, at most `prompt_length`. */
  promptIds: number[];
  truncated: boolean;
  /** The record's `multi_modal` (the kept images with their spans in the prompt; dropped ones listed). */
  multiModal: MultiModal;
  /** The kept images as data URIs, in placeholder order: the engine call's `image_data`. */
  imageData: string[];
}

/**
 * The prompt of a row with images for a vision-language family: ids with
 * expanded placeholders (`buildMultimodalPromptIds`, with the prompt's tools
 * rendered and `rollout.image_truncation` deciding what left truncation does
 * at an image), the record's `multi_modal`, and the kept images as data URIs
 * for the engine (`image_data`). Shared by `single_turn_agent`, `tool_agent` and
 * the agent gateway (`prefix` names the messages in fields: default `prompt`, the row's).
 * @throws InputError naming the image or the field (see shared/vision/).
 */
export async function visionPrompt(
  tok: ChatTokenizer,
  messages: readonly ChatMessage[],
  opts: { promptLength: number; tools?: readonly ToolSchema[]; chatTemplateKwargs?: Record<string, unknown>; imageTruncation?: "error" | "drop"; prefix?: string },
): Promise<VisionPrompt> {
  const images = await resolveImages(tok, messages, { prefix: opts.prefix ?? "prompt" });
  const p = buildMultimodalPromptIds(tok, messages, images, opts);
  const kept = new Set(p.images.map((k) => k.field));
  return {
    promptIds: p.promptIds,
    truncated: p.truncated,
    multiModal: multiModalField(tok, p.images, p.dropped),
    imageData: images.filter((img) => kept.has(img.field.slice(0, 256))).map(imageDataUri),
  };
}

/** An image as the engine's `image_data` entry: `data:<mime>;base64,<bytes>` (the mime read from the bytes, not the source's). */
export function imageDataUri(img: ResolvedImage): string {
  return `data:${img.mime};base64,${img.base64 ?? bytesToBase64(img.data)}`;
}
