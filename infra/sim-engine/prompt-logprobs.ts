import { hashInt, unitFloat } from "../../shared/inference/hash.ts";
import type { SimEngine } from "./sim-engine.ts";

/**
 * Prompt (input-token) log-probs of the simulated engine, the scoring side of
 * a teacher: `log p(ids[j] | ids[<j])` for every position `j ≥ 1`, null at
 * position 0 (no context). Deterministic in (script seed, `scoreSeed`,
 * `ids[0..j]`), 4 decimals in [−6, 0], hashed apart from the sampled tokens'
 * `logProbs`, so a teacher's scores differ from the policy's log-probs even
 * on the same engine, and two engines with another `scoreSeed` differ too.
 */
export function simPromptLogProbs(engine: SimEngine, ids: readonly number[]): (number | null)[] {
  const out: (number | null)[] = new Array(ids.length);
  let h = hashInt(hashInt(0x1b873593, engine.policy.seed), engine.scoreSeed);
  for (let j = 0; j < ids.length; j++) {
    if (j === 0) out[0] = null;
    else {
      const u = unitFloat(hashInt(h, ids[j]!));
      out[j] = Math.round(-6 * u * u * 1e4) / 1e4 + 0;
    }
    h = hashInt(h, ids[j]!);
  }
  return out;
}

/**
 * vLLM's `prompt_logprobs` for `ids`: entry 0 null, entry `j` a dict keyed by
 * the prompt token's id (a JSON string) holding `{logprob, rank, decoded_token}`.
 * The simulator has no distribution over alternatives, so every entry holds
 * the prompt token alone with rank 1, whatever top-k was asked.
 * @see vllm/v1/engine/logprobs.py (`_update_prompt_logprobs`), vllm/logprobs.py (`Logprob`); docs/engines.md §2.8
 */
export function vllmPromptLogprobsBody(engine: SimEngine, ids: readonly number[]): (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[] {
  const lps = simPromptLogProbs(engine, ids);
  return lps.map((lp, j) => (lp === null ? null : { [String(ids[j])]: { logprob: lp, rank: 1, decoded_token: engine.tokenizer.decode([ids[j]!]) } }));
}

/**
 * SGLang's `meta_info.input_token_logprobs` for `ids` with `logprob_start_len
 * = start` (≥ 0): `[logprob, token_id, null]` for every position `start …
 * n−1`, the first entry's log-prob null, as current SGLang builds it.
 * @see sglang/srt/managers/scheduler_output_processor_mixin.py (`add_input_logprob_return_values`: "Always pad the first one with None", ids `origin_input_ids[logprob_start_len:]`)
 */
export function sglangInputTokenLogprobs(engine: SimEngine, ids: readonly number[], start: number): [number | null, number, null][] {
  const lps = simPromptLogProbs(engine, ids);
  const out: [number | null, number, null][] = [];
  for (let j = Math.min(start, ids.length); j < ids.length; j++) out.push([j === start ? null : lps[j]!, ids[j]!, null]);
  return out;
}
