import { z } from "zod";
import { encodeInt32 } from "../../shared/schema/typed-base64.ts";
import type { SimEngine, SimEngineFault, SimGenerateResult } from "./sim-engine.ts";

/**
 * The simulated engine's wire formats: request schemas and reply/error bodies
 * shaped as vLLM and SGLang shape them, per engine version
 * ({@link SimEngineVersion}). Top-level request fields are lenient where the
 * real servers are (vLLM's pydantic models allow extra fields; SGLang's
 * request dataclass ignores them); SGLang's `sampling_params` is strict, as
 * its msgspec struct is ({@link sglangSamplingProblem}).
 * @see docs/engines.md §2 (vLLM) and §3 (SGLang)
 */

/**
 * The engine version the simulator plays on the vLLM endpoints: `main` (vLLM
 * main after v0.29: the current context-overflow wording, `{token_id,
 * logprob, rank}` log-prob entries on `/inference/v1/generate`) or `0.2x`
 * (the older wording "This model's maximum context length is…" and
 * `{token: "token_id:N", logprob}` entries). SGLang endpoints play SGLang main.
 * @see docs/engines.md §5
 */
export type SimEngineVersion = "main" | "0.2x";
/** Every {@link SimEngineVersion}, newest first. */
export const SIM_ENGINE_VERSIONS: readonly SimEngineVersion[] = ["main", "0.2x"];

const Ids = z.array(z.number().int().min(0));
/** `stop`: a string or a list (vLLM and SGLang both take either); vLLM refuses an empty string. */
const Stop = z.union([z.string(), z.array(z.string())]).refine((s) => (typeof s === "string" ? [s] : s).every((x) => x.length > 0), "stop cannot contain an empty string.");

/** The stop strings of a request's `stop` field, as a list (undefined when none). */
export function stopList(stop: string | string[] | null | undefined): string[] | undefined {
  const list = stop == null ? [] : typeof stop === "string" ? [stop] : stop;
  return list.length > 0 ? list : undefined;
}

/**
 * The reply `text` of a turn that a stop string ended: cut before the string
 * (vLLM's `include_stop_str_in_output: false`, SGLang without `no_stop_trim`),
 * or kept whole. Unchanged when the text does not hold the string (it was
 * decoded without special tokens).
 * @see vLLM `StopChecker.check_stop_strings`; SGLang `DetokenizerManager.trim_matched_stop`
 */
export function trimStopString(text: string, stop: string | null, keep: boolean): string {
  if (stop === null || keep) return text;
  const at = text.indexOf(stop);
  return at < 0 ? text : text.slice(0, at);
}

/** vLLM `StreamOptions`: `include_usage` adds a last event with `choices: []` and `usage`. */
const StreamOptions = z.looseObject({ include_usage: z.boolean().nullish(), continuous_usage_stats: z.boolean().nullish() });

/** vLLM `POST /v1/completions` body (the fields the simulator honours). */
export const VllmCompletionRequest = z.looseObject({
  model: z.string().nullish(),
  prompt: z.union([Ids.min(1), z.string().min(1)]),
  max_tokens: z.number().int().nullish(),
  temperature: z.number().nullish(),
  top_p: z.number().nullish(),
  top_k: z.number().int().nullish(),
  logprobs: z.number().int().min(-1).nullish(),
  /** Scoring (a teacher): log-probs of the prompt tokens (`choices[0].prompt_logprobs`). */
  prompt_logprobs: z.number().int().min(-1).nullish(),
  stop_token_ids: Ids.nullish(),
  stop: Stop.nullish(),
  include_stop_str_in_output: z.boolean().nullish(),
  return_token_ids: z.boolean().nullish(),
  return_tokens_as_token_ids: z.boolean().nullish(),
  skip_special_tokens: z.boolean().nullish(),
  request_id: z.string().nullish(),
  /** `true`: an event stream of delta chunks (see `vllmCompletionChunk`). */
  stream: z.boolean().nullish(),
  stream_options: StreamOptions.nullish(),
  n: z.literal(1).nullish(),
})
  // vLLM `CompletionRequest.validate_stream_options` and `check_logprobs` (model validators: a 400 naming the field).
  .refine((b) => !(b.stream_options && !b.stream), { message: "Stream options can only be defined when `stream=True`.", path: ["stream_options"] })
  .refine((b) => !(b.stream && b.prompt_logprobs != null && b.prompt_logprobs > 0), { message: "`prompt_logprobs` are not available when `stream=True`.", path: ["prompt_logprobs"] });

