import { z } from "zod";
import { encodeInt32 } from "../../shared/session/typed-base64.ts";
import type { SimEngine, SimEngineFault, SimGenerateResult } from "./sim-engine.ts";

/**
 * The simulated engine's wire formats: request schemas (lenient like the real
 * servers: unknown fields are ignored) and reply/error bodies shaped as vLLM
 * and SGLang shape them.
 * @see ../shared/fixtures/wire-contracts.md §1.2–1.9 (vLLM) and §2.1–2.4 (SGLang)
 */

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

/** vLLM `POST /v1/completions` body (the fields the simulator honours). */
export const VllmCompletionRequest = z.looseObject({
  model: z.string().nullish(),
  prompt: z.union([Ids.min(1), z.string().min(1)]),
  max_tokens: z.number().int().min(1).nullish(),
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
  stream: z.literal(false).nullish(),
  n: z.literal(1).nullish(),
});

/** vLLM `POST /inference/v1/generate` body. */
export const VllmGenerateRequest = z.looseObject({
  model: z.string().nullish(),
  request_id: z.string().nullish(),
  token_ids: Ids.min(1),
  sampling_params: z
    .looseObject({
      max_tokens: z.number().int().min(1).nullish(),
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
  stream: z.literal(false).nullish(),
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
      top_k: z.number().int().refine((k) => k !== 0, "top_k 0 is invalid in SGLang; use -1 to disable").nullish(),
    })
    .default({}),
  return_logprob: z.boolean().nullish(),
  /** SGLang `GenerateReqInput.return_routed_experts` (server flag `--enable-return-routed-experts`). */
  return_routed_experts: z.boolean().nullish(),
  /** −1 (default): output tokens only; L ≥ 0: also `input_token_logprobs` of positions L…n−1. */
  logprob_start_len: z.number().int().min(-1).nullish(),
  rid: z.string().nullish(),
  stream: z.literal(false).nullish(),
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
    usage: usage(out),
    system_fingerprint: null,
    kv_transfer_params: null,
  };
}

/** vLLM `/inference/v1/generate` reply body (chat-style log-probs with `token_id:` strings). */
export function vllmGenerateReply(out: SimGenerateResult, opts: { requestId: string; logprobs: boolean }): Record<string, unknown> {
  return {
    request_id: `generate-tokens-${opts.requestId}`,
    choices: [
      {
        index: 0,
        finish_reason: out.finish_reason,
        token_ids: out.token_ids,
        logprobs: opts.logprobs
          ? {
              content: out.token_ids.map((id, i) => ({
                token: tokenIdString(id),
                logprob: out.log_probs[i],
                bytes: null,
                top_logprobs: [{ token: tokenIdString(id), logprob: out.log_probs[i], bytes: null }],
              })),
            }
          : null,
      },
    ],
    usage: usage(out),
    prompt_logprobs: null,
    kv_transfer_params: null,
  };
}

function usage(out: SimGenerateResult) {
  return {
    prompt_tokens: out.prompt_tokens,
    completion_tokens: out.token_ids.length,
    total_tokens: out.prompt_tokens + out.token_ids.length,
    prompt_tokens_details: { cached_tokens: out.cached_tokens },
  };
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

/** A fault rendered as the vLLM server answers it. */
export function vllmFault(f: SimEngineFault): { status: number; body: unknown } {
  if (f.kind === "context_overflow") {
    const { prompt_tokens: p = 0, max_tokens: m = 0, max_model_len: n = 0 } = f.detail;
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
