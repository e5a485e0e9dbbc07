import { PyLiteralError, PyReader } from "./python-literal.ts";
import {
  contentWithoutParsed,
  scanBlocks,
  type BlockBody,
  type ExtractResult,
  type ParseError,
  type ParsedCall,
  type ToolCallParser,
  type ToolCallParserOptions,
} from "./tool-call-parser.ts";

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";
const FN_OPEN = "<function=";
const FN_CLOSE = "</function>";
const P_OPEN = "<parameter=";
const P_CLOSE = "</parameter>";
const CALL_SHAPE = "a tool call must be <tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>";

/** True when, after whitespace, `text` continues at `at` with one of `next` (or ends, when `orEnd`). */
function followedBy(text: string, at: number, next: readonly string[], orEnd = false): boolean {
  let k = at;
  while (k < text.length && /\s/.test(text[k]!)) k++;
  if (k >= text.length) return orEnd;
  return next.some((n) => text.startsWith(n, k));
}

/** True when the text before `at`, whitespace trimmed, ends with `tag`. */
function precededBy(text: string, at: number, tag: string): boolean {
  let k = at;
  while (k > 0 && /\s/.test(text[k - 1]!)) k--;
  return text.startsWith(tag, k - tag.length) && k >= tag.length;
}

/**
 * A finder for the first `tag` at or after `from` that sits where the format
 * puts it (`ok(index)`), else the first plain one, else -1. The XML format
 * does not quote values, so a value holding `</tool_call>` is told apart from
 * the real end tag by what surrounds it. Calls must come with non-decreasing
 * `from`; the finder remembers where the last search for a well-placed tag
 * ended, so a text full of badly placed tags is searched once, not once per
 * block (linear in the text).
 */
function structuralFinder(text: string, tag: string, ok: (at: number) => boolean): (from: number) => number {
  let found = -2; // -2: not searched yet; -1: no well-placed tag after `searchedFrom`
  let searchedFrom = 0;
  return (from) => {
    if (found === -2 || (found >= 0 && found < from)) {
      found = -1;
      for (let k = text.indexOf(tag, from); k >= 0; k = text.indexOf(tag, k + 1)) {
        if (ok(k)) {
          found = k;
          break;
        }
      }
      searchedFrom = from;
    }
    if (found >= from && from >= searchedFrom) return found;
    return text.indexOf(tag, from);
  };
}

/** Drops one leading and one trailing newline, as the Qwen3-Coder template writes values on their own lines. */
function trimOneNewline(v: string): string {
  let s = v;
  if (s.startsWith("\n")) s = s.slice(1);
  if (s.endsWith("\n")) s = s.slice(0, -1);
  return s;
}

/**
 * Where each parameter value of one function section ends. The Qwen3-Coder
 * template puts every `<parameter=NAME>` on its own line and closes it with
 * `</parameter>`; a value is plain text, so it may itself hold those tags.
 * Following vLLM's `Qwen3CoderToolParser._find_true_param_end`, a value ends
 * at the first `</parameter>` that is followed by the next `<parameter=` or
 * by the function end, counting a line-start `<parameter=` inside the value
 * as opening a nested literal that its own `</parameter>` closes. When no such
 * end exists (the model left `</parameter>` out), the value ends at whichever
 * comes first: a line-start `<parameter=NAME>` (NAME in the tool's schema,
 * when there is one) or a plain `</parameter>` — SGLang's
 * `Qwen3CoderDetector` rule — else at the function end when the function was
 * closed. All positions are found in one pass over the section, so the scan
 * is linear however the tags are arranged.
 */
class ParamEnds {
  private readonly at: number[] = [];
  private readonly open: boolean[] = [];
  /** For token j: index of the first token (from j on, nested opens matched) that ends a value, or -1. */
  private readonly endFrom: number[];
  /** For token j: index of the first `</parameter>` token from j on, or -1. */
  private readonly closeFrom: number[];
  private cursor = 0;
  /** -2: not searched yet; -1: none left; else the position found. */
  private implicit = -2;

