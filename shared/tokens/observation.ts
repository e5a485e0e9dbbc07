import { TemplateError } from "../errors.ts";
import type { ChatMessage, ToolSchema } from "../schema/index.ts";
import { LRUCache } from "lru-cache";
import { contentText, type ChatTokenizer } from "./tokenizer.ts";
import { deriveTextFormula, evaluateFormula, FORMULA_PROBES, renderOptionsKey, type TextFormula } from "./text-formula.ts";

/** Options for {@link ObservationEncoder}. */
export interface ObservationOptions {
  /** The tool schemas the prompt was rendered with (so the template's tools preamble matches and is diffed away). */
  tools?: readonly ToolSchema[];
  /** Extra chat-template variables, e.g. `{enable_thinking: false}`; also shape the generation prompt. */
  chatTemplateKwargs?: Record<string, unknown>;
  /**
   * `formula` (default): observations of a shape with a checked text formula
   * are one tokenization of their text; `render`: always render the
   * synthetic conversation (the reference path, kept for benchmarks and
   * tests). Both give the same ids.
   */
  method?: "formula" | "render";
}

const SYNTHETIC_SYSTEM: ChatMessage = { role: "system", content: "continuous token synthetic system" };
const SYNTHETIC_USER: ChatMessage = { role: "user", content: "continuous token synthetic user" };
/** Text of the synthetic assistant answer; found in renders to locate the end of that turn. */
const ANSWER_MARKER = "continuous token synthetic answer";
/** Name of the synthetic tool; its first occurrence in a render is inside the synthetic assistant turn. */
const CALL_MARKER = "continuous_token_tool";
const ANSWER_HISTORY: ChatMessage[] = [SYNTHETIC_SYSTEM, SYNTHETIC_USER, { role: "assistant", content: ANSWER_MARKER }];

function what(messages: readonly ChatMessage[]): string {
  const tools = messages.filter((m) => m.role === "tool").length;
  const rest = messages.length - tools;
  if (tools && rest) return `${tools} tool result(s) and ${rest} more message(s)`;
  return tools ? `${tools} tool result(s)` : rest === 1 ? `a ${messages[0]!.role} message` : `${rest} messages`;
}

/**
 * Encodes observations — the messages that follow an assistant turn (a run of
 * `tool` results, or one `user` turn from a simulated user) — incrementally,
 * without re-rendering or touching earlier tokens (DESIGN §2 invariant 1, §4.1).
 *
 * The result, appended after the model's sampled ids, is:
 * 1. the close of the assistant turn as the template renders it:
 *    - after the end-of-turn token (`<|im_end|>` for Qwen), the template's
 *      turn separator (Qwen: `\n`);
 *    - after any other stop id of the model (Qwen3: `<|endoftext|>` 151643,
 *      see `ChatTokenizer.stopTokenIds`), which the engine also ends a turn
 *      on: the end-of-turn token and then the separator (Qwen: `[151645, 198]`),
 *      so the context never reads `<|endoftext|><|im_start|>`, which no
 *      template renders; the sampled stop id itself stays in the stream;
 *    - after anything else (a turn cut by `length`): nothing;
 * 2. the tokens the template renders for the new messages *in context*: one
 *    render of a short synthetic conversation shaped like the real one —
 *    system, user, an assistant turn (with one call per tool result before
 *    tool results, a plain answer before a user turn), then the new messages —
 *    and the text after the synthetic assistant turn's end-of-turn token and
 *    separator. The synthetic history never holds a message list the real
 *    conversation could not have, so templates that enforce role
 *    alternation (Gemma 3: "Conversation roles must alternate") accept it
 *    (case E5), whatever the template prepends for a fresh conversation
 *    (Qwen's `# Tools` system block) is cut away exactly, and history
 *    rewriting (Qwen3 dropping earlier `<think>` blocks) never affects the
 *    result; the family's message shaping (Gemma 3: tool results as one user
 *    turn) applies as in every render;
 * 3. the generation prompt of the next assistant turn.
 *
 * Steps 2 and 3 are rendered once per observation *shape* (roles, and
 * which of content, `name`, `tool_call_id` are absent, empty or set), not
 * once per observation: the render with marker contents is split into the
 * constant texts around each value (`deriveTextFormula`, which also finds
 * the values the template trims), checked against renders with probe
 * contents (texts and ids), and then an observation costs one tokenization
 * of its text. A shape whose check fails is rendered every time as
 * described above (see {@link ObservationEncoder.formulaFallbacks}).
 *
 * All of it is observation (mask 0). With an append-only template, prompt ‖
 * response then equals the template's own render of the whole conversation.
 *
 * @see verl's Continuous Token builder (`verl/utils/tokenizer/continuous_token.py`),
 *   whose synthetic-prefix diff this follows.
 */
