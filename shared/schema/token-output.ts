import { z } from "zod";
import { RoutedExpertsSpan } from "./routed-experts.ts";

/**
 * What one engine call returns (verl's `TokenOutput`). `token_ids` are the
 * generated ids only, including the stop token when the engine returns it (as
 * vLLM does). `log_probs` has the same length when present. `finish_reason`
 * matches vLLM's values restricted to what ends a turn: `stop`, `length`,
 * `abort`. `num_preempted` is −1 when the engine does not say (SGLang never
 * does). `cached_tokens` is the engine's prefix-cache hit count, when known.
 * `routed_experts` is present only when the request asked for them
 * (`return_routed_experts`): see {@link RoutedExpertsSpan} for which
 * positions of the call's input ‖ output they cover.
 */
export const TokenOutput = z
  .object({
    token_ids: z.array(z.number().int().min(0)),
    log_probs: z.array(z.number()).nullish(),
    finish_reason: z.enum(["stop", "length", "abort"]),
    stop_reason: z.union([z.string(), z.number(), z.null()]).optional(),
    num_preempted: z.number().int().min(-1).default(-1),
    cached_tokens: z.number().int().min(0).optional(),
    extra_fields: z.record(z.string(), z.unknown()).default({}),
    routed_experts: RoutedExpertsSpan.optional(),
  })
  .refine((o) => o.log_probs == null || o.log_probs.length === o.token_ids.length, {
    message: "log_probs must have one entry per token id",
    path: ["log_probs"],
  });
export type TokenOutput = z.infer<typeof TokenOutput>;
