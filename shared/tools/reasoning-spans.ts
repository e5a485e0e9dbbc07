import { THINK_CLOSE, THINK_OPEN } from "./tool-call-parser.ts";

/** A half-open range `[start, end)` of a turn's text. */
export interface Span {
  start: number;
  end: number;
}

/**
 * The parts of an assistant turn where a tool call counts, by the same rules
 * as {@link scanBlocks}: a `<think>…</think>` block is skipped, an unclosed
 * `<think>` hides the rest of the text, and an orphan `</think>` (the template
 * put `<think>` in the prompt) hides everything before it. For parsers whose
 * call syntax does not start with `<` (pythonic `[fn(…)]`).
 */
export function visibleSpans(text: string): Span[] {
  let spans: Span[] = [];
  let segStart = 0;
  let i = 0;
  while (i < text.length) {
    const lt = text.indexOf("<", i);
    if (lt < 0) break;
    if (text.startsWith(THINK_OPEN, lt)) {
      spans.push({ start: segStart, end: lt });
      const close = text.indexOf(THINK_CLOSE, lt + THINK_OPEN.length);
      if (close < 0) return spans.filter((s) => s.end > s.start);
      i = close + THINK_CLOSE.length;
      segStart = i;
    } else if (text.startsWith(THINK_CLOSE, lt)) {
      i = lt + THINK_CLOSE.length;
      spans = [];
      segStart = i;
    } else {
      i = lt + 1;
    }
  }
  spans.push({ start: segStart, end: text.length });
  return spans.filter((s) => s.end > s.start);
}
