import type { AppConfig } from "../../shared/config/app-config.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";

// What `edgeloop doctor` reads in an engine's replies, per wire format: where the ids and log-probs are
// (or why they are absent, and the fix), the reply's text; and the Prometheus sums of its load check.

/** `engine.format`: the wire format the replies are read in. */
export type EngineFormat = AppConfig["engine"]["format"];

/** Whether the reply carries no ids in any of the forms the adapters read (as against ids that are there but refused). */
export function idsAbsent(format: EngineFormat, body: unknown): boolean {
  const b = (body ?? {}) as Record<string, unknown>;
  if (format === "sglang") {
    const lps = (b.meta_info as Record<string, unknown> | undefined)?.output_token_logprobs;
    return b.output_ids == null && b.token_ids == null && !(Array.isArray(lps) && lps.length > 0);
  }
  const c = (Array.isArray(b.choices) ? b.choices[0] : undefined) as Record<string, unknown> | undefined;
  if (!c) return false;
  if (c.token_ids != null) return false;
  const lp = c.logprobs as Record<string, unknown> | null | undefined;
  if (format === "vllm-generate") {
    const content = lp?.content;
    return !(Array.isArray(content) && content.some((x) => x && (typeof (x as { token_id?: unknown }).token_id === "number" || /^token_id:\d+$/.test(String((x as { token?: unknown }).token)))));
  }
  const tokens = lp?.tokens;
  return !(Array.isArray(tokens) && tokens.some((t) => /^token_id:\d+$/.test(String(t))));
}

/** The fix of a reply without token ids, per format. */
export function idsFix(format: EngineFormat): string {
  if (format === "sglang") return "the reply has no output_ids (nor ids in meta_info.output_token_logprobs): edgeloop never re-encodes text; serve SGLang's native /generate unmodified (a proxy in front may strip them)";
  if (format === "vllm-generate") return "the reply has no choices[0].token_ids (nor ids in logprobs.content): edgeloop never re-encodes text; a proxy in front may strip them";
  return "the reply has neither choices[0].token_ids nor token_id:N strings in logprobs.tokens: edgeloop never re-encodes text; it needs vLLM >= 0.10.2 (return_token_ids) or a server that honours return_tokens_as_token_ids";
}

/** Where the ids came from, for the ok line. */
export function idsSource(format: EngineFormat, body: unknown): string {
  const b = (body ?? {}) as Record<string, unknown>;
  if (format === "sglang") return b.output_ids != null ? "output_ids" : b.token_ids != null ? "token_ids" : "meta_info.output_token_logprobs";
  const c = ((b.choices as unknown[])?.[0] ?? {}) as Record<string, unknown>;
  if (c.token_ids != null) return "choices[0].token_ids";
  return format === "vllm-generate" ? "choices[0].logprobs.content" : "token_id:N strings in choices[0].logprobs.tokens (no token_ids: vLLM < 0.10.2)";
}

/** Whether the reply carries no log-probs where the format puts them. */
export function logprobsAbsent(format: EngineFormat, body: unknown): boolean {
  const b = (body ?? {}) as Record<string, unknown>;
  if (format === "sglang") return (b.meta_info as Record<string, unknown> | undefined)?.output_token_logprobs == null;
  const c = ((b.choices as unknown[])?.[0] ?? {}) as Record<string, unknown>;
  const lp = c.logprobs as Record<string, unknown> | null | undefined;
  if (lp == null) return true;
  return format === "vllm-generate" ? lp.content == null : lp.token_logprobs == null;
}

/** The fix of a reply without log-probs, per format. */
export function logprobsFix(format: EngineFormat): string {
  if (format === "sglang") return "the reply has no meta_info.output_token_logprobs although return_logprob was sent: rollout_log_probs need one per sampled token; a proxy in front may strip meta_info";
  return `the reply has no ${format === "vllm-generate" ? "choices[0].logprobs.content" : "choices[0].logprobs.token_logprobs"} although logprobs: 0 was sent: rollout_log_probs need one per sampled token; a proxy in front may strip them`;
}

/** Index of the first position where `a` and `b` differ (a length difference counts at the shorter end), −1 when equal. */
export function firstDifference(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
  return a.length === b.length ? -1 : n;
}

/** The reply's `text` (vLLM completions `choices[0].text`, SGLang `text`); the generate endpoint has none (it does not detokenize). */
export function replyText(format: EngineFormat, body: unknown): string | undefined {
  const b = (body ?? {}) as Record<string, unknown>;
  if (format === "vllm-generate") return undefined;
  const t = format === "sglang" ? b.text : ((b.choices as unknown[] | undefined)?.[0] as Record<string, unknown> | undefined)?.text;
  return typeof t === "string" ? t : undefined;
}

/**
 * Whether `ids` decode through `tok` to the engine's `text`: with or without
 * the final stop id (vLLM leaves a stop token's text out) and special tokens,
 * and, as a last resort, ignoring whitespace (engines space special tokens
 * their own way); another tokenizer's decode differs in its words.
 */
export function decodesTo(tok: ChatTokenizer, ids: readonly number[], text: string): boolean {
  const variants: (readonly number[])[] = [ids];
  if (ids.length > 0 && tok.isStopToken(ids[ids.length - 1])) variants.push(ids.slice(0, -1));
  const squash = (s: string) => s.replace(/\s+/g, "");
  for (const v of variants) {
    for (const skipSpecialTokens of [false, true]) {
      let d: string;
      try {
        d = tok.decode(v, { skipSpecialTokens });
      } catch {
        continue;
      }
      if (d === text || squash(d) === squash(text)) return true;
    }
  }
  return false;
}

/**
 * The sum of the samples of the named metrics in a Prometheus text page
 * (`name{labels} value` or `name value`), or null when none of them appears.
 * One pass over the lines.
 */
export function prometheusSum(page: string, names: readonly string[]): number | null {
  let sum = 0;
  let seen = false;
  for (const line of page.split("\n")) {
    if (line.startsWith("#")) continue;
    for (const name of names) {
      if (!line.startsWith(name)) continue;
      const next = line.charAt(name.length);
      if (next !== "{" && next !== " ") continue;
      const rest = next === "{" ? line.slice(line.indexOf("}", name.length) + 1) : line.slice(name.length);
      const value = Number(rest.trim().split(/\s+/)[0]);
      if (Number.isFinite(value)) {
        sum += value;
        seen = true;
      }
    }
  }
  return seen ? sum : null;
}
