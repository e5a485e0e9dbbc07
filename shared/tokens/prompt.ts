import { InputError } from "../errors.ts";
import { hasMultimodalContent, type ChatMessage, type ToolSchema } from "../schema/index.ts";
import { contentText, type ChatTokenizer } from "./tokenizer.ts";
import { deriveTextFormula, evaluateFormula, FORMULA_PROBES, renderOptionsKey, templateTrim, toolsKey, type FormulaSlot, type TextFormula } from "./text-formula.ts";
import { LRUCache } from "lru-cache";

/** Encoded initial prompts by (model, tools, template kwargs, messages); bounded by total key characters. */
const promptCache = new LRUCache<string, number[]>({ maxSize: 32 * 1024 * 1024, sizeCalculation: (v, k) => k.length + v.length * 8 });

/** Options for {@link buildPromptIds}. */
export interface PromptOptions {
  /** Tool schemas to render into the prompt (tool agents), in the tools file's order. */
  tools?: readonly ToolSchema[];
  /** `rollout.prompt_length`: the most tokens the initial prompt may hold. */
  promptLength: number;
  /** Extra chat-template variables, e.g. `{enable_thinking: false}`. */
  chatTemplateKwargs?: Record<string, unknown>;
  /**
   * `formula` (default): prompts of a shape with a checked text formula
   * (see {@link promptFormulaFallback}) reuse the encoded system + tools
   * block and tokenize only the rest; `render`: always render and encode the
   * whole prompt (the reference path, kept for benchmarks and tests). Both
   * give the same ids.
   */
  method?: "formula" | "render";
}

/**
 * The initial prompt of a trajectory (DESIGN §2 invariant 5, §4.1):
 * `applyChatTemplate(messages, {tools, add_generation_prompt: true})`.
 *
 * A text prompt longer than `promptLength` tokens is left-truncated — the
 * rightmost `promptLength` ids are kept, so the generation prompt survives —
 * and `truncated` is true (verl's `truncation: "left"`).
 *
 * Cost: the system + tools block is encoded once per (model, tools, kwargs,
 * system text) and only the text after it is tokenized, when the prompt's
 * shape (`[user]`, `[system, user]`, … up to four system/user messages)
 * has a checked text formula (derived from the template the second time a
 * shape is seen; see `deriveTextFormula`); other prompts are rendered and
 * encoded whole. Either way the ids are the full render's. Each distinct
 * prompt is rendered and tokenized once per process while it stays in a cache
 * bounded to 32 Mi (key characters + 8 × ids), whatever its size: the n
 * sessions of a row share one encoding (issue 26, S18).
 * @throws InputError (field `prompt[m].content[p]`, the first media part) when
 *   a message holds an image, video or audio part: a text-only family cannot
 *   render it, and a vision family's prompt is built with placeholders
 *   expanded by `buildMultimodalPromptIds` instead.
 * @throws InputError (field `rollout.prompt_length`) when truncation would
 *   leave no more than the generation prompt.
 */
