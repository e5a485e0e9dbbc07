import { expect, test } from "bun:test";
import { builtinModelFiles } from "../../shared/models/builtin-families.ts";
import { TemplateError } from "../../shared/errors.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";

// A template that writes the answered call's name into a tool result (gpt-oss harmony: `<|start|>functions.{name} …`)
// took it, for a tool message without `name`, from the encoder's synthetic call: the observation read
// `functions.continuous_token_tool` — tokens no real conversation has. Now such a message is refused, naming the fix;
// templates that do not write the name are unaffected, and a result that merely mentions the synthetic name is fine.
const families = Object.fromEntries(await Promise.all(["gpt_oss", "qwen3", "llama3_1", "deepseek_v3", "gemma3"].map(async (f) => [f, new ChatTokenizer(await builtinModelFiles(f))] as const)));

test("gpt_oss: a nameless tool result is a TemplateError; with its name it renders functions.{name}", () => {
  const tok = families.gpt_oss!;
  for (const method of ["formula", "render"] as const) {
    const enc = new ObservationEncoder(tok, { method });
    const err = (() => {
      try {
        enc.encode([{ role: "tool", content: "42" }], tok.eosTokenId);
      } catch (e) {
        return e as TemplateError;
      }
    })();
    expect(err).toBeInstanceOf(TemplateError);
    expect(err!.message).toContain("writes the answered call's name into each tool result, and a tool message has no name");
    const ok = enc.encode([{ role: "tool", name: "calc", content: "continuous_token_tool 42" }], tok.eosTokenId);
    expect(tok.decode(ok)).toBe("<|start|>functions.calc to=assistant<|channel|>commentary<|message|>continuous_token_tool 42<|end|><|start|>assistant");
  }
});

test("families whose template does not write the name: nameless tool results encode as before, whatever their content", () => {
  const msgs: ChatMessage[] = [{ role: "tool", content: "continuous_token_tool" }];
  for (const f of ["qwen3", "llama3_1", "deepseek_v3", "gemma3"]) {
    const tok = families[f]!;
    const a = new ObservationEncoder(tok).encode(msgs, tok.eosTokenId);
    const b = new ObservationEncoder(tok).encode([{ ...msgs[0]!, name: "calc" }], tok.eosTokenId);
    expect(a).toEqual(b);
    expect(tok.decode(a)).toContain("continuous_token_tool");
  }
});