export class ObservationEncoder {
  private readonly tok: ChatTokenizer;
  private readonly core: ObservationCore;
  private readonly useFormula: boolean;

  constructor(tok: ChatTokenizer, opts: ObservationOptions = {}) {
    this.tok = tok;
    this.core = ObservationCore.for(tok, opts);
    this.useFormula = opts.method !== "render";
  }

  /**
   * Observation ids for `newMessages` appended after a turn whose last sampled
   * id is `lastTokenId` (undefined when nothing was sampled yet).
   *
   * Step 2 below (the new messages and the generation prompt) costs one
   * tokenization of their text: the text comes from the observation's
   * formula for this shape (see {@link formulaFallbacks}), derived once per
   * tokenizer, tools and template kwargs. Shapes without a formula, and
   * encoders built with `method: "render"`, render the synthetic
   * conversation each time; both give the same ids.
   *
   * @param newMessages what follows an assistant turn: a run of `tool`
   *   messages, then zero or more `user` (or `system`) messages (`tool_agent`
   *   sends a run of tool results or one user turn; an agent behind the agent
   *   gateway may send tool results and a user turn at once). A template that
   *   cannot render the combination (Gemma 3: two user turns in a row) raises.
   * @throws TemplateError when the messages are not such a group, when the
   *   template raises, or when the template is not append-only for them (the
   *   synthetic assistant turn's close is not a token prefix of the render
   *   with the new messages) — never silently wrong tokens.
   * @param opts.closeTurn the turn ended complete without a stop id (a stop
   *   string matched): it is closed like a turn ended by a non-turn-end stop
   *   id (end-of-turn token, then the separator), not left open like a turn
   *   cut by `length`.
   */
  encode(newMessages: readonly ChatMessage[], lastTokenId: number | undefined, opts: { closeTurn?: boolean } = {}): number[] {
    if (newMessages.length === 0) throw new TemplateError("observation: no new messages to encode");
    // A run of tool results, then (optionally) user/system turns: what may follow an assistant turn.
    const tools = newMessages.findIndex((m) => m.role !== "tool");
    const nTools = tools < 0 ? newMessages.length : tools;
    for (let i = nTools; i < newMessages.length; i++) {
      const role = newMessages[i]!.role;
      if (role !== "user" && role !== "system") {
        throw new TemplateError(
          `observation: expected tool results and/or user/system messages after an assistant turn, got roles [${newMessages.map((m) => m.role).join(", ")}]`,
        );
      }
    }
    const body = (this.useFormula && this.core.formulaIds(newMessages)) || this.core.renderIds(newMessages, nTools);
    const close = opts.closeTurn && !this.tok.isStopToken(lastTokenId) ? [this.core.closeId(), ...this.core.turnSeparator()] : this.core.turnClose(lastTokenId);
    return close.length === 0 ? body : [...close, ...body];
  }

  /**
   * The ids that close an assistant turn whose last sampled id is
   * `lastTokenId` (step 1 of {@link encode}): the separator after a turn-end
   * id (`ChatTokenizer.turnEndIds`: the end-of-turn token, and e.g. Llama
   * 3.1's `<|eom_id|>`); end-of-turn token + separator after another stop id;
   * nothing otherwise.
   */
  turnClose(lastTokenId: number | undefined): number[] {
    return this.core.turnClose(lastTokenId);
  }

