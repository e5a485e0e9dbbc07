import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import type { FaultRateInjector } from "./fault-rate.ts";
import type { SimFault, SimFaultRateInput, SimScript } from "./script.ts";

// The shapes of the simulated engine (options, a request and its result, logs, stats) and its defaults.

/** Default context size of the simulated model, in tokens (Qwen3-8B's native 40,960). */
export const DEFAULT_MAX_MODEL_LEN = 40_960;
/** Model name the simulated engine reports. */
export const DEFAULT_SIM_MODEL = "edgeloop/sim-qwen3";

/**
 * MoE dimensions of the simulated model, for routed experts (R3): `layers`
 * MoE layers, `top_k` experts per token and layer, out of `num_experts`.
 */
export interface SimMoe {
  layers: number;
  top_k: number;
  num_experts: number;
}

/** The simulated model's MoE shape unless `engine.moe` says otherwise: 4 layers, top-2 of 16 experts. */
export const DEFAULT_SIM_MOE: SimMoe = { layers: 4, top_k: 2, num_experts: 16 };

/** Latency model; both default to 0 (answers as fast as the tokenizer allows). */
export interface SimLatency {
  /** Milliseconds per prompt token not found in the prefix cache. */
  prefill_ms_per_token?: number;
  /** Milliseconds per generated token. */
  decode_ms_per_token?: number;
  /**
   * Streaming: every decoded token is its own `on_tokens` chunk, whatever the
   * pace (default false: a chunk goes out whenever decoding waits on the
   * clock, so a replica behind its pace on a loaded machine sends several
   * tokens at once). For tests that act at an exact token count.
   */
  stream_every_token?: boolean;
}

/** Options of `SimEngine` (sim-engine.ts). */
export interface SimEngineOptions {
  /** The real tokenizer (Qwen3's from `defaultTokenizer()` unless another model is simulated). */
  tokenizer: ChatTokenizer;
  /** Scripted policy (parsed or raw JSON value); default `DEFAULT_POLICY` (script.ts). */
  script?: SimScript | unknown;
  /** Replica name, for logs (`replica-0`, a URL...). */
  name?: string;
  model?: string;
  /** Context size in tokens (default {@link DEFAULT_MAX_MODEL_LEN}); prompt + max_tokens beyond it is a 400. */
  maxModelLen?: number;
  /** Prefix-cache capacity in blocks (default `DEFAULT_KV_CACHE_BLOCKS`, kv-cache.ts). */
  kvCacheBlocks?: number;
  /** Tokens per cache block (default 16). */
  blockSize?: number;
  latency?: SimLatency;
  /** Replica-level fault, checked before the script's. */
  fault?: SimFault;
  /**
   * Probabilistic faults, drawn when no other fault fires: a spec, or an
   * injector shared with other replicas (see `startSimEngine`). Overrides the
   * script's `fault_rate`.
   */
  faultRate?: SimFaultRateInput | FaultRateInjector;
  /** MoE shape for routed experts (default {@link DEFAULT_SIM_MOE}); `num_experts` defaults to `max(16, top_k)`. */
  moe?: { layers: number; top_k: number; num_experts?: number };
  /**
   * Seed of the prompt log-probs this engine scores with (vLLM
   * `prompt_logprobs`, SGLang `input_token_logprobs`; see `simPromptLogProbs`):
   * a simulated teacher is an engine with its own `scoreSeed` (default 0).
   */
  scoreSeed?: number;
}

/** One generation request as the core sees it (after an HTTP layer has parsed its wire format). */
export interface SimGenerateRequest {
  request_id: string;
  prompt_ids: readonly number[];
  /** Generated tokens at most (≥ 1). */
  max_tokens: number;
  stop_token_ids?: readonly number[];
  /**
   * Stop strings: the turn ends at the first generated token whose decoded
   * text (special tokens kept) completes one of them; that token is kept.
   */
  stop?: readonly string[];
  /** The routing key the call carried (`X-Session-ID`), for the request log. */
  routing_key?: string;
  /** Which endpoint served it (`/v1/completions`, `/generate`, `in-process`...). */
  endpoint?: string;
  /** Client gone / deadline: ends a `hang`. */
  signal?: AbortSignal;
  /**
   * How the context limit is compared: `vllm` (default) refuses `prompt +
   * max_tokens > max_model_len` (equality is served); `sglang` refuses
   * `prompt >= context_len` and `prompt + max_new_tokens >= context_len`.
   * @see docs/engines.md §2.7 (vLLM `TokenizeParams._token_len_check`) and §3.3 (SGLang `TokenizerManager._validate_one_request`)
   */
  context_rule?: "vllm" | "sglang";
  /**
   * Streaming sink: called with each run of newly decoded tokens (ids and
   * their log-probs, same length), in order, at the decode pace
   * (`latency.decode_ms_per_token`: a chunk goes out whenever decoding waits
   * on the clock, so at a pace of ≥ 1 ms per token every token is its own
   * chunk; at pace 0 the whole reply is one chunk). `last` is true on the
   * final call, made once decoding ended (it may carry no tokens) and before
   * `generate` resolves. The chunks concatenate to the result's `token_ids`
   * and `log_probs`. A client gone after ≥ 1 delivered token resolves
   * `abort` with the delivered tokens instead of throwing.
   */
  on_tokens?: (token_ids: number[], log_probs: number[], last: boolean) => void;
}

