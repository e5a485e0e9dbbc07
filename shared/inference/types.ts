import type { SamplingParams, TokenOutput } from "../schema/index.ts";

/**
 * One token-in/token-out request (DESIGN §4.2).
 *
 * `request_id` is fresh for every call; `routing_key` is the same for every
 * turn of one trajectory (the trajectory key) so that a sticky router sends
 * it back to the replica holding its KV-cache prefix. `max_tokens` is always
 * set explicitly by the caller (from the trajectory's remaining budget) and is
 * ≥ 1.
 */
export interface GenerateRequest {
  request_id: string;
  routing_key: string;
  /**
   * Key of the prompt's shared prefix (see {@link prefixKeyOf}): the same for
   * every trajectory whose prompt starts with the same system+tools block, so
   * a gateway can send a trajectory's first turn where that prefix is cached.
   * Sent as `x-edgeloop-prefix-key`; optional.
   */
  prefix_key?: string;
  /** The whole running token stream: prompt ‖ response so far. */
  prompt_ids: ArrayLike<number>;
  sampling_params: SamplingParams;
  /** Generated tokens at most; ≥ 1. */
  max_tokens: number;
  /** Aborts the HTTP call (deadline, shutdown). */
  signal?: AbortSignal;
  /**
   * Ask for the routed MoE experts of every token (`rollout.return_routed_experts`):
   * SGLang `return_routed_experts: true`; the reply's `TokenOutput.routed_experts`
   * then covers the call's input ‖ output (see `RoutedExpertsSpan`).
   * Adapters that cannot return them throw a `ConfigError` naming the field.
   */
  return_routed_experts?: boolean;
  /**
   * The images of `prompt_ids`, one per `<|vision_start|><|image_pad|>+<|vision_end|>`
   * run, in order, as `data:` URIs (vision-language families; see
   * shared/vision/). SGLang: `image_data` of `/generate` — it decodes the
   * ids, takes each run as one image and expands it again to its processor's
   * count (docs/engines.md §3.10). Absent or empty: text only, bodies
   * unchanged. Adapters that cannot carry images (vLLM's token-id endpoints)
   * throw a `ConfigError` naming the field.
   */
  image_data?: readonly string[];
  /**
   * Streaming sink (issue 30 item 3, true streaming). A client that can stream
   * calls it with each run of newly generated tokens, in order, as the engine
   * produces them and before `generate` resolves: `token_ids` (≥ 1 ids) and
   * their `log_probs` (same length, or null when the call does not return
   * them). Contract, for every client that calls it:
   * - the concatenation of every chunk of one call equals the resolved
   *   `TokenOutput.token_ids` exactly (and the log-probs likewise); the
   *   record is built from that output, never from the chunks;
   * - a stream that breaks after ≥ 1 token resolves (does not throw) with the
   *   tokens received and `finish_reason: "abort"`, so the agent loop resumes
   *   from them as from a preemption; a call that fails before any token
   *   throws as a non-streaming call would, and only then may a wrapper
   *   (`RetryingClient`) retry it;
   * - it is never called after `generate` settles.
   * Clients that cannot stream ignore it (the caller then sees the whole
   * output at once). Wrappers forward it.
   */
  on_tokens?: (token_ids: number[], log_probs: number[] | null) => void;
}

/**
 * Anything that can generate tokens: an engine adapter (vLLM, SGLang), the
 * gateway client, or the in-process simulated engine.
 * Errors are typed (`shared/errors.ts`): `ContextOverflowError`,
 * `EngineUnavailableError`, `EngineAbortedError`, `BadEngineResponseError`.
 */
export interface InferenceClient {
  generate(req: GenerateRequest): Promise<TokenOutput>;
  /** The engine's `max_model_len` (context size in tokens), when it can tell. */
  maxModelLen?(): Promise<number | undefined>;
  /**
   * The longest stream (prompt ‖ response, tokens) this engine serves for a
   * model whose context is `contextLen` tokens: vLLM allows `input +
   * max_tokens == max_model_len` (returns `contextLen`); SGLang refuses
   * `input + max_new_tokens >= context_len` (returns `contextLen − 1`).
   * Absent: `contextLen`. Wrappers forward it.
   * @see docs/engines.md §2.7 and §3.3
   */
  servableLength?(contextLen: number): number;
}

/** {@link InferenceClient.servableLength} of `client` for `contextLen` (`contextLen` when the client does not say). */
export function servableLength(client: InferenceClient, contextLen: number): number {
  return client.servableLength ? client.servableLength(contextLen) : contextLen;
}