export function buildPromptIds(
  tok: ChatTokenizer,
  messages: readonly ChatMessage[],
  opts: PromptOptions,
): { promptIds: number[]; truncated: boolean } {
  if (hasMultimodalContent(messages)) {
    // Named at the first media part; a vision family's prompts go through buildMultimodalPromptIds (shared/vision/).
    let field = "prompt";
    for (let m = 0; m < messages.length && field === "prompt"; m++) {
      const c = messages[m]!.content;
      if (Array.isArray(c)) {
        const p = c.findIndex((part) => part.type !== "text");
        if (p >= 0) field = `prompt[${m}].content[${p}]`;
      }
    }
    throw new InputError(
      field,
      tok.traits.vision
        ? "holds a media part: a vision-language prompt is built with buildMultimodalPromptIds (images only)"
        : `holds image parts, and model ${tok.name} (family ${tok.traits.family}) is text-only; use a vision-language family (--model qwen3_vl)`,
    );
  }
  if (!Number.isInteger(opts.promptLength) || opts.promptLength < 1) {
    throw new InputError("rollout.prompt_length", "must be an integer >= 1");
  }
  // The n sessions of a row share their prompt: render and encode each distinct one once
  // (the chat template is the expensive part, ~0.3 ms for a prompt with a tools block).
  const cacheKey = `${tok.name}\u0000${toolsKey(opts.tools)}\u0000${JSON.stringify(opts.chatTemplateKwargs ?? {})}\u0000${JSON.stringify(messages)}`;
  // A truncated prompt's kept ids (they depend on prompt_length) are cached apart from whole encodings,
  // so the n sessions of a row also skip the generation-prompt check's two renders.
  const tailKey = `${opts.promptLength}\u0000${cacheKey}`;
  const tailHit = promptCache.get(tailKey);
  if (tailHit) return { promptIds: tailHit.slice(), truncated: true };
  let cached = promptCache.get(cacheKey);
  if (!cached) {
    // The system + tools block repeats across rows: with a formula for this prompt's shape, its ids
    // come from a cache and only the text after its last boundary token is tokenized.
    const parts = opts.method === "render" ? undefined : promptParts(tok, messages, opts);
    const length = parts ? parts.prefix.length + parts.rest.length : -1;
    const text = parts ? undefined : tok.renderText(messages, { tools: opts.tools, addGenerationPrompt: true, chatTemplateKwargs: opts.chatTemplateKwargs });
    // A huge prompt (say 30 MB of text) is not tokenized whole when its tail can be cut at a pre-token
    // boundary: only the tail can survive left truncation, and a tail of (prompt_length + margin) × the
    // longest token's characters holds more than prompt_length tokens. The cut is at a position where the
    // tokenizer's pre-tokens are known to start (preTokenBoundaryAtOrBefore), so the tail's ids are exactly
    // the whole encoding's from there; without such a position (one unbroken 40,000-character word), or for
    // a tokenizer whose pre-tokens are not known, the text is encoded whole (bounded by limits.max_prompt_chars).
    const tailChars = (opts.promptLength + 64) * tok.maxTokenChars();
    if ((text?.length ?? length) > 2 * tailChars && tok.preTokenBoundariesKnown()) {
      const whole = text ?? parts!.prefix + parts!.rest;
      const cut = preTokenBoundaryAtOrBefore(whole, whole.length - tailChars, tailChars);
      if (cut !== null) {
        const tail = tok.encode(whole.slice(cut));
        const kept = checkedTail(tok, messages, opts, tail, Number.POSITIVE_INFINITY);
        promptCache.set(tailKey, kept);
        return { promptIds: kept.slice(), truncated: true };
      }
    }
    if (parts) {
      const prefixIds = parts.prefixIds();
      const rest = tok.encode(parts.rest);
      cached = prefixIds.length === 0 ? rest : prefixIds.concat(rest);
    } else {
      cached = tok.encode(text!);
    }
    // Cached whatever the prompt's size (the cache is bounded by key characters plus ids): the n
    // sessions of a row with a 4 MiB prompt tokenize it once, not n times (S18).
    promptCache.set(cacheKey, cached);
  }
  const ids = cached.slice();
  if (ids.length <= opts.promptLength) return { promptIds: ids, truncated: false };
  const kept = checkedTail(tok, messages, opts, ids, ids.length);
  promptCache.set(tailKey, kept);
  return { promptIds: kept.slice(), truncated: true };
}

/**
 * The last `prompt_length` ids of `ids` (an encoding of the whole prompt, or
 * of its tail), after checking that they hold more than the generation prompt.
 * @throws InputError (field `rollout.prompt_length`).
 */
function checkedTail(tok: ChatTokenizer, messages: readonly ChatMessage[], opts: PromptOptions, ids: number[], total: number): number[] {
  // Left truncation must leave the generation prompt and at least one token of the conversation;
  // shorter, the model would be asked to answer nothing. The generation prompt is what a render
  // with it adds to one without (both texts; only the difference is encoded).
  const render = (gen: boolean) => tok.renderText(messages, { tools: opts.tools, addGenerationPrompt: gen, chatTemplateKwargs: opts.chatTemplateKwargs });
  const withGen = render(true);
  const withoutGen = render(false);
  const genLength = withGen.startsWith(withoutGen) ? tok.encode(withGen.slice(withoutGen.length)).length : 0;
  if (opts.promptLength <= genLength) {
    const all = Number.isFinite(total) ? ` (${total} tokens in all)` : "";
    throw new InputError(
      "rollout.prompt_length",
      `${opts.promptLength} tokens cannot hold this prompt's generation prompt (${genLength} tokens) and any of the conversation${all}`,
    );
  }
  return ids.slice(ids.length - opts.promptLength);
}

/**
 * A prompt's formula: the text formula of the rendered prompt (generation
 * prompt included) for one shape, and where its encoding may be cut: at
 * the last boundary token of the constant texts before the first value of
 * the last message. Everything before that cut depends only on the earlier
 * messages (the system text), the tools and the kwargs.
 */
interface PromptFormula {
  formula: TextFormula;
  /** Slots before the cut: their values (all of earlier messages) key the prefix cache. */
  prefixSlots: number;
  /** The cut: inside `formula.texts[cutPiece]` at `cutAt`; cutPiece < 0 when there is no boundary token to cut at. */
  cutPiece: number;
  cutAt: number;
}

/** Per (tokenizer, tools, kwargs): prompt formulas by shape (failures kept) and encoded prefixes. */
interface PromptPlan {
  formulas: Map<string, PromptFormula | string>;
  /** Shapes seen once (derived when seen again). */
  seen: Set<string>;
  /** Encoded prefixes by shape and prefix values; bounded by size. */
  prefixes: LRUCache<string, number[]>;
}

