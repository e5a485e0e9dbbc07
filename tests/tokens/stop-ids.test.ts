import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ConfigError } from "../../shared/errors.ts";
import { withStopIds } from "../../shared/agent-loop/agent-loop.ts";
import { buildPromptIds } from "../../shared/tokens/prompt.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { ChatTokenizer, defaultTokenizer, loadDefaultModelFiles, type ModelFiles } from "../../shared/tokens/tokenizer.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import { loadTokenizer } from "../../infra/node/model-dir.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";

// E4: a Qwen3 turn may end on any id of the generation config's stop list
// (151645 <|im_end|>, 151643 <|endoftext|>). The sampled id stays; the next
// observation closes the turn as the template renders it.
const IM_END = 151645;
const EOT = 151643;

let tok: ChatTokenizer;
let files: ModelFiles;
beforeAll(async () => {
  tok = await defaultTokenizer();
  files = await loadDefaultModelFiles();
});

describe("the model's stop list", () => {
  test("Qwen3: end-of-turn first, then <|endoftext|> (generation_config.json eos_token_id)", () => {
    expect(tok.eosTokenId).toBe(IM_END);
    expect(tok.stopTokenIds).toEqual([IM_END, EOT]);
    expect(tok.isStopToken(EOT)).toBe(true);
    expect(tok.isStopToken(IM_END)).toBe(true);
    expect(tok.isStopToken(151644)).toBe(false);
    expect(tok.isStopToken(undefined)).toBe(false);
  });

  test("a model without a generation config stops on its eos_token only; an int eos_token_id is a list of one", () => {
    expect(new ChatTokenizer({ ...files, name: "no-gen", generationConfig: undefined }).stopTokenIds).toEqual([IM_END]);
    expect(new ChatTokenizer({ ...files, name: "int-gen", generationConfig: { eos_token_id: EOT } }).stopTokenIds).toEqual([IM_END, EOT]);
    expect(new ChatTokenizer({ ...files, name: "dup-gen", generationConfig: { eos_token_id: [EOT, IM_END, EOT] } }).stopTokenIds).toEqual([IM_END, EOT]);
  });

  test("an eos_token_id outside the vocabulary is a ConfigError naming the file and the id", () => {
    const bad = () => new ChatTokenizer({ ...files, name: "bad", generationConfig: { eos_token_id: [IM_END, 999_999_999] } });
    expect(bad).toThrow(ConfigError);
    expect(bad).toThrow("bad/generation_config.json: eos_token_id: 999999999 is not a token id of this tokenizer");
    expect(() => new ChatTokenizer({ ...files, name: "bad2", generationConfig: { eos_token_id: "x" } })).toThrow('eos_token_id: "x" is not a token id');
  });

  describe("a model directory's generation_config.json", () => {
    let dir: string;
    beforeAll(() => {
      dir = mkdtempSync(join(tmpdir(), "edgeloop-model-"));
      writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(files.tokenizer));
      writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(files.tokenizerConfig));
    });
    afterAll(() => rmSync(dir, { recursive: true, force: true }));

    test("absent: [eos]; present: its list; not JSON: ConfigError", async () => {
      expect((await loadTokenizer(dir)).stopTokenIds).toEqual([IM_END]);
      const withGen = mkdtempSync(join(tmpdir(), "edgeloop-model-"));
      const broken = mkdtempSync(join(tmpdir(), "edgeloop-model-"));
      try {
        for (const d of [withGen, broken]) {
          writeFileSync(join(d, "tokenizer.json"), JSON.stringify(files.tokenizer));
          writeFileSync(join(d, "tokenizer_config.json"), JSON.stringify(files.tokenizerConfig));
        }
        writeFileSync(join(withGen, "generation_config.json"), JSON.stringify({ bos_token_id: EOT, eos_token_id: [IM_END, EOT], top_k: 20 }));
        writeFileSync(join(broken, "generation_config.json"), "{not json");
        expect((await loadTokenizer(withGen)).stopTokenIds).toEqual([IM_END, EOT]);
        await expect(loadTokenizer(broken)).rejects.toThrow(ConfigError);
      } finally {
        rmSync(withGen, { recursive: true, force: true });
        rmSync(broken, { recursive: true, force: true });
      }
    });
  });

  test("withStopIds merges the model's list after the row's own ids, without repeats", () => {
    const sp = { temperature: 1, top_p: 1, top_k: -1, logprobs: true };
    expect(withStopIds(sp, [IM_END, EOT]).stop_token_ids).toEqual([IM_END, EOT]);
    expect(withStopIds({ ...sp, stop_token_ids: [EOT, 7] }, [IM_END, EOT]).stop_token_ids).toEqual([EOT, 7, IM_END]);
    const full = { ...sp, stop_token_ids: [IM_END, EOT] };
    expect(withStopIds(full, [IM_END, EOT])).toBe(full);
  });
});

