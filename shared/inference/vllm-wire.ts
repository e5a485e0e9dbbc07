import { z } from "zod";

/**
 * zod schemas of the vLLM replies edgeloop reads (only the fields it uses;
 * unknown fields pass through, as vLLM adds fields between versions).
 * @see ../shared/fixtures/wire-contracts.md §1.3 and §1.6
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

/** `POST /inference/v1/generate` reply: chat-style log-probs `{content: [{token, logprob}]}`. */
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
            content: z.array(z.looseObject({ token: z.string().nullish(), logprob: z.number().nullable() })).nullish(),
          })
          .nullish(),
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
