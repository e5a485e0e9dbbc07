import type { ChatMessage } from "../schema/index.ts";
import { fnv1a32 } from "../inference/hash.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import { contentText } from "../tokens/tokenizer.ts";
import { splitHarmonyMessages } from "../tools/harmony-parser.ts";
import type { ParsedCall, ToolCallParser } from "../tools/tool-call-parser.ts";
import type { ChatReplyMessage } from "./openai-wire.ts";

/**
 * A message in the form two requests are compared in. What an agent
 * framework may change when it passes a reply back without changing the
 * conversation is ignored: `content` null, "" and text parts are their text;
 * `reasoning_content` is dropped (OpenAI clients and most frameworks do not
 * send it back; the tokens keep it); tool calls compare by name and
 * arguments as JSON values (re-serialised arguments are the same call), not
 * by id; a tool message by its text (its `name` may be filled in by
 * edgeloop, see {@link namedToolResults}; its `tool_call_id` is not rendered).
 * Image parts count (a vision family renders them): `images` lists each
 * image's URL in order, so the same text with another image, or one image
 * more or fewer, is another message.
 */
export function comparable(m: ChatMessage): unknown {
  const base: Record<string, unknown> = { role: m.role, content: contentText(m.content ?? "") };
  if (Array.isArray(m.content) && m.content.some((p) => p.type !== "text")) {
    base.images = m.content.filter((p) => p.type !== "text").map((p) => {
      const q = p as { type: string; image?: unknown; image_url?: { url?: unknown } | string };
      return q.type === "image" ? q.image : typeof q.image_url === "string" ? q.image_url : (q.image_url?.url ?? q.type);
    });
  }
  if (m.role === "assistant" && m.tool_calls?.length) {
    base.tool_calls = m.tool_calls.map((c) => [c.function.name, argumentsValue(c.function.arguments)]);
  }
  return base;
}

function argumentsValue(a: string | Record<string, unknown>): unknown {
  if (typeof a !== "string") return a;
  try {
    return JSON.parse(a);
  } catch {
    return a;
  }
}

