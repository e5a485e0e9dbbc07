import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { builtinTokenizer } from "../../shared/models/index.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { buildPromptIds } from "../../shared/tokens/prompt.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Load the tokenizers once, with room for a loaded machine (bun's per-test default is 5 s).
beforeAll(async () => {
  await Promise.all(["llama3_1", "deepseek_v3", "gemma3"].map((n) => builtinTokenizer(n)));
}, HANG_MS);

// Property, per append-only family: prompt, then each assistant turn's ids
// appended verbatim (the turn exactly as the template renders it, up to and
// including its end-of-turn token), then observations encoded alone, equals
// the template's full render of the conversation. Random conversations with
// tool calls, parallel results and user turns.

const tools: ToolSchema[] = [
  { type: "function", function: { name: "calc", description: "evaluate", parameters: { type: "object", properties: { expr: { type: "string" } } } } },
  { type: "function", function: { name: "lookup", description: "look up", parameters: { type: "object", properties: { q: { type: "string" } } } } },
];

const word = fc.constantFrom("alpha", "beta", "42", "x+y", "Paris", "héllo", "数", "(1)", "a,b", "ok.", "{}", ";", "}", "<b>");
const text = fc.array(word, { minLength: 1, maxLength: 6 }).map((ws) => ws.join(" "));
const call = fc.record({ name: fc.constantFrom("calc", "lookup"), arg: text });
type Turn = { kind: "tools"; content: string; calls: { name: string; arg: string }[]; results: string[] } | { kind: "user"; content: string; reply: string };
const turn: fc.Arbitrary<Turn> = fc.oneof(
  fc
    .record({ content: fc.oneof(fc.constant(""), text), calls: fc.array(call, { minLength: 1, maxLength: 3 }) })
    .chain((t) => fc.array(text, { minLength: t.calls.length, maxLength: t.calls.length }).map((results) => ({ kind: "tools" as const, ...t, results }))),
  fc.record({ content: text, reply: text }).map((t) => ({ kind: "user" as const, ...t })),
);
const conversation = fc.record({
  system: fc.option(text, { nil: undefined }),
  first: text,
  turns: fc.array(turn, { minLength: 1, maxLength: 4 }),
  withTools: fc.boolean(),
});

/** The ids the template renders for `assistant` after `history` + generation prompt, through its end-of-turn token. */
function sampledIds(tok: ChatTokenizer, history: ChatMessage[], assistant: ChatMessage, schemas?: ToolSchema[]): number[] {
  const before = tok.renderText(history, { tools: schemas, addGenerationPrompt: true });
  const after = tok.renderText([...history, assistant], { tools: schemas });
  expect(after.startsWith(before)).toBe(true);
  const rest = after.slice(before.length);
  const eos = tok.eosText();
  const end = rest.indexOf(eos);
  expect(end).toBeGreaterThanOrEqual(0);
  return tok.encode(rest.slice(0, end + eos.length));
}

for (const family of ["llama3_1", "deepseek_v3", "gemma3"]) {
  describe(`${family}: incremental build equals the full render`, () => {
    test("random conversations with tool calls, parallel results and user turns", async () => {
      const tok = await builtinTokenizer(family);
      fc.assert(
        fc.property(conversation, (conv) => {
          const schemas = conv.withTools ? tools : undefined;
          const messages: ChatMessage[] = [];
          if (conv.system) messages.push({ role: "system", content: conv.system });
          messages.push({ role: "user", content: conv.first });
          const { promptIds } = buildPromptIds(tok, messages, { tools: schemas, promptLength: 100_000 });
          const b = new TrajectoryBuilder({ promptIds, responseLength: 100_000, maxModelLen: 200_000, trackLogProbs: false });
          const enc = new ObservationEncoder(tok, { tools: schemas });
          let sampledTotal = 0;
          for (const t of conv.turns) {
            const calls = t.kind === "tools" ? t.calls : [];
            const assistant: ChatMessage = {
              role: "assistant",
              content: t.content,
              ...(calls.length ? { tool_calls: calls.map((c) => ({ type: "function" as const, function: { name: c.name, arguments: { expr: c.arg } } })) } : {}),
            };
            const sampled = sampledIds(tok, messages, assistant, schemas);
            sampledTotal += sampled.length;
            b.appendAction(sampled, null);
            messages.push(assistant);
            const added: ChatMessage[] = t.kind === "tools" ? t.results.map((r) => ({ role: "tool" as const, content: r })) : [{ role: "user", content: t.reply }];
            b.appendObservation(enc.encode(added, b.lastTokenId));
            messages.push(...added);
          }
          expect(b.contextIds()).toEqual(tok.renderIds(messages, { tools: schemas, addGenerationPrompt: true }));
          expect(b.responseMask().filter((m) => m === 1).length).toBe(sampledTotal);
        }),
        { numRuns: 60 },
      );
    }, HANG_MS);
  });
}
