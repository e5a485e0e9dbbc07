import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import { splitReasoning } from "./conversation.ts";

/** What a streamed reply announces before its first delta (the reply's own `id`, `created`, `model`, `usage.prompt_tokens`). */
export interface StreamHead {
  id: string;
  /** Unix seconds. */
  created: number;
  model: string;
  /** The context the engine was sent, tokens. */
  prompt_tokens: number;
}

/**
 * Where a turn's text goes while it is sampled (true streaming, issue 30
 * item 3). Called in this order: `start` once, then `reasoning` at most once
 * (the whole reasoning, possibly "", when the turn's `</think>` decides it),
 * then `content` deltas (each non-empty). Everything sent is final: the
 * reasoning equals the reply's `reasoning_content` and the content deltas
 * concatenate to a prefix of its `content`; the rest (and the tool calls) is
 * the reply's, once the turn is committed. Implemented by the SSE writers.
 */
export interface TurnSink {
  start(head: StreamHead): void;
  reasoning(text: string): void;
  content(delta: string): void;
}

/**
 * Tool-call start markers of the parsers whose `content` is the turn's text
 * with parsed blocks cut out (so text before the first marker is always a
 * prefix of it): content streams up to the first marker (or a tail that may
 * begin one) and is held from there. A parser not listed here (llama3_json,
 * pythonic and harmony decide by the shape of the whole turn; registered
 * custom parsers) streams its content whole when the turn ends.
 */
export const STREAM_MARKERS: Readonly<Record<string, readonly string[]>> = {
  hermes: ["<tool_call>"],
  qwen3_coder: ["<tool_call>", "<function="],
  deepseek_v3: ["<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"],
};

/** How a {@link TurnStream} decides a turn's text (see {@link streamModeOf}). */
export interface TurnStreamOptions {
  /** The tokenizer's family (`splitReasoning`'s). */
  family: string;
  /** Markers that may start a tool call ([] with `tool_choice: "none"`); null: hold all content to the end. */
  markers: readonly string[] | null;
  /** The request's stop strings: text from a (possible) stop string on is held. */
  stop?: readonly string[];
  /** The prompt left a `<think>` block open (see {@link promptOpensThink}). */
  thinkOpened: boolean;
  /** Sampled tokens streamed at most (the call's `max_tokens`): the builder keeps no more. */
  maxTokens: number;
}

const THINK_OPEN = "<think>";
const THINK_CLOSE = "</think>";

/** Whether `c` (one UTF-16 unit) is white space as `String.prototype.trimEnd` removes it. */
function isWs(c: string): boolean {
  return c.trim() === "";
}

