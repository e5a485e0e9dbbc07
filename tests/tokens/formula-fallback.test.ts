import { beforeAll, describe, expect, test } from "bun:test";
import { ChatTokenizer, loadDefaultModelFiles, type ModelFiles } from "../../shared/tokens/tokenizer.ts";
import { buildPromptIds, promptFormulaFallback } from "../../shared/tokens/prompt.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { tokenMethodFallbacks } from "../../shared/tokens/token-methods.ts";
import { deriveTextFormula, evaluateFormula } from "../../shared/tokens/text-formula.ts";

// A template whose output is not the contents verbatim (here: user and tool
// contents upper-cased) fails the formula check: those shapes are rendered
// as before, with the same ids, and the fallback is reported.

const UPPER_TEMPLATE =
  "{%- for m in messages %}<|im_start|>{{ m.role }}\n" +
  "{% if m.role == 'user' or m.role == 'tool' %}{{ m.content | upper }}{% else %}{{ m.content }}{% endif %}<|im_end|>\n" +
  "{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

let files: ModelFiles;
beforeAll(async () => {
  files = await loadDefaultModelFiles();
});
const custom = (template: string, name: string) => new ChatTokenizer({ ...files, name, tokenizerConfig: { ...files.tokenizerConfig, chat_template: template } });

describe("a template that fails the formula check", () => {
  test("observations are rendered per turn, with the render path's ids, and the fallback is reported", () => {
    const tok = custom(UPPER_TEMPLATE, "upper-case-template");
    const enc = new ObservationEncoder(tok);
    const fallbacks = enc.formulaFallbacks();
    expect(fallbacks.length).toBe(5);
    expect(fallbacks[0]).toBe("1 tool result(s): the template writes a value other than verbatim or trimmed");
    const msgs = [{ role: "tool" as const, content: "Result: ok" }];
    const ids = enc.encode(msgs, tok.eosTokenId);
    expect(ids).toEqual(new ObservationEncoder(tok, { method: "render" }).encode(msgs, tok.eosTokenId));
    expect(ids).toEqual([198, ...tok.encode("<|im_start|>tool\nRESULT: OK<|im_end|>\n<|im_start|>assistant\n")]);
  });

  test("prompts are rendered whole, and the start lines say both", () => {
    const tok = custom(UPPER_TEMPLATE, "upper-case-template-2");
    const msgs = [{ role: "user" as const, content: "What is 2+2?" }];
    expect(promptFormulaFallback(tok, msgs, {})).toBe("the template writes a value other than verbatim or trimmed");
    expect(buildPromptIds(tok, msgs, { promptLength: 1000 }).promptIds).toEqual(tok.encode("<|im_start|>user\nWHAT IS 2+2?<|im_end|>\n<|im_start|>assistant\n"));
    const lines = tokenMethodFallbacks(tok);
    expect(lines).toHaveLength(2);
    expect(lines[0]).toStartWith("observations: template render per turn (formula check failed for 1 tool result(s): the template writes a value other than verbatim or trimmed; ");
    expect(lines[1]).toBe(
      "initial prompts: full render per row (formula check failed for [user]: the template writes a value other than verbatim or trimmed; [system, user]: the template writes a value other than verbatim or trimmed)",
    );
  });

  test("a value the template tests (not only writes) fails on a probe", () => {
    // `if '<' in content`: the markers pass, a probe with special-token text does not.
    const tok = custom(
      "{%- for m in messages %}<|im_start|>{{ m.role }}\n{% if '<' in m.content %}[markup removed]{%- else %}{{ m.content }}{%- endif %}<|im_end|>\n{% endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
      "tests-content-template",
    );
    expect(promptFormulaFallback(tok, [{ role: "user", content: "q" }], {})).toMatch(/^the render with content ".*" differs from the formula$/);
    expect(buildPromptIds(tok, [{ role: "user", content: "a <b> c" }], { promptLength: 1000 }).promptIds).toEqual(
      tok.encode("<|im_start|>user\n[markup removed]<|im_end|>\n<|im_start|>assistant\n"),
    );
  });
});

describe("deriveTextFormula", () => {
  test("constant texts around verbatim and trimmed slots", () => {
    const r = deriveTextFormula(2, ([a, b]) => `<${a!.trim()}|${b}>`);
    expect(r).toEqual({ ok: true, formula: { texts: ["<", "|", ">"], slots: [{ value: 0, trim: true }, { value: 1, trim: false }] } });
    if (r.ok) expect(evaluateFormula(r.formula, [" x ", " y "])).toBe("<x| y >");
  });
  test("a render that raises gives the reason, never throws", () => {
    expect(deriveTextFormula(1, () => {
      throw new Error("boom");
    })).toEqual({ ok: false, reason: "the template raised: boom" });
  });
});