  /**
   * The ids the template puts after an assistant's end-of-turn token before
   * the next message (`[198]` for Qwen), found from a render; empty for
   * templates that put nothing there.
   */
  turnSeparator(): number[] {
    return this.core.turnSeparator();
  }

  /**
   * Which observation shapes this encoder renders per turn instead of using
   * a token formula, and why: one line per failing shape among `samples`
   * (default: one tool result, one with a `name`, two tool results, a user
   * turn, a tool result then a user turn), e.g.
   * `a tool result: the render with content "  x  " differs from the formula`.
   * Empty when every sample has a formula; shapes the template cannot
   * render at all are not listed. Derives (and caches) the formulas it
   * checks; never throws. The CLI prints the result in its start lines.
   */
  formulaFallbacks(samples: readonly (readonly ChatMessage[])[] = FORMULA_SAMPLES): string[] {
    const out: string[] = [];
    for (const msgs of samples) {
      const r = this.core.formulaFor(msgs);
      if (r?.ok) continue;
      const nTools = msgs.findIndex((m) => m.role !== "tool");
      try {
        this.core.renderIds(msgs, nTools < 0 ? msgs.length : nTools);
      } catch {
        continue; // the template cannot render this shape at all (Gemma 3: tool results then a user turn): not a fallback
      }
      out.push(`${what(msgs)}: ${r ? r.reason : "not a shape the formula covers"}`);
    }
    return out;
  }
}

/** The shapes {@link ObservationEncoder.formulaFallbacks} checks by default. */
const FORMULA_SAMPLES: readonly (readonly ChatMessage[])[] = [
  [{ role: "tool", content: "result" }],
  [{ role: "tool", content: "result", name: "tool" }],
  [
    { role: "tool", content: "result" },
    { role: "tool", content: "result" },
  ],
  [{ role: "user", content: "reply" }],
  [
    { role: "tool", content: "result" },
    { role: "user", content: "reply" },
  ],
];

/**
 * An observation formula: the text formula of the new messages (values as
 * {@link observationShape} lists them) and the generation prompt's ids, or
 * why the shape is rendered.
 */
type ObservationFormula = { ok: true; formula: TextFormula; genIds: number[] } | { ok: false; reason: string };

/** Per (tokenizer, tools, template kwargs) state shared by every encoder of a run: separator, synthetic histories, formulas. */
const cores = new WeakMap<ChatTokenizer, LRUCache<string, ObservationCore>>();

/**
 * The part of {@link ObservationEncoder} that depends only on the tokenizer,
 * the tools and the template kwargs, shared by every encoder built with them
 * (a run builds one encoder per trajectory; the formulas are derived once).
 */
class ObservationCore {
  /** {@link writesCallName} per tool-message roles and names. */
  private readonly callNameShapes = new Map<string, boolean>();
  private readonly tok: ChatTokenizer;
  private readonly opts: ObservationOptions;
  private separator: number[] | undefined;
  private separatorStr: string | undefined;
  private readonly toolHistories = new Map<number, ChatMessage[]>();
  /** Formulas by shape key ({@link observationShape}); failures are kept too, so a shape is derived once. */
  private readonly formulas = new Map<string, ObservationFormula>();
  /** Shapes seen once by {@link formulaIds}. */
  private readonly seen = new Set<string>();

  private constructor(tok: ChatTokenizer, opts: ObservationOptions) {
    this.tok = tok;
    this.opts = { tools: opts.tools, chatTemplateKwargs: opts.chatTemplateKwargs };
  }