  constructor(
    private readonly fn: string,
    private readonly names: ReadonlySet<string> | undefined,
  ) {
    let o = this.lineStartOpen(0);
    let c = fn.indexOf(P_CLOSE);
    const structural: boolean[] = [];
    while (o >= 0 || c >= 0) {
      if (c < 0 || (o >= 0 && o < c)) {
        this.at.push(o);
        this.open.push(true);
        structural.push(false);
        o = this.lineStartOpen(o + P_OPEN.length);
      } else {
        this.at.push(c);
        this.open.push(false);
        structural.push(followedBy(fn, c + P_CLOSE.length, [P_OPEN], true));
        c = fn.indexOf(P_CLOSE, c + P_CLOSE.length);
      }
    }
    const n = this.at.length;
    const match = new Array<number>(n).fill(-1);
    const stack: number[] = [];
    for (let j = 0; j < n; j++) {
      if (this.open[j]) stack.push(j);
      else if (stack.length > 0) match[stack.pop()!] = j;
    }
    this.endFrom = new Array<number>(n + 1).fill(-1);
    this.closeFrom = new Array<number>(n + 1).fill(-1);
    for (let j = n - 1; j >= 0; j--) {
      if (!this.open[j]) this.endFrom[j] = structural[j] ? j : this.endFrom[j + 1]!;
      else this.endFrom[j] = match[j]! >= 0 ? this.endFrom[match[j]! + 1]! : -1;
      this.closeFrom[j] = this.open[j] ? this.closeFrom[j + 1]! : j;
    }
  }

  private lineStartOpen(from: number): number {
    for (let k = this.fn.indexOf(P_OPEN, from); k >= 0; k = this.fn.indexOf(P_OPEN, k + 1)) if (k > 0 && this.fn[k - 1] === "\n") return k;
    return -1;
  }

  /**
   * The value starting at `v0` (right after its header's `>`): `end` (exclusive)
   * and `next` (where the following parameter is looked for), or undefined
   * when the value has no end. Calls must come with increasing `v0`.
   */
  end(v0: number, fnClosed: boolean): { end: number; next: number } | undefined {
    while (this.cursor < this.at.length && this.at[this.cursor]! < v0) this.cursor++;
    const e = this.endFrom[this.cursor] ?? -1;
    if (e >= 0) return { end: this.at[e]!, next: this.at[e]! + P_CLOSE.length };
    // The first line-start `<parameter=NAME>` with a known NAME at or after v0, remembered across calls.
    if (this.implicit !== -1 && this.implicit < v0) {
      this.implicit = -1;
      for (let k = this.lineStartOpen(v0); k >= 0; k = this.lineStartOpen(k + 1)) {
        let eol = this.fn.indexOf("\n", k + P_OPEN.length);
        if (eol < 0) eol = this.fn.length;
        let gt = k + P_OPEN.length;
        while (gt < eol && this.fn.charCodeAt(gt) !== 0x3e) gt++;
        const name = gt < eol ? this.fn.slice(k + P_OPEN.length, gt).trim() : undefined;
        if (name && (!this.names || this.names.has(name))) {
          this.implicit = k;
          break;
        }
      }
    }
    const implicit = this.implicit;
    const pj = this.closeFrom[this.cursor] ?? -1;
    const plain = pj >= 0 ? this.at[pj]! : -1;
    if (plain >= 0 && (implicit < 0 || plain < implicit)) return { end: plain, next: plain + P_CLOSE.length };
    if (implicit >= 0) return { end: implicit, next: implicit };
    if (fnClosed) return { end: this.fn.length, next: this.fn.length };
    return undefined;
  }
}

/** A whole value read as one Python literal (`{'k': 'v'}`, `(1, 2)`, `'x'`), or undefined. Never evaluates anything. */
function pythonLiteral(t: string): { value: unknown } | undefined {
  try {
    const r = new PyReader(t, 0);
    const value = r.value();
    r.ws();
    return r.pos === t.length ? { value } : undefined;
  } catch (err) {
    if (err instanceof PyLiteralError) return undefined;
    throw err;
  }
}

function schemaType(prop: unknown): string | undefined {
  if (!prop || typeof prop !== "object") return undefined;
  const t = (prop as { type?: unknown }).type;
  if (typeof t === "string") return t.toLowerCase();
  if (Array.isArray(t)) {
    const first = t.find((x) => typeof x === "string" && x.toLowerCase() !== "null");
    return typeof first === "string" ? first.toLowerCase() : undefined;
  }
  return undefined;
}