/** The longest `k < len(m)` such that `text[0, end)` ends with `m`'s first `k` characters, over `markers`, looking no further back than `from`. */
function partialTail(text: string, from: number, end: number, markers: readonly string[]): number {
  let hold = 0;
  for (const m of markers) {
    for (let k = Math.min(m.length - 1, end - from); k > hold; k--) {
      if (text.startsWith(m.slice(0, k), end - k)) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

/**
 * The first occurrence in `text` of any of `markers` at or after `from`, or -1. Each call with a larger `from` rescans only the overlap.
 */
function firstOf(text: string, from: number, markers: readonly string[]): number {
  let at = -1;
  for (const m of markers) {
    const i = text.indexOf(m, from);
    if (i >= 0 && (at < 0 || i < at)) at = i;
  }
  return at;
}

/**
 * Whether a generation prompt leaves a `<think>` block open (DeepSeek-R1 and
 * Qwen3-Thinking templates write `<think>\n` for the model): the model's
 * turn then starts inside reasoning and closes it with an orphan `</think>`.
 * Reads the last 8 context ids only.
 */
export function promptOpensThink(tok: ChatTokenizer, context: ArrayLike<number>): boolean {
  const tail = tok.decode(Array.prototype.slice.call(context, Math.max(0, context.length - 8)));
  const at = tail.lastIndexOf(THINK_OPEN);
  return at >= 0 && tail.indexOf(THINK_CLOSE, at) < 0 && tail.slice(at + THINK_OPEN.length).trim() === "";
}

/**
 * One turn's streamed text, built from the engine's token chunks as they
 * arrive (`push`): decoded incrementally (vLLM's prefix/read offsets: a
 * window is decoded twice and only what it added is taken, so a multi-byte
 * character split across tokens is never emitted in halves, and a
 * SentencePiece word boundary decodes as in the whole text), then passed to
 * the sink only where the non-streaming reply ({@link parseReply}) is
 * already decided:
 * - nothing from a stop string on, nor a tail that may begin one;
 * - reasoning (a turn starting with `<think>`, or a prompt that opened one):
 *   held until `</think>`, then sent whole — a turn cut while thinking is
 *   all content, so nothing before `</think>` is decided earlier;
 * - content: leading newlines dropped, then up to the first tool-call
 *   marker of the run's parser or a tail that may begin one, less trailing
 *   white space; with a parser without markers, nothing until the end;
 * - gpt-oss (harmony channels): nothing until the end.
 * The trailing stop id of the turn is never decoded into the text. Linear in
 * the reply: each push decodes a window of a few tokens and scans only new text.
 */
export class TurnStream {
  private readonly ids: number[] = [];
  private pendingStop: number | undefined;
  private prefixOffset = 0;
  private readOffset = 0;
  private full = "";
  private stopAt = -1;
  private stopScan = 0;
  private state: "start" | "thinking" | "content" | "hold";
  private thinkScan = 0;
  private startScan = 0;
  private contentFrom = 0;
  private emittedTo = -1;
  private markerAt = -1;
  private markerScan = 0;
  private wsScan = 0;
  private lastNonWs = 0;
  private seen = 0;
  private started = false;

  constructor(
    private readonly tok: ChatTokenizer,
    private readonly o: TurnStreamOptions,
    private readonly sink: TurnSink,
    private readonly head: StreamHead,
  ) {
    this.state = o.family === "gpt_oss" ? "hold" : o.thinkOpened ? "thinking" : "start";
  }

  /** One engine chunk (`GenerateRequest.on_tokens`): ids in order, continuing the turn's earlier chunks. */
  push(tokenIds: readonly number[]): void {
    if (!this.started) {
      this.started = true;
      this.sink.start(this.head);
    }
    for (const id of tokenIds) {
      if (this.seen++ >= this.o.maxTokens) break;
      if (this.pendingStop !== undefined) this.ids.push(this.pendingStop);
      this.pendingStop = undefined;
      if (this.tok.isStopToken(id)) this.pendingStop = id;
      else this.ids.push(id);
    }
    if (this.state === "hold" || this.ids.length === this.readOffset) return;
    const before = this.tok.decode(this.ids.slice(this.prefixOffset, this.readOffset));
    const now = this.tok.decode(this.ids.slice(this.prefixOffset));
    if (now.length <= before.length || now.endsWith("\uFFFD") || !now.startsWith(before)) return;
    this.full += now.slice(before.length);
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    this.advance();
  }

  /** Where the text is final: before the first stop string, or before a tail that may begin one. */
  private safeEnd(): number {
    const stops = this.o.stop;
    if (!stops?.length) return this.full.length;
    if (this.stopAt >= 0) return this.stopAt;
    let longest = 0;
    for (const s of stops) longest = Math.max(longest, s.length);
    const at = firstOf(this.full, Math.max(0, this.stopScan - longest + 1), stops);
    if (at >= 0) return (this.stopAt = at);
    this.stopScan = this.full.length;
    return this.full.length - partialTail(this.full, 0, this.full.length, stops);
  }

  private advance(): void {
    const full = this.full;
    const safe = this.safeEnd();
    if (this.state === "start") {
      let i = this.startScan;
      while (i < safe && isWs(full[i]!)) i++;
      this.startScan = i;
      if (i === safe) return;
      if (i + THINK_OPEN.length <= safe && full.startsWith(THINK_OPEN, i)) {
        this.state = "thinking";
        this.thinkScan = i + THINK_OPEN.length;
      } else if (safe - i < THINK_OPEN.length && THINK_OPEN.startsWith(full.slice(i, safe))) return;
      else this.state = "content";
    }
    if (this.state === "thinking") {
      const e = full.indexOf(THINK_CLOSE, this.thinkScan);
      if (e < 0 || e + THINK_CLOSE.length > safe) {
        this.thinkScan = Math.max(this.thinkScan, safe - THINK_CLOSE.length + 1, 0);
        return;
      }
      this.sink.reasoning(splitReasoning(this.o.family, full.slice(0, e + THINK_CLOSE.length), true).reasoning ?? "");
      this.state = "content";
      this.contentFrom = e + THINK_CLOSE.length;
    }
    if (this.state !== "content" || this.o.markers === null) return;
    if (this.emittedTo < 0) {
      while (this.contentFrom < safe && full.charCodeAt(this.contentFrom) === 10) this.contentFrom++;
      if (this.contentFrom === safe) return;
      this.emittedTo = this.contentFrom;
      this.markerScan = this.contentFrom;
      this.wsScan = this.lastNonWs = this.contentFrom;
    }
    const markers = this.o.markers;
    let limit = safe;
    if (markers.length) {
      if (this.markerAt < 0) {
        let longest = 0;
        for (const m of markers) longest = Math.max(longest, m.length);
        this.markerAt = firstOf(full, Math.max(this.contentFrom, this.markerScan - longest + 1), markers);
        this.markerScan = full.length;
      }
      if (this.markerAt >= 0) limit = Math.min(limit, this.markerAt);
      else limit -= partialTail(full, this.emittedTo, safe, markers);
    }
    // Trailing white space waits (the reply's content is trimmed at its end). The limit never moves back
    // (text once past every marker and stop prefix stays so), so this scan goes forward only.
    for (; this.wsScan < limit; this.wsScan++) if (!isWs(full[this.wsScan]!)) this.lastNonWs = this.wsScan + 1;
    limit = Math.min(limit, this.lastNonWs);
    if (limit > this.emittedTo) {
      this.sink.content(full.slice(this.emittedTo, limit));
      this.emittedTo = limit;
    }
  }
}
