import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { fnv1a32 } from "../../shared/inference/hash.ts";
import { assistantOpeners } from "./family-text.ts";
import type { SimRule, SimScript, SimTurn } from "./script.ts";

/** The turn a prompt resolves to: its rule (−1: none), the turn's index and script entry, the open turn's tokens so far. */
export interface ResolvedTurn {
  rule_index: number;
  turn_index: number;
  turn: SimTurn;
  open: number[] | undefined;
  /** Whether the turn is the rule's own (else the script's default). */
  scripted: boolean;
  /** Which turn list of the rule was played (see `SimRule.variants`). */
  variant: number;
}

/** Counts the assistant turns a prompt already holds, in the tokenizer's family's markup (`<|im_start|>assistant`, else its openers). */
export class AssistantTurns {
  private readonly header: number[];
  /** The ids of "\n" (what an unscripted turn repeats when it has no text of its own). */
  readonly newline: number[];
  private readonly imStart?: number;
  private readonly openers: { openers: number[][]; tail: number[] };

  constructor(private readonly tokenizer: ChatTokenizer) {
    this.imStart = this.tokenizer.tokenId("<|im_start|>");
    this.header = this.imStart === undefined ? [] : this.tokenizer.encode("<|im_start|>assistant");
    this.newline = this.tokenizer.encode("\n");
    // Other families (no <|im_start|>): their generation prompt opens an assistant turn.
    this.openers = this.imStart === undefined ? assistantOpeners(this.tokenizer) : { openers: [], tail: [] };
  }

  /**
   * Number of assistant turns already in the prompt: occurrences of
   * `<|im_start|>assistant`, not counting the last one while it is still open
   * (no `<|im_end|>` or `<|im_start|>` after it: the generation prompt, or a
   * turn being resumed after an abort). Also returns the open turn's tokens
   * after `assistant\n` (what was generated of it so far).
   */
  count(ids: readonly number[]): { count: number; open: number[] | undefined } {
    if (this.imStart === undefined) return this.familyAssistantTurns(ids);
    const h = this.header;
    if (h.length === 0) return { count: 0, open: undefined };
    let count = 0;
    let last = -1;
    for (let i = 0; i + h.length <= ids.length; i++) {
      let ok = true;
      for (let j = 0; j < h.length; j++) if (ids[i + j] !== h[j]) { ok = false; break; }
      if (ok) {
        count++;
        last = i;
      }
    }
    if (last < 0) return { count: 0, open: undefined };
    let start = last + h.length;
    for (let i = start; i < ids.length; i++) {
      if (this.tokenizer.isStopToken(ids[i]) || ids[i] === this.imStart) return { count, open: undefined };
    }
    if (this.newline.length === 1 && ids[start] === this.newline[0]) start++;
    return { count: count - 1, open: ids.slice(start) as number[] };
  }

  /**
   * {@link count} for families without `<|im_start|>`: occurrences
   * of any opener (see `assistantOpeners`), the last one open when no stop,
   * turn-end id or opener follows it.
   */
  private familyAssistantTurns(ids: readonly number[]): { count: number; open: number[] | undefined } {
    let count = 0;
    let last = -1;
    let lastLen = 0;
    const firsts = new Set(this.openers.openers.map((o) => o[0]));
    for (let i = 0; i < ids.length; i++) {
      for (const o of this.openers.openers) {
        if (o.length > 0 && i + o.length <= ids.length && o.every((t, j) => ids[i + j] === t) && !this.continuesAssistant(ids, i, o)) {
          count++;
          last = i;
          lastLen = o.length;
          break;
        }
      }
    }
    if (last < 0) return { count: 0, open: undefined };
    let start = last + lastLen;
    for (let i = start; i < ids.length; i++) {
      if (this.tokenizer.isStopToken(ids[i]) || this.tokenizer.turnEndIds.includes(ids[i]!) || firsts.has(ids[i])) return { count, open: undefined };
    }
    const tail = this.openers.tail;
    if (tail.length > 0 && tail.every((t, j) => ids[start + j] === t)) start += tail.length;
    return { count: count - 1, open: ids.slice(start) as number[] };
  }

  /**
   * Harmony writes one `<|start|>assistant` per message, and one assistant
   * turn holds several (analysis, then a call or the final answer): an
   * opener whose previous message is also the assistant's continues the
   * same turn.
   */
  private continuesAssistant(ids: readonly number[], i: number, opener: readonly number[]): boolean {
    if (this.tokenizer.traits.family !== "gpt_oss") return false;
    const start = opener[0];
    for (let j = i - 1; j >= 0; j--) if (ids[j] === start) return opener.every((t, k) => ids[j + k] === t);
    return false;
  }
}

/** The rule that applies to a prompt (the first whose `when` its text contains; −1: none) and the turn to play. */
export function resolveTurn(script: SimScript, tokenizer: ChatTokenizer, turns: AssistantTurns, ids: readonly number[], routingKey?: string): ResolvedTurn {
  const { count, open } = turns.count(ids);
  let ruleIndex = -1;
  let rule: SimRule | undefined;
  if (script.rules.length > 0) {
    const text = ids.length === 0 ? "" : tokenizer.decode(ids);
    ruleIndex = script.rules.findIndex((r) => text.includes(r.when));
    rule = ruleIndex >= 0 ? script.rules[ruleIndex] : undefined;
  }
  const variant = rule ? variantOf(script.seed, rule, ruleIndex, routingKey) : 0;
  const list = rule ? (variant === 0 ? rule.turns : rule.variants![variant - 1]!) : [];
  let turn: SimTurn;
  let scripted = false;
  if (rule && count < list.length) {
    turn = list[count];
    scripted = true;
  }
  else {
    const d = script.default;
    turn = d[Math.min(count - list.length, d.length - 1)];
  }
  return { rule_index: ruleIndex, turn_index: count, turn, open, scripted, variant };
}

/**
 * Which turn list of `rule` a trajectory plays (see `SimRule.variants`): 0
 * for `turns`, k for `variants[k − 1]`, drawn from (seed, rule index, the
 * session index in the routing key `{uid}_{session_id}_{output}`).
 */
function variantOf(seed: number, rule: SimRule, ruleIndex: number, routingKey: string | undefined): number {
  const n = rule.variants?.length ?? 0;
  if (n === 0 || routingKey === undefined) return 0;
  const m = /_(\d+)_\d+$/.exec(routingKey);
  if (!m) return 0;
  return fnv1a32(`${seed}:variant:${ruleIndex}:${m[1]}`) % (n + 1);
}
