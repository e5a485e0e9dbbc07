import { z } from "zod";
import type { TokenOutput } from "../schema/index.ts";
import {
  badReply,
  DEFAULT_ENGINE_TIMEOUT_MS,
  engineErrorFromReply,
  withReplica,
  engineHeaders,
  engineTopK,
  joinUrl,
  postEngineJson,
  type FetchLike,
} from "./engine-http.ts";
import { cachedModelMaxLen, finishOutput } from "./finish-output.ts";
import type { GenerateRequest, InferenceClient } from "./types.ts";

/** Options of {@link SglangClient}. */
export interface SglangClientOptions {
  /** Base URL of the SGLang server (or a gateway), e.g. `http://127.0.0.1:30000`. */
  url: string;
  /** Per-request deadline in ms (default {@link DEFAULT_ENGINE_TIMEOUT_MS}). */
  timeoutMs?: number;
  /** Web-standard fetch (default `globalThis.fetch`). */
  fetch?: FetchLike;
}

/**
 * SGLang `meta_info.finish_reason`: `{type:"stop", matched}`,
 * `{type:"length", length}`, `{type:"abort", message, status_code}`.
 */
const FinishReason = z.looseObject({
  type: z.string(),
  matched: z.union([z.number(), z.string()]).nullish(),
  message: z.string().nullish(),
});

/** One `[logprob, token_id, text|null]` triple of `output_token_logprobs`. */
const LogprobTriple = z.tuple([z.number().nullable(), z.number().int().min(0).nullable()]).rest(z.unknown());

/**
 * `POST /generate` reply (single, non-streaming). Very old builds and
 * `--skip-tokenizer-init` variants put ids under `token_ids` instead of `output_ids`.
 * @see ../shared/fixtures/wire-contracts.md §2.2
 */
export const SglangGenerateReply = z.looseObject({
  text: z.string().nullish(),
  output_ids: z.array(z.number().int().min(0)).nullish(),
  token_ids: z.array(z.number().int().min(0)).nullish(),
  meta_info: z.looseObject({
    id: z.string().nullish(),
    finish_reason: FinishReason.nullish(),
    prompt_tokens: z.number().int().nullish(),
    completion_tokens: z.number().int().nullish(),
    cached_tokens: z.number().int().min(0).nullish(),
    output_token_logprobs: z.array(LogprobTriple).nullish(),
    /** The weights' version (`--weight-version`, `POST /update_weight_version`); "default" when never set. */
    weight_version: z.string().nullish(),
  }),
});

/**
 * Token-in/token-out client for SGLang's native `POST /generate`.
 *
 * Sends `input_ids`, `sampling_params.max_new_tokens` (always set),
 * `sampling_params.stop` when the request has stop strings (the matched one
 * comes back as `finish_reason.matched`),
 * `return_logprob: true` with `logprob_start_len: -1` (output tokens only) and
 * `rid` = the request id. Reads `output_ids` (or the ids inside the
 * `output_token_logprobs` triples), the finish-reason object and
 * `meta_info.cached_tokens`. `num_preempted` is always −1 (SGLang does not say).
 *
 * @throws ContextOverflowError, EngineUnavailableError, EngineAbortedError, BadEngineResponseError
 * @see https://github.com/sgl-project/sglang `GenerateReqInput` (wire-contracts.md §2)
 */
export class SglangClient implements InferenceClient {
  readonly url: string;
  private readonly timeoutMs: number;
  private readonly fetchFn: FetchLike;
  private readonly askMaxLen: () => Promise<number | undefined>;

  constructor(opts: SglangClientOptions) {
    this.url = opts.url;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_ENGINE_TIMEOUT_MS;
    this.fetchFn = opts.fetch ?? ((input, init) => fetch(input, init));
    this.askMaxLen = cachedModelMaxLen(this.fetchFn, this.url, this.timeoutMs);
  }

  /** The body sent to `POST /generate` for `req`. */
  generateBody(req: GenerateRequest): Record<string, unknown> {
    const sp = req.sampling_params;
    return {
      input_ids: Array.from(req.prompt_ids),
      sampling_params: {
        max_new_tokens: req.max_tokens,
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: engineTopK(sp.top_k, "sglang"),
        ...(sp.stop_token_ids ? { stop_token_ids: sp.stop_token_ids } : {}),
        ...(sp.stop?.length ? { stop: sp.stop } : {}),
        ...(sp.seed !== undefined ? { sampling_seed: sp.seed } : {}),
        skip_special_tokens: false,
        no_stop_trim: true,
        n: 1,
      },
      return_logprob: true,
      logprob_start_len: -1,
      top_logprobs_num: 0,
      return_text_in_logprobs: false,
      stream: false,
      rid: req.request_id,
    };
  }

  /** One generation call; see the class docs for the error mapping. */
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const url = joinUrl(this.url, "/generate");
    const reply = await postEngineJson(this.fetchFn, url, this.generateBody(req), engineHeaders(req.routing_key, req.request_id, req.prefix_key), {
      timeoutMs: this.timeoutMs,
      signal: req.signal,
    });
    if (reply.status < 200 || reply.status >= 300) throw engineErrorFromReply(url, reply);
    if (reply.body === undefined) throw badReply(url, "body is not JSON");
    return withReplica(parseSglangReply(url, reply.body, req.sampling_params.logprobs), reply);
  }

  /** `max_model_len` from `GET /v1/models` (cached after the first success); undefined when absent. */
  maxModelLen(): Promise<number | undefined> {
    return this.askMaxLen();
  }
}

/**
 * An SGLang `/generate` reply → {@link TokenOutput}. `stop_reason` is
 * `finish_reason.matched` for a stop (token id or stop string), absent otherwise.
 * @throws BadEngineResponseError, EngineAbortedError (abort without tokens)
 */
export function parseSglangReply(url: string, body: unknown, wantLogprobs: boolean): TokenOutput {
  if (Array.isArray(body)) throw badReply(url, "a batch (array) reply to a single request");
  const parsed = SglangGenerateReply.safeParse(body);
  if (!parsed.success) throw badReply(url, `not a /generate reply (${parsed.error.issues[0]?.path.join(".")}: ${parsed.error.issues[0]?.message})`);
  const { meta_info: meta } = parsed.data;
  const triples = meta.output_token_logprobs ?? undefined;
  const tripleIds = triples?.every((t) => t[1] !== null) ? triples.map((t) => t[1] as number) : undefined;
  const ids = parsed.data.output_ids ?? parsed.data.token_ids ?? tripleIds;
  if (!ids) throw badReply(url, "no token ids: neither output_ids nor ids in meta_info.output_token_logprobs");
  if (tripleIds && (tripleIds.length !== ids.length || tripleIds.some((v, i) => v !== ids[i]))) {
    throw badReply(url, "output_ids disagree with the ids in meta_info.output_token_logprobs");
  }
  const fr = meta.finish_reason;
  const out = finishOutput(url, {
    ids,
    logProbs: triples?.map((t) => t[0]),
    wantLogprobs,
    finishReason: fr?.type,
    stopReason: fr?.type === "stop" ? (fr.matched ?? null) : undefined,
    cachedTokens: meta.cached_tokens ?? undefined,
  });
  // SGLang reports the weights' version; its unset default ("default") says nothing.
  const wv = meta.weight_version;
  if (typeof wv === "string" && wv !== "" && wv !== SGLANG_DEFAULT_WEIGHT_VERSION) out.extra_fields = { ...out.extra_fields, model_version: wv };
  return out;
}

/** SGLang's `--weight-version` default: a reply carrying it reports no version. */
export const SGLANG_DEFAULT_WEIGHT_VERSION = "default";
