import { InputError, TemplateError } from "../errors.ts";
import { INLINE_IMAGE_MAX_BYTES, type ChatMessage, type MultiModal, type RecordImage, type ToolSchema } from "../schema/index.ts";
import type { VisionTraits } from "../tokens/model-traits.ts";
import { ObservationEncoder } from "../tokens/observation.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import type { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import { bytesToBase64, imagePartSource, loadImage, type ImageFetcher, type LoadedImage } from "./image-source.ts";
import { imageGrid, type ImageGrid } from "./qwen-vl-grid.ts";

/** An image of a conversation, loaded and sized: where it was, its bytes, and its grid under the model's processor. */
export interface ResolvedImage extends LoadedImage {
  /** Where the image was, e.g. `prompt[1].content[0].image`. */
  field: string;
  grid: ImageGrid;
}

/** Placeholder token ids of a vision family, looked up once. */
export interface VisionIds {
  pad: number;
  start: number;
  end: number;
}

/**
 * The vision traits and placeholder ids of `tok`'s family.
 * @throws InputError (field `field`) when the family is text-only: its
 *   prompts cannot hold images (verl: "Multimodal inputs require … a non-None processor").
 * @throws TemplateError when a placeholder token is not one id of the vocabulary.
 */
export function visionOf(tok: ChatTokenizer, field = "prompt"): { traits: VisionTraits; ids: VisionIds } {
  const traits = tok.traits.vision;
  if (!traits) throw new InputError(field, `holds image parts, and model ${tok.name} (family ${tok.traits.family}) is text-only; use a vision-language family (qwen3_vl)`);
  const id = (t: string) => {
    const v = tok.tokenId(t);
    if (v === undefined) throw new TemplateError(`model ${tok.name}: vision token ${t} is not in the vocabulary`);
    return v;
  };
  return { traits, ids: { pad: id(traits.imagePad), start: id(traits.visionStart), end: id(traits.visionEnd) } };
}

/**
 * The image references of `messages` in the order the template renders them
 * (message order, part order): each `{source, field}` with `field` =
 * `${prefix}[m].content[p]…`. Images may sit in `user` and `tool` messages
 * only — Qwen3-VL's template renders only the text parts of system and
 * assistant contents, so an image there would be silently dropped.
 * @throws InputError naming the part: an image in a system/assistant
 *   message, a video or audio part (not supported), a malformed image part.
 */
export function imageRefs(messages: readonly ChatMessage[], prefix: string): { source: string; field: string }[] {
  const out: { source: string; field: string }[] = [];
  for (let m = 0; m < messages.length; m++) {
    const c = messages[m]!.content;
    if (!Array.isArray(c)) continue;
    for (let p = 0; p < c.length; p++) {
      const part = c[p]!;
      const field = `${prefix}[${m}].content[${p}]`;
      if (part.type === "text") continue;
      if (part.type !== "image" && part.type !== "image_url") throw new InputError(`${field}.type`, `'${part.type}' parts are not supported (images only: image, image_url)`);
      const role = messages[m]!.role;
      if (role !== "user" && role !== "tool") throw new InputError(field, `an image in a ${role} message is not rendered by the chat template (images go in user and tool messages)`);
      out.push(imagePartSource(part, field));
    }
  }
  return out;
}

/**
 * Loads and sizes the images of `messages` ({@link imageRefs}, in render
 * order) for `tok`'s vision family.
 * @throws InputError naming the image's field (see `loadImage`, `imageGrid`).
 */
export async function resolveImages(
  tok: ChatTokenizer,
  messages: readonly ChatMessage[],
  opts: { prefix: string; fetch?: ImageFetcher; maxBytes?: number },
): Promise<ResolvedImage[]> {
  const refs = imageRefs(messages, opts.prefix);
  if (refs.length === 0) return [];
  const { traits } = visionOf(tok, refs[0]!.field);
  return Promise.all(
    refs.map(async (r) => {
      const img = await loadImage(r.source, r.field, { fetch: opts.fetch, maxBytes: opts.maxBytes });
      return { ...img, field: r.field, grid: imageGrid(img.width, img.height, traits.settings, r.field) };
    }),
  );
}