/**
 * What the core generated. `stop_token` is the id that ended a `stop` turn, if
 * one did; `stop_string` the requested stop string that ended it, if one did
 * (then `stop_token` is null).
 */
export interface SimGenerateResult {
  token_ids: number[];
  /** One per token, in [−5, 0], deterministic in (seed, prompt, position). */
  log_probs: number[];
  finish_reason: "stop" | "length" | "abort";
  stop_token: number | null;
  stop_string: string | null;
  /** Whether `stop_token` was among the request's `stop_token_ids` (vLLM's `stop_reason` then names it). */
  stop_token_requested: boolean;
  prompt_tokens: number;
  /** Prompt tokens served from this replica's prefix cache. */
  cached_tokens: number;
  /** Which assistant turn of the script this was (0-based). */
  turn_index: number;
  /** Index of the rule that applied, −1 for `default`. */
  rule_index: number;
  /** The replica's weight version when the reply was ready (SGLang's `meta_info.weight_version`). */
  weight_version: string;
  /** Times a `retract` pause took this request's KV away (SGLang `meta_info.num_retractions`). */
  num_retractions: number;
}

/**
 * A failure the engine answers instead of tokens. The HTTP layer renders it
 * in each engine's wire format; `SimEngineClient` turns it into the typed error.
 * `kind`: `http_500`, `http_503`, `context_overflow`, `client_gone` (a hang ended by the client).
 */
export class SimEngineFault extends Error {
  override name = "SimEngineFault";
  constructor(
    readonly kind: "http_500" | "http_503" | "context_overflow" | "client_gone",
    message: string,
    readonly detail: { prompt_tokens?: number; max_tokens?: number; max_model_len?: number } = {},
  ) {
    super(message);
  }
}

/** One line of a replica's request log (last 10,000 kept). */
export interface SimRequestLog {
  request_id: string;
  routing_key?: string;
  endpoint?: string;
  prompt_tokens: number;
  /** The request's `stop_token_ids`, when it carried any. */
  stop_token_ids?: number[];
  /** The request's stop strings, when it carried any. */
  stop?: string[];
  cached_tokens?: number;
  completion_tokens?: number;
  finish_reason?: string;
  fault?: string;
  /** Epoch ms the request arrived (before any hold by a pause). */
  received_ms?: number;
  /** Arrival order on this replica (1, 2, …): orders requests and pauses within one millisecond (see `SimPauseRecord.after_seq`). */
  seq?: number;
  /** Epoch ms generation started (after a hold by a pause; = `received_ms` when none). */
  started_ms?: number;
  /** Epoch ms the reply was ready. */
  ended_ms?: number;
  /** The replica's `weight_version` when the request ended. */
  weight_version?: string;
  /** Tokens the reply holds unless it is cut (scripted, after stop and `max_tokens`), once decoding began. */
  planned?: number;
  /** Tokens decoded so far (live while the request decodes): what an abort now would return. Tests wait on it, not on the clock. */
  decoded?: number;
}

/**
 * How a pause treats in-flight requests (both engines' modes):
 * `abort` — they end now with the tokens generated so far (`finish_reason`
 * abort); `wait` — they run to completion, then the replica is paused;
 * `keep` (vLLM) / `in_place` (SGLang) — they are frozen and continue after
 * resume; `retract` (SGLang) — they go back to the waiting queue, their KV
 * dropped, and are recomputed (prefill of prompt + generated tokens) on
 * resume. In every mode new requests are held (not refused) until resume.
 * @see https://docs.vllm.ai/en/latest/training/async_rl/ (abort/wait/keep), SGLang `PauseGenerationReqInput` (abort/in_place/retract)
 */
export type SimPauseMode = "abort" | "wait" | "keep" | "in_place" | "retract";

/** One pause of a replica: its mode and when it began and ended (epoch ms; `resumed_ms` null while paused). */
export interface SimPauseRecord {
  mode: SimPauseMode;
  clear_cache: boolean;
  paused_ms: number;
  resumed_ms: number | null;
  /** `seq` of the last request that arrived before the pause began: later ones arrived during it (or after it). */
  after_seq: number;
}

/** Counters of one replica. */
export interface SimEngineStats {
  requests: number;
  prompt_tokens: number;
  cached_tokens: number;
  completion_tokens: number;
  inflight: number;
  max_inflight: number;
}
