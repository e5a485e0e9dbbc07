import { z } from "zod";

/**
 * Sampling parameters sent with every engine request. `top_k` follows verl:
 * `-1` (or 0) means disabled; adapters translate to each engine's convention
 * (vLLM 0, SGLang −1). `max_tokens` is never taken from here: the builder
 * computes it for each request from the remaining budget (DESIGN §4.1).
 */
export const SamplingParams = z.object({
  temperature: z.number().min(0).default(1.0),
  top_p: z.number().gt(0).max(1).default(1.0),
  top_k: z.number().int().min(-1).default(-1),
  seed: z.number().int().optional(),
  stop_token_ids: z.array(z.number().int().min(0)).optional(),
  /**
   * Stop strings: generation ends once the decoded text of the generated
   * tokens contains one (finish `stop`, `stop_reason` = that string). The
   * tokens are kept up to and including the one that completed it; engines
   * trim only their `text`, which edgeloop does not read.
   * @see vLLM `SamplingParams.stop` (v1 `IncrementalDetokenizer.update` truncates `output_text` only), SGLang `sampling_params.stop`
   */
  stop: z.array(z.string().min(1, "a stop string must not be empty")).optional(),
  /** Ask the engine for the log-prob of each sampled token (verl's `calculate_log_probs`). */
  logprobs: z.boolean().default(true),
});
export type SamplingParams = z.infer<typeof SamplingParams>;