const plans = new WeakMap<ChatTokenizer, LRUCache<string, PromptPlan>>();

/** At most this many messages in a prompt shape with a formula (longer prompts are rendered whole). */
const MAX_SHAPE_MESSAGES = 4;

function planFor(tok: ChatTokenizer, tools: readonly ToolSchema[] | undefined, kwargs: Record<string, unknown> | undefined): PromptPlan {
  let byKey = plans.get(tok);
  if (!byKey) {
    byKey = new LRUCache<string, PromptPlan>({ max: 64 });
    plans.set(tok, byKey);
  }
  const key = renderOptionsKey(tools, kwargs);
  let plan = byKey.get(key);
  if (!plan) {
    plan = {
      formulas: new Map(),
      seen: new Set(),
      prefixes: new LRUCache({ maxSize: 4 * 1024 * 1024, sizeCalculation: (v, k) => k.length + v.length * 8 }),
    };
    byKey.set(key, plan);
  }
  return plan;
}

/**
 * The shape of a prompt for its formula: per message its role and whether
 * its content is empty (a constant of the shape), and the non-empty
 * contents in order with the index of the first one of the last message.
 * Undefined for prompts the formula does not cover: more than
 * {@link MAX_SHAPE_MESSAGES} messages, roles other than system and user,
 * or messages with a name, tool calls or reasoning.
 */
function promptShape(messages: readonly ChatMessage[]): { key: string; values: string[]; lastFrom: number } | undefined {
  if (messages.length === 0 || messages.length > MAX_SHAPE_MESSAGES) return undefined;
  let key = "";
  const values: string[] = [];
  let lastFrom = 0;
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    if ((m.role !== "system" && m.role !== "user") || m.name !== undefined || m.tool_call_id !== undefined || m.tool_calls !== undefined || m.reasoning_content !== undefined) {
      return undefined;
    }
    if (i === messages.length - 1) lastFrom = values.length;
    const c = contentText(m.content);
    if (c !== "") values.push(c);
    key += m.role + (c === "" ? "0" : "1") + "|";
  }
  return { key, values, lastFrom };
}

/**
 * Derives the formula of `like`'s shape: the prompt render (generation
 * prompt included) with marker and probe contents, then the cut before the
 * last message's first content. `lastFrom`: index of the last message's
 * first value.
 */
function derivePromptFormula(tok: ChatTokenizer, like: readonly ChatMessage[], count: number, lastFrom: number, opts: PromptOptions): PromptFormula | string {
  const r = deriveTextFormula(count, (values) => {
    let i = 0;
    const msgs = like.map((m) => ({ role: m.role, content: contentText(m.content) === "" ? "" : values[i++]! }));
    return tok.renderText(msgs, { tools: opts.tools, addGenerationPrompt: true, chatTemplateKwargs: opts.chatTemplateKwargs });
  });
  if (!r.ok) return r.reason;
  const { texts, slots } = r.formula;
  // The first slot holding a value of the last message; everything before it is the prefix.
  let prefixSlots = slots.findIndex((s: FormulaSlot) => s.value >= lastFrom);
  if (prefixSlots < 0) prefixSlots = slots.length;
  let f: PromptFormula = { formula: r.formula, prefixSlots: 0, cutPiece: -1, cutAt: 0 };
  search: for (let piece = prefixSlots; piece >= 0; piece--) {
    const t = texts[piece]!;
    for (let at = t.length - 1; at >= 0; at--) {
      if (tok.isSafeCut(t, at)) {
        f = { formula: r.formula, prefixSlots: piece, cutPiece: piece, cutAt: at };
        break search;
      }
    }
  }
  // The ids, not only the texts, must agree: check the cut encoding on the probes as well.
  for (let p = 0; p < FORMULA_PROBES.length; p++) {
    const values = Array.from({ length: count }, (_, i) => FORMULA_PROBES[(p + i) % FORMULA_PROBES.length]!);
    const { prefix, rest } = splitText(f, values);
    const got = [...(prefix === "" ? [] : tok.encode(prefix)), ...tok.encode(rest)];
    const want = tok.encode(prefix + rest);
    if (got.length !== want.length || got.some((id, i) => id !== want[i])) {
      return `the ids of the prompt cut before its last message differ from the whole prompt's for content ${JSON.stringify(values[0])}`;
    }
  }
  return f;
}