/**
 * `ids` (a render's encoding: one pad per image) with the i-th pad repeated
 * `images[i].grid.tokens` times; `spans[i]` = `[start, end)` of image i's
 * pads in the result, plus `offset`. One linear pass.
 * @throws InputError (field `field`) when the number of pads is not the
 *   number of images (a text part spelling `<|image_pad|>`), or a pad is
 *   not between `<|vision_start|>` and `<|vision_end|>`.
 */
export function expandImagePads(ids: readonly number[], images: readonly ResolvedImage[], v: VisionIds, field: string, offset = 0): { ids: number[]; spans: [number, number][] } {
  const out: number[] = [];
  const spans: [number, number][] = [];
  let k = 0;
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    if (id !== v.pad) {
      out.push(id);
      continue;
    }
    const img = images[k];
    if (!img || ids[i - 1] !== v.start || ids[i + 1] !== v.end) {
      throw new InputError(field, `renders ${ids.filter((x) => x === v.pad).length} image placeholder(s) for ${images.length} image(s): a text part spells a vision token (<|image_pad|>)`);
    }
    const start = offset + out.length;
    for (let t = 0; t < img.grid.tokens; t++) out.push(v.pad);
    spans.push([start, start + img.grid.tokens]);
    k++;
  }
  if (k !== images.length) throw new InputError(field, `renders ${k} image placeholder(s) for ${images.length} image(s)`);
  return { ids: out, spans };
}

/** What a record keeps of one image at `span` (see `RecordImage`): the bytes inline when at most {@link INLINE_IMAGE_MAX_BYTES}. */
export function recordImage(img: ResolvedImage, span: [number, number], source: "prompt" | "tool"): RecordImage {
  const out: RecordImage = {
    sha256: img.sha256,
    mime: img.mime,
    bytes: img.data.length,
    width: img.width,
    height: img.height,
    image_grid_thw: img.grid.grid_thw,
    span,
    source,
    field: img.field.slice(0, 256),
  };
  if (img.data.length <= INLINE_IMAGE_MAX_BYTES) out.data = img.base64 ?? bytesToBase64(img.data);
  return out;
}

/** The record's `multi_modal` field for `images` (see `MultiModal`). */
export function multiModalField(tok: ChatTokenizer, images: RecordImage[], dropped?: { sha256: string; field: string }[]): MultiModal {
  const { traits, ids } = visionOf(tok);
  const s = traits.settings;
  return {
    processor: { name: traits.processor, patch_size: s.patch_size, merge_size: s.merge_size, temporal_patch_size: s.temporal_patch_size, min_pixels: s.min_pixels, max_pixels: s.max_pixels },
    image_token_id: ids.pad,
    vision_start_id: ids.start,
    vision_end_id: ids.end,
    images,
    ...(dropped && dropped.length > 0 ? { dropped_images: dropped } : {}),
  };
}

/** Options for {@link buildMultimodalPromptIds}. */
export interface MultimodalPromptOptions {
  /** `rollout.prompt_length`: the most tokens the prompt may hold, image tokens included. */
  promptLength: number;
  tools?: readonly ToolSchema[];
  chatTemplateKwargs?: Record<string, unknown>;
  /**
   * What left truncation does when it reaches an image: `error` (default,
   * DESIGN §2 invariant 5 and verl) fails the row naming the image; `drop`
   * drops every image it reaches whole (the cut moves right past the image's
   * `<|vision_end|>`, so the prompt may hold fewer than `promptLength`
   * tokens) and lists them in `dropped`. Text before the first image is
   * truncated either way. A prompt is never cut inside an image.
   */
  imageTruncation?: "error" | "drop";
}

/** A prompt with images: ids with expanded placeholders, the kept images' record entries, and what truncation did. */
export interface MultimodalPrompt {
  promptIds: number[];
  images: RecordImage[];
  truncated: boolean;
  /** Images left truncation dropped whole (`imageTruncation: "drop"`). */
  dropped: { sha256: string; field: string }[];
}