  /** The shared core for `tok` and the options' tools and kwargs (at most 64 per tokenizer kept, least recently used dropped). */
  static for(tok: ChatTokenizer, opts: ObservationOptions): ObservationCore {
    let byKey = cores.get(tok);
    if (!byKey) {
      byKey = new LRUCache<string, ObservationCore>({ max: 64 });
      cores.set(tok, byKey);
    }
    const key = renderOptionsKey(opts.tools, opts.chatTemplateKwargs);
    let core = byKey.get(key);
    if (!core) {
      core = new ObservationCore(tok, opts);
      byKey.set(key, core);
    }
    return core;
  }

  /**
   * The formula for the shape of `newMessages` (derived on first use), or
   * undefined when the messages carry fields the formula does not cover
   * (tool calls, reasoning).
   */
  formulaFor(newMessages: readonly ChatMessage[]): ObservationFormula | undefined {
    const shape = observationShape(newMessages);
    if (!shape) return undefined;
    let f = this.formulas.get(shape.key);
    if (!f) {
      f = this.derive(newMessages, shape.values.length);
      this.formulas.set(shape.key, f);
    }
    return f;
  }

  /**
   * Ids of the new messages and the generation prompt from the shape's
   * formula: one tokenization of the formula's text. Undefined when the
   * shape has no formula, or is seen for the first time (the formula is
   * derived on its second use): the caller renders.
   */
  formulaIds(newMessages: readonly ChatMessage[]): number[] | undefined {
    const shape = observationShape(newMessages);
    if (!shape) return undefined;
    let f = this.formulas.get(shape.key);
    if (!f) {
      // Derived the second time a shape is seen: a one-off tools list (agent gateway) costs no derivation.
      if (!this.seen.has(shape.key)) {
        this.seen.add(shape.key);
        return undefined;
      }
      f = this.derive(newMessages, shape.values.length);
      this.formulas.set(shape.key, f);
    }
    return f.ok ? this.idsOf(f, shape.values) : undefined;
  }

  /**
   * Derives the formula of `like`'s shape: the synthetic conversation's
   * render (see {@link renderText}) with marker and probe values in the
   * shape's non-empty value slots. Requires the text to start with a
   * boundary token and the generation prompt to be constant and start with
   * one, so that one encode of the text equals the render path's two.
   */
  private derive(like: readonly ChatMessage[], count: number): ObservationFormula {
    const n = like.findIndex((m) => m.role !== "tool");
    const nTools = n < 0 ? like.length : n;
    const gens = new Set<string>();
    const rendered = new Map<string, { body: string; gen: string }>();
    const r = deriveTextFormula(count, (values) => {
      const parts = this.renderParts(withValues(like, values), nTools);
      if (!parts) throw new TemplateError("the observation text does not start with a boundary token");
      gens.add(parts.gen);
      rendered.set(values.join("\u0001"), parts);
      return parts.body + parts.gen;
    });
    if (!r.ok) return r;
    const gen = [...gens][0]!;
    const { texts, slots } = r.formula;
    const last = texts[texts.length - 1]!;
    if (gens.size !== 1 || !last.endsWith(gen)) return { ok: false, reason: "the generation prompt depends on the messages" };
    // The generation prompt is encoded once: the render path encodes it apart from the messages too.
    const formula = { texts: [...texts.slice(0, -1), last.slice(0, last.length - gen.length)], slots };
    const empty = slots.length === 0 && formula.texts[0] === "";
    if (!empty && !this.tok.startsWithBoundaryToken(formula.texts[0]!)) return { ok: false, reason: "the observation text does not start with a boundary token" };
    const f: ObservationFormula = { ok: true, formula, genIds: gen === "" ? [] : this.tok.encode(gen) };
    // The ids, not only the texts, must agree: check them on the probes as well.
    for (let p = 0; p < FORMULA_PROBES.length; p++) {
      const values = Array.from({ length: count }, (_, i) => FORMULA_PROBES[(p + i) % FORMULA_PROBES.length]!);
      // The render path's ids for these texts (both start at a boundary token: one encode each).
      const parts = rendered.get(values.join("\u0001"));
      const want = parts ? [...(parts.body === "" ? [] : this.tok.encode(parts.body)), ...(parts.gen === "" ? [] : this.tok.encode(parts.gen))] : this.renderIds(withValues(like, values), nTools);
      const got = this.idsOf(f, values);
      if (got.length !== want.length || got.some((id, i) => id !== want[i])) {
        return { ok: false, reason: `the ids of the formula's text differ from the render's for content ${JSON.stringify(values[0])}` };
      }
    }
    return f;
  }

