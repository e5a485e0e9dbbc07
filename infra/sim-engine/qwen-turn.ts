/**
 * One-pass readers of a scripted turn written in Qwen3's format (`<think>…</think>`
 * reasoning, Hermes `<tool_call>{"name": N, "arguments": ARGS}</tool_call>`
 * blocks), for the simulated engine's family conversions. They return exactly
 * what the regexes they replace matched (`/<think>[\s\S]*?<\/think>\s*‍/g`,
 * `/\s*<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g` and the call-head regex of
 * {@link callHead}), in time linear in the text: those regexes rescanned long
 * white-space runs and unclosed blocks from every start (158 s for one turn
 * with 320,000 trailing spaces).
 */

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";
const CALL_OPEN = "<tool_call>";
const CALL_CLOSE = "</tool_call>";

/** True for the code units of JavaScript's `\s` (and of `String.prototype.trim`). */
export function isJsSpace(c: number): boolean {
  if (c === 32 || (c >= 9 && c <= 13) || c === 0xa0) return true;
  if (c < 0x1680) return false;
  return c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000 || c === 0xfeff;
}

function skipSpaces(s: string, i: number): number {
  while (i < s.length && isJsSpace(s.charCodeAt(i))) i++;
  return i;
}

/** A `<think>` block: `[start, end)` covers the tags and the white space after the close; `body` is what lies between the tags. */
export interface ThinkBlock {
  start: number;
  end: number;
  body: string;
}

/**
 * The `<think>…</think>` blocks of `text`, left to right, each with the white
 * space after it (what `/<think>[\s\S]*?<\/think>\s*‍/g` matches); `first`
 * stops after one (the non-global regex).
 */
export function thinkBlocks(text: string, first = false): ThinkBlock[] {
  const out: ThinkBlock[] = [];
  let from = 0;
  for (;;) {
    const open = text.indexOf(THINK_OPEN, from);
    if (open < 0) break;
    const close = text.indexOf(THINK_CLOSE, open + THINK_OPEN.length);
    // No close after this open: none after a later open either.
    if (close < 0) break;
    const end = skipSpaces(text, close + THINK_CLOSE.length);
    out.push({ start: open, end, body: text.slice(open + THINK_OPEN.length, close) });
    if (first) break;
    from = end;
  }
  return out;
}

/** `text` without the given blocks (sorted, not overlapping). */
export function without(text: string, blocks: readonly { start: number; end: number }[]): string {
  if (blocks.length === 0) return text;
  const parts: string[] = [];
  let at = 0;
  for (const b of blocks) {
    parts.push(text.slice(at, b.start));
    at = b.end;
  }
  parts.push(text.slice(at));
  return parts.join("");
}

/**
 * The `<tool_call>` blocks of `text`, left to right: `[start, end)` covers the
 * white space before the open tag, the tags and the body; `body` is what lies
 * between the tags, trimmed (what `/\s*<tool_call>\s*([\s\S]*?)\s*<\/tool_call>/g`
 * matches and captures).
 */
export function toolCallBlocks(text: string): ThinkBlock[] {
  const out: ThinkBlock[] = [];
  let from = 0;
  for (;;) {
    const open = text.indexOf(CALL_OPEN, from);
    if (open < 0) break;
    const close = text.indexOf(CALL_CLOSE, open + CALL_OPEN.length);
    if (close < 0) break;
    let start = open;
    while (start > from && isJsSpace(text.charCodeAt(start - 1))) start--;
    out.push({ start, end: close + CALL_CLOSE.length, body: text.slice(open + CALL_OPEN.length, close).trim() });
    from = close + CALL_CLOSE.length;
  }
  return out;
}

function isLineTerminator(c: number): boolean {
  return c === 10 || c === 13 || c === 0x2028 || c === 0x2029;
}

/**
 * The name literal and the arguments text of a trimmed call body
 * `{"name": "N", "arguments": ARGS}` — `name` as written (a JSON string
 * literal, quotes included), `args` the text between the arguments' colon
 * (and the white space after it) and the final `}` — or null when the body
 * does not have that shape. Exactly what
 * `/^\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*([\s\S]*)\}$/` captures
 * (that regex was quadratic on a long blank run after the arguments' colon).
 */
export function callHead(body: string): { name: string; args: string } | null {
  const n = body.length;
  if (n < 2 || body[0] !== "{" || body[n - 1] !== "}") return null;
  const lit = (i: number, s: string) => (body.startsWith(s, i) ? i + s.length : -1);
  let i = skipSpaces(body, 1);
  if ((i = lit(i, '"name"')) < 0) return null;
  i = skipSpaces(body, i);
  if ((i = lit(i, ":")) < 0) return null;
  i = skipSpaces(body, i);
  if (body[i] !== '"') return null;
  const nameStart = i;
  i++;
  for (;;) {
    if (i >= n) return null;
    const c = body.charCodeAt(i);
    if (c === 34) break;
    if (c === 92) {
      if (i + 1 >= n || isLineTerminator(body.charCodeAt(i + 1))) return null;
      i += 2;
    } else i++;
  }
  const name = body.slice(nameStart, i + 1);
  i = skipSpaces(body, i + 1);
  if ((i = lit(i, ",")) < 0) return null;
  i = skipSpaces(body, i);
  if ((i = lit(i, '"arguments"')) < 0) return null;
  i = skipSpaces(body, i);
  if ((i = lit(i, ":")) < 0) return null;
  i = skipSpaces(body, i);
  if (i > n - 1) return null;
  return { name, args: body.slice(i, n - 1) };
}
