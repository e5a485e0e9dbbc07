import { PyLiteralError, PyReader, type PyCall } from "./python-literal.ts";
import { visibleSpans } from "./reasoning-spans.ts";
import { skipBlanks, skipBlanksBack } from "./blanks.ts";
import type { ExtractResult, ParseError, ParsedCall, ToolCallParser } from "./tool-call-parser.ts";

/** `[` then a (dotted) name then `(`: where a call list starts. */
const LIST_START = /\[\s*[A-Za-z_\p{L}][\w\p{L}\p{N}]*(?:\.[A-Za-z_\p{L}][\w\p{L}\p{N}]*)*\s*\(/gu;
/** Llama 4 wraps its call lists in these; they go with the list they surround. */
const PY_START = "<|python_start|>";
const PY_END = "<|python_end|>";
const CALL_SHAPE = 'a tool call list must look like [tool_name(arg="value", n=1), other_tool()] with Python literal arguments';

/**
 * Reads one `[call, call, …]` list at `start` (the `[`) into `calls` (emptied
 * first: a scratch list reused across lists) and returns the index after its
 * `]`; throws PyLiteralError.
 */
function readCallList(r: PyReader, start: number, end: number, calls: PyCall[]): number {
  r.pos = start + 1;
  calls.length = 0;
  for (;;) {
    r.ws();
    if (r.peek() === "]") break;
    calls.push(r.call());
    r.ws();
    if (r.peek() === ",") r.pos++;
    else if (r.peek() !== "]") r.fail(r.pos >= end ? "the call list is not closed with ']'" : `expected ',' or ']' at offset ${r.pos}`);
  }
  return r.pos + 1;
}

/**
 * The pythonic parser (Gemma 3, Llama 3.2/4 "pythonic" tool calling):
 * `[get_weather(city="Paris", days=3), get_time()]`, any number of lists per
 * turn, optionally wrapped in Llama 4's `<|python_start|>…<|python_end|>`.
 * Arguments are Python literals read by our own {@link PyReader} (never
 * evaluated), so a string holding `)]` or `"` stays one argument. Lists inside
 * `<think>` do not count. A list that starts like a call (`[name(`) but does
 * not read (positional arguments, a non-literal, an unclosed string or
 * bracket) is one {@link ParseError} with the reader's message; scanning
 * resumes after the text it covered, or stops when it ran to the end.
 *
 * A raw line break inside a quoted argument (multi-line code written without
 * `\n` escapes) is part of the value, and `true`/`false`/`null` are accepted
 * as literals (see {@link PyReader}); `docs/tool-call-formats.md` has the table
 * of what is accepted and refused, and which engine rule each row follows.
 *
 * Differences from vLLM: vLLM's `pythonic` parser only accepts a turn that is
 * nothing but one call list and falls back to plain text otherwise; here
 * lists are found anywhere in the visible text, and a broken one is an error
 * the model sees, not prose.
 * @see vLLM `PythonicToolParser.extract_tool_calls` (`vllm/tool_parsers/pythonic_tool_parser.py`)
 * @see SGLang `PythonicDetector.detect_and_parse` (`python/sglang/srt/function_call/pythonic_detector.py`)
 */
export class PythonicToolCallParser implements ToolCallParser {
  readonly name = "pythonic";

  extract(text: string): ExtractResult {
    const calls: ParsedCall[] = [];
    const errors: ParseError[] = [];
    try {
      // The text ranges the lists (and their Llama 4 wrappers) cover, as start, end pairs.
      const cut: number[] = [];
      const listCalls: PyCall[] = [];
      let index = 0;
      for (const span of visibleSpans(text)) {
        LIST_START.lastIndex = span.start;
        // One reader per span (its position is set per list): the span's text is sliced once, not per list.
        const reader = new PyReader(text.slice(0, span.end), span.start);
        for (let m = LIST_START.exec(text); m && m.index < span.end; m = LIST_START.exec(text)) {
          const at = m.index;
          reader.pos = at;
          try {
            const listEnd = readCallList(reader, at, span.end, listCalls);
            // A call's range starts at its name and ends at its ')': nothing to trim.
            for (const c of listCalls) calls.push({ index: index++, name: c.name, arguments: c.kwargs, raw: text.slice(c.start, c.end) });
            let s = at;
            let e = listEnd;
            // `<|python_start|>` right before the list (blanks between) and `<|python_end|>` right after it:
            // found by scanning the blanks on either side, never by slicing the text before or after.
            const beforeEnd = skipBlanksBack(text, at, span.start);
            const startsAt = beforeEnd - PY_START.length;
            if (startsAt >= span.start && text.startsWith(PY_START, startsAt) && text.startsWith(PY_END, skipBlanks(text, e))) {
              s = startsAt;
              e = text.indexOf(PY_END, e) + PY_END.length;
            }
            cut.push(s, e);
            LIST_START.lastIndex = listEnd;
          } catch (err) {
            if (!(err instanceof PyLiteralError)) throw err;
            const name = /\[\s*([^\s(]+)/.exec(m[0])?.[1];
            const stop = Math.max(err.pos, reader.pos, at + m[0].length);
            const close = text.indexOf("]", stop);
            const end = close >= 0 && close < span.end ? close + 1 : span.end;
            errors.push({ index: index++, name, raw: text.slice(at, end), message: `Invalid tool call${name ? ` to '${name}'` : ""}: ${err.message}; ${CALL_SHAPE}.` });
            LIST_START.lastIndex = end;
          }
        }
      }
      let content = "";
      let from = 0;
      for (let k = 0; k < cut.length; k += 2) {
        content += text.slice(from, cut[k]);
        from = cut[k + 1]!;
      }
      content += text.slice(from);
      return { content, calls, errors };
    } catch {
      return { content: text, calls: [], errors: [] };
    }
  }
}
