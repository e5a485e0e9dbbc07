import { InputError } from "../errors.ts";
import { hasMultimodalContent, type ChatMessage, type ToolSchema } from "../schema/index.ts";
import type { ChatTokenizer } from "./tokenizer.ts";
import { LRUCache } from "lru-cache";

/** Encoded initial prompts by (model, tools, template kwargs, messages); bounded by total key characters. */
const promptCache = new LRUCache<string, number[]>({ maxSize: 32 * 1024 * 1024, sizeCalculation: (v, k) => k.length + v.length * 8 });
const toolKeys = new WeakMap<readonly ToolSchema[], string>();
/** A cache key for a tools list (its JSON, computed once per list object). */
function toolsKey(tools: readonly ToolSchema[] | undefined): string {
  if (!tools || tools.length === 0) return "";
  let k = toolKeys.get(tools);
  if (k === undefined) {
    k = JSON.stringify(tools);
    toolKeys.set(tools, k);
  }
  return k;
}

/** Options for {@link buildPromptIds}. */
export interface PromptOptions {
  /** Tool schemas to render into the prompt (tool agents), in the tools file's order. */
  tools?: readonly ToolSchema[];
  /** `rollout.prompt_length`: the most tokens the initial prompt may hold. */
  promptLength: number;
  /** Extra chat-template variables, e.g. `{enable_thinking: false}`. */
  chatTemplateKwargs?: Record<string, unknown>;
}

/**
 * The initial prompt of a trajectory (DESIGN §2 invariant 5, §4.1):
 * `applyChatTemplate(messages, {tools, add_generation_prompt: true})`.
 *
 * A text prompt longer than `promptLength` tokens is left-truncated — the
 * rightmost `promptLength` ids are kept, so the generation prompt survives —
 * and `truncated` is true (verl's `truncation: "left"`).
 * @throws InputError (field `prompt`) when a message holds an image, video or
 *   audio part: cutting placeholders would corrupt features, so such prompts
 *   are rejected rather than truncated.
 * @throws InputError (field `rollout.prompt_length`) when truncation would
 *   leave no more than the generation prompt.
 */
export function buildPromptIds(
  tok: ChatTokenizer,
  messages: readonly ChatMessage[],
  opts: PromptOptions,
): { promptIds: number[]; truncated: boolean } {
  if (hasMultimodalContent(messages)) {
    throw new InputError("prompt", "holds image/video/audio parts; edgeloop's token core is text-only and never truncates multimodal prompts");
  }
  if (!Number.isInteger(opts.promptLength) || opts.promptLength < 1) {
    throw new InputError("rollout.prompt_length", "must be an integer >= 1");
  }
  // The n sessions of a row share their prompt: render and encode each distinct one once
  // (the chat template is the expensive part, ~0.3 ms for a prompt with a tools block).
  const cacheKey = `${tok.name}\u0000${toolsKey(opts.tools)}\u0000${JSON.stringify(opts.chatTemplateKwargs ?? {})}\u0000${JSON.stringify(messages)}`;
  let cached = promptCache.get(cacheKey);
  if (!cached) {
    const text = tok.renderText(messages, { tools: opts.tools, addGenerationPrompt: true, chatTemplateKwargs: opts.chatTemplateKwargs });
    // A huge prompt (say 30 MB of text) is never tokenized whole: only its tail can survive left
    // truncation, and a tail of (prompt_length + margin) × the longest token's characters is sure to
    // hold more than prompt_length tokens. Pre-tokenization is local, so the kept ids equal the
    // last ids of the whole text's encoding (the margin absorbs the cut word).
    const tailChars = (opts.promptLength + 64) * tok.maxTokenChars();
    if (text.length > 2 * tailChars) {
      const tail = tok.encode(text.slice(text.length - tailChars));
      return { promptIds: checkedTail(tok, messages, opts, tail, Number.POSITIVE_INFINITY), truncated: true };
    }
    cached = tok.encode(text);
    if (cacheKey.length < 1_000_000) promptCache.set(cacheKey, cached);
  }
  const ids = cached.slice();
  if (ids.length <= opts.promptLength) return { promptIds: ids, truncated: false };
  return { promptIds: checkedTail(tok, messages, opts, ids, ids.length), truncated: true };
}

/**
 * The last `prompt_length` ids of `ids` (an encoding of the whole prompt, or
 * of its tail), after checking that they hold more than the generation prompt.
 * @throws InputError (field `rollout.prompt_length`).
 */
function checkedTail(tok: ChatTokenizer, messages: readonly ChatMessage[], opts: PromptOptions, ids: number[], total: number): number[] {
  // Left truncation must leave the generation prompt and at least one token of the conversation;
  // shorter, the model would be asked to answer nothing. The generation prompt is what a render
  // with it adds to one without (both texts; only the difference is encoded).
  const render = (gen: boolean) => tok.renderText(messages, { tools: opts.tools, addGenerationPrompt: gen, chatTemplateKwargs: opts.chatTemplateKwargs });
  const withGen = render(true);
  const withoutGen = render(false);
  const genLength = withGen.startsWith(withoutGen) ? tok.encode(withGen.slice(withoutGen.length)).length : 0;
  if (opts.promptLength <= genLength) {
    const all = Number.isFinite(total) ? ` (${total} tokens in all)` : "";
    throw new InputError(
      "rollout.prompt_length",
      `${opts.promptLength} tokens cannot hold this prompt's generation prompt (${genLength} tokens) and any of the conversation${all}`,
    );
  }
  return ids.slice(ids.length - opts.promptLength);
}