describe("ObservationEncoder closes a turn ended by any stop id", () => {
  test("turnClose: [198] after <|im_end|>, [151645, 198] after <|endoftext|>, nothing after a cut turn", () => {
    const enc = new ObservationEncoder(tok);
    expect(enc.turnClose(IM_END)).toEqual([198]);
    expect(enc.turnClose(EOT)).toEqual([IM_END, 198]);
    expect(enc.turnClose(4272)).toEqual([]);
    expect(enc.turnClose(undefined)).toEqual([]);
  });

  test("E4 ids: a tool observation after 151643 starts [151645, 198, 151644, 872, 198, 151665]", () => {
    const tools: ToolSchema[] = [{ type: "function", function: { name: "calc", description: "c", parameters: { type: "object", properties: {} } } }];
    const obs = new ObservationEncoder(tok, { tools }).encode([{ role: "tool", content: "4" }], EOT);
    expect(obs).toEqual([IM_END, 198, 151644, 872, 198, 151665, 198, 19, 198, 151666, IM_END, 198, 151644, 77091, 198]);
    // The same observation after <|im_end|> is this minus the leading 151645.
    expect(new ObservationEncoder(tok, { tools }).encode([{ role: "tool", content: "4" }], IM_END)).toEqual(obs.slice(1));
  });

  test("a user observation after 151643 starts [151645, 198, 151644, 872, 198]", () => {
    const obs = new ObservationEncoder(tok).encode([{ role: "user", content: "Sure?" }], EOT);
    expect(obs).toEqual([IM_END, 198, ...tok.encode("<|im_start|>user\nSure?<|im_end|>\n<|im_start|>assistant\n")]);
  });

  test("another model's stop list is honoured: a stop id the template does not end turns with gets the close too", () => {
    // Qwen3's files with a generation config that also stops on <|im_start|> (151644).
    const t2 = new ChatTokenizer({ ...files, name: "qwen3-stop-im-start", generationConfig: { eos_token_id: [IM_END, EOT, 151644] } });
    expect(new ObservationEncoder(t2).turnClose(151644)).toEqual([IM_END, 198]);
    expect(new ObservationEncoder(tok).turnClose(151644)).toEqual([]);
  });
});

describe("property: for any stop id ending a turn, prompt ‖ response is the template's render with the turn closed", () => {
  const word = fc.constantFrom("alpha", "42", "x+y", "Paris", "héllo", "数", "(1)", "a,b", "ok.", "#### 4");
  const text = fc.array(word, { minLength: 1, maxLength: 5 }).map((ws) => ws.join(" "));
  const toolCall = text.map((a) => `<tool_call>\n{"name": "calc", "arguments": {"expression": ${JSON.stringify(a)}}}\n</tool_call>`);
  const turn = fc.record({
    content: fc.oneof(text, toolCall, fc.tuple(text, toolCall).map(([a, b]) => `${a}\n${b}`)),
    stop: fc.constantFrom(IM_END, EOT),
    obs: fc.oneof(
      fc.array(text, { minLength: 1, maxLength: 3 }).map((rs) => ({ kind: "tool" as const, rs })),
      text.map((r) => ({ kind: "user" as const, rs: [r] })),
    ),
  });
  const tools: ToolSchema[] = [{ type: "function", function: { name: "calc", description: "evaluate", parameters: { type: "object", properties: { expression: { type: "string" } } } } }];

  test("Qwen3, stop ids 151645 and 151643, tool and user observations", () => {
    fc.assert(
      fc.property(text, fc.array(turn, { minLength: 1, maxLength: 4 }), fc.boolean(), (first, turns, withTools) => {
        const schemas = withTools ? tools : undefined;
        const messages: ChatMessage[] = [{ role: "user", content: first }];
        const { promptIds } = buildPromptIds(tok, messages, { tools: schemas, promptLength: 100_000 });
        const b = new TrajectoryBuilder({ promptIds, responseLength: 100_000, maxModelLen: 200_000, trackLogProbs: true });
        const enc = new ObservationEncoder(tok, { tools: schemas });
        let sampledCount = 0;
        for (const t of turns) {
          const sampled = [...tok.encode(t.content), t.stop];
          b.appendAction(sampled, sampled.map(() => -0.5));
          sampledCount += sampled.length;
          // The template's view of the turn: the sampled text; a stop id other than the
          // end-of-turn token is part of what the model said, and the template closes the turn.
          messages.push({ role: "assistant", content: t.stop === IM_END ? t.content : t.content + tok.decode([t.stop]) });
          const added: ChatMessage[] = t.obs.kind === "tool" ? t.obs.rs.map((r) => ({ role: "tool" as const, content: r })) : [{ role: "user", content: t.obs.rs[0]! }];
          const obs = enc.encode(added, b.lastTokenId);
          expect(obs.slice(0, t.stop === IM_END ? 1 : 2)).toEqual(t.stop === IM_END ? [198] : [IM_END, 198]);
          b.appendObservation(obs);
          messages.push(...added);
        }
        expect(b.contextIds()).toEqual(tok.renderIds(messages, { tools: schemas, addGenerationPrompt: true }));
        // Every sampled id (stop ids included) has mask 1, nothing else does.
        expect(b.responseMask().filter((m) => m === 1).length).toBe(sampledCount);
      }),
      { numRuns: 120 },
    );
  });
});
