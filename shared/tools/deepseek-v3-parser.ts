import { indexOutsideJsonStrings, isPlainObject } from "./json-aware-scan.ts";
import { contentWithoutParsed, scanBlocks, type BlockBody, type ExtractResult, type ParseError, type ParsedCall, type ToolCallParser } from "./tool-call-parser.ts";

export const DSV3_CALLS_BEGIN = "<｜tool▁calls▁begin｜>";
export const DSV3_CALLS_END = "<｜tool▁calls▁end｜>";
export const DSV3_CALL_BEGIN = "<｜tool▁call▁begin｜>";
export const DSV3_CALL_END = "<｜tool▁call▁end｜>";
export const DSV3_SEP = "<｜tool▁sep｜>";
/**
 * How a call looks, in words: error messages become tool outputs, and the
 * model's tool-call special tokens written there would be encoded as real
 * special tokens inside the output, so none appear.
 */
const CALL_SHAPE = "a tool call is the tool-call begin token, function, the tool separator token, the tool name and a newline, then the arguments as a JSON object in a ```json fenced block, then the tool-call end token";

/**
 * Reads one call body after `<｜tool▁call▁begin｜>`: the header up to the first
 * newline, then the end tag searched outside JSON strings so that
 * `<｜tool▁call▁end｜>` inside an argument value does not end the call.
 */
function readBody(text: string, start: number): BlockBody {
  const nl = text.indexOf("\n", start);
  const from = nl < 0 ? start : nl;
  const end = indexOutsideJsonStrings(text, DSV3_CALL_END, from);
  if (end < 0) return { body: text.slice(start), end: text.length, closed: false };
  return { body: text.slice(start, end), end: end + DSV3_CALL_END.length, closed: true };
}

const isWs = (c: string | undefined): boolean => c !== undefined && /\s/.test(c);

/**
 * The text of a fenced block that is all of `s` (whitespace around it
 * allowed): "```" with an optional `json` label, then the body, then "```".
 * One spaces/tabs run and one newline next to each fence are not part of the
 * body. Undefined when `s` is not one fenced block. Scans `s` once (a regex
 * with a lazy body and a trailing whitespace run backtracked quadratically on
 * long blank runs).
 */
function fencedBody(s: string): string | undefined {
  const FENCE = "```";
  let a = 0;
  while (isWs(s[a])) a++;
  let z = s.length;
  while (z > a && isWs(s[z - 1])) z--;
  if (!s.startsWith(FENCE, a)) return undefined;
  let open = a + FENCE.length;
  if (s.startsWith("json", open)) open += 4;
  while (s[open] === " " || s[open] === "\t") open++;
  if (s[open] === "\n") open++;
  const close = z - FENCE.length;
  // The closing fence cannot start inside the label/blank run after the opening one (no backticks there).
  if (close < a + FENCE.length || !s.startsWith(FENCE, close)) return undefined;
  let end = close;
  while (end > open && (s[end - 1] === " " || s[end - 1] === "\t")) end--;
  if (end > open && s[end - 1] === "\n") end--;
  return s.slice(open, end);
}

function parseBody(index: number, b: BlockBody): ParsedCall | ParseError {
  const raw = b.body;
  const sep = raw.indexOf(DSV3_SEP);
  const nl = raw.indexOf("\n", sep < 0 ? 0 : sep);
  const name = sep < 0 ? undefined : raw.slice(sep + DSV3_SEP.length, nl < 0 ? raw.length : nl).trim() || undefined;
  if (!b.closed) return { index, name, raw, message: `The tool call${name ? ` to '${name}'` : ""} was not closed with the tool-call end token; ${CALL_SHAPE}.` };
  if (sep < 0 || !name) return { index, raw, message: `Invalid tool call: no tool name; ${CALL_SHAPE}.` };
  const fenced = fencedBody(nl < 0 ? "" : raw.slice(nl + 1));
  if (fenced === undefined) return { index, name, raw, message: `Invalid tool call to '${name}': the arguments must be a \`\`\`json fenced block; ${CALL_SHAPE}.` };
  let args: unknown;
  try {
    args = fenced.trim() === "" ? {} : JSON.parse(fenced);
  } catch {
    return { index, name, raw, message: `Invalid JSON in the arguments of '${name}'; ${CALL_SHAPE}.` };
  }
  if (!isPlainObject(args)) return { index, name, raw, message: `Invalid arguments for '${name}': arguments must be a JSON object.` };
  return { index, name, arguments: args, raw };
}

/**
 * The DeepSeek V3 parser, for the format of the model's own chat template:
 * `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>`
 * (further calls joined by `\n`), then `<｜tool▁calls▁end｜>`. The end tag is
 * looked for outside JSON strings; calls inside `<think>` (R1-style
 * reasoning) do not count; a call that never closes, has no name, no fenced
 * block, bad JSON or non-object arguments is a {@link ParseError}. `content`
 * drops the parsed calls and the `<｜tool▁calls▁begin｜>`/`<｜tool▁calls▁end｜>` wrapper.
 *
 * Difference from vLLM: vLLM ignores calls unless `<｜tool▁calls▁begin｜>`
 * is present and silently skips blocks its regex does not match.
 * @see vLLM `DeepSeekV3ToolParser` (`vllm/entrypoints/openai/tool_parsers/deepseekv3_tool_parser.py`)
 */
export class DeepSeekV3ToolCallParser implements ToolCallParser {
  readonly name = "deepseek_v3";

  extract(text: string): ExtractResult {
    const calls: ParsedCall[] = [];
    const errors: ParseError[] = [];
    try {
      const { blocks, at } = scanBlocks(text, DSV3_CALL_BEGIN, (start) => readBody(text, start));
      const parsed = blocks.map((b, i) => {
        const r = parseBody(i, b);
        if ("arguments" in r) calls.push(r);
        else errors.push(r);
        return "arguments" in r;
      });
      const content = contentWithoutParsed(text, at, blocks, parsed);
      const stripped = calls.length > 0 && errors.length === 0 ? content.replace(/<｜tool▁calls▁begin｜>\s*/g, "").replace(/\s*<｜tool▁calls▁end｜>/g, "") : content;
      return { content: stripped, calls, errors };
    } catch {
      return { content: text, calls: [], errors: [] };
    }
  }
}
