import { z } from "zod";
import { isInt, isNum, isObj, nil, optId, optIdArray, optInt, optStr } from "./fast-check.ts";

/**
 * zod schemas of the vLLM replies edgeloop reads (only the fields it uses;
 * unknown fields pass through, as vLLM adds fields between versions).
 * @see docs/engines.md §2.3, §2.5 and §2.6
 */

const CompletionLogprobs = z.looseObject({
  token_logprobs: z.array(z.number().nullable()).nullish(),
  tokens: z.array(z.string()).nullish(),
});

const Usage = z
  .looseObject({
    prompt_tokens: z.number().int().nullish(),
    completion_tokens: z.number().int().nullish(),
    prompt_tokens_details: z.looseObject({ cached_tokens: z.number().int().min(0).nullish() }).nullish(),
  })
  .nullish();

/** `POST /v1/completions` reply (non-streaming). */
export const VllmCompletionReply = z.looseObject({
  id: z.string().nullish(),
  choices: z
    .array(
      z.looseObject({
        index: z.number().int().nullish(),
        text: z.string().nullish(),
        logprobs: CompletionLogprobs.nullish(),
        finish_reason: z.string().nullish(),
        stop_reason: z.union([z.number(), z.string()]).nullish(),
        token_ids: z.array(z.number().int().min(0)).nullish(),
      }),
    )
    .min(1),
  usage: Usage,
});
export type VllmCompletionReply = z.infer<typeof VllmCompletionReply>;

/**
 * `POST /inference/v1/generate` reply. Log-prob entries: older servers send
 * chat-style `{token: "token_id:N", logprob}`, vLLM main `{token_id, logprob,
 * rank}` (`output_mode: "tokens"`); `choices[].weight_versions` (vLLM main):
 * per-token weight-version spans.
 * @see docs/engines.md §2.5
 */
export const VllmGenerateReply = z.looseObject({
  request_id: z.string().nullish(),
  choices: z
    .array(
      z.looseObject({
        index: z.number().int().nullish(),
        finish_reason: z.string().nullish(),
        stop_reason: z.union([z.number(), z.string()]).nullish(),
        token_ids: z.array(z.number().int().min(0)).nullish(),
        logprobs: z
          .looseObject({
            content: z.array(z.looseObject({ token: z.string().nullish(), token_id: z.number().int().min(0).nullish(), logprob: z.number().nullable() })).nullish(),
          })
          .nullish(),
        weight_versions: z.unknown().optional(),
      }),
    )
    .min(1),
  usage: Usage,
});
export type VllmGenerateReply = z.infer<typeof VllmGenerateReply>;

/** `GET /v1/models` reply (vLLM and SGLang); `max_model_len` is the context size in tokens. */
export const ModelsReply = z.looseObject({
  data: z.array(z.looseObject({ id: z.string(), max_model_len: z.number().int().positive().nullish() })),
});

const TOKEN_ID_STRING = /^token_id:(\d+)$/;

/**
 * Token ids from `return_tokens_as_token_ids` strings (`"token_id:12095"`), or
 * `undefined` when any entry is not in that form (the server ignored the flag:
 * the ids cannot be recovered without re-encoding text, which edgeloop never does).
 */
export function idsFromTokenIdStrings(tokens: readonly (string | null | undefined)[]): number[] | undefined {
  const out: number[] = [];
  for (const t of tokens) {
    const m = typeof t === "string" ? TOKEN_ID_STRING.exec(t) : null;
    if (!m) return undefined;
    out.push(Number(m[1]));
  }
  return out;
}

// ---- A fast path for the hot reply: the same verdict as the schemas above for replies they accept,
// without zod's per-element work over the per-token arrays. Anything it does not vouch for goes to zod.

function usageOk(u: unknown): boolean {
  if (nil(u)) return true;
  if (!isObj(u) || !optInt(u.prompt_tokens) || !optInt(u.completion_tokens)) return false;
  const d = u.prompt_tokens_details;
  return nil(d) || (isObj(d) && (nil(d.cached_tokens) || (isInt(d.cached_tokens) && (d.cached_tokens as number) >= 0)));
}

function completionLogprobsOk(lp: unknown): boolean {
  if (nil(lp)) return true;
  if (!isObj(lp)) return false;
  const t = lp.token_logprobs;
  if (!nil(t)) {
    if (!Array.isArray(t)) return false;
    for (let i = 0; i < t.length; i++) if (t[i] !== null && !isNum(t[i])) return false;
  }
  const s = lp.tokens;
  if (!nil(s)) {
    if (!Array.isArray(s)) return false;
    for (let i = 0; i < s.length; i++) if (typeof s[i] !== "string") return false;
  }
  return true;
}

/**
 * `body` itself, typed, when {@link VllmCompletionReply} surely accepts it
 * (its schema has no defaults or transforms, so zod's output holds the same
 * values); undefined otherwise — then parse with zod, which names the field.
 * Checks every field the schema checks, on every choice.
 */
export function fastVllmCompletionReply(body: unknown): VllmCompletionReply | undefined {
  if (!isObj(body) || !optStr(body.id) || !usageOk(body.usage)) return undefined;
  const choices = body.choices;
  if (!Array.isArray(choices) || choices.length < 1) return undefined;
  for (const c of choices) {
    if (!isObj(c) || !optInt(c.index) || !optStr(c.text) || !optStr(c.finish_reason)) return undefined;
    if (!(nil(c.stop_reason) || typeof c.stop_reason === "string" || isNum(c.stop_reason))) return undefined;
    if (!optIdArray(c.token_ids) || !completionLogprobsOk(c.logprobs)) return undefined;
  }
  return body as VllmCompletionReply;
}

/** Like {@link fastVllmCompletionReply}, for {@link VllmGenerateReply}. */
export function fastVllmGenerateReply(body: unknown): VllmGenerateReply | undefined {
  if (!isObj(body) || !optStr(body.request_id) || !usageOk(body.usage)) return undefined;
  const choices = body.choices;
  if (!Array.isArray(choices) || choices.length < 1) return undefined;
  for (const c of choices) {
    if (!isObj(c) || !optInt(c.index) || !optStr(c.finish_reason)) return undefined;
    if (!(nil(c.stop_reason) || typeof c.stop_reason === "string" || isNum(c.stop_reason))) return undefined;
    if (!optIdArray(c.token_ids)) return undefined;
    const lp = c.logprobs;
    if (nil(lp)) continue;
    if (!isObj(lp)) return undefined;
    const content = lp.content;
    if (nil(content)) continue;
    if (!Array.isArray(content)) return undefined;
    for (let i = 0; i < content.length; i++) {
      const e = content[i];
      if (!isObj(e) || !optStr(e.token) || !optId(e.token_id) || !(e.logprob === null || isNum(e.logprob))) return undefined;
    }
  }
  return body as VllmGenerateReply;
}
