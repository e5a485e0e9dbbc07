import type { ToolSchema } from "../schema/index.ts";

/**
 * One tool call found in an assistant turn, arguments normalised to an object.
 * `index` is the call's position among all `<tool_call>` blocks of the turn
 * that count (outside `<think>`), shared with {@link ParseError} so that calls
 * and errors keep the model's order.
 */
export interface ParsedCall {
  index: number;
  name: string;
  arguments: Record<string, unknown>;
  /** The block body as the model wrote it (between the start and end tags). */
  raw: string;
}

/**
 * A tool-call block that could not be turned into a call (bad JSON, no name,
 * arguments that are not an object, a block that never closes). The loop turns
 * it into an error observation the model can read (case C10).
 */
export interface ParseError {
  index: number;
  /** The tool name when it could still be recovered from the block. */
  name?: string;
  /** A runtime-independent message meant for the model. */
  message: string;
  raw: string;
}

/** What a parser extracts from one assistant turn. */
export interface ExtractResult {
  /** The turn's text without the blocks that were parsed into calls (think text, prose and blocks that became errors kept). */
  content: string;
  calls: ParsedCall[];
  errors: ParseError[];
}

/**
 * A tool-call parser, selected by `rollout.multi_turn.format`. It works on the
 * decoded text of one assistant turn (decoded with special tokens kept) and
 * never throws: malformed output becomes {@link ParseError}s.
 * @see verl `ToolParser.extract_tool_calls` (`verl/experimental/agent_loop/tool_parser.py`)
 */
export interface ToolCallParser {
  readonly name: string;
  extract(text: string): ExtractResult;
}

/** Options a parser factory receives: the active tool schemas (qwen3_coder converts parameter types by them). */
export interface ToolCallParserOptions {
  tools?: readonly ToolSchema[];
}

export const THINK_OPEN = "<think>";
export const THINK_CLOSE = "</think>";

/** A body found between a start and an end tag: `end` is the index after the end tag; `closed` false when it ran to the end of the text. */
export interface BlockBody {
  body: string;
  end: number;
  closed: boolean;
}

/**
 * Scans `text` left to right for blocks opened by `open`, skipping reasoning:
 * a `<think>…</think>` block is passed over (calls drafted inside it do not
 * count, case C9), an unclosed `<think>` hides the rest of the text, and an
 * orphan `</think>` (the template put `<think>` in the prompt) discards what
 * was found before it. `readBody(start)` reads one block starting right after
 * the open tag. Returns the blocks in order, `at` (the index of each block's
 * open tag) and the text outside them.
 */
export function scanBlocks(
  text: string,
  open: string,
  readBody: (start: number) => BlockBody,
): { blocks: BlockBody[]; at: number[]; content: string } {
  let blocks: BlockBody[] = [];
  let at: number[] = [];
  let content = "";
  let i = 0;
  let segStart = 0;
  while (i < text.length) {
    const lt = text.indexOf("<", i);
    if (lt < 0) break;
    if (text.startsWith(THINK_OPEN, lt)) {
      const close = text.indexOf(THINK_CLOSE, lt + THINK_OPEN.length);
      if (close < 0) break;
      i = close + THINK_CLOSE.length;
    } else if (text.startsWith(THINK_CLOSE, lt)) {
      i = lt + THINK_CLOSE.length;
      blocks = [];
      at = [];
      content = text.slice(0, i);
      segStart = i;
    } else if (text.startsWith(open, lt)) {
      content += text.slice(segStart, lt);
      const b = readBody(lt + open.length);
      blocks.push(b);
      at.push(lt);
      i = b.end;
      segStart = i;
    } else {
      i = lt + 1;
    }
  }
  content += text.slice(segStart);
  return { blocks, at, content };
}

/**
 * The turn's text without the blocks that became calls: block `i` spans
 * `[at[i], blocks[i].end)` and is dropped when `parsed[i]`; a block that
 * became an error stays as the model wrote it (tags included), so a caller
 * that only shows `content` — the agent gateway's OpenAI reply — still shows
 * the broken call instead of nothing.
 */
export function contentWithoutParsed(text: string, at: readonly number[], blocks: readonly BlockBody[], parsed: readonly boolean[]): string {
  let out = "";
  let from = 0;
  blocks.forEach((b, i) => {
    if (!parsed[i]) return;
    out += text.slice(from, at[i]);
    from = b.end;
  });
  return out + text.slice(from);
}
