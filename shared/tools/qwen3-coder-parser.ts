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

function readBody(text: string, start: number): BlockBody {
  const end = text.indexOf(CLOSE, start);
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

/** Finds the end of a section starting at `from`: the earliest of the given markers, or the end of the text. */
function sectionEnd(text: string, from: number, markers: string[]): { end: number; marker: string | undefined } {
  let best = text.length;
  let which: string | undefined;
  for (const m of markers) {
    const k = text.indexOf(m, from);
    if (k >= 0 && k < best) {
      best = k;
      which = m;
    }
  }
  return { end: best, marker: which };
}

/**
 * The Qwen3-Coder XML parser:
 * `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
 * As in verl, an unterminated `<tool_call>`, `<function=` or `<parameter=`
 * still yields what it holds (a finish_reason "length" turn executes nothing
 * anyway); a function or parameter header without `>` is an error / skipped.
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
        const fnAt: number[] = [];
        for (let k = b.body.indexOf(FN_OPEN); k >= 0; k = b.body.indexOf(FN_OPEN, k + FN_OPEN.length)) fnAt.push(k);
        if (fnAt.length === 0) {
          errors.push({ index: index++, raw: b.body, message: "Invalid tool call: expected <function=NAME> inside <tool_call>." });
          continue;
        }
        for (const at of fnAt) {
          const r = this.parseFunction(b.body, at + FN_OPEN.length, index++);
          if ("arguments" in r) calls.push(r);
          else errors.push(r);
        }
      }
      return { content, calls, errors };
    } catch {
      return { content: text, calls: [], errors: [] };
    }
  }

  private parseFunction(body: string, start: number, index: number): ParsedCall | ParseError {
    const { end } = sectionEnd(body, start, [FN_CLOSE, FN_OPEN]);
    const fn = body.slice(start, end);
    const gt = fn.indexOf(">");
    if (gt < 0) return { index, raw: fn, message: "Invalid tool call: the <function=NAME> header is not closed with '>'." };
    const name = fn.slice(0, gt).trim();
    if (!name) return { index, raw: fn, message: "Invalid tool call: empty function name." };
    const props = this.props.get(name) ?? {};
    const args: Record<string, unknown> = {};
    for (let k = fn.indexOf(P_OPEN, gt); k >= 0; ) {
      const pStart = k + P_OPEN.length;
      const { end: pEnd, marker } = sectionEnd(fn, pStart, [P_CLOSE, P_OPEN]);
      const param = fn.slice(pStart, pEnd);
      const pgt = param.indexOf(">");
      if (pgt >= 0) {
        const pname = param.slice(0, pgt).trim();
        if (pname) args[pname] = convertParamValue(trimOneNewline(param.slice(pgt + 1)), schemaType(props[pname]));
      }
      k = marker === P_CLOSE ? fn.indexOf(P_OPEN, pEnd + P_CLOSE.length) : marker === P_OPEN ? pEnd : -1;
    }
    return { index, name, arguments: args, raw: fn };
  }
}