/**
 * Converts a parameter's text by its schema type, as verl's qwen3_coder parser:
 * `"null"` → null; string-like → as is; int-like → integer (else text);
 * num/float → number (else text); bool → `=== "true"`; object and anything else
 * (array…) → JSON when it parses, else a Python literal when the whole text is
 * one (`{'k': 'v'}`, `(1, 2)`, `True`), else the text. A parameter absent
 * from the schema stays text. Never evaluates anything.
 * @see verl `Qwen3XMLToolParser._convert_param_value`
 * @see vLLM `Qwen3CoderToolParser._convert_param_value` and SGLang `Qwen3CoderDetector._convert_param_value` (`json.loads`, then `ast.literal_eval`)
 */
export function convertParamValue(value: string, type: string | undefined): unknown {
  if (value.trim().toLowerCase() === "null") return null;
  if (type === undefined) return value;
  if (["string", "str", "text", "varchar", "char", "enum"].includes(type)) return value;
  const t = value.trim();
  if (/^(int|uint|long|short|unsigned)/.test(type)) return /^[+-]?\d+$/.test(t) ? Number.parseInt(t, 10) : value;
  if (/^(num|float)/.test(type)) {
    if (!/^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$/.test(t)) return value;
    return Number(t);
  }
  if (["boolean", "bool", "binary"].includes(type)) return t.toLowerCase() === "true";
  try {
    return JSON.parse(t);
  } catch {
    const lit = pythonLiteral(t);
    return lit ? lit.value : value;
  }
}

/**
 * The Qwen3-Coder XML parser:
 * `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
 * The format does not quote values, so end tags are matched where the format
 * puts them: a block ends at the `</tool_call>` that follows `</function>`, a
 * function starts at the block start or after `</function>`, and a value ends
 * at the `</parameter>` followed by the next `<parameter=` or the function's
 * end ({@link ParamEnds}). A value holding `</tool_call>`, `<parameter=x>` or
 * `</parameter>` in prose therefore stays whole. Following vLLM and SGLang, a
 * value whose `</parameter>` is missing ends before the next line-start
 * `<parameter=NAME>` or at `</function>`, and a last block whose function is
 * closed needs no `</tool_call>`. A block that never closes its function, a
 * header without `>` or a parameter with no end at all is a {@link ParseError}
 * (verl instead keeps what an unterminated block holds and skips a broken
 * parameter silently). Every scan is linear in the text.
 * Values are converted by the tool's parameter schema
 * ({@link convertParamValue}). Calls inside `<think>` do not count.
 * @see verl `Qwen3XMLToolParser` (`verl/experimental/agent_loop/tool_parser.py`)
 * @see vLLM `Qwen3CoderToolParser` (`vllm/tool_parsers/qwen3coder_tool_parser.py`), `Qwen3Parser` (`vllm/parser/qwen3.py`)
 * @see SGLang `Qwen3CoderDetector.detect_and_parse` (`python/sglang/srt/function_call/qwen3_coder_detector.py`)
 */
export class Qwen3CoderToolCallParser implements ToolCallParser {
  readonly name = "qwen3_coder";
  private readonly props = new Map<string, Record<string, unknown>>();

  constructor(opts: ToolCallParserOptions = {}) {
    for (const t of opts.tools ?? []) this.props.set(t.function.name, (t.function.parameters?.properties ?? {}) as Record<string, unknown>);
  }

