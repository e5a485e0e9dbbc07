import { expect, test } from "bun:test";
import fc from "fast-check";
import { toolCallTokens } from "../../functions/viewer/client/segments.ts";

/** The scan toolCallTokens had before (every call walked every token: calls × tokens), as the reference. */
function reference(pieces: readonly string[], start: number, end: number): Set<number> {
  const inCall = new Set<number>();
  let text = "";
  const ends: number[] = [];
  for (let i = start; i < end; i++) {
    text += pieces[i] ?? "";
    ends.push(text.length);
  }
  const re = /<tool_call>[\s\S]*?(<\/tool_call>|$)/g;
  for (let m = re.exec(text); m; m = re.exec(text)) {
    if (m[0].length === 0) break;
    const a = m.index;
    const b = m.index + m[0].length;
    let from = 0;
    for (let k = 0; k < ends.length; k++) {
      const to = ends[k]!;
      if (to > a && from < b) inCall.add(start + k);
      from = to;
    }
  }
  return inCall;
}

test("toolCallTokens: the tokens inside <tool_call>…</tool_call>, as the quadratic scan found them (property)", () => {
  const piece = fc.constantFrom("", "<tool_call>", "</tool_call>", "<tool", "_call>", "</tool_", "call>", "x", " ", "\n", "{}", "<", ">");
  fc.assert(
    fc.property(fc.array(piece, { maxLength: 40 }), fc.nat(5), fc.nat(5), (pieces, s, e) => {
      const start = Math.min(s, pieces.length);
      const end = Math.max(start, pieces.length - e);
      expect([...toolCallTokens(pieces, start, end)].sort((a, b) => a - b)).toEqual([...reference(pieces, start, end)].sort((a, b) => a - b));
    }),
    { numRuns: 5000 },
  );
  expect([...toolCallTokens(["a", "<tool_call>", "{", "}", "</tool_call>", "b"], 0, 6)]).toEqual([1, 2, 3, 4]);
});
