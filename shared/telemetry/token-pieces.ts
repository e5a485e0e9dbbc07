import type { ChatTokenizer } from "../tokens/tokenizer.ts";

/**
 * The text of every token, for display (the viewer, `edgeloop inspect`):
 * `pieces[i]` is what token `i` adds to the decoded text, special tokens
 * included. A character split over several byte-level tokens (UTF-8 bytes)
 * is given whole to the token that completes it, the earlier ones get `""`,
 * so `pieces.join("")` equals `decode(ids)` wherever the decoder is
 * concatenative (byte-level BPE such as Qwen's).
 */
export function tokenPieces(tokenizer: ChatTokenizer, ids: ArrayLike<number>): string[] {
  const pieces = new Array<string>(ids.length);
  let start = 0;
  for (let i = 0; i < ids.length; i++) {
    pieces[i] = "";
    const text = tokenizer.decode(Array.prototype.slice.call(ids, start, i + 1) as number[]);
    // A trailing U+FFFD is an incomplete UTF-8 sequence while fewer than 4 byte tokens are pending.
    if (text.endsWith("\uFFFD") && i - start < 3 && i + 1 < ids.length) continue;
    pieces[i] = text;
    start = i + 1;
  }
  return pieces;
}