/** vLLM `POST /inference/v1/generate` body. */
export const VllmGenerateRequest = z.looseObject({
  model: z.string().nullish(),
  request_id: z.string().nullish(),
  token_ids: Ids.min(1),
  sampling_params: z
    .looseObject({
      max_tokens: z.number().int().nullish(),
      temperature: z.number().nullish(),
      top_p: z.number().nullish(),
      top_k: z.number().int().nullish(),
      logprobs: z.number().int().min(-1).nullish(),
      /** Scoring (a teacher): top-level `prompt_logprobs` of the reply. */
      prompt_logprobs: z.number().int().min(-1).nullish(),
      stop_token_ids: Ids.nullish(),
      stop: Stop.nullish(),
      include_stop_str_in_output: z.boolean().nullish(),
      detokenize: z.boolean().nullish(),
    })
    .default({})
    .refine((sp) => !(stopList(sp.stop) && sp.detokenize === false), {
      message: "stop strings are only supported when detokenize is True. Set detokenize=True to use stop.",
      path: ["detokenize"],
    }),
  /** `true`: an event stream of delta chunks (`ServingTokens.serve_tokens_stream_generator`). */
  stream: z.boolean().nullish(),
  stream_options: StreamOptions.nullish(),
});

/** SGLang `POST /generate` body (single request; `input_ids` or `text`). */
export const SglangGenerateRequest = z.looseObject({
  input_ids: Ids.min(1).nullish(),
  text: z.string().min(1).nullish(),
  sampling_params: z
    .looseObject({
      /** 0: prefill only (a teacher's scoring call), as SGLang serves it. */
      max_new_tokens: z.number().int().min(0).nullish(),
      stop_token_ids: Ids.nullish(),
      stop: Stop.nullish(),
      no_stop_trim: z.boolean().nullish(),
      skip_special_tokens: z.boolean().nullish(),
      top_k: z.number().int().nullish(),
    })
    .default({}),
  return_logprob: z.boolean().nullish(),
  /** SGLang `GenerateReqInput.return_routed_experts` (server flag `--enable-return-routed-experts`). */
  return_routed_experts: z.boolean().nullish(),
  /** −1 (default): output tokens only; L ≥ 0: also `input_token_logprobs` of positions L…n−1. */
  logprob_start_len: z.number().int().min(-1).nullish(),
  rid: z.string().nullish(),
  /** `true`: `data: {text, output_ids, meta_info}` events (cumulative unless `--incremental-streaming-output`). */
  stream: z.boolean().nullish(),
  /**
   * SGLang `GenerateReqInput.image_data`: one entry per image, in the order of
   * the image runs in `input_ids` (a data URI or bare base64; SGLang also takes
   * URLs and paths, which the simulator refuses). A single string is one image.
   */
  image_data: z.union([z.string(), z.array(z.string())]).nullish(),
});

/** `POST /tokenize` body (vLLM shape; SGLang's `/v1/tokenize` is the same minus `messages`). */
export const TokenizeRequest = z.looseObject({
  prompt: z.string().nullish(),
  messages: z.array(z.looseObject({ role: z.string(), content: z.unknown() })).nullish(),
  add_generation_prompt: z.boolean().nullish(),
  return_token_strs: z.boolean().nullish(),
});

/** Text of ids; "" for none (the tokenizer library rejects an empty list). */
export function decodeText(engine: SimEngine, ids: readonly number[], skipSpecial = false): string {
  return ids.length === 0 ? "" : engine.tokenizer.decode(ids, { skipSpecialTokens: skipSpecial });
}

