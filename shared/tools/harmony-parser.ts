import { firstOutsideJsonStrings, isPlainObject } from "./json-aware-scan.ts";
import type { ExtractResult, ParseError, ParsedCall, ToolCallParser } from "./tool-call-parser.ts";

export const H_START = "<|start|>";
export const H_END = "<|end|>";
export const H_MESSAGE = "<|message|>";
export const H_CHANNEL = "<|channel|>";
export const H_CONSTRAIN = "<|constrain|>";
export const H_CALL = "<|call|>";
export const H_RETURN = "<|return|>";
const TERMINATORS = [H_END, H_CALL, H_RETURN] as const;
/**
 * How a call looks, in words: error messages become tool observations, and
 * harmony's special tokens written there would be encoded as real framing
 * tokens inside the tool message (`<|call|>`, `<|start|>` …), so none appear.
 */
const CALL_SHAPE = "call a function with a message on the commentary channel addressed to functions.NAME whose content is a JSON object of its arguments";

/** One harmony message of an assistant turn, as sampled. */
export interface HarmonyMessage {
  /** The header text between `<|start|>` (or the turn start) and `<|message|>`. */
  header: string;
  channel?: string;
  /** `to=` target, e.g. `functions.get_weather`. */
  recipient?: string;
  /** `<|constrain|>` value (e.g. `json`). */
  contentType?: string;
  content: string;
  /** The token that ended the message, or undefined when the text ran out. */
  terminator?: string;
  /** Offsets of the whole message in the turn text, `[start, end)`. */
  start: number;
  end: number;
}

/** Reads `<|channel|>X`, `to=Y` and `<|constrain|>Z` from a header, wherever the recipient sits (role or channel part). */
export function parseHarmonyHeader(header: string): Pick<HarmonyMessage, "channel" | "recipient" | "contentType"> {
  const channel = /<\|channel\|>\s*([^\s<]+)/.exec(header)?.[1];
  const recipient = /(?:^|\s|>)to=([^\s<]+)/.exec(header)?.[1];
  const contentType = /<\|constrain\|>\s*([^\s<]+)/.exec(header)?.[1];
  return { channel, recipient, contentType };
}

/**
 * Splits an assistant turn (decoded with special tokens, starting right after
 * the generation prompt `<|start|>assistant`) into its messages. A message
 * addressed to a tool (`to=…`) is read to its terminator outside JSON strings,
 * so a `<|call|>` inside an argument value does not end it.
 */
export function splitHarmonyMessages(text: string): HarmonyMessage[] {
  const out: HarmonyMessage[] = [];
  const nextMessage = nextFinder(text, H_MESSAGE);
  const nextStartTag = nextFinder(text, H_START);
  const plain = TERMINATORS.map((t) => nextFinder(text, t));
  let pos = 0;
  let first = true;
  while (pos < text.length) {
    let hStart = pos;
    if (text.startsWith(H_START, pos)) hStart = pos + H_START.length;
    else if (!first) {
      const next = nextStartTag(pos);
      if (next < 0) break;
      pos = next;
      continue;
    }
    first = false;
    const msgAt = nextMessage(hStart);
    const nextStart = nextStartTag(hStart);
    if (msgAt < 0 || (nextStart >= 0 && nextStart < msgAt)) {
      const end = nextStart >= 0 && (msgAt < 0 || nextStart < msgAt) ? nextStart : text.length;
      const header = text.slice(hStart, end);
      out.push({ header, ...parseHarmonyHeader(header), content: "", start: pos, end });
      pos = end;
      continue;
    }
    const header = text.slice(hStart, msgAt);
    const h = parseHarmonyHeader(header);
    const cStart = msgAt + H_MESSAGE.length;
    const found = h.recipient !== undefined ? firstOutsideJsonStrings(text, TERMINATORS, cStart) : firstPlain(plain, cStart);
    const cEnd = found.at < 0 ? text.length : found.at;
    const end = found.at < 0 ? text.length : found.at + found.close!.length;
    out.push({ header, ...h, content: text.slice(cStart, cEnd), terminator: found.close, start: pos, end });
    pos = end;
  }
  return out;
}

/**
 * `from => text.indexOf(tag, from)` for non-decreasing `from`, remembering the
 * last answer, so asking once per message costs one pass over the text in all
 * (a tag that never occurs is not searched for again and again).
 */
function nextFinder(text: string, tag: string): (from: number) => number {
  let last = -2;
  let lastFrom = 0;
  return (from) => {
    if (from < lastFrom) return text.indexOf(tag, from);
    lastFrom = from;
    if (last !== -1 && last < from) last = text.indexOf(tag, from);
    return last;
  };
}

