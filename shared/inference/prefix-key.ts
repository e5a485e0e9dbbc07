import { hashInt } from "./hash.ts";

/** The most leading tokens a prefix key covers (a longer first block is keyed by its first 8,192 tokens). */
export const PREFIX_KEY_MAX_TOKENS = 8_192;

/**
 * The prefix key of a prompt (`GenerateRequest.prefix_key`): a 64-bit hash of
 * its leading block, the tokens up to and including the first turn-end token
 * (`turnEndIds`, e.g. Qwen's `<|im_end|>`), at most {@link PREFIX_KEY_MAX_TOKENS}.
 * Chat templates render the system message, with the tools block inside it
 * (Qwen3, Llama 3.1, DeepSeek V3), first, so every trajectory of a dataset that
 * shares a system+tools block gets one key; a prompt without a system block is
 * keyed by its first user turn, which its `n` sessions share. A prompt with no
 * turn end is keyed by all of it (up to the cap).
 * Format: `{block length}-{hex}-{hex}`, e.g. `312-1f0c2a9b-77e01d45`.
 */
export function prefixKeyOf(promptIds: ArrayLike<number>, turnEndIds: readonly number[]): string {
  const limit = Math.min(promptIds.length, PREFIX_KEY_MAX_TOKENS);
  let a = 0x2f6b9c1d;
  let b = 0x63d2a5e7;
  let n = 0;
  while (n < limit) {
    const id = promptIds[n++];
    a = hashInt(a, id);
    b = hashInt(b ^ 0x5bd1e995, id + 0x9e3779b9);
    if (turnEndIds.includes(id)) break;
  }
  return `${n}-${a.toString(16).padStart(8, "0")}-${b.toString(16).padStart(8, "0")}`;
}