  /** Ids of the new messages and the generation prompt from a formula: one tokenization of the messages' text, then the cached generation prompt. */
  private idsOf(f: ObservationFormula & { ok: true }, values: readonly string[]): number[] {
    const text = evaluateFormula(f.formula, values);
    const body = text === "" ? [] : this.tok.encode(text);
    return f.genIds.length === 0 ? body : body.concat(f.genIds);
  }

  /**
   * The render path: ids of the new messages and of the generation prompt,
   * from one render of the synthetic conversation with them (and one with
   * the generation prompt); see {@link ObservationEncoder}.
   */
  renderIds(newMessages: readonly ChatMessage[], nTools: number): number[] {
    const { history, fullText, prefixText } = this.renderFull(newMessages, nTools);
    const body = this.suffix({ text: prefixText }, { text: fullText }, "new messages");
    const genPrompt = this.suffix({ text: fullText }, { text: this.renderText([...history, ...newMessages], true) }, "generation prompt");
    return genPrompt.length === 0 ? body : [...body, ...genPrompt];
  }

  /**
   * The render path's texts when its ids are one tokenization each: the
   * new messages' text (`body`, empty or starting with a boundary token)
   * and the generation prompt's (`gen`, likewise); undefined otherwise.
   */
  private renderParts(newMessages: readonly ChatMessage[], nTools: number): { body: string; gen: string } | undefined {
    const { history, fullText, prefixText } = this.renderFull(newMessages, nTools);
    const withGen = this.renderText([...history, ...newMessages], true);
    if (!fullText.startsWith(prefixText) || !withGen.startsWith(fullText)) return undefined;
    const body = fullText.slice(prefixText.length);
    const gen = withGen.slice(fullText.length);
    if ((body !== "" && !this.tok.startsWithBoundaryToken(body)) || (gen !== "" && !this.tok.startsWithBoundaryToken(gen))) return undefined;
    return { body, gen };
  }

  /** The synthetic conversation's render with `newMessages` and the text up to the new messages (see {@link ObservationEncoder}). */
  private renderFull(newMessages: readonly ChatMessage[], nTools: number): { history: ChatMessage[]; fullText: string; prefixText: string } {
    const history = nTools > 0 ? this.toolHistory(nTools) : ANSWER_HISTORY;
    const full = [...history, ...newMessages];
    const fullText = this.renderText(full, false);
    // After the last synthetic call: harmony closes each call message with its own <|call|>.
    const at = nTools > 0 ? this.turnEndIn(fullText, CALL_MARKER, nTools) : this.turnEndIn(fullText, ANSWER_MARKER);
    let prefixText: string;
    if (at >= 0) {
      const sep = this.separatorText();
      if (!fullText.startsWith(sep, at)) {
        throw new TemplateError(`chat template of ${this.tok.name}: the turn separator ${JSON.stringify(sep)} does not follow the assistant turn when ${what(newMessages)} follow it`);
      }
      prefixText = fullText.slice(0, at + sep.length);
    } else {
      // A template that writes no end-of-turn token after the assistant turn: diff against the history's own render.
      prefixText = this.renderText(history, false);
    }
    // A template that writes the answered call's name into a tool result (harmony: `functions.{name}`) takes it
    // from the message's `name`, else from the call it answers — here the synthetic one: never write that.
    if (nTools > 0 && newMessages.some((m) => m.role === "tool" && !m.name) && this.writesCallName(newMessages, nTools)) {
      throw new TemplateError(
        `observation: the chat template of ${this.tok.name} writes the answered call's name into each tool result, and a tool message has no name: ` +
          "give each tool message its call's function name (`name`, or a `tool_call_id` matching a call of the assistant turn)",
      );
    }
    return { history, fullText, prefixText };
  }