/** The `token_id:<id>` form of `return_tokens_as_token_ids`. */
export function tokenIdString(id: number): string {
  return `token_id:${id}`;
}

/** vLLM `/v1/completions` reply body for one result. */
export function vllmCompletionReply(
  engine: SimEngine,
  out: SimGenerateResult,
  opts: {
    /** `--enable-prompt-tokens-details`: `usage.prompt_tokens_details.cached_tokens` (default true). */
    promptTokensDetails?: boolean;
    requestId: string;
    promptIds: readonly number[];
    logprobs: boolean;
    returnTokenIds: boolean;
    asTokenIds: boolean;
    skipSpecial: boolean;
    /** `include_stop_str_in_output` (default false: the text ends before a matched stop string). */
    includeStopStr?: boolean;
  },
): Record<string, unknown> {
  const tokenStr = (id: number) => (opts.asTokenIds ? tokenIdString(id) : engine.tokenizer.decode([id]));
  let logprobs: Record<string, unknown> | null = null;
  if (opts.logprobs) {
    const tokens = out.token_ids.map(tokenStr);
    const offsets: number[] = [];
    let off = 0;
    for (const t of tokens) {
      offsets.push(off);
      off += t.length;
    }
    logprobs = {
      text_offset: offsets,
      token_logprobs: out.log_probs,
      tokens,
      top_logprobs: tokens.map((t, i) => ({ [t]: out.log_probs[i] })),
    };
  }
  return {
    id: `cmpl-${opts.requestId}`,
    object: "text_completion",
    created: Math.floor(Date.now() / 1000),
    model: engine.model,
    choices: [
      {
        index: 0,
        text: trimStopString(decodeText(engine, out.token_ids, opts.skipSpecial), out.stop_string, opts.includeStopStr === true),
        logprobs,
        finish_reason: out.finish_reason,
        stop_reason: out.stop_string ?? (out.stop_token_requested ? out.stop_token : null),
        token_ids: opts.returnTokenIds ? out.token_ids : null,
        prompt_token_ids: opts.returnTokenIds ? [...opts.promptIds] : null,
        prompt_logprobs: null,
      },
    ],
    usage: usage(out, opts.promptTokensDetails ?? true),
    system_fingerprint: null,
    kv_transfer_params: null,
  };
}

/**
 * vLLM `/inference/v1/generate` reply body: log-prob entries `{token_id,
 * logprob, rank, top_logprobs}` (`main`, `output_mode: "tokens"`) or
 * chat-style `{token: "token_id:N", logprob, bytes, top_logprobs}` (`0.2x`).
 */
export function vllmGenerateReply(out: SimGenerateResult, opts: { requestId: string; logprobs: boolean; version?: SimEngineVersion; promptTokensDetails?: boolean }): Record<string, unknown> {
  return {
    request_id: `generate-tokens-${opts.requestId}`,
    choices: [
      {
        index: 0,
        finish_reason: out.finish_reason,
        token_ids: out.token_ids,
        logprobs: opts.logprobs ? vllmGenerateLogprobs(out.token_ids, out.log_probs, opts.version) : null,
      },
    ],
    usage: usage(out, opts.promptTokensDetails ?? true),
    prompt_logprobs: null,
    kv_transfer_params: null,
  };
}

/**
 * `choices[0].logprobs` of `/inference/v1/generate` for `ids`: entries
 * `{token_id, logprob, rank, top_logprobs}` (`main`) or chat-style
 * `{token: "token_id:N", logprob, bytes, top_logprobs}` (`0.2x`).
 */