/** Deep equality of JSON values (object key order ignored). */
export function jsonEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== typeof b || a === null || b === null || typeof a !== "object") return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a)) {
    const bb = b as unknown[];
    return a.length === bb.length && a.every((x, i) => jsonEqual(x, bb[i]));
  }
  const ka = Object.keys(a as object);
  const kb = Object.keys(b as object);
  if (ka.length !== kb.length) return false;
  return ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && jsonEqual((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}

/**
 * The messages a request adds to a conversation, when it continues it: the
 * request holds every message of `history` (compared with {@link comparable})
 * in order, then one or more new messages that form one observation — a run
 * of `tool` results, then zero or more `user` (or `system`) messages, what the
 * observation encoder appends incrementally. Null otherwise (the request
 * edits, drops or reorders history, or adds something else: a fresh render).
 */
export function continuation(history: readonly ChatMessage[], messages: readonly ChatMessage[]): ChatMessage[] | null {
  if (messages.length <= history.length) return null;
  if (history.length === 0 || history[history.length - 1]!.role !== "assistant") return null;
  // History holds tool results with their tool's name filled in (namedToolResults); an agent that
  // sent them without a name sends them so again: fill the request's the same way before comparing.
  const named = namedToolResults(messages.slice(0, history.length), messages);
  for (let i = 0; i < history.length; i++) if (!jsonEqual(comparable(history[i]!), comparable(named[i]!))) return null;
  const added = messages.slice(history.length);
  // Tool results, then user/system turns (the shapes the observation encoder appends).
  const firstOther = added.findIndex((m) => m.role !== "tool");
  const rest = firstOther < 0 ? [] : added.slice(firstOther);
  return rest.every((m) => m.role === "user" || m.role === "system") ? added : null;
}

/**
 * Tool messages with their tool's `name` filled in from the assistant
 * message whose call they answer (`tool_call_id`), when the agent left it
 * out: templates that name the tool in the result's header (gpt-oss harmony)
 * read it from the message, and `tool_agent` always sets it.
 */
export function namedToolResults(added: ChatMessage[], history: readonly ChatMessage[]): ChatMessage[] {
  const byId = new Map<string, string>();
  for (const m of history) for (const c of m.tool_calls ?? []) if (c.id) byId.set(c.id, c.function.name);
  return added.map((m) => (m.role === "tool" && !m.name && m.tool_call_id && byId.has(m.tool_call_id) ? { ...m, name: byId.get(m.tool_call_id)! } : m));
}

/**
 * The reasoning of an assistant turn and the text after it, by family:
 * - Qwen3 and other `<think>` models: the text up to `</think>` (a leading
 *   `<think>` dropped) is reasoning, the rest (leading newlines dropped) is
 *   the answer; without `</think>` all of it is the answer. Matches vLLM's
 *   `qwen3`/`deepseek_r1` reasoning parsers (`reasoning_content`).
 * - gpt-oss: the `analysis` channel's messages are reasoning (joined by
 *   newlines); the rest goes to the harmony tool parser unchanged.
 * `opened` false (the generation prompt did not leave a `<think>` open, see
 * `promptOpensThink`): a turn has reasoning only when its text starts (after
 * white space) with `<think>`; an orphan `</think>` later in a turn that did
 * not start thinking is plain text. This keeps the split decidable from the
 * turn's first tokens, so a streamed reply can send its content before the
 * turn ends (issue 30 item 3). Default true: an orphan `</think>` ends reasoning
 * wherever it is (vLLM's rule for templates that open the block in the prompt).
 */
export function splitReasoning(family: string, text: string, opened = true): { reasoning: string | null; rest: string } {
  if (family === "gpt_oss") {
    const analysis = splitHarmonyMessages(text)
      .filter((m) => m.channel === "analysis" && !m.recipient)
      .map((m) => m.content);
    return { reasoning: analysis.length ? analysis.join("\n") : null, rest: text };
  }
  if (!opened && !text.trimStart().startsWith("<think>")) return { reasoning: null, rest: text };
  const end = text.indexOf("</think>");
  if (end < 0) return { reasoning: null, rest: text };
  let r = text.slice(0, end);
  const start = r.indexOf("<think>");
  if (start >= 0) r = r.slice(start + "<think>".length);
  return { reasoning: stripNewlines(r, true), rest: stripNewlines(text.slice(end + "</think>".length), false) };
}

/**
 * `s` without its leading newlines (and, with `trailing`, its trailing ones):
 * what `/^\n+|\n+$/g` removes, in one pass. That regex is quadratic on a
 * long newline run not at the end of the text (each start in the run
 * rescans it), and sampled models do write such runs.
 */
function stripNewlines(s: string, trailing: boolean): string {
  let a = 0;
  while (a < s.length && s.charCodeAt(a) === 10) a++;
  let z = s.length;
  if (trailing) while (z > a && s.charCodeAt(z - 1) === 10) z--;
  return a === 0 && z === s.length ? s : s.slice(a, z);
}

/** An assistant turn as the reply gives it and as the conversation then holds it. */
export interface ParsedReply {
  message: ChatReplyMessage;
  /** The same turn as a {@link ChatMessage} (what the next request must repeat). */
  history: ChatMessage;
  calls: ParsedCall[];
  /** The stop string that ended the turn (the first in the text; the earliest listed at that place), when one did. */
  stop_sequence?: string;
}

/**
 * Parses one sampled turn into the reply's message: the ids are decoded with
 * special tokens (the stop id that ended the turn dropped; with `stop`, the
 * text from the first stop string on), the reasoning is
 * split off ({@link splitReasoning}), tool calls are parsed with the run's
 * parser unless `tool_choice` is `none` (then the text is all content).
 * Tool-call ids are `call_{session}_{output}_{turn}_{i}`, `session` being
 * 16 hex digits of two 32-bit hashes of the session key ({@link sessionTag}):
 * fixed by the session and the turn's position, so a replayed or resumed turn
 * gives the same ids, and distinct across sessions (an agent framework that
 * keys state by call id across sessions does not mix them up); `arguments` are the
 * parsed arguments as a JSON string. Malformed call blocks stay in the
 * content, as the model wrote them. `content` is null when the turn is only
 * tool calls (as OpenAI answers).
 */
export function parseReply(
  tok: ChatTokenizer,
  parser: ToolCallParser,
  ids: ArrayLike<number>,
  o: { toolChoice: "auto" | "none"; session: string; outputIndex: number; turn: number; stop?: readonly string[]; thinkOpened?: boolean },
): ParsedReply {
  const body = ids.length > 0 && tok.isStopToken(ids[ids.length - 1]) ? Array.prototype.slice.call(ids, 0, -1) : Array.from(ids);
  let text = tok.decode(body);
  let stopSequence: string | undefined;
  // A turn a stop string ended: the text stops before it (OpenAI and vLLM leave it out; the tokens keep it).
  if (o.stop?.length) {
    const at = Math.min(...o.stop.map((x) => text.indexOf(x)).filter((i) => i >= 0));
    if (Number.isFinite(at)) {
      stopSequence = o.stop.find((x) => text.indexOf(x) === at);
      text = text.slice(0, at);
    }
  }
  const { reasoning, rest } = splitReasoning(tok.traits.family, text, o.thinkOpened ?? true);
  let content = rest;
  let calls: ParsedCall[] = [];
  if (o.toolChoice !== "none") {
    const parsed = parser.extract(rest);
    calls = parsed.calls;
    content = parsed.content;
  }
  // trimEnd removes what /\s+$/ did (the same white space set), without its quadratic rescans.
  content = stripNewlines(content, false).trimEnd();
  const toolCalls = calls.map((c, i) => ({ id: `call_${o.session}_${o.outputIndex}_${o.turn}_${i}`, type: "function" as const, function: { name: c.name, arguments: JSON.stringify(c.arguments) } }));
  const message: ChatReplyMessage = {
    role: "assistant",
    content: content === "" && toolCalls.length ? null : content,
    ...(reasoning !== null ? { reasoning_content: reasoning } : {}),
    ...(toolCalls.length ? { tool_calls: toolCalls } : {}),
  };
  const history: ChatMessage = {
    role: "assistant",
    content: message.content ?? "",
    ...(reasoning !== null ? { reasoning_content: reasoning } : {}),
    ...(toolCalls.length ? { tool_calls: toolCalls } : {}),
  };
  return { message, history, calls, ...(stopSequence !== undefined ? { stop_sequence: stopSequence } : {}) };
}

/**
 * 16 lowercase hex digits naming a session in its tool-call ids: two 32-bit
 * FNV-1a hashes of `key` (different seeds), so ids of two sessions collide
 * with odds about 2^-64 per pair. Pure, the same on every runtime.
 */
export function sessionTag(key: string): string {
  return fnv1a32(key).toString(16).padStart(8, "0") + fnv1a32(key, 0x9747b28c).toString(16).padStart(8, "0");
}
