import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { ConfigError } from "../../shared/errors.ts";
import { cachedTokenizer, defaultTokenizer, DEFAULT_MODEL, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/**
 * The tokenizer of a model directory holding `tokenizer.json` and
 * `tokenizer_config.json` (Hugging Face layout), loaded lazily and cached per
 * resolved directory. `undefined` or `"qwen3"` gives the default Qwen3 model.
 * @throws ConfigError when a file is missing or not JSON.
 */
export function loadTokenizer(modelDir?: string): Promise<ChatTokenizer> {
  if (!modelDir || modelDir === DEFAULT_MODEL) return defaultTokenizer();
  const dir = resolve(modelDir);
  return cachedTokenizer(dir, async () => {
    const read = async (file: string) => {
      try {
        return JSON.parse(await readFile(join(dir, file), "utf8"));
      } catch (e) {
        throw new ConfigError("model", `cannot read ${join(dir, file)}: ${(e as Error).message}; point --model at a directory with tokenizer.json and tokenizer_config.json`, { cause: e });
      }
    };
    const [tokenizer, tokenizerConfig] = await Promise.all([read("tokenizer.json"), read("tokenizer_config.json")]);
    return { name: dir, tokenizer, tokenizerConfig };
  });
}