export function vllmGenerateLogprobs(ids: readonly number[], lps: readonly number[], version: SimEngineVersion = "main"): { content: unknown[] } {
  const entry =
    version === "main"
      ? (id: number, lp: number) => ({ token_id: id, logprob: lp, rank: 1, top_logprobs: [{ token_id: id, logprob: lp, rank: 1 }] })
      : (id: number, lp: number) => ({ token: tokenIdString(id), logprob: lp, bytes: null, top_logprobs: [{ token: tokenIdString(id), logprob: lp, bytes: null }] });
  return { content: ids.map((id, i) => entry(id, lps[i]!)) };
}

/**
 * vLLM's `usage`: `prompt_tokens_details.cached_tokens` only when the server
 * runs with `--enable-prompt-tokens-details` (`details`), else null.
 * @see docs/engines.md §2.11
 */
function usage(out: SimGenerateResult, details: boolean) {
  return {
    prompt_tokens: out.prompt_tokens,
    completion_tokens: out.token_ids.length,
    total_tokens: out.prompt_tokens + out.token_ids.length,
    prompt_tokens_details: details ? { cached_tokens: out.cached_tokens } : null,
  };
}

/**
 * Why vLLM refuses a request's sampling values (its error text), or null:
 * `SamplingParams._verify_args` — temperature ≥ 0, top_p in (0, 1], top_k
 * −1, 0 or ≥ 1, max_tokens ≥ 1. `null`/absent values take vLLM's defaults.
 * @see vLLM `vllm/sampling_params.py` `SamplingParams._verify_args`
 */
export function vllmSamplingProblem(sp: { temperature?: unknown; top_p?: unknown; top_k?: unknown; max_tokens?: unknown }): string | null {
  const t = sp.temperature;
  if (typeof t === "number" && t < 0) return `temperature must be non-negative, got ${t}.`;
  const p = sp.top_p;
  if (typeof p === "number" && !(p > 0 && p <= 1)) return `top_p must be in (0, 1], got ${p}.`;
  const k = sp.top_k;
  if (typeof k === "number" && k < -1) return `top_k must be 0 (disable), or at least 1, got ${k}.`;
  const m = sp.max_tokens;
  if (typeof m === "number" && m < 1) return `max_tokens must be at least 1, got ${m}.`;
  return null;
}

/**
 * The API fields of SGLang's `SamplingParams` (a msgspec struct, `kw_only`:
 * any other key fails its construction).
 * @see SGLang `python/sglang/srt/sampling/sampling_params.py` `SamplingParams`
 */
const SGLANG_SAMPLING_KEYS = new Set([
  "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
  "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "json_schema", "regex", "ebnf",
  "structural_tag", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
  "custom_params", "stream_interval", "logit_bias", "sampling_seed",
]);

/**
 * Why SGLang refuses `sampling_params` (its error text), or null when it
 * takes them: an unknown key (msgspec's "Unexpected keyword argument"), then
 * `SamplingParams.verify`'s ranges — temperature ≥ 0 and finite, top_p in
 * (0, 1], min_p in [0, 1], top_k −1 or ≥ 1, penalties in range,
 * max_new_tokens ≥ 0, min_new_tokens ≤ max_new_tokens. `null` values mean
 * "the default", as `__post_init__` treats them.
 * @see SGLang `SamplingParams.__post_init__` and `.verify` (sampling_params.py)
 */
