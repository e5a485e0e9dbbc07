import type { ToolSchema } from "../schema/index.ts";
import { ObservationEncoder } from "./observation.ts";
import { promptFormulaFallback } from "./prompt.ts";
import type { ChatTokenizer } from "./tokenizer.ts";

/**
 * Start-up lines saying where a model's template falls back from token
 * formulas to rendering (issue 19): one line for observations
 * (`observations: template render per turn (formula check failed for …)`)
 * and one for initial prompts, each only when some common shape fails its
 * check — one tool result, one with a name, two, a user turn, tool results
 * then a user turn; prompts `[user]` and `[system, user]`. Empty when every
 * shape has a formula (the built-in families). Derives and caches the
 * formulas (a few ms per shape, once per tokenizer, tools and kwargs);
 * never throws.
 */
export function tokenMethodFallbacks(tok: ChatTokenizer, opts: { tools?: readonly ToolSchema[]; chatTemplateKwargs?: Record<string, unknown> } = {}): string[] {
  const lines: string[] = [];
  const obs = new ObservationEncoder(tok, opts).formulaFallbacks();
  if (obs.length > 0) lines.push(`observations: template render per turn (formula check failed for ${obs.join("; ")})`);
  const prompts: string[] = [];
  for (const shape of [[{ role: "user" as const, content: "question" }], [{ role: "system" as const, content: "system" }, { role: "user" as const, content: "question" }]]) {
    const why = promptFormulaFallback(tok, shape, opts);
    if (why !== undefined) prompts.push(`[${shape.map((m) => m.role).join(", ")}]: ${why}`);
  }
  if (prompts.length > 0) lines.push(`initial prompts: full render per row (formula check failed for ${prompts.join("; ")})`);
  return lines;
}
