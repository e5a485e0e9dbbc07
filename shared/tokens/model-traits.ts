import type { ToolSchema } from "../schema/index.ts";

/**
 * What the history looks like when the template renders a longer
 * conversation: `append-only` templates render every earlier message the same
 * way whatever follows (prompt ‖ response equals a fresh render);
 * `rewrites-history` templates drop or rewrite earlier parts (Qwen3 drops
 * earlier `<think>` blocks, gpt-oss earlier `analysis` messages). Either way
 * edgeloop keeps sampled tokens verbatim and the trajectory append-only; the
 * policy only says whether a fresh render of the whole conversation equals
 * the trajectory (append-only) or differs from it in the rewritten parts.
 */
export type HistoryPolicy = "append-only" | "rewrites-history";

/** A message as a chat template sees it (after `normaliseForTemplate`). */
export type TemplateMessage = Record<string, unknown>;

/**
 * How a family's template wants messages shaped. Applied to every render,
 * so the prompt, observations and full renders all see the same messages.
 */
export interface MessageShaping {
  /**
   * Rewrites the normalised messages before the template sees them, e.g.
   * Gemma 3 (no tool role): tool results become one user turn. Must be a pure
   * function of the messages and tools.
   */
  prepare?: (messages: TemplateMessage[], tools: readonly ToolSchema[] | undefined) => TemplateMessage[];
  /** Pass tool-call `arguments` to the template as a JSON string (DeepSeek V3 concatenates them). Default: an object. */
  argumentsAsString?: boolean;
  /** An assistant message with tool calls and no text gets `content: null` (DeepSeek V3 tests `content is none`). Default `""`. */
  nullContentWithToolCalls?: boolean;
  /**
   * Vision-language templates (Qwen3-VL): a message whose content holds an
   * image part is passed to the template as its list of parts, text parts
   * as `{type: "text", text}` and each image as `{type: "image"}` (the bytes
   * never reach the template; it writes one placeholder per image). Default:
   * every list content is joined to its text, image parts dropped.
   */
  keepImageParts?: boolean;
}

/**
 * How a vision-language family turns an image into tokens: the template's
 * placeholder tokens and the processor settings that decide how many
 * `imagePad` tokens one image stands for (see shared/vision/qwen-vl-grid.ts).
 */
export interface VisionTraits {
  /** Processor family of the resize rule (`qwen_vl`: transformers' Qwen2-VL `smart_resize`). */
  processor: "qwen_vl";
  /** Settings of the model's published `preprocessor_config.json`. */
  settings: Readonly<{ min_pixels: number; max_pixels: number; patch_size: number; merge_size: number; temporal_patch_size: number }>;
  /** The token written once per image by the template and repeated to the image's token count (`<|image_pad|>`). */
  imagePad: string;
  /** The tokens around each image's pads (`<|vision_start|>`, `<|vision_end|>`). */
  visionStart: string;
  visionEnd: string;
}

/**
 * The model-specific behaviour beyond tokenizer and template: everything
 * the rest of edgeloop asks of a model family.
 */
export interface ModelTraits extends MessageShaping {
  /** Family name (`qwen3`, `llama3_1`, …) or `custom` for a model directory. */
  family: string;
  /** Tool-call parser used when `rollout.multi_turn.format` is not set. */
  defaultParser: string;
  /** See {@link HistoryPolicy}. */
  historyPolicy: HistoryPolicy;
  /** The role the template renders tool results as (`tool`, `ipython`, `user`). Informational: edgeloop messages keep role `tool`. */
  toolResultRole: string;
  /**
   * Token strings after which an assistant turn is complete as the template
   * renders it (default: only `eos_token`). Llama 3.1's `<|eom_id|>` is one:
   * the `ipython` message follows it directly. A sampled stop id that is not
   * one of these is closed with `eos_token` by the next observation (E4).
   */
  turnEndTokens?: readonly string[];
  /**
   * The token the next observation writes after a sampled stop id that is
   * not a turn end (E4), when it is not `eos_token`: harmony closes every
   * message in history with `<|end|>` (its `eos_token` `<|return|>` only ends
   * a sampled final answer).
   */
  closeToken?: string;
  /** Present for vision-language families (images in prompts and tool results); absent: text-only, image parts refused. */
  vision?: VisionTraits;
}

/** Traits of a model directory that does not name a family: hermes, append-only, role `tool`. */
export const CUSTOM_TRAITS: ModelTraits = Object.freeze({
  family: "custom",
  defaultParser: "hermes",
  historyPolicy: "append-only",
  toolResultRole: "tool",
});

/** Qwen3's traits: `hermes` calls, earlier `<think>` blocks dropped by the template, role `tool`. */
export const QWEN3_TRAITS: ModelTraits = Object.freeze({
  family: "qwen3",
  defaultParser: "hermes",
  historyPolicy: "rewrites-history",
  toolResultRole: "tool",
});
