import { TemplateError } from "../errors.ts";
import type { ChatMessage, ToolSchema } from "../schema/index.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

/** Options for {@link ObservationEncoder}. */
export interface ObservationOptions {
  /** The tool schemas the prompt was rendered with (so the template's tools preamble matches and is diffed away). */
  tools?: readonly ToolSchema[];
  /** Extra chat-template variables, e.g. `{enable_thinking: false}`; also shape the generation prompt. */
  chatTemplateKwargs?: Record<string, unknown>;
}

const SYNTHETIC_SYSTEM: ChatMessage = { role: "system", content: "continuous token synthetic system" };
const SYNTHETIC_USER: ChatMessage = { role: "user", content: "continuous token synthetic user" };

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
 * 2. the tokens the template renders for the new messages *in context*, found
 *    as the difference between two renders of a short synthetic conversation
 *    (with and without the new messages), so that whatever the template
 *    prepends for a fresh conversation (Qwen's `# Tools` system block) is
 *    removed exactly and history rewriting (Qwen3 dropping earlier `<think>`
 *    blocks) never affects the result;
 * 3. the generation prompt of the next assistant turn.
 *
 * All of it is observation (mask 0). With an append-only template, prompt ‖
 * response then equals the template's own render of the whole conversation.
 *
 * @see verl's Continuous Token builder (`verl/utils/tokenizer/continuous_token.py`),
 *   whose synthetic-prefix diff this follows.
 */
export class ObservationEncoder {
  private readonly tok: ChatTokenizer;
  private readonly opts: ObservationOptions;
  private separator: number[] | undefined;
  private readonly prefixCache = new Map<string, Render>();

  constructor(tok: ChatTokenizer, opts: ObservationOptions = {}) {
    this.tok = tok;
    this.opts = opts;
  }

  /**
   * Observation ids for `newMessages` appended after a turn whose last sampled
   * id is `lastTokenId` (undefined when nothing was sampled yet).
   *
   * @param newMessages one or more consecutive `tool` messages, or exactly one
   *   `user` (or `system`) message.
   * @throws TemplateError when the messages are not such a group, or when the
   *   template is not append-only for them (a render of the shorter
   *   conversation is not a token prefix of the longer one) — never silently
   *   wrong tokens.
   */
  encode(newMessages: readonly ChatMessage[], lastTokenId: number | undefined): number[] {
    if (newMessages.length === 0) throw new TemplateError("observation: no new messages to encode");
    const allTools = newMessages.every((m) => m.role === "tool");
    const oneTurn = newMessages.length === 1 && (newMessages[0]!.role === "user" || newMessages[0]!.role === "system");
    if (!allTools && !oneTurn) {
      throw new TemplateError(
        `observation: expected a run of tool messages or one user/system message, got roles [${newMessages.map((m) => m.role).join(", ")}]`,
      );
    }
    const prefix = allTools ? this.toolPrefix(newMessages.length) : [SYNTHETIC_SYSTEM, SYNTHETIC_USER];
    const full = [...prefix, ...newMessages];
    const prefixRender = this.prefixRender(prefix, allTools ? `tool:${newMessages.length}` : "user");
    const fullText = this.renderText(full, false);
    const body = this.suffix(prefixRender, { text: fullText }, "new messages");
    const genPrompt = this.suffix({ text: fullText }, { text: this.renderText(full, true) }, "generation prompt");
    return [...this.turnClose(lastTokenId), ...body, ...genPrompt];
  }

  /**
   * The ids that close an assistant turn whose last sampled id is
   * `lastTokenId` (step 1 of {@link encode}): the separator after the
   * end-of-turn token; end-of-turn token + separator after another stop id;
   * nothing otherwise.
   */
  turnClose(lastTokenId: number | undefined): number[] {
    if (lastTokenId === this.tok.eosTokenId) return this.turnSeparator();
    if (this.tok.isStopToken(lastTokenId)) return [this.tok.eosTokenId, ...this.turnSeparator()];
    return [];
  }

  /**
   * The ids the template puts after an assistant's end-of-turn token before
   * the next message (`[198]` for Qwen), found from a render; empty for
   * templates that put nothing there.
   */
  turnSeparator(): number[] {
    if (this.separator) return this.separator;
    const ids = this.render([SYNTHETIC_SYSTEM, SYNTHETIC_USER, { role: "assistant", content: "synthetic answer" }], false);
    const eos = ids.lastIndexOf(this.tok.eosTokenId);
    if (eos < 0) {
      throw new TemplateError(`template of ${this.tok.name}: an assistant turn does not end with the eos token ${this.tok.eosTokenId}`);
    }
    this.separator = ids.slice(eos + 1);
    return this.separator;
  }

  /** Synthetic history for a tool group: an assistant turn with one call per tool message. */
  private toolPrefix(calls: number): ChatMessage[] {
    return [
      SYNTHETIC_SYSTEM,
      SYNTHETIC_USER,
      {
        role: "assistant",
        content: "",
        reasoning_content: "reasoning",
        tool_calls: Array.from({ length: calls }, (_, i) => ({
          id: `continuous_token_call_${i}`,
          type: "function" as const,
          function: { name: "continuous_token_tool", arguments: {} },
        })),
      },
    ];
  }

  private prefixRender(prefix: ChatMessage[], cacheKey: string): Render {
    let r = this.prefixCache.get(cacheKey);
    if (!r) {
      const text = this.renderText(prefix, false);
      r = { text, ids: this.tok.encode(text) };
      this.prefixCache.set(cacheKey, r);
    }
    return r;
  }

  private renderText(messages: ChatMessage[], addGenerationPrompt: boolean): string {
    return this.tok.renderText(messages, {
      tools: this.opts.tools,
      addGenerationPrompt,
      chatTemplateKwargs: this.opts.chatTemplateKwargs,
    });
  }

  private render(messages: ChatMessage[], addGenerationPrompt: boolean): number[] {
    return this.tok.encode(this.renderText(messages, addGenerationPrompt));
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

/** A render: its text, and its ids when already encoded. */
interface Render {
  text: string;
  ids?: number[];
}
