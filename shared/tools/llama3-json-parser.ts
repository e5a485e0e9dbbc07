import { callArgumentsValue, isPlainObject, recoverName } from "./json-aware-scan.ts";
import { skipBlanks } from "./blanks.ts";
import { THINK_CLOSE, THINK_OPEN, type ExtractResult, type ParseError, type ParsedCall, type ToolCallParser } from "./tool-call-parser.ts";

const PYTHON_TAG = "<|python_tag|>";
const CALL_SHAPE = `a tool call must be a JSON object {"name": <tool name>, "parameters": <JSON object>}; several calls are separated by ";"`;

/**
 * The Llama 3.1 JSON tool-call parser (`llama3_json`): a turn that starts
 * (after whitespace and an optional `<|python_tag|>`) with `{` is one or more
 * JSON objects `{"name": …, "parameters": {…}}` (`"arguments"` accepted too;
 * both with different values is an error), separated by `;`, by whitespace
 * or by nothing (after a call, a further object that looks like a call — it
 * has a `name`, `parameters` or `arguments` key — is the next call).
 * Otherwise the turn is text and has no calls.
 *
 * - Objects are delimited by matching braces outside JSON strings, so a `}`,
 *   `;` or `{` inside an argument string is kept (the C13 kind of case).
 * - Reasoning is never executed: text up to the last `</think>` is skipped,
 *   and an unclosed `<think>` hides the rest of the turn.
 * - A call that is not valid JSON, has no name, has non-object parameters or
 *   never closes is a {@link ParseError} (an error observation the model
 *   reads), never dropped. A JSON object with neither `name` nor
 *   `parameters`/`arguments` is an answer written as JSON, not a call.
 * - Text after the last call (not a `;`) stays as content, and so do the
 *   objects that became errors, as the model wrote them.
 * @see vLLM `Llama3JsonToolParser.extract_tool_calls` (`vllm/tool_parsers/llama_tool_parser.py`), `vllm/parser/llama_json.py`
 * @see SGLang `Llama32Detector.detect_and_parse` (`python/sglang/srt/function_call/llama32_detector.py`)
 * @see https://github.com/meta-llama/llama-models/blob/main/models/llama3_1/prompt_format.md
 */
export class Llama3JsonToolCallParser implements ToolCallParser {
  readonly name = "llama3_json";

  extract(text: string): ExtractResult {
    const calls: ParsedCall[] = [];
    const errors: ParseError[] = [];
    let start = 0;
    const open = text.indexOf(THINK_OPEN);
    if (open >= 0 && text.indexOf(THINK_CLOSE, open) < 0) return { content: text, calls, errors };
    const close = text.lastIndexOf(THINK_CLOSE);
    if (close >= 0) start = close + THINK_CLOSE.length;
    let i = skipWs(text, start);
    if (text.startsWith(PYTHON_TAG, i)) i = skipWs(text, i + PYTHON_TAG.length);
    if (text[i] !== "{") {
      if (text.startsWith(PYTHON_TAG, skipWs(text, start))) {
        errors.push({ index: 0, raw: text.slice(i), message: `Invalid tool call after <|python_tag|>: only JSON tool calls are supported; ${CALL_SHAPE}.` });
        return { content: text, calls, errors };
      }
      return { content: text, calls, errors };
    }
    const head = text.slice(0, start);
    // Calls that became errors stay in the content as the model wrote them (a caller showing only content sees them).
    const kept: string[] = [];
    const withKept = (rest: string): string => head + [...kept, rest].filter((x) => x !== "").join("\n");
    let index = 0;
    for (;;) {
      const end = matchBrace(text, i);
      const raw = end < 0 ? text.slice(i) : text.slice(i, end);
      if (end < 0) {
        const name = recoverName(raw);
        errors.push({ index, name, raw, message: `The tool call${name ? ` to '${name}'` : ""} is not a complete JSON object (its braces never close); ${CALL_SHAPE}.` });
        kept.push(raw);
        return { content: withKept(""), calls, errors };
      }
      const r = parseCall(index, raw);
      if (r === "not-a-call") {
        if (index === 0) return { content: text, calls, errors };
        errors.push({ index, raw, message: `Invalid tool call: the object has no "name"; ${CALL_SHAPE}.` });
        kept.push(raw);
      } else if ("arguments" in r) calls.push(r);
      else {
        errors.push(r);
        kept.push(raw);
      }
      index++;
      const j = skipWs(text, end);
      if (text[j] === ";" && text[skipWs(text, j + 1)] === "{") {
        i = skipWs(text, j + 1);
        continue;
      }
      // Calls may also follow each other with only whitespace (a newline) or nothing between them, as vLLM and SGLang
      // read them; there a following object counts only when it looks like a call (else it is the answer's text).
      if (text[j] === "{") {
        const e2 = matchBrace(text, j);
        if (parseCall(index, e2 < 0 ? text.slice(j) : text.slice(j, e2)) !== "not-a-call") {
          i = j;
          continue;
        }
      }
      const rest = text.slice(j);
      return { content: withKept(rest === ";" ? "" : rest), calls, errors };
    }
  }
}

/** The index after the blanks at `i` (`/\s/`'s set, decided by code: {@link skipBlanks}). */
function skipWs(text: string, i: number): number {
  return skipBlanks(text, i);
}

/** Index just past the `}` matching the `{` at `start`, outside JSON strings; -1 when it never closes. */
function matchBrace(text: string, start: number): number {
  let depth = 0;
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++;
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b) depth++;
    else if (c === 0x7d && --depth === 0) return i + 1;
  }
  return -1;
}

function parseCall(index: number, raw: string): ParsedCall | ParseError | "not-a-call" {
  let v: unknown;
  try {
    v = JSON.parse(raw);
  } catch {
    const name = recoverName(raw);
    if (name === undefined && !/"(parameters|arguments)"\s*:/.test(raw)) return "not-a-call";
    return { index, name, raw, message: `Invalid JSON in tool call${name ? ` for '${name}'` : ""}; ${CALL_SHAPE}.` };
  }
  if (!isPlainObject(v)) return "not-a-call";
  const hasArgs = "parameters" in v || "arguments" in v;
  if (!("name" in v) && !hasArgs) return "not-a-call";
  const name = v.name;
  if (typeof name !== "string" || name.length === 0) {
    return { index, raw, message: `Invalid tool call: "name" is missing or not a non-empty string; ${CALL_SHAPE}.` };
  }
  const picked = callArgumentsValue(v);
  if ("error" in picked) return { index, name, raw, message: `Invalid tool call to '${name}': ${picked.error}; ${CALL_SHAPE}.` };
  let args = picked.value;
  if (args === undefined || args === null) args = {};
  if (typeof args === "string") {
    try {
      args = JSON.parse(args);
    } catch {
      return { index, name, raw, message: `Invalid JSON in parameters for '${name}': the parameters string is not a JSON object.` };
    }
  }
  if (!isPlainObject(args)) return { index, name, raw, message: `Invalid parameters for '${name}': parameters must be a JSON object.` };
  return { index, name, arguments: args, raw };
}