  extract(text: string): ExtractResult {
    const calls: ParsedCall[] = [];
    const errors: ParseError[] = [];
    try {
      // A block ends at the `</tool_call>` that follows a `</function>` (else the first plain one).
      const blockEnd = structuralFinder(text, CLOSE, (k) => precededBy(text, k, FN_CLOSE));
      const { blocks, at } = scanBlocks(text, OPEN, (start): BlockBody => {
        const end = blockEnd(start);
        if (end < 0) return { body: text.slice(start), end: text.length, closed: false };
        return { body: text.slice(start, end), end: end + CLOSE.length, closed: true };
      });
      let index = 0;
      // A block leaves the content only when every function in it became a call.
      const parsed = blocks.map(() => false);
      blocks.forEach((b, bi) => {
        const body = b.body;
        const fnAt: number[] = [];
        let first = 0;
        while (first < body.length && /\s/.test(body[first]!)) first++;
        for (let k = body.indexOf(FN_OPEN); k >= 0; k = body.indexOf(FN_OPEN, k + FN_OPEN.length)) {
          if (k === first || precededBy(body, k, FN_CLOSE)) fnAt.push(k);
        }
        // The last block of the turn may lack `</tool_call>` when its function is closed: only the wrapper is missing
        // (vLLM `Qwen3CoderToolParser._get_function_calls` and SGLang `Qwen3CoderDetector.detect_and_parse` read it too).
        const closed = b.closed || (fnAt.length > 0 && precededBy(body, body.length, FN_CLOSE));
        if (!closed) {
          const name = fnAt.length > 0 ? /^([^>\n]*)>/.exec(body.slice(fnAt[0]! + FN_OPEN.length))?.[1]?.trim() : undefined;
          errors.push({ index: index++, name: name || undefined, raw: body, message: `The tool call${name ? ` to '${name}'` : ""} was not closed with </tool_call>; ${CALL_SHAPE}.` });
          return;
        }
        if (fnAt.length === 0) {
          errors.push({ index: index++, raw: body, message: `Invalid tool call: expected <function=NAME> inside <tool_call>; ${CALL_SHAPE}.` });
          return;
        }
        let ok = true;
        fnAt.forEach((fa, j) => {
          const r = this.parseFunction(body.slice(fa + FN_OPEN.length, fnAt[j + 1] ?? body.length), index++);
          if ("arguments" in r) calls.push(r);
          else {
            errors.push(r);
            ok = false;
          }
        });
        parsed[bi] = ok;
      });
      return { content: contentWithoutParsed(text, at, blocks, parsed), calls, errors };
    } catch {
      return { content: text, calls: [], errors: [] };
    }
  }

  /** One function section (text after `<function=`, up to the next function or the block end). */
  private parseFunction(section: string, index: number): ParsedCall | ParseError {
    const close = section.lastIndexOf(FN_CLOSE);
    const fn = close >= 0 ? section.slice(0, close) : section;
    const raw = section.trim();
    const gt = fn.indexOf(">");
    if (gt < 0) return { index, raw, message: `Invalid tool call: the <function=NAME> header is not closed with '>'; ${CALL_SHAPE}.` };
    const name = fn.slice(0, gt).trim();
    if (!name) return { index, raw, message: `Invalid tool call: empty function name; ${CALL_SHAPE}.` };
    const known = this.props.get(name);
    const props = known ?? {};
    const ends = new ParamEnds(fn, known && Object.keys(known).length > 0 ? new Set(Object.keys(known)) : undefined);
    const args: Record<string, unknown> = {};
    let k = fn.indexOf(P_OPEN, gt);
    while (k >= 0) {
      const pStart = k + P_OPEN.length;
      const pgt = fn.indexOf(">", pStart);
      let nl = false;
      for (let i = pStart; i < pgt && !nl; i++) nl = fn.charCodeAt(i) === 0x0a;
      if (pgt < 0 || nl) return { index, name, raw, message: `Invalid tool call to '${name}': a <parameter=NAME> header is not closed with '>'; ${CALL_SHAPE}.` };
      const pname = fn.slice(pStart, pgt).trim();
      if (!pname) return { index, name, raw, message: `Invalid tool call to '${name}': empty parameter name; ${CALL_SHAPE}.` };
      const v = ends.end(pgt + 1, close >= 0);
      if (!v) return { index, name, raw, message: `Invalid tool call to '${name}': parameter '${pname}' is not closed with </parameter>; ${CALL_SHAPE}.` };
      args[pname] = convertParamValue(trimOneNewline(fn.slice(pgt + 1, v.end)), schemaType(props[pname]));
      k = fn.indexOf(P_OPEN, v.next);
    }
    return { index, name, arguments: args, raw };
  }
}