  /**
   * Whether the template writes the answered call's name into these tool
   * results (judged on a render with empty contents, so a result that merely
   * mentions the synthetic name does not count). Cached per roles and names.
   */
  private writesCallName(newMessages: readonly ChatMessage[], nTools: number): boolean {
    const key = `${nTools}:${newMessages.map((m) => `${m.role}:${m.name ?? ""}`).join("\u0001")}`;
    let v = this.callNameShapes.get(key);
    if (v === undefined) {
      const bare = newMessages.map((m) => ({ ...m, content: "" }));
      const history = this.toolHistory(nTools);
      const text = this.renderText([...history, ...bare], false);
      const at = this.turnEndIn(text, CALL_MARKER, nTools);
      const prefix = at >= 0 ? at : this.renderText(history, false).length;
      v = text.slice(prefix).includes(CALL_MARKER);
      this.callNameShapes.set(key, v);
    }
    return v;
  }

  /** The id written after a non-turn-end stop id: the family's `closeToken` (harmony: `<|end|>`), else the end-of-turn token. */
  closeId(): number {
    const t = this.tok.traits.closeToken;
    const id = t === undefined ? undefined : this.tok.tokenId(t);
    if (t !== undefined && id === undefined) throw new TemplateError(`model ${this.tok.name}: close token ${t} is not in the vocabulary`);
    return id ?? this.tok.eosTokenId;
  }

  /** See {@link ObservationEncoder.turnClose}. */
  turnClose(lastTokenId: number | undefined): number[] {
    if (lastTokenId !== undefined && this.tok.turnEndIds.includes(lastTokenId)) return this.turnSeparator();
    if (this.tok.isStopToken(lastTokenId)) return [this.closeId(), ...this.turnSeparator()];
    return [];
  }

  /** See {@link ObservationEncoder.turnSeparator}. */
  turnSeparator(): number[] {
    if (this.separator) return this.separator;
    const text = this.renderText(ANSWER_HISTORY, false);
    if (this.turnEndIn(text, ANSWER_MARKER) < 0) {
      throw new TemplateError(`template of ${this.tok.name}: an assistant turn does not end with the eos token ${this.tok.eosTokenId}`);
    }
    this.separator = this.separatorText() === "" ? [] : this.tok.encode(this.separatorText());
    return this.separator;
  }

  /**
   * The separator's text: what the template writes after an assistant
   * turn's end-of-turn token (read from a render of [system, user, assistant]).
   */
  private separatorText(): string {
    if (this.separatorStr === undefined) {
      const text = this.renderText(ANSWER_HISTORY, false);
      const at = this.turnEndIn(text, ANSWER_MARKER);
      this.separatorStr = at < 0 ? "" : text.slice(at);
    }
    return this.separatorStr;
  }

  /**
   * Index just past the turn-end token (`ChatTokenizer.turnEndIds`) that
   * closes the synthetic assistant turn holding `marker` (after its
   * `occurrence`-th appearance: one per synthetic call), or -1 when the
   * template renders none after it (or does not render the marker).
   */
  private turnEndIn(text: string, marker: string, occurrence = 1): number {
    // The `occurrence`-th marker (or the last one when the template writes fewer).
    let m = text.indexOf(marker);
    if (m < 0) return -1;
    for (let k = 1; k < occurrence; k++) {
      const next = text.indexOf(marker, m + 1);
      if (next < 0) break;
      m = next;
    }
    // The earliest turn-end token after the marker: the end-of-turn token, or another one the
    // template closes assistant turns with (gpt-oss renders `<|call|>` and `<|end|>`, never `<|return|>`).
    let best = -1;
    for (const id of this.tok.turnEndIds) {
      const t = this.tok.idToToken(id)!;
      const e = text.indexOf(t, m + marker.length);
      if (e >= 0 && (best < 0 || e + t.length < best)) best = e + t.length;
    }
    return best;
  }

