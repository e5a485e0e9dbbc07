/** Which part of an over-long tool response to keep. */
export type TruncateSide = "left" | "right" | "middle";

/**
 * Cuts a tool response to `max` characters, counted in Unicode code points
 * (as Python's `len`), adding verl's markers (which are not counted):
 * - `left` keeps the tail: `"(truncated)..." + last max`;
 * - `right` keeps the head: `first max + "...(truncated)"`;
 * - `middle` keeps `first ⌊max/2⌋ + "...(truncated)..." + last ⌊max/2⌋`.
 * Text of at most `max` code points is returned unchanged. Costs O(max) time
 * and memory whatever the text's length: the code points are counted from
 * either end, never by splitting the whole text.
 *
 * Deviation from verl: for `middle` with `max = 1`, Python's `text[-0:]`
 * keeps the whole string as the "tail"; here the tail is empty, so the result
 * is just the marker.
 * @see verl `ToolAgentLoop._call_tool` (`tool_response_truncate_side`, meanings after PR #6313)
 */
export function truncateToolResponse(text: string, max: number, side: TruncateSide): string {
  if (text.length <= max) return text;
  // Is there a code point past the first `max`? Walks at most max + 1 code points, never the whole text.
  const headEnd = afterCodePoints(text, 0, max);
  if (headEnd >= text.length) return text;
  if (side === "left") return "(truncated)..." + text.slice(beforeLastCodePoints(text, max));
  if (side === "right") return text.slice(0, headEnd) + "...(truncated)";
  const half = Math.floor(max / 2);
  return text.slice(0, afterCodePoints(text, 0, half)) + "...(truncated)..." + (half > 0 ? text.slice(beforeLastCodePoints(text, half)) : "");
}

/** Whether UTF-16 unit `c` is a high (leading) surrogate. */
const isHigh = (c: number) => c >= 0xd800 && c <= 0xdbff;
/** Whether UTF-16 unit `c` is a low (trailing) surrogate. */
const isLow = (c: number) => c >= 0xdc00 && c <= 0xdfff;

/** The UTF-16 index after `n` code points from `from` (a lone surrogate counts as one, as `Array.from` does); at most `text.length`. */
function afterCodePoints(text: string, from: number, n: number): number {
  let i = from;
  for (let k = 0; k < n && i < text.length; k++) i += isHigh(text.charCodeAt(i)) && i + 1 < text.length && isLow(text.charCodeAt(i + 1)) ? 2 : 1;
  return i;
}

/** The UTF-16 index where the last `n` code points of `text` begin (0 when it holds fewer). */
function beforeLastCodePoints(text: string, n: number): number {
  let i = text.length;
  for (let k = 0; k < n && i > 0; k++) i -= isLow(text.charCodeAt(i - 1)) && i - 2 >= 0 && isHigh(text.charCodeAt(i - 2)) ? 2 : 1;
  return i;
}