/** The prompt's text from its formula, as the part before the cut and the rest. */
function splitText(f: PromptFormula, values: readonly string[]): { prefix: string; rest: string } {
  const { texts, slots } = f.formula;
  if (f.cutPiece < 0) return { prefix: "", rest: evaluateFormula(f.formula, values) };
  const v = (s: FormulaSlot) => (s.trim ? templateTrim(values[s.value]!) : values[s.value]!);
  let prefix = "";
  for (let i = 0; i < f.cutPiece; i++) prefix += texts[i]! + v(slots[i]!);
  prefix += texts[f.cutPiece]!.slice(0, f.cutAt);
  let rest = texts[f.cutPiece]!.slice(f.cutAt);
  for (let i = f.cutPiece; i < slots.length; i++) rest += v(slots[i]!) + texts[i + 1]!;
  return { prefix, rest };
}

/**
 * The prompt's text from the shape's formula, as the part before the cut
 * (system + tools block) and the rest, with the prefix's ids (cached per
 * shape and system text; asked for only once the prompt is known not to
 * be huge); undefined when the shape has no formula (the caller renders the
 * whole prompt). A shape's formula is derived the second time it is seen,
 * so one-off tools lists and kwargs cost no derivation.
 */
function promptParts(tok: ChatTokenizer, messages: readonly ChatMessage[], opts: PromptOptions): { prefix: string; rest: string; prefixIds: () => number[] } | undefined {
  const shape = promptShape(messages);
  if (!shape) return undefined;
  const plan = planFor(tok, opts.tools, opts.chatTemplateKwargs);
  let f = plan.formulas.get(shape.key);
  if (f === undefined) {
    if (!plan.seen.has(shape.key)) {
      plan.seen.add(shape.key);
      return undefined;
    }
    f = derivePromptFormula(tok, messages, shape.values.length, shape.lastFrom, opts);
    plan.formulas.set(shape.key, f);
  }
  if (typeof f === "string") return undefined;
  const { prefix, rest } = splitText(f, shape.values);
  const formula = f;
  const prefixIds = (): number[] => {
    if (prefix === "") return [];
    let prefixKey = shape.key;
    for (let i = 0; i < formula.prefixSlots; i++) prefixKey += "\u0000" + shape.values[formula.formula.slots[i]!.value]!;
    let ids = plan.prefixes.get(prefixKey);
    if (!ids) {
      ids = tok.encode(prefix);
      if (prefixKey.length < 1_000_000) plan.prefixes.set(prefixKey, ids);
    }
    return ids;
  };
  return { prefix, rest, prefixIds };
}

/**
 * Why prompts of `messages`' shape are rendered whole instead of built from
 * a formula with a cached system + tools block, or undefined when they use
 * the formula (or the shape is one the formula does not cover: more than
 * four messages, other roles; or one the template cannot render at all). Derives and caches the formula; never
 * throws. The CLI prints it in its start lines.
 */
export function promptFormulaFallback(tok: ChatTokenizer, messages: readonly ChatMessage[], opts: Omit<PromptOptions, "promptLength">): string | undefined {
  const shape = promptShape(messages);
  if (!shape) return undefined;
  const plan = planFor(tok, opts.tools, opts.chatTemplateKwargs);
  let f = plan.formulas.get(shape.key);
  if (f === undefined) {
    f = derivePromptFormula(tok, messages, shape.values.length, shape.lastFrom, { ...opts, promptLength: 1 });
    plan.formulas.set(shape.key, f);
  }
  if (typeof f !== "string") return undefined;
  try {
    tok.renderText(messages, { tools: opts.tools, addGenerationPrompt: true, chatTemplateKwargs: opts.chatTemplateKwargs });
  } catch {
    return undefined; // the template cannot render this shape at all: not a fallback
  }
  return f;
}

/**
 * The largest index `i` in `[at - maxBack, at]` where a pre-token starts for
 * tokenizers whose {@link ChatTokenizer.preTokenBoundariesKnown} holds: right
 * after a `\n` when `text[i]` is not whitespace (every alternative of their
 * split regex that can match a newline ends at it), or a space between two
 * ASCII letters (a letter run ends at the space, and ` word` begins there);
 * null when there is none. One backward scan of at most `maxBack + 1`
 * characters.
 */
export function preTokenBoundaryAtOrBefore(text: string, at: number, maxBack: number): number | null {
  const stop = Math.max(1, at - maxBack);
  const letter = (c: number) => (c >= 65 && c <= 90) || (c >= 97 && c <= 122);
  for (let i = Math.min(at, text.length - 2); i >= stop; i--) {
    const prev = text.charCodeAt(i - 1);
    const c = text.charCodeAt(i);
    if (c === 32 && letter(prev) && letter(text.charCodeAt(i + 1))) return i;
    if (prev !== 10) continue;
    // \s of the tokenizers' regexes (and, conservatively, every control character): not a boundary before it.
    if (c <= 32 || c === 0x85 || c === 0xa0 || c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000 || c === 0xfeff) continue;
    return i;
  }
  return null;
}