  /** Synthetic history for a tool group: system, user, an assistant turn with one call per tool message. */
  private toolHistory(calls: number): ChatMessage[] {
    let h = this.toolHistories.get(calls);
    if (!h) {
      h = [
        SYNTHETIC_SYSTEM,
        SYNTHETIC_USER,
        {
          role: "assistant",
          content: "",
          reasoning_content: "reasoning",
          tool_calls: Array.from({ length: calls }, (_, i) => ({
            id: `continuous_token_call_${i}`,
            type: "function" as const,
            function: { name: CALL_MARKER, arguments: {} },
          })),
        },
      ];
      this.toolHistories.set(calls, h);
    }
    return h;
  }

  private renderText(messages: readonly ChatMessage[], addGenerationPrompt: boolean): string {
    return this.tok.renderText(messages, {
      tools: this.opts.tools,
      addGenerationPrompt,
      chatTemplateKwargs: this.opts.chatTemplateKwargs,
    });
  }

  /**
   * The ids of `longer` past its prefix `shorter`. When the new text starts
   * with a boundary token (Qwen: `<|im_start|>`), only the new text is
   * encoded — the tokenizer splits there anyway, so this equals the token
   * diff of the two full encodings, at a fraction of the cost. Otherwise both
   * renders are encoded and diffed; throws when `shorter` is not a token
   * prefix of `longer`.
   */
  private suffix(shorter: Render, longer: Render, what: string): number[] {
    if (longer.text.startsWith(shorter.text)) {
      const rest = longer.text.slice(shorter.text.length);
      if (rest === "") return [];
      if (this.tok.startsWithBoundaryToken(rest)) return this.tok.encode(rest);
    }
    const a = shorter.ids ?? this.tok.encode(shorter.text);
    const b = longer.ids ?? this.tok.encode(longer.text);
    const n = a.length;
    let ok = b.length >= n;
    for (let i = 0; ok && i < n; i++) if (a[i] !== b[i]) ok = false;
    if (!ok) {
      throw new TemplateError(
        `chat template of ${this.tok.name} is not append-only for the ${what}: the shorter render is not a token prefix of the longer one`,
      );
    }
    return b.slice(n);
  }
}

/**
 * The shape of an observation for its formula, and its values: per message
 * the role, then for its content, `name` and `tool_call_id` whether each is
 * absent (`-`), empty (`0`, a constant of the shape: templates test `if
 * content`) or a value (`1`). The values are the non-empty ones in message
 * order (content, name, tool_call_id). Undefined for messages with tool
 * calls or reasoning, which the formula does not cover.
 */
function observationShape(messages: readonly ChatMessage[]): { key: string; values: string[] } | undefined {
  let key = "";
  const values: string[] = [];
  const field = (v: string | undefined) => {
    if (v === undefined) return "-";
    if (v === "") return "0";
    values.push(v);
    return "1";
  };
  for (const m of messages) {
    if ((m.tool_calls && m.tool_calls.length > 0) || m.reasoning_content !== undefined) return undefined;
    key += m.role + field(contentText(m.content)) + field(m.name) + field(m.tool_call_id) + "|";
  }
  return { key, values };
}

/** Messages of `like`'s shape with `values` in its non-empty value slots (the inverse of {@link observationShape}). */
function withValues(like: readonly ChatMessage[], values: readonly string[]): ChatMessage[] {
  let i = 0;
  const pick = (v: string | undefined) => (v === undefined ? undefined : v === "" ? "" : values[i++]!);
  return like.map((m) => {
    const out: ChatMessage = { role: m.role, content: pick(contentText(m.content))! };
    const name = pick(m.name);
    if (name !== undefined) out.name = name;
    const id = pick(m.tool_call_id);
    if (id !== undefined) out.tool_call_id = id;
    return out;
  });
}

/** A render: its text, and its ids when already encoded. */
interface Render {
  text: string;
  ids?: number[];
}
