import { beforeAll, describe, expect, test } from "bun:test";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { assistantOpeners, familyText } from "../../infra/sim-engine/family-text.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Load the tokenizers once, with room for a loaded machine (bun's per-test default is 5 s).
beforeAll(async () => {
  await Promise.all(["qwen3", "llama3_1", "deepseek_v3", "gemma3"].map((n) => builtinTokenizer(n)));
}, HANG_MS);

const TURN = '<think>\nLet me compute 2*7.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2*7"}}\n</tool_call>';
const BAD = '<think>\nLet me compute.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2*7",}}\n</tool_call>';

describe("the sim engine samples the policy's turns in each family's format", () => {
  test("qwen3: unchanged", async () => {
    expect(familyText(await builtinTokenizer("qwen3"), TURN)).toBe(TURN);
  });
  test("llama3_1, deepseek_v3, gemma3: tool format; think dropped; malformed arguments stay malformed", async () => {
    const out: Record<string, [string, string]> = {};
    for (const f of ["llama3_1", "deepseek_v3", "gemma3"]) {
      const tok = await builtinTokenizer(f);
      out[f] = [familyText(tok, TURN), familyText(tok, BAD)];
    }
    expect(out).toEqual({
      llama3_1: ['{"name": "calc", "parameters": {"expression": "2*7"}}', '{"name": "calc", "parameters": {"expression": "2*7",}}'],
      deepseek_v3: [
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{"expression":"2*7"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{"expression": "2*7",}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
      ],
      gemma3: ['[calc(expression="2*7")]', '[calc({"expression": "2*7",})]'],
    });
    expect(familyText(await builtinTokenizer("gemma3"), "<think>\nok\n</think>\n\nThe answer is 14.\n#### 14")).toBe("The answer is 14.\n#### 14");
  });
  test("assistant turns are counted at each family's openers (DeepSeek: also after tool outputs)", async () => {
    const ds = await builtinTokenizer("deepseek_v3");
    expect(assistantOpeners(ds)).toEqual({ openers: [[128804], [128811]], tail: [] });
    const engine = new SimEngine({ tokenizer: ds, script: { rules: [], default: ["x"] } });
    const ids = ds.renderIds(
      [
        { role: "user", content: "q" },
        { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "calc", arguments: { e: "1" } } }] },
        { role: "tool", content: "1" },
      ],
      { addGenerationPrompt: true },
    );
    expect(engine.assistantTurns(ids)).toEqual({ count: 1, open: [] });
    const llama = await builtinTokenizer("llama3_1");
    expect(assistantOpeners(llama)).toEqual({ openers: [[128006, 78191, 128007]], tail: [271] });
    const le = new SimEngine({ tokenizer: llama, script: { rules: [], default: ["x"] } });
    const open = [...llama.renderIds([{ role: "user", content: "q" }], { addGenerationPrompt: true }), ...llama.encode("partial")];
    expect(le.assistantTurns(open)).toEqual({ count: 0, open: llama.encode("partial") });
  });
});