export function sglangSamplingProblem(sp: Record<string, unknown>): string | null {
  for (const k of Object.keys(sp)) if (!SGLANG_SAMPLING_KEYS.has(k)) return `Unexpected keyword argument '${k}'`;
  const num = (k: string, d: number): number | string => {
    const v = sp[k];
    if (v == null) return d;
    return typeof v === "number" ? v : `Expected \`number\`, got \`${typeof v}\` - at \`$.${k}\``;
  };
  const vals: Record<string, number> = {};
  for (const [k, d] of [["temperature", 1], ["top_p", 1], ["top_k", -1], ["min_p", 0], ["frequency_penalty", 0], ["presence_penalty", 0], ["repetition_penalty", 1], ["min_new_tokens", 0]] as const) {
    const v = num(k, d);
    if (typeof v === "string") return v;
    vals[k] = v;
  }
  const mnt = sp.max_new_tokens;
  if (mnt != null && !(typeof mnt === "number" && Number.isInteger(mnt))) return `Expected \`int\`, got \`${typeof mnt}\` - at \`$.max_new_tokens\``;
  const t = vals.temperature!;
  // __post_init__: temperature ~0 means greedy (top_k 1); −1 means the whole vocabulary.
  const topK = t >= 0 && t < 1e-6 ? 1 : vals.top_k!;
  if (!Number.isFinite(t) || t < 0) return `temperature must be a non-negative finite number, got ${t}.`;
  if (!(vals.top_p! > 0 && vals.top_p! <= 1)) return `top_p must be in (0, 1], got ${vals.top_p}.`;
  if (!(vals.min_p! >= 0 && vals.min_p! <= 1)) return `min_p must be in [0, 1], got ${vals.min_p}.`;
  if (topK !== -1 && topK < 1) return `top_k must be -1 (disable) or at least 1, got ${topK}.`;
  if (!(vals.frequency_penalty! >= -2 && vals.frequency_penalty! <= 2)) return `frequency_penalty must be in [-2, 2], got ${vals.frequency_penalty}.`;
  if (!(vals.presence_penalty! >= -2 && vals.presence_penalty! <= 2)) return `presence_penalty must be in [-2, 2], got ${vals.presence_penalty}.`;
  if (!(vals.repetition_penalty! > 0 && vals.repetition_penalty! <= 2)) return `repetition_penalty must be in (0, 2] (1.0 = no penalty), got ${vals.repetition_penalty}.`;
  if (!(vals.min_new_tokens! >= 0)) return `min_new_tokens must be in [0, max_new_tokens], got ${vals.min_new_tokens}.`;
  if (typeof mnt === "number") {
    if (mnt < 0) return `max_new_tokens must be at least 0, got ${mnt}.`;
    if (!(vals.min_new_tokens! <= mnt)) return `min_new_tokens must be in [0, max_new_tokens(${mnt})], got ${vals.min_new_tokens}.`;
  }
  return null;
}

/** SGLang `/generate` reply body. */
export function sglangReply(
  engine: SimEngine,
  out: SimGenerateResult,
  opts: {
    rid: string;
    logprob: boolean;
    skipSpecial: boolean;
    latencyS: number;
    /** The version the reply was generated under (default: the engine's now). */
    weightVersion?: string;
    /** `no_stop_trim`: keep a matched stop string in `text`. */
    noStopTrim?: boolean;
    /** `return_routed_experts`: the request's input ids, whose stream ‖ output the experts cover. */
    routedExpertsFor?: readonly number[];
  },
): Record<string, unknown> {
  const finish =
    out.finish_reason === "stop"
      ? { type: "stop", matched: out.stop_string ?? out.stop_token }
      : out.finish_reason === "length"
        ? { type: "length", length: out.token_ids.length }
        : { type: "abort", message: "Abort before or during generation (simulated preemption)", status_code: null, err_type: null };
  return {
    text: trimStopString(decodeText(engine, out.token_ids, opts.skipSpecial), out.stop_string, opts.noStopTrim === true),
    output_ids: out.token_ids,
    meta_info: {
      id: opts.rid,
      finish_reason: finish,
      prompt_tokens: out.prompt_tokens,
      completion_tokens: out.token_ids.length,
      cached_tokens: out.cached_tokens,
      num_retractions: out.num_retractions,
      e2e_latency: opts.latencyS,
      // SGLang reports the weights' version (`--weight-version`, `/update_weight_version`) on every reply.
      weight_version: opts.weightVersion ?? engine.weightVersion,
      ...(opts.logprob ? { output_token_logprobs: out.token_ids.map((id, i) => [out.log_probs[i], id, null]) } : {}),
      ...(opts.routedExpertsFor ? { routed_experts: sglangRoutedExperts(engine, opts.routedExpertsFor, out.token_ids) } : {}),
    },
  };
}

