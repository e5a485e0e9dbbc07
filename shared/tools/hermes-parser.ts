import { callArgumentsValue, indexOutsideJsonStrings, isPlainObject, recoverName } from "./json-aware-scan.ts";
import { contentWithoutParsed, scanBlocks, type BlockBody, type ExtractResult, type ParseError, type ParsedCall, type ToolCallParser } from "./tool-call-parser.ts";

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";

/**
 * Reads a Hermes block body starting right after `<tool_call>`. The end tag
 * is looked for outside JSON strings, so a `</tool_call>` inside an argument
 * value does not end the call. When quotes do not balance (the body is not
 * JSON), the first plain end tag is used; when there is none, the block runs
 * to the end of the text and is reported unclosed.
 */
export function readHermesBody(text: string, start: number): BlockBody {
  const at = indexOutsideJsonStrings(text, CLOSE, start);
  if (at >= 0) return { body: text.slice(start, at), end: at + CLOSE.length, closed: true };
  return { body: text.slice(start), end: text.length, closed: false };
}

/**
 * Turns one block body into a call or an error; never throws. A block that
 * never closes is still a call when its body (whitespace trimmed) is a
 * complete JSON call object — the end tag is the only thing missing, as both
 * engines read it; any other unclosed body is an error.
 * @see vLLM `Hermes2ProToolParser.extract_tool_calls` (`<tool_call>(.*)` to the end of the text)
 * @see SGLang `HermesDetector.detect_and_parse` (one JSON value after each `<tool_call>`, no end tag needed)
 */
export function parseHermesBody(index: number, b: BlockBody): ParsedCall | ParseError {
  const raw = b.body;
  const callShape = `a tool call must be <tool_call>{"name": <tool name>, "arguments": <JSON object>}</tool_call>`;
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    const name = recoverName(raw);
    if (!b.closed) return { index, name, raw, message: `The tool call${name ? ` to '${name}'` : ""} was not closed with </tool_call>; ${callShape}.` };
    return { index, name, raw, message: `Invalid JSON in tool call${name ? ` for '${name}'` : ""}; ${callShape}.` };
  }
  if (!isPlainObject(v)) {
    if (!b.closed) return { index, raw, message: `The tool call was not closed with </tool_call>; ${callShape}.` };
    return { index, raw, message: `Invalid tool call: ${callShape}.` };
  }
  const name = v.name;
  if (typeof name !== "string" || name.length === 0) {
    return { index, raw, message: `Invalid tool call: "name" is missing or not a non-empty string; ${callShape}.` };
  }
  const picked = callArgumentsValue(v);
  if ("error" in picked) return { index, name, raw, message: `Invalid tool call to '${name}': ${picked.error}; ${callShape}.` };
  let args = picked.value;
  if (args === undefined || args === null) args = {};
  if (typeof args === "string") {
    try {
      args = JSON.parse(args);
    } catch {
      return { index, name, raw, message: `Invalid JSON in arguments for '${name}': the arguments string is not a JSON object.` };
    }
  }
  if (!isPlainObject(args)) {
    return { index, name, raw, message: `Invalid arguments for '${name}': arguments must be a JSON object.` };
  }
  return { index, name, arguments: args, raw };
}

/**
 * The Hermes/Qwen parser: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`,
 * any number per turn. Calls inside `<think>` do not count (case C9); the end
 * tag is found outside JSON strings; `parameters` is read like `arguments`;
 * `arguments` given as a JSON string holding an object is parsed; a missing or
 * null `arguments` is `{}`; a last block whose complete JSON object is not
 * followed by `</tool_call>` is a call. A block that is not valid JSON, has no
 * name, has non-object arguments, gives `arguments` and `parameters` that
 * differ, or never closes around a complete object is a {@link ParseError}
 * (case C10).
 *
 * Differences from verl: verl drops bad blocks silently (logging them) and
 * ignores a turn without both tags; here they surface as errors the loop
 * shows to the model. `content` drops only the blocks that were parsed.
 * @see verl `HermesToolParser` (`verl/experimental/agent_loop/tool_parser.py`)
 * @see vLLM `Hermes2ProToolParser` (`vllm/tool_parsers/hermes_tool_parser.py`), `HermesParser` (`vllm/parser/hermes.py`)
 * @see SGLang `HermesDetector` (`python/sglang/srt/function_call/hermes_detector.py`), `Qwen25Detector` (`qwen25_detector.py`)
 */
export class HermesToolCallParser implements ToolCallParser {
  readonly name = "hermes";

  extract(text: string): ExtractResult {
    const calls: ParsedCall[] = [];
    const errors: ParseError[] = [];
    try {
      const { blocks, at } = scanBlocks(text, OPEN, (start) => readHermesBody(text, start));
      const parsed = blocks.map((b, i) => {
        const r = parseHermesBody(i, b);
        if ("arguments" in r) calls.push(r);
        else errors.push(r);
        return "arguments" in r;
      });
      return { content: contentWithoutParsed(text, at, blocks, parsed), calls, errors };
    } catch {
      return { content: text, calls: [], errors: [] };
    }
  }
}
