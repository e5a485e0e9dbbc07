/** Which part of an over-long tool response to keep. */
export type TruncateSide = "left" | "right" | "middle";

/**
 * Cuts a tool response to `max` characters, counted in Unicode code points
 * (as Python's `len`), adding verl's markers (which are not counted):
 * - `left` keeps the tail: `"(truncated)..." + last max`;
 * - `right` keeps the head: `first max + "...(truncated)"`;
 * - `middle` keeps `first ⌊max/2⌋ + "...(truncated)..." + last ⌊max/2⌋`.
 * Text of at most `max` code points is returned unchanged.
 *
 * Deviation from verl: for `middle` with `max = 1`, Python's `text[-0:]`
 * keeps the whole string as the "tail"; here the tail is empty, so the result
 * is just the marker.
 * @see verl `ToolAgentLoop._call_tool` (`tool_response_truncate_side`, meanings after PR #6313)
 */
export function truncateToolResponse(text: string, max: number, side: TruncateSide): string {
  if (text.length <= max) return text;
  const cps = Array.from(text);
  if (cps.length <= max) return text;
  if (side === "left") return "(truncated)..." + cps.slice(cps.length - max).join("");
  if (side === "right") return cps.slice(0, max).join("") + "...(truncated)";
  const half = Math.floor(max / 2);
  return cps.slice(0, half).join("") + "...(truncated)..." + (half > 0 ? cps.slice(cps.length - half).join("") : "");
}