function refuseVisionIds(kwargs: Record<string, unknown> | undefined): void {
  // Numbered pictures ("Picture 3: ") count over the whole conversation, so an observation rendered
  // alone would number its images from 1: not append-only.
  if (kwargs?.add_vision_id) throw new InputError("rollout.chat_template_kwargs.add_vision_id", "is not supported with images (the template numbers pictures over the whole conversation)");
}

/**
 * The initial prompt of a trajectory with images (DESIGN §4.1 for a
 * vision-language family): the template's render with one placeholder per
 * image, encoded, each `<|image_pad|>` repeated to the image's token count.
 * `images` are `resolveImages(tok, messages, {prefix: "prompt"})`.
 *
 * Over `promptLength` tokens the prompt is left-truncated (the rightmost
 * tokens kept, generation prompt included) and never inside an image: see
 * {@link MultimodalPromptOptions.imageTruncation}. Spans are positions in
 * the kept prompt.
 * @throws InputError (field `rollout.prompt_length`) naming the image that
 *   truncation would reach (`error`), or when the kept tokens would hold no
 *   more than the generation prompt; (field `prompt`) for a placeholder
 *   count that is not the number of images, `add_vision_id`.
 */
export function buildMultimodalPromptIds(tok: ChatTokenizer, messages: readonly ChatMessage[], images: readonly ResolvedImage[], opts: MultimodalPromptOptions): MultimodalPrompt {
  if (!Number.isInteger(opts.promptLength) || opts.promptLength < 1) throw new InputError("rollout.prompt_length", "must be an integer >= 1");
  refuseVisionIds(opts.chatTemplateKwargs);
  const { ids: vids } = visionOf(tok);
  const render = (gen: boolean) => tok.renderText(messages, { tools: opts.tools, addGenerationPrompt: gen, chatTemplateKwargs: opts.chatTemplateKwargs });
  const full = expandImagePads(tok.encode(render(true)), images, vids, "prompt");
  const total = full.ids.length;
  if (total <= opts.promptLength) {
    return { promptIds: full.ids, images: images.map((img, i) => recordImage(img, full.spans[i]!, "prompt")), truncated: false, dropped: [] };
  }
  let cut = total - opts.promptLength;
  const reached: number[] = [];
  for (let i = 0; i < images.length; i++) if (full.spans[i]![0] - 1 < cut) reached.push(i);
  if (reached.length > 0) {
    const imageTokens = images.reduce((n, img) => n + img.grid.tokens, 0);
    const first = images[reached[0]!]!;
    if ((opts.imageTruncation ?? "error") === "error") {
      throw new InputError(
        "rollout.prompt_length",
        `the prompt holds ${total} tokens (${imageTokens} of them in ${images.length} image(s)) and prompt_length is ${opts.promptLength}: left truncation would cut image ${first.field} ` +
          `(sha256 ${first.sha256.slice(0, 12)}…, ${first.grid.tokens} tokens at [${full.spans[reached[0]!]!.join(", ")})); images are never cut: raise rollout.prompt_length, send a smaller image, or drop whole images (image_truncation: drop)`,
      );
    }
    // Past the last reached image's <|vision_end|>: whole images only.
    cut = Math.max(cut, full.spans[reached[reached.length - 1]!]![1] + 1);
  }
  const withoutGen = render(false);
  const withGen = render(true);
  const genLength = withGen.startsWith(withoutGen) ? tok.encode(withGen.slice(withoutGen.length)).length : 0;
  if (total - cut <= genLength) {
    throw new InputError("rollout.prompt_length", `${opts.promptLength} tokens cannot hold this prompt's generation prompt (${genLength} tokens) and any of the conversation once whole images are dropped (${total} tokens in all)`);
  }
  const kept: RecordImage[] = [];
  const dropped: { sha256: string; field: string }[] = [];
  for (let i = 0; i < images.length; i++) {
    const [s, e] = full.spans[i]!;
    if (s - 1 < cut) dropped.push({ sha256: images[i]!.sha256, field: images[i]!.field });
    else kept.push(recordImage(images[i]!, [s - cut, e - cut], "prompt"));
  }
  return { promptIds: full.ids.slice(cut), images: kept, truncated: true, dropped };
}

