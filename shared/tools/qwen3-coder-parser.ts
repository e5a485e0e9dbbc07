import {
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
 * First `tag` at or after `from` that sits where the format puts it
 * (`ok(index)`), else the first plain one, else -1. The XML format does not
 * quote values, so a value holding `</tool_call>` or `</parameter>` is told
 * apart from the real end tag by what surrounds the tag.
 */
function structuralIndex(text: string, tag: string, from: number, ok: (at: number) => boolean): number {
  for (let k = text.indexOf(tag, from); k >= 0; k = text.indexOf(tag, k + 1)) if (ok(k)) return k;
  return text.indexOf(tag, from);
}

/** A block ends at the `</tool_call>` that follows a `</function>`. */
function readBody(text: string, start: number): BlockBody {
  const end = structuralIndex(text, CLOSE, start, (k) => precededBy(text, k, FN_CLOSE));
  if (end < 0) return { body: text.slice(start), end: text.length, closed: false };
  return { body: text.slice(start, end), end: end + CLOSE.length, closed: true };
}

/** Drops one leading and one trailing newline, as the Qwen3-Coder template writes values on their own lines. */
function trimOneNewline(v: string): string {
  let s = v;
  if (s.startsWith("\n")) s = s.slice(1);
  if (s.endsWith("\n")) s = s.slice(0, -1);
  return s;
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
 * (array…) → JSON when it parses, else the text. A parameter absent from the
 * schema stays text. Never evaluates anything.
 * @see verl `Qwen3XMLToolParser._convert_param_value`
 */
export function convertParamValue(value: string, type: string | undefined): unknown {
  if (value.trim().toLowerCase() === "null") return null;
  if (type === undefined) return value;
  if (["string", "str", "text", "varchar", "char", "enum"].includes(type)) return value;
  const t = value.trim();
  if (/^(int|uint|long|short|unsigned)/.test(type)) return /^[+-]?\d+$/.test(t) ? Number.parseInt(t, 10) : value;
  if (/^(num|float)/.test(type)) {
    if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(t)) return value;
    return Number(t);
  }
  if (["boolean", "bool", "binary"].includes(type)) return t.toLowerCase() === "true";
  try {
    return JSON.parse(t);
  } catch {
    return value;
  }
}

/**
 * The Qwen3-Coder XML parser:
 * `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
 * The format does not quote values, so end tags are matched where the format
 * puts them: a block ends at the `</tool_call>` that follows `</function>`, a
 * function starts at the block start or after `</function>`, and a value ends
 * at the `</parameter>` followed by the next `<parameter=` or the function's
 * end. A value holding `</tool_call>`, `<parameter=x>` or `</parameter>` in
 * prose therefore stays whole. A block that never closes, a header without
 * `>` or an unclosed parameter is a {@link ParseError} (verl instead keeps
 * what an unterminated block holds and skips a broken parameter silently).
 * Values are converted by the tool's parameter schema
 * ({@link convertParamValue}). Calls inside `<think>` do not count.
 * @see verl `Qwen3XMLToolParser` (`verl/experimental/agent_loop/tool_parser.py`)
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
      const { blocks, content } = scanBlocks(text, OPEN, (start) => readBody(text, start));
      let index = 0;
      for (const b of blocks) {
        const body = b.body;
        const fnAt: number[] = [];
        for (let k = body.indexOf(FN_OPEN); k >= 0; k = body.indexOf(FN_OPEN, k + FN_OPEN.length)) {
          if (body.slice(0, k).trim() === "" || precededBy(body, k, FN_CLOSE)) fnAt.push(k);
        }
        if (!b.closed) {
          const name = fnAt.length > 0 ? /^([^>\n]*)>/.exec(body.slice(fnAt[0]! + FN_OPEN.length))?.[1]?.trim() : undefined;
          errors.push({ index: index++, name: name || undefined, raw: body, message: `The tool call${name ? ` to '${name}'` : ""} was not closed with </tool_call>; ${CALL_SHAPE}.` });
          continue;
        }
        if (fnAt.length === 0) {
          errors.push({ index: index++, raw: body, message: `Invalid tool call: expected <function=NAME> inside <tool_call>; ${CALL_SHAPE}.` });
          continue;
        }
        fnAt.forEach((at, j) => {
          const r = this.parseFunction(body.slice(at + FN_OPEN.length, fnAt[j + 1] ?? body.length), index++);
          if ("arguments" in r) calls.push(r);
          else errors.push(r);
        });
      }
      return { content, calls, errors };
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
    const props = this.props.get(name) ?? {};
    const args: Record<string, unknown> = {};
    let k = fn.indexOf(P_OPEN, gt);
    while (k >= 0) {
      const pStart = k + P_OPEN.length;
      const pgt = fn.indexOf(">", pStart);
      const nl = fn.indexOf("\n", pStart);
      if (pgt < 0 || (nl >= 0 && nl < pgt)) return { index, name, raw, message: `Invalid tool call to '${name}': a <parameter=NAME> header is not closed with '>'; ${CALL_SHAPE}.` };
      const pname = fn.slice(pStart, pgt).trim();
      const vEnd = structuralIndex(fn, P_CLOSE, pgt + 1, (at) => followedBy(fn, at + P_CLOSE.length, [P_OPEN], true));
      if (!pname) return { index, name, raw, message: `Invalid tool call to '${name}': empty parameter name; ${CALL_SHAPE}.` };
      if (vEnd < 0) return { index, name, raw, message: `Invalid tool call to '${name}': parameter '${pname}' is not closed with </parameter>; ${CALL_SHAPE}.` };
      args[pname] = convertParamValue(trimOneNewline(fn.slice(pgt + 1, vEnd)), schemaType(props[pname]));
      k = fn.indexOf(P_OPEN, vEnd + P_CLOSE.length);
    }
    return { index, name, arguments: args, raw };
  }
}

