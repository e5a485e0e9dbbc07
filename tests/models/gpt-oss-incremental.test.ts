import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { gptOssTurnClose } from "../../shared/models/gpt-oss.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { HarmonyToolCallParser } from "../../shared/tools/harmony-parser.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { gptOssTokenizer } from "./gpt-oss-tokenizer.ts";

const tools: ToolSchema[] = [
  { type: "function", function: { name: "search", description: "Search.", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } } },
  { type: "function", function: { name: "calc", description: "Calculate.", parameters: { type: "object", properties: { expr: { type: "string" } }, required: ["expr"] } } },
];

const text = fc.oneof(fc.constantFrom("ok", "42", "Zürich 🌧 東京", "a\nb", '{"x": 1}', " spaced ", "<tool_call>"), fc.string({ minLength: 1, maxLength: 12 }));
const call = fc.record({ name: fc.constantFrom("search", "calc"), arg: text });
/** One tool round: optional analysis, optional preamble, 1–3 calls (parallel calls render as consecutive call messages), their results. */
const round = fc.record({ reasoning: fc.option(text, { nil: undefined }), preamble: fc.option(text, { nil: undefined }), calls: fc.array(call, { minLength: 1, maxLength: 3 }), results: fc.array(text, { minLength: 3, maxLength: 3 }) });
const convo = fc.record({ system: fc.option(text, { nil: undefined }), user: text, rounds: fc.array(round, { maxLength: 3 }), finalReasoning: fc.option(text, { nil: undefined }), answer: text });

describe("gpt-oss: incremental encoding equals the full render wherever harmony is append-only (tool rounds of one user turn)", () => {
  test("prompt ‖ sampled turns ‖ observations = render of the whole conversation (property)", async () => {
    const tok = await gptOssTokenizer();
    const enc = new ObservationEncoder(tok, { tools });
    const parser = new HarmonyToolCallParser();
    fc.assert(
      fc.property(convo, (c) => {
        const messages: ChatMessage[] = [];
        if (c.system !== undefined) messages.push({ role: "system", content: c.system });
        messages.push({ role: "user", content: c.user });
        const ids = tok.renderIds(messages, { tools, addGenerationPrompt: true });
        // The model samples exactly what the template renders for its turn.
        const sample = (turn: ChatMessage): number[] => {
          const before = tok.renderText(messages, { tools, addGenerationPrompt: true });
          const after = tok.renderText([...messages, turn], { tools });
          expect(after.startsWith(before)).toBe(true);
          return tok.encode(after.slice(before.length));
        };
        for (const r of c.rounds) {
          const turn: ChatMessage = {
            role: "assistant",
            content: r.preamble ?? "",
            ...(r.reasoning !== undefined ? { reasoning_content: r.reasoning } : {}),
            tool_calls: r.calls.map((k) => ({ type: "function" as const, function: { name: k.name, arguments: JSON.stringify({ [k.name === "search" ? "q" : "expr"]: k.arg }) } })),
          };
          const sampled = sample(turn);
          expect(sampled.at(-1)).toBe(200012);
          const parsed = parser.extract(tok.decode(sampled));
          expect(parsed.errors).toEqual([]);
          expect(parsed.calls.map((p) => p.name)).toEqual(r.calls.map((k) => k.name));
          messages.push(turn);
          const results: ChatMessage[] = r.calls.map((k, i) => ({ role: "tool", name: k.name, content: r.results[i]! }));
          ids.push(...sampled, ...gptOssTurnClose(sampled.at(-1)), ...enc.encode(results, undefined));
          messages.push(...results);
        }
        const final: ChatMessage = { role: "assistant", content: c.answer, ...(c.finalReasoning !== undefined ? { reasoning_content: c.finalReasoning } : {}) };
        const sampled = sample(final);
        expect(sampled.at(-1)).toBe(200002);
        ids.push(...sampled);
        messages.push(final);
        expect(tok.decode(ids)).toBe(tok.renderText(messages, { tools }));
        expect(ids).toEqual(tok.renderIds(messages, { tools }));
      }),
      { numRuns: 60 },
    );
  });
});
