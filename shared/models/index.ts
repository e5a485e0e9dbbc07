/**
 * `edgeloop/models` — the built-in model families (Qwen3, Llama 3.1,
 * Gemma 3, DeepSeek V3, gpt-oss): their tokenizers and chat templates
 * (`builtinTokenizer`), traits, generation configs, and model ids
 * (`modelIdOf`: family plus a tokenizer/template fingerprint, what records
 * and batches carry).
 */
import { cachedTokenizer, defaultTokenizer, DEFAULT_MODEL, type ChatTokenizer } from "../tokens/tokenizer.ts";
import { builtinModelFiles } from "./builtin-families.ts";

export { BUILTIN_MODELS, builtinFamily, builtinModelFiles, isBuiltinModel, type BuiltinFamily, type BuiltinModel } from "./builtin-families.ts";
export { decodeRefusal, describeModelId, modelIdOf, sameModel } from "./model-id.ts";
export { CUSTOM_TRAITS, QWEN3_TRAITS, type HistoryPolicy, type MessageShaping, type ModelTraits, type TemplateMessage } from "../tokens/model-traits.ts";

/**
 * The {@link ChatTokenizer} of a built-in model family, loaded lazily (only
 * that family's package is imported) and cached per name.
 * @throws ConfigError for an unknown name or a family not available in this build.
 */
export function builtinTokenizer(name: string): Promise<ChatTokenizer> {
  if (name === DEFAULT_MODEL) return defaultTokenizer();
  return cachedTokenizer(name, () => builtinModelFiles(name));
}

/**
 * One line describing a model for the run's start lines: name, family,
 * end-of-turn token, stop ids and default parser, e.g.
 * `llama3_1 (end of turn <|eot_id|> 128009; stop ids 128009, 128001, 128008; parser llama3_json; history append-only)`.
 * `parser` overrides the family's default (the configured `rollout.multi_turn.format`).
 */
export function describeModel(tok: ChatTokenizer, parser?: string | null): string {
  const fam = tok.traits.family === tok.name ? "" : ` [${tok.traits.family}]`;
  return `${tok.name}${fam} (end of turn ${tok.eosText()} ${tok.eosTokenId}; stop ids ${tok.stopTokenIds.join(", ")}; parser ${parser ?? tok.traits.defaultParser}; history ${tok.traits.historyPolicy})`;
}
