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
  private seen = 0;
  private started = false;
  private readonly stopLen: number;
  private readonly markerLen: number;
  /** Text held as a possible start of a stop string (shorter than the longest); null once a stop string was found. */
  private stopTail: string | null = "";
  private state: "start" | "thinking" | "content" | "hold";
  /** start: the leading white space, and what follows it while it may still be `<think>` (under 7 characters). */
  private startWs = "";
  private startRest = "";
  /** thinking: the text so far (joined once, at `</think>`), and its last characters for a `</think>` across pieces. */
  private thinkText: string[] = [];
  private thinkTail = "";
  /** content: true once a character other than a newline came (leading newlines are dropped, as the reply's). */
  private pastLead = false;
  /** content: a tail that may begin a marker; null once a marker was found (nothing more is sent). */
  private markerTail: string | null = "";
  /** content: trailing white space not sent yet (the reply's content is trimmed at its end). */
  private wsPending = "";

  constructor(
    private readonly tok: ChatTokenizer,
    private readonly o: TurnStreamOptions,
    private readonly sink: TurnSink,
    private readonly head: StreamHead,
  ) {
    this.state = o.family === "gpt_oss" ? "hold" : o.thinkOpened ? "thinking" : "start";
    this.stopLen = Math.max(0, ...(o.stop ?? []).map((x) => x.length));
    this.markerLen = Math.max(0, ...(o.markers ?? []).map((x) => x.length));
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
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    this.safe(now.slice(before.length));
  }

  /** New decoded text: what is before any stop string (and not a possible start of one) goes on. */
  private safe(piece: string): void {
    const stops = this.o.stop;
    if (!stops?.length) return this.reason(piece);
    if (this.stopTail === null) return;
    const text = this.stopTail + piece;
    const at = firstOf(text, 0, stops);
    if (at >= 0) {
      this.stopTail = null;
      return this.reason(text.slice(0, at));
    }
    const hold = partialTail(text, Math.max(0, text.length - this.stopLen), text.length, stops);
    this.stopTail = text.slice(text.length - hold);
    this.reason(text.slice(0, text.length - hold));
  }

  /** Final text in reply order: reasoning decided at `</think>` (see the class doc), the rest to content. */
  private reason(piece: string): void {
    if (piece === "") return;
    if (this.state === "start") {
      let i = 0;
      if (this.startRest === "") {
        while (i < piece.length && isWs(piece[i]!)) i++;
        this.startWs += piece.slice(0, i);
      }
      const rest = this.startRest + piece.slice(i);
      if (rest === "") return;
      if (rest.startsWith(THINK_OPEN)) {
        this.state = "thinking";
        this.thinkText = [this.startWs, rest];
        this.thinkTail = "";
        return this.think(true);
      }
      if (rest.length < THINK_OPEN.length && THINK_OPEN.startsWith(rest)) {
        this.startRest = rest;
        return;
      }
      this.state = "content";
      return this.content(this.startWs + rest);
    }
    if (this.state === "thinking") {
      this.thinkText.push(piece);
      return this.think(false);
    }
    if (this.state === "content") this.content(piece);
  }

  /** Looks for `</think>` in the newest thinking text (and the few characters before it). */
  private think(first: boolean): void {
    const last = this.thinkText[this.thinkText.length - 1]!;
    const look = first ? this.thinkText.join("") : this.thinkTail + last;
    const at = look.indexOf(THINK_CLOSE);
    if (at < 0) {
      this.thinkTail = look.slice(Math.max(0, look.length - THINK_CLOSE.length + 1));
      return;
    }
    // Where `</think>` ends in the whole text: the look window ends where the whole text ends.
    const whole = this.thinkText.join("");
    const end = whole.length - look.length + at + THINK_CLOSE.length;
    this.thinkText = [];
    this.sink.reasoning(splitReasoning(this.o.family, whole.slice(0, end), true).reasoning ?? "");
    this.state = "content";
    this.content(whole.slice(end));
  }

  /** Content text: leading newlines dropped, held from a (possible) tool-call marker on, trailing white space held. */
  private content(piece: string): void {
    const markers = this.o.markers;
    if (markers === null || this.markerTail === null) return;
    if (!this.pastLead) {
      let i = 0;
      while (i < piece.length && piece.charCodeAt(i) === 10) i++;
      piece = piece.slice(i);
      if (piece === "") return;
      this.pastLead = true;
    }
    let ok = piece;
    if (markers.length) {
      const text = this.markerTail + piece;
      const at = firstOf(text, 0, markers);
      if (at >= 0) {
        this.markerTail = null;
        ok = text.slice(0, at);
      } else {
        const hold = partialTail(text, Math.max(0, text.length - this.markerLen), text.length, markers);
        this.markerTail = text.slice(text.length - hold);
        ok = text.slice(0, text.length - hold);
      }
    }
    let j = ok.length;
    while (j > 0 && isWs(ok[j - 1]!)) j--;
    if (j === 0) {
      this.wsPending += ok;
      return;
    }
    const out = this.wsPending + ok.slice(0, j);
    this.wsPending = ok.slice(j);
    this.sink.content(out);
  }
}
