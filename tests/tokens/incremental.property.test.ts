import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { buildPromptIds } from "../../shared/tokens/prompt.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";

// Property: building a trajectory incrementally (prompt, then sampled ids
// appended verbatim, then observations encoded alone) gives exactly the
// template's full render of the conversation, for Qwen3's template.

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const tools: ToolSchema[] = [
  { type: "function", function: { name: "calc", description: "evaluate", parameters: { type: "object", properties: { expr: { type: "string" } } } } },
  { type: "function", function: { name: "lookup", description: "look up", parameters: { type: "object", properties: { q: { type: "string" } } } } },
];

const word = fc.constantFrom("alpha", "beta", "gamma", "42", "x+y", "Paris", "héllo", "数", "(1)", "a,b", "ok.");
const text = fc.array(word, { minLength: 1, maxLength: 6 }).map((ws) => ws.join(" "));
const call = fc.record({ name: fc.constantFrom("calc", "lookup"), arg: text });

type Turn =
  | { kind: "tools"; content: string; calls: { name: string; arg: string }[]; results: string[] }
  | { kind: "user"; content: string; reply: string };

const turn: fc.Arbitrary<Turn> = fc.oneof(
  fc
    .record({ content: fc.oneof(fc.constant(""), text), calls: fc.array(call, { minLength: 1, maxLength: 3 }) })
    .chain((t) =>
      fc.array(text, { minLength: t.calls.length, maxLength: t.calls.length }).map((results) => ({ kind: "tools" as const, ...t, results })),
    ),
  fc.record({ content: text, reply: text }).map((t) => ({ kind: "user" as const, ...t })),
);

const conversation = fc.record({
  system: fc.option(text, { nil: undefined }),
  first: text,
  turns: fc.array(turn, { minLength: 1, maxLength: 4 }),
  withTools: fc.boolean(),
});

/** Python's json.dumps for a flat {key: string} object, as the template's tojson writes it. */
function pyJson(obj: Record<string, string>): string {
  return "{" + Object.entries(obj).map(([k, v]) => `${JSON.stringify(k)}: ${JSON.stringify(v)}`).join(", ") + "}";
}

/** What the policy would sample for an assistant turn, in Qwen3's format, ending with <|im_end|>. */
function assistantText(content: string, calls: { name: string; arg: string }[], think?: string): string {
  let s = think !== undefined ? `<think>\n${think}\n</think>\n\n` : "";
  s += content;
  calls.forEach((c, i) => {
    if (i > 0 || content) s += "\n";
    s += `<tool_call>\n{"name": "${c.name}", "arguments": ${pyJson({ expr: c.arg })}}\n</tool_call>`;
  });
  return s + "<|im_end|>";
}

describe("incremental build equals the full render", () => {
  test("no reasoning, template defaults", () => {
    fc.assert(
      fc.property(conversation, (conv) => {
        const schemas = conv.withTools ? tools : undefined;
        const messages: ChatMessage[] = [];
        if (conv.system) messages.push({ role: "system", content: conv.system });
        messages.push({ role: "user", content: conv.first });
        const { promptIds } = buildPromptIds(tok, messages, { tools: schemas, promptLength: 100_000 });
        const b = new TrajectoryBuilder({ promptIds, responseLength: 100_000, maxModelLen: 200_000, trackLogProbs: true });
        const enc = new ObservationEncoder(tok, { tools: schemas });
        for (const t of conv.turns) {
          const calls = t.kind === "tools" ? t.calls : [];
          const sampled = tok.encode(assistantText(t.content, calls));
          b.appendAction(sampled, sampled.map(() => -0.5));
          messages.push({
            role: "assistant",
            content: t.content,
            ...(calls.length
              ? { tool_calls: calls.map((c) => ({ type: "function" as const, function: { name: c.name, arguments: { expr: c.arg } } })) }
              : {}),
          });
          const added: ChatMessage[] =
            t.kind === "tools" ? t.results.map((r) => ({ role: "tool" as const, content: r })) : [{ role: "user", content: t.reply }];
          b.appendObservation(enc.encode(added, b.lastTokenId));
          messages.push(...added);
        }
        const full = tok.renderIds(messages, { tools: schemas, addGenerationPrompt: true });
        expect(b.contextIds()).toEqual(full);
        // Mask is 1 exactly on sampled ids: their count equals the sum of sampled lengths.
        const ones = b.responseMask().filter((m) => m === 1).length;
        const sampledTotal = conv.turns.reduce(
          (n, t) => n + tok.encode(assistantText(t.content, t.kind === "tools" ? t.calls : [])).length,
          0,
        );
        expect(ones).toBe(sampledTotal);
      }),
      { numRuns: 150 },
    );
  });

  test("with <think> blocks or enable_thinking=false: sampled ids verbatim, observations as expected", () => {
    fc.assert(
      fc.property(conversation, text, fc.boolean(), (conv, thought, disableThinking) => {
        const kwargs = disableThinking ? { enable_thinking: false } : undefined;
        const schemas = conv.withTools ? tools : undefined;
        const { promptIds } = buildPromptIds(tok, [{ role: "user", content: conv.first }], {
          tools: schemas,
          promptLength: 100_000,
          chatTemplateKwargs: kwargs,
        });
        const b = new TrajectoryBuilder({ promptIds, responseLength: 100_000, maxModelLen: 200_000, trackLogProbs: true });
        const enc = new ObservationEncoder(tok, { tools: schemas, chatTemplateKwargs: kwargs });
        const genPrompt = disableThinking ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" : "<|im_start|>assistant\n";
        const expected: number[] = [...promptIds];
        for (const t of conv.turns) {
          const calls = t.kind === "tools" ? t.calls : [];
          const sampled = tok.encode(assistantText(t.content, calls, disableThinking ? undefined : thought));
          b.appendAction(sampled, sampled.map(() => -0.25));
          expected.push(...sampled);
          const obs =
            t.kind === "tools"
              ? enc.encode(t.results.map((r) => ({ role: "tool" as const, content: r })), b.lastTokenId)
              : enc.encode([{ role: "user", content: t.reply }], b.lastTokenId);
          const body =
            t.kind === "tools"
              ? "<|im_start|>user" + t.results.map((r) => `\n<tool_response>\n${r}\n</tool_response>`).join("") + "<|im_end|>\n"
              : `<|im_start|>user\n${t.reply}<|im_end|>\n`;
          expect(obs).toEqual([198, ...tok.encode(body + genPrompt)]);
          b.appendObservation(obs);
          expected.push(...obs);
        }
        expect(b.contextIds()).toEqual(expected);
      }),
      { numRuns: 100 },
    );
  });
});