/**
 * SGLang's `meta_info.routed_experts` for one reply: base64 of the int32
 * little-endian bytes of `[P + C − 1, layers, top_k]` over input ‖ output —
 * every forwarded token, the last sampled one excluded; no shape is sent.
 * @see SGLang `RoutedExpertsCapturer.get_routed_experts` (`[: seqlen - 1]`) and `TokenizerManager` (`pybase64.b64encode(...tobytes())`)
 */
export function sglangRoutedExperts(engine: SimEngine, input: readonly number[], output: readonly number[]): string {
  const stream = output.length ? [...input, ...output] : input;
  return encodeInt32(engine.routedExperts(stream, stream.length - 1));
}

/** vLLM's nested error body `{error:{message,type,param,code}}`, `code` = HTTP status. */
export function vllmError(status: number, message: string, param: string | null = null): { status: number; body: unknown } {
  const type = status === 400 ? "BadRequestError" : status === 404 ? "NotFoundError" : status === 503 ? "ServiceUnavailableError" : "InternalServerError";
  return { status, body: { error: { message, type, param, code: status } } };
}

/** SGLang's error bodies: 400 `{error:{message}}`; scheduler 5xx as FastAPI `{detail}`. */
export function sglangError(status: number, message: string): { status: number; body: unknown } {
  return status >= 500 ? { status, body: { detail: message } } : { status, body: { error: { message } } };
}

/**
 * A fault rendered as the vLLM server of `version` answers it. Context
 * overflow, `main`: "max_tokens=M cannot be greater than max_model_len=L"
 * when M alone is too large (`TokenizeParams.__post_init__`), else "You passed
 * P input tokens and requested M output tokens. However, the model's context
 * length is only L tokens, resulting in a maximum input length of L−M tokens…"
 * (`TokenizeParams._token_len_check`); `0.2x`: "This model's maximum context
 * length is L tokens…".
 * @see docs/engines.md §2.7
 */
export function vllmFault(f: SimEngineFault, version: SimEngineVersion = "main"): { status: number; body: unknown } {
  if (f.kind === "context_overflow") {
    const { prompt_tokens: p = 0, max_tokens: m = 0, max_model_len: n = 0 } = f.detail;
    if (version === "main") {
      if (m > n) return vllmError(400, `max_tokens=${m} cannot be greater than max_model_len=${n}. Please request fewer output tokens.`, "max_tokens");
      return vllmError(
        400,
        `You passed ${p} input tokens and requested ${m} output tokens. However, the model's context length is only ${n} tokens, resulting in a maximum input length of ${n - m} tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value=${p})`,
        "input_tokens",
      );
    }
    return vllmError(
      400,
      `This model's maximum context length is ${n} tokens. However, you requested ${m} output tokens and your prompt contains at least ${p} input tokens, for a total of at least ${p + m} tokens. Please reduce the length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=${p})`,
      "input_tokens",
    );
  }
  if (f.kind === "http_503") return vllmError(503, f.message);
  if (f.kind === "client_gone") return vllmError(499, f.message);
  return vllmError(500, f.message);
}

/** A fault rendered as SGLang answers it (both context-overflow phrasings, by case). */
export function sglangFault(f: SimEngineFault): { status: number; body: unknown } {
  if (f.kind === "context_overflow") {
    const { prompt_tokens: p = 0, max_tokens: m = 0, max_model_len: n = 0 } = f.detail;
    if (p >= n) return sglangError(400, `The input (${p} tokens) is longer than the model's context length (${n} tokens).`);
    return sglangError(
      400,
      `Requested token count exceeds the model's maximum context length of ${n} tokens. You requested a total of ${p + m} tokens: ${p} tokens from the input messages and ${m} tokens for the completion. Please reduce the number of tokens in the input messages or the completion to fit within the limit.`,
    );
  }
  if (f.kind === "client_gone") return { status: 499, body: { error: { message: f.message } } };
  return sglangError(f.kind === "http_503" ? 503 : 500, f.message);
}
