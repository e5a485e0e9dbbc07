import { expect, test } from "bun:test";
import { decodeRefusal, modelIdOf } from "../../shared/models/index.ts";
import { ChatTokenizer, loadDefaultModelFiles } from "../../shared/tokens/tokenizer.ts";

// N4: a model's fingerprint covers what decides its token ids and their rendering, and nothing process-specific.

test("the fingerprint is the same for two loads of one model's files and changes with the template, an added token or the stop ids", async () => {
  const files = await loadDefaultModelFiles();
  const a = await modelIdOf(new ChatTokenizer(files));
  const b = await modelIdOf(new ChatTokenizer(await loadDefaultModelFiles()));
  expect(a).toEqual(b);
  expect(a).toEqual({ name: "qwen3", fingerprint: a.fingerprint });
  expect(a.fingerprint).toMatch(/^[0-9a-f]{16}$/);
  const template = files.tokenizerConfig.chat_template as string;
  const otherTemplate = await modelIdOf(new ChatTokenizer({ ...files, tokenizerConfig: { ...files.tokenizerConfig, chat_template: template.replace("<|im_start|>assistant", "<|im_start|>assistant ") } }));
  expect(otherTemplate.fingerprint).not.toBe(a.fingerprint);
  const otherStops = await modelIdOf(new ChatTokenizer({ ...files, generationConfig: { eos_token_id: [151645] } }));
  expect(otherStops.fingerprint).not.toBe(a.fingerprint);
  const tj = files.tokenizer as { added_tokens: { id: number; content: string }[] };
  const renamed = { ...tj, added_tokens: tj.added_tokens.map((t) => (t.content === "<tool_call>" ? { ...t, content: "<tool_call_x>" } : t)) };
  const otherAdded = await modelIdOf(new ChatTokenizer({ ...files, tokenizer: renamed }));
  expect(otherAdded.fingerprint).not.toBe(a.fingerprint);
});

test("decodeRefusal: a record of the same fingerprint, or naming no model, decodes; another fingerprint is refused naming both", () => {
  const own = { name: "qwen3", fingerprint: "d90f4c60ab225f77" };
  expect(decodeRefusal(undefined, own)).toBeNull();
  expect(decodeRefusal({ name: "my-qwen-dir", fingerprint: own.fingerprint }, own)).toBeNull();
  expect(decodeRefusal({ name: "llama3_1", fingerprint: "a46dd04db0e482fa" }, own)).toBe(
    "the record's tokens are of model llama3_1 (fingerprint a46dd04db0e482fa), this process has qwen3 (fingerprint d90f4c60ab225f77): not decoded (decoding with another tokenizer gives garbage); decode where that model is loaded (e.g. --model llama3_1)",
  );
});
