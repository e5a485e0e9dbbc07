import type { ChatMessage } from "../schema/index.ts";
import type { AgentOutputState, AgentSessionState } from "./agent-session.ts";
import { comparable, jsonEqual, namedToolResults } from "./conversation.ts";

/**
 * Where a call's request sits in the session's trajectory tree (see
 * {@link planTurn}):
 * - `continue`: it continues `out` at its end (the new messages `added`,
 *   encoded incrementally onto it, as a linear session does);
 * - `branch`: it opens a new output sharing `parent`'s first `messages`
 *   messages and its prompt ‖ response up to token `at` — after a sampled
 *   turn (`point: "after"`, the request's `added` messages follow), at a
 *   sampled turn's start (`"reask"`, the same messages sampled again, nothing
 *   added), or inside the parent's prompt (`"prompt"`, e.g. a sub-agent
 *   given the parent's first messages and its own; `at` is found by
 *   rendering, see the gateway);
 * - `root`: it shares no continuable point with any output: a fresh render.
 */
export type TurnPlan =
  | { kind: "continue"; out: AgentOutputState; added: ChatMessage[] }
  | { kind: "branch"; point: "after" | "reask"; parent: AgentOutputState; at: number; messages: number; added: ChatMessage[] }
  | { kind: "branch"; point: "prompt"; parent: AgentOutputState; messages: number }
  | { kind: "root" };

/** Comparable forms of the messages an output holds, by message object (a branch shares its parent's objects). */
const comparables = new WeakMap<ChatMessage, unknown>();

function comparableOf(m: ChatMessage): unknown {
  let c = comparables.get(m);
  if (c === undefined) {
    c = comparable(m);
    comparables.set(m, c);
  }
  return c;
}

/** The messages an observation may add after an assistant turn: tool results, then user/system turns. */
function observationShape(added: readonly ChatMessage[]): boolean {
  if (added.length === 0) return false;
  let i = 0;
  while (i < added.length && added[i]!.role === "tool") i++;
  for (; i < added.length; i++) if (added[i]!.role !== "user" && added[i]!.role !== "system") return false;
  return true;
}

/**
 * The deepest point of the session's trajectory tree that `messages`
 * extend, among all outputs rendered with the same tools (`toolsKey`):
 * messages are compared as {@link comparable} forms (what a continuation
 * compares; tool results named from the request's own calls), once per
 * output and message, so a call costs O(outputs × matched messages).
 * Deeper is more messages on the point's path (a continuation in place puts
 * all of them there), then a continuation in place (it wins over a re-ask of
 * another output whose messages read the same; among those, one whose last
 * reply's tool-call ids the request echoes — siblings whose samples read
 * alike are told apart by the ids they were given — then the latest output,
 * as a linear session continues its current output), then more shared tokens,
 * then the earliest output (the ancestor that owns the shared tokens). Points are message boundaries only: the end of a
 * sampled turn whose output went on (`after`), the start of a sampled turn
 * (`reask`), or a boundary among the messages a prompt rendered (`prompt`,
 * to be checked by tokens by the caller). Only outputs of the call's agent
 * `role` are candidates ({@link sameRole}): a role's tokens never enter
 * another role's output, so a call of a new role opens a root. Pure: nothing
 * is changed.
 */
export function planTurn(st: AgentSessionState, messages: readonly ChatMessage[], toolsKey: string, role?: { name: string }): TurnPlan {
  const named = namedToolResults(messages.slice(), messages);
  const mine = named.map(comparable);
  let best: { plan: TurnPlan; depth: number; at: number; inPlace: boolean; ids: boolean; index: number } | null = null;
  const offer = (plan: TurnPlan, depth: number, at: number, inPlace: boolean, index: number, ids = false) => {
    if (best) {
      if (depth !== best.depth) {
        if (depth < best.depth) return;
      } else if (inPlace !== best.inPlace) {
        if (!inPlace) return;
      } else if (ids !== best.ids) {
        if (!ids) return;
      } else if (at !== best.at) {
        if (at < best.at) return;
      } else if (inPlace ? index < best.index : index > best.index) return;
    }
    best = { plan, depth, at, inPlace, ids, index };
  };
  for (const out of st.outputs) {
    if (out.toolsKey !== toolsKey || !sameRole(out, role)) continue;
    const h = out.messages;
    let k = 0;
    const n = Math.min(h.length, mine.length);
    while (k < n && jsonEqual(comparableOf(h[k]!), mine[k])) k++;
    if (k === 0) continue;
    // A continuation in place: the request repeats all of the output and adds an observation.
    if (k === h.length && !out.ended && h[h.length - 1]!.role === "assistant" && observationShape(messages.slice(k))) {
      const last = out.turns[out.turns.length - 1];
      if (last && last.msg === h.length - 1 && last.end === out.builder.contextLength) {
        // Every message of the request is then on this output's path: as deep as any point can be.
        // Among outputs that read alike (siblings of one re-ask whose samples are equal), the one whose reply's tool-call ids the request echoes.
        offer({ kind: "continue", out, added: messages.slice(k) }, messages.length, last.end, true, out.index, sameCallIds(messages[k - 1]!, h[h.length - 1]!));
        continue;
      }
    }
    // The deepest sampled turn this request reaches: a re-ask of it, or a branch after it.
    let found = false;
    for (let t = out.turns.length - 1; t >= 0 && !found; t--) {
      const m = out.turns[t]!;
      if (m.msg === messages.length && k >= m.msg) {
        offer({ kind: "branch", point: "reask", parent: out, at: m.start, messages: m.msg, added: [] }, m.msg, m.start, false, out.index);
        found = true;
      } else if (m.after && k >= m.msg + 1 && messages.length > m.msg + 1 && observationShape(messages.slice(m.msg + 1))) {
        offer({ kind: "branch", point: "after", parent: out, at: m.end, messages: m.msg + 1, added: messages.slice(m.msg + 1) }, m.msg + 1, m.end, false, out.index);
        found = true;
      }
    }
    if (found) continue;
    // A boundary among the messages the prompt rendered (checked by tokens by the caller).
    const j = Math.min(k, out.promptMessages);
    if (j >= 1 && (j < messages.length || j < out.promptMessages)) offer({ kind: "branch", point: "prompt", parent: out, messages: j }, j, 0, false, out.index);
  }
  return best ? (best as { plan: TurnPlan }).plan : { kind: "root" };
}

/** Whether `a` (the request's) and `b` (recorded) are assistant messages with tool calls of the same ids, in order. */
function sameCallIds(a: ChatMessage, b: ChatMessage): boolean {
  const x = a.role === "assistant" ? a.tool_calls : undefined;
  const y = b.role === "assistant" ? b.tool_calls : undefined;
  return !!x && !!y && x.length > 0 && x.length === y.length && x.every((c, i) => c.id === y[i]!.id);
}

/** Whether a call of `role` may continue or branch from `out`: the same role, or neither has one (a role's tokens never enter another role's output). */
export function sameRole(out: AgentOutputState, role: { name: string } | undefined): boolean {
  return (out.role?.name ?? null) === (role?.name ?? null);
}