function firstPlain(finders: readonly ((from: number) => number)[], start: number): { at: number; close?: string } {
  let best = -1;
  let which: string | undefined;
  finders.forEach((find, i) => {
    const k = find(start);
    if (k >= 0 && (best < 0 || k < best)) {
      best = k;
      which = TERMINATORS[i];
    }
  });
  return { at: best, close: which };
}

function toCall(index: number, m: HarmonyMessage, raw: string): ParsedCall | ParseError {
  const recipient = m.recipient!;
  const name = recipient.startsWith("functions.") ? recipient.slice("functions.".length) : undefined;
  if (!name) return { index, raw, message: `Invalid tool call: unknown recipient '${recipient}'; only function tools are available; ${CALL_SHAPE}.` };
  // A message addressed to a function on the analysis channel and ended by `<|call|>` (or by the end of the turn,
  // where the loop stripped the `<|call|>` stop id) is a call, as vLLM and SGLang read it; one the model ended with
  // `<|end|>` is not a call in SGLang (reasoning there), so here it is an error, not executed.
  if (m.channel === "analysis" && m.terminator !== undefined && m.terminator !== H_CALL) {
    return { index, name, raw, message: `The call to '${name}' was sent on the analysis channel and ended as a message, so it was not executed; calls to functions must go to the commentary channel; ${CALL_SHAPE}.` };
  }
  let args: unknown;
  try {
    args = m.content.trim() === "" ? {} : JSON.parse(m.content);
  } catch {
    return { index, name, raw, message: `Invalid JSON in the arguments of '${name}'; ${CALL_SHAPE}.` };
  }
  if (!isPlainObject(args)) return { index, name, raw, message: `Invalid arguments for '${name}': arguments must be a JSON object.` };
  return { index, name, arguments: args, raw };
}

/**
 * The harmony parser (gpt-oss). Works on the decoded assistant turn, which
 * starts after the generation prompt `<|start|>assistant` and holds one or
 * more messages `[<|start|>assistant]<|channel|>C[ to=R][ <|constrain|>T]<|message|>…`
 * each ended by `<|end|>`, `<|call|>` or `<|return|>`. A message whose
 * recipient is `functions.NAME` is a call with its JSON content as arguments
 * (read outside JSON strings: `<|call|>` inside a string stays in it).
 * Text in the `analysis` channel is reasoning and never yields a call (a
 * call drafted in its text stays text); a message *addressed* to a function
 * on the analysis channel is a call when `<|call|>` ends it (or the turn
 * ends, the stop id stripped), as both engines read it, and a
 * {@link ParseError} when it ends with `<|end|>`/`<|return|>`. A recipient
 * outside `functions.`, bad JSON or non-object arguments is a
 * {@link ParseError}. The last message may run to the end of the text:
 * the loop strips the stop id that ended the turn (`<|call|>`, `<|return|>`)
 * before parsing, so that is a complete message; a turn cut by a length stop
 * shows as bad JSON instead (and the loop executes nothing on a length stop
 * unless configured). `content` is the text of the `final` channel
 * messages (else of the `commentary` messages without a recipient); a turn
 * with no `<|message|>` at all is plain text and all content.
 *
 * Difference from vLLM/openai-harmony: they execute any `functions.*`
 * recipient whatever its channel and terminator, and pass malformed JSON on
 * as the arguments text; here a malformed call, or an analysis-channel one
 * ended with `<|end|>`, is an error observation for the model.
 * @see https://github.com/openai/harmony/blob/main/docs/format.md ("Receiving tool calls")
 * @see vLLM `OpenAIToolParser.extract_tool_calls` (`vllm/tool_parsers/openai_tool_parser.py`)
 * @see SGLang `GptOssDetector` (`python/sglang/srt/function_call/gpt_oss_detector.py`) and `CanonicalStrategy._parse_block` (`python/sglang/srt/harmony_parser.py`)
 */
export class HarmonyToolCallParser implements ToolCallParser {
  readonly name = "harmony";

  extract(text: string): ExtractResult {
    const calls: ParsedCall[] = [];
    const errors: ParseError[] = [];
    try {
      // Text with no harmony message at all (a policy that ignores the format) is all content.
      if (!text.includes(H_MESSAGE)) return { content: text, calls, errors };
      const msgs = splitHarmonyMessages(text);
      let index = 0;
      const finals: string[] = [];
      const commentary: string[] = [];
      for (const m of msgs) {
        if (m.recipient !== undefined && m.recipient !== "assistant" && m.recipient !== "user") {
          const r = toCall(index++, m, text.slice(m.start, m.end));
          if ("arguments" in r) calls.push(r);
          else errors.push(r);
        } else if (m.channel === "final") finals.push(m.content);
        else if (m.channel === "commentary") commentary.push(m.content);
      }
      return { content: (finals.length > 0 ? finals : commentary).join("\n"), calls, errors };
    } catch {
      return { content: text, calls: [], errors: [] };
    }
  }
}
