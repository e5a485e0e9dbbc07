import { readFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { ConfigError } from "../../shared/errors.ts";
import { cachedTokenizer, defaultTokenizer, DEFAULT_MODEL, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/**
 * The tokenizer of a model directory holding `tokenizer.json` and
 * `tokenizer_config.json` (Hugging Face layout) and, optionally,
 * `generation_config.json` (its `eos_token_id` list becomes the stop ids),
 * loaded lazily and cached per resolved directory. `undefined` or `"qwen3"`
 * gives the default Qwen3 model.
 * @throws ConfigError when a required file is missing, or any file is not JSON.
 */
export function loadTokenizer(modelDir?: string): Promise<ChatTokenizer> {
  if (!modelDir || modelDir === DEFAULT_MODEL) return defaultTokenizer();
  const dir = resolve(modelDir);
  return cachedTokenizer(dir, async () => {
    const read = async (file: string, optional = false) => {
      let text: string;
      try {
        text = await readFile(join(dir, file), "utf8");
      } catch (e) {
        if (optional && (e as { code?: string }).code === "ENOENT") return undefined;
        throw new ConfigError("model", `cannot read ${join(dir, file)}: ${(e as Error).message}; point --model at a directory with tokenizer.json and tokenizer_config.json`, { cause: e });
      }
      try {
        return JSON.parse(text);
      } catch (e) {
        throw new ConfigError("model", `cannot read ${join(dir, file)}: ${(e as Error).message}; point --model at a directory with tokenizer.json and tokenizer_config.json`, { cause: e });
      }
    };
    const [tokenizer, tokenizerConfig, generationConfig] = await Promise.all([
      read("tokenizer.json"),
      read("tokenizer_config.json"),
      read("generation_config.json", true),
    ]);
    return { name: dir, tokenizer, tokenizerConfig, ...(generationConfig ? { generationConfig } : {}) };
  });
}
