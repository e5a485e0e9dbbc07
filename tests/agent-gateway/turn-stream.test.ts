import { beforeAll, describe, expect, setDefaultTimeout, test } from "bun:test";
import { parseReply } from "../../shared/agent-gateway/conversation.ts";
import { promptOpensThink, STREAM_MARKERS, TurnStream, type TurnSink } from "../../shared/agent-gateway/turn-stream.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { createToolCallParser } from "../../shared/tools/parser-registry.ts";
import { hostileFor, hostileTexts, linearCheck } from "../helpers/linear-time.ts";

setDefaultTimeout(120_000);
const HEAD = { id: "chatcmpl-x", created: 1, model: "m", prompt_tokens: 3 };
let tok: ChatTokenizer;
beforeAll(async () => void (tok = await defaultTokenizer()));

/** A sink recording what a stream sent. */
function recorder() {
  const r = { starts: 0, reasoning: undefined as string | undefined, deltas: [] as string[] };
  const sink: TurnSink = { start: () => void r.starts++, reasoning: (t) => void (r.reasoning = t), content: (d) => void r.deltas.push(d) };
  return { r, sink };
}

/** Streams `ids` one token at a time; returns what was sent. */
function streamIds(t: ChatTokenizer, ids: number[], o: { markers?: readonly string[] | null; stop?: string[]; thinkOpened?: boolean } = {}) {
  const { r, sink } = recorder();
  const s = new TurnStream(t, { family: t.traits.family, markers: o.markers === undefined ? STREAM_MARKERS.hermes! : o.markers, ...(o.stop ? { stop: o.stop } : {}), thinkOpened: o.thinkOpened ?? false, maxTokens: ids.length }, sink, HEAD);
  for (const id of ids) s.push([id]);
  return r;
}

describe("TurnStream", () => {
  test("multi-byte characters split across byte-level tokens are sent whole; the deltas are a prefix of parseReply's content", () => {
    const text = "Grüße 😀 日本語 — done";
    const ids = [...tok.encode(text), 151645];
    // The emoji is several byte tokens: no token alone decodes to it.
    expect(ids.length).toBeGreaterThan([...text].length / 2);
    const r = streamIds(tok, ids);
    expect(r.starts).toBe(1);
    expect(r.deltas.some((d) => d.includes("\uFFFD"))).toBe(false);
    expect(r.deltas.length).toBeGreaterThan(5);
    const content = parseReply(tok, createToolCallParser("hermes"), ids, { toolChoice: "auto", session: "s", outputIndex: 0, turn: 0, thinkOpened: false }).message.content;
    expect(r.deltas.join("")).toBe(content!);
  });

  test("reasoning waits for </think> and is sent whole; content before a tool call, less its trailing blanks; nothing past the marker", () => {
    const text = '<think>\nplan\n</think>\n\nCalling now. \n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>';
    const r = streamIds(tok, [...tok.encode(text), 151645]);
    expect(r.reasoning).toBe("plan");
    expect(r.deltas.join("")).toBe("Calling now.");
  });

  test("a stop string and a tail that may begin one are held", () => {
    const r = streamIds(tok, tok.encode("alpha beta END gamma"), { stop: ["END"] });
    expect(r.deltas.join("")).toBe("alpha beta");
    const held = streamIds(tok, tok.encode("alpha EN"), { stop: ["END"] });
    expect(held.deltas.join("")).toBe("alpha");
  });

  test("a prompt that opened <think>: the text up to the orphan </think> is reasoning, as parseReply reads it then", () => {
    const prompt = tok.encode("<|im_start|>assistant\n<think>\n");
    expect(promptOpensThink(tok, prompt)).toBe(true);
    expect(promptOpensThink(tok, tok.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n"))).toBe(false);
    const ids = [...tok.encode("deep thought\n</think>\n\nAnswer."), 151645];
    const r = streamIds(tok, ids, { thinkOpened: true });
    const m = parseReply(tok, createToolCallParser("hermes"), ids, { toolChoice: "auto", session: "s", outputIndex: 0, turn: 0, thinkOpened: true }).message;
    expect([r.reasoning, r.deltas.join("")]).toEqual([m.reasoning_content, m.content!]);
    expect(m.reasoning_content).toBe("deep thought");
    // Without the opened prompt the orphan </think> is text: no reasoning.
    const plain = parseReply(tok, createToolCallParser("hermes"), ids, { toolChoice: "auto", session: "s", outputIndex: 0, turn: 0, thinkOpened: false }).message;
    expect(plain.reasoning_content).toBeUndefined();
    expect(streamIds(tok, ids).deltas.join("")).toBe(plain.content!);
  });

  test("hostile text streamed one character a token (eight a chunk) costs a linear number of scans", () => {
    // One char per id (code point = id), id 0 the stop token: the cost is the stream's own scanning.
    const chars = { decode: (ids: ArrayLike<number>) => String.fromCharCode(...Array.from(ids)), isStopToken: (id: number) => id === 0, traits: { family: "qwen3" } } as unknown as ChatTokenizer;
    const all: Record<string, string> = { ...hostileTexts(["<think>", "</think>", "<tool_call>", "STOP"]), ...hostileFor("hermes") };
    // The shapes each hold of the stream must survive: blank runs (held trailing white space), marker and stop prefixes, thinking.
    const pick = ["spaces", "mixed blanks", "blank run then text", "think blank body", "think unterminated", "<tool_call> + blanks", "blanks then <tool_call>", "STOP then blanks", "call then blanks", "calls repeated"];
    const texts = Object.fromEntries(Object.entries(all).filter(([k]) => pick.includes(k)));
    expect(Object.keys(texts).length).toBeGreaterThanOrEqual(6);
    for (const [what, text] of Object.entries(texts)) {
      const ids = Array.from(text, (c) => c.charCodeAt(0));
      const run = (t: string) => {
        const s = new TurnStream(chars, { family: "qwen3", markers: STREAM_MARKERS.hermes!, stop: ["STOP", "\u0000\u0001"], thinkOpened: false, maxTokens: t.length }, { start() {}, reasoning() {}, content() {} }, HEAD);
        // Eight one-character tokens a chunk (an engine's chunks hold several tokens): the per-call overhead of a
        // chunk a token (~1 µs) is a constant that made the growth check's ratio noisy on a loaded machine.
        for (let i = 0; i < t.length; i += 8) {
          const chunk: number[] = [];
          for (let k = i; k < Math.min(t.length, i + 8); k++) chunk.push(t === text ? ids[k]! : t.charCodeAt(k));
          s.push(chunk);
        }
      };
      const r = linearCheck(text, run, 1);
      expect({ what, superLinear: r.superLinear, ratio4: r.ratio4 }).toEqual({ what, superLinear: false, ratio4: r.ratio4 });
    }
  });
});