/**
 * An encoder for observations that may hold images: the render path of
 * {@link ObservationEncoder} (its text formulas see only text), with the
 * prompt's tools and kwargs.
 */
export function imageObservationEncoder(tok: ChatTokenizer, opts: { tools?: readonly ToolSchema[]; chatTemplateKwargs?: Record<string, unknown> } = {}): ObservationEncoder {
  refuseVisionIds(opts.chatTemplateKwargs);
  return new ObservationEncoder(tok, { ...opts, method: "render" });
}

/**
 * Observation ids for `newMessages` (tool results, user turns) holding
 * `images` (`resolveImages(tok, newMessages, {prefix})`), appended after a
 * turn whose last sampled id is `lastTokenId`, at position `offset` of
 * `prompt ‖ response`: the encoder's ids with each pad expanded, and the
 * images' record entries with spans at their positions (source `tool`).
 * `encodeOpts` go to `ObservationEncoder.encode` (`closeTurn`: the agent
 * gateway's turns ended by a stop string).
 * @throws as `ObservationEncoder.encode` and {@link expandImagePads}.
 */
export function encodeImageObservation(
  encoder: ObservationEncoder,
  tok: ChatTokenizer,
  newMessages: readonly ChatMessage[],
  images: readonly ResolvedImage[],
  lastTokenId: number | undefined,
  offset: number,
  field = "observation",
  encodeOpts: { closeTurn?: boolean } = {},
): { ids: number[]; images: RecordImage[] } {
  const raw = encoder.encode(newMessages, lastTokenId, encodeOpts);
  if (images.length === 0) return { ids: raw, images: [] };
  const { ids: vids } = visionOf(tok, field);
  const { ids, spans } = expandImagePads(raw, images, vids, field, offset);
  return { ids, images: images.map((img, i) => recordImage(img, spans[i]!, "tool")) };
}

/**
 * Appends an observation with images to `builder` under its budgets
 * (`response_length`, `max_model_len`): whole when it fits; otherwise cut
 * before the `<|vision_start|>` of the first image that does not fit whole
 * (an image is never split), the trajectory marked truncated, and only the
 * images kept are returned.
 */
export function appendImageObservation(builder: TrajectoryBuilder, obs: { ids: number[]; images: RecordImage[] }): { images: RecordImage[]; truncated: boolean; appended: number } {
  const room = builder.nextMaxTokens();
  const base = builder.contextLength;
  if (obs.ids.length <= room) {
    const r = builder.appendObservation(obs.ids);
    return { images: obs.images, truncated: r.truncated, appended: r.appended };
  }
  let take = room;
  for (const img of obs.images) {
    const [s, e] = [img.span[0] - base, img.span[1] - base];
    if (s - 1 < take && e + 1 > take) take = Math.max(0, s - 1);
  }
  const r = builder.appendObservation(obs.ids.slice(0, take));
  builder.markTruncated();
  return { images: obs.images.filter((img) => img.span[1] - base + 1 <= take), truncated: true, appended: r.appended };
}

/**
 * The image placeholder runs of `ids`: each `[start, end)` of a run of
 * `<|image_pad|>` ids, which must sit right after `<|vision_start|>` and
 * right before `<|vision_end|>` — the form SGLang's Qwen-VL processor
 * recognises in `input_ids` (regex `<|vision_start|>(?:<|image_pad|>)+<|vision_end|>`,
 * one image per run). One linear pass.
 * @returns the runs, or a string naming the first pad outside that form.
 * @see SGLang `python/sglang/srt/multimodal/processors/qwen_vl.py` (`image_token_regex`)
 */
export function imagePadRuns(ids: ArrayLike<number>, v: VisionIds): [number, number][] | string {
  const runs: [number, number][] = [];
  for (let i = 0; i < ids.length; i++) {
    if (ids[i] !== v.pad) continue;
    const start = i;
    while (i < ids.length && ids[i] === v.pad) i++;
    if (ids[start - 1] !== v.start || ids[i] !== v.end) return `the <|image_pad|> run at [${start}, ${i}) is not between <|vision_start|> and <|vision_end|>`;
    runs.push([start, i]);
  }
  return runs;
}
