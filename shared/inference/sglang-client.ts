import { asPlainArray } from "../tokens/plain-array.ts";
import { isInt, isNum, isObj, nil, optId, optIdArray, optInt, optStr } from "./fast-check.ts";
import { z } from "zod";
import { ConfigError } from "../errors.ts";
import type { RoutedExpertsShape, RoutedExpertsSpan, TokenOutput } from "../schema/index.ts";
import { decodeInt32 } from "../schema/typed-base64.ts";
import { firstRepeatedExpert } from "../schema/routed-experts.ts";
import {
  badReply,
  DEFAULT_ENGINE_TIMEOUT_MS,
  engineErrorFromReply,
  withReplica,
  engineHeaders,
  engineTopK,
  joinUrl,
  postEngineJson,
  type EngineHttpReply,
  type FetchLike,
} from "./engine-http.ts";
import { cachedModelMaxLen, engineVersionSpans, finishOutput } from "./finish-output.ts";
import { generateStreamed, streamEventError, type StreamedTokens } from "./engine-stream.ts";
import type { GenerateRequest, InferenceClient } from "./types.ts";

/** Options of {@link SglangClient}. */
export interface SglangClientOptions {
  /** Base URL of the SGLang server (or a gateway), e.g. `http://127.0.0.1:30000`. */
  url: string;
  /** Per-request deadline in ms (default {@link DEFAULT_ENGINE_TIMEOUT_MS}). */
  timeoutMs?: number;
  /** Reply cap in bytes, counted while the reply streams (default `DEFAULT_ENGINE_MAX_REPLY_BYTES`, 64 MiB). */
  maxReplyBytes?: number;
  /** Web-standard fetch (default `globalThis.fetch`). */
  fetch?: FetchLike;
  /**
   * `[layers, top_k]` of the served MoE model (`engine.moe`): needed to read
   * `meta_info.routed_experts`, which carries no shape. Without it a request
   * with `return_routed_experts` is refused with a `ConfigError`.
   */
  moe?: { layers: number; top_k: number };
  /** The server's `--api-key` (`engine.api_key`), sent as `Authorization: Bearer` on every call; never logged. */
  apiKey?: string | null;
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
 * @see docs/engines.md §3.2
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
    /** Routed experts (`return_routed_experts: true`): base64 of int32 `[P + C − 1, layers, top_k]` (see {@link decodeSglangRoutedExperts}). */
    routed_experts: z.string().nullish(),
    /** Times the scheduler retracted (preempted) the request: edgeloop's `num_preempted`. */
    num_retractions: z.number().int().min(0).nullish(),
    /** Per-token weight-version spans (read by {@link engineVersionSpans}; unusable spans are ignored). */
    weight_versions: z.unknown().optional(),
  }),
});

/**
 * `body` itself, typed, when {@link SglangGenerateReply} surely accepts it;
 * undefined otherwise (then zod parses it and names the field). Checks every
 * field the schema checks — `output_token_logprobs` triples included — by
 * hand. zod's output holds the same values: the schema has no defaults or
 * transforms, and a triple's rest elements pass through.
 */
export function fastSglangGenerateReply(body: unknown): z.infer<typeof SglangGenerateReply> | undefined {
  if (!isObj(body) || !optStr(body.text) || !optIdArray(body.output_ids) || !optIdArray(body.token_ids)) return undefined;
  const m = body.meta_info;
  if (!isObj(m) || !optStr(m.id) || !optInt(m.prompt_tokens) || !optInt(m.completion_tokens) || !optId(m.cached_tokens)) return undefined;
  if (!optStr(m.weight_version) || !optStr(m.routed_experts) || !optId(m.num_retractions)) return undefined;
  const fr = m.finish_reason;
  if (!nil(fr)) {
    if (!isObj(fr) || typeof fr.type !== "string" || !optStr(fr.message)) return undefined;
    if (!(nil(fr.matched) || typeof fr.matched === "string" || isNum(fr.matched))) return undefined;
  }
  const lps = m.output_token_logprobs;
  if (!nil(lps)) {
    if (!Array.isArray(lps)) return undefined;
    for (let i = 0; i < lps.length; i++) {
      const t = lps[i];
      if (!Array.isArray(t) || t.length < 2) return undefined;
      if (!(t[0] === null || isNum(t[0])) || !(t[1] === null || (isInt(t[1]) && t[1] >= 0))) return undefined;
    }
  }
  return body as z.infer<typeof SglangGenerateReply>;
}

/**
 * Token-in/token-out client for SGLang's native `POST /generate`.
 *
 * Sends `input_ids`, `sampling_params.max_new_tokens` (always set),
 * `sampling_params.stop` when the request has stop strings (the matched one
 * comes back as `finish_reason.matched`),
 * `return_logprob: true` with `logprob_start_len: -1` (output tokens only) and
 * `rid` = the request id. Reads `output_ids` (or the ids inside the
 * `output_token_logprobs` triples), the finish-reason object and
 * `meta_info.cached_tokens`, `meta_info.num_retractions` (→ `num_preempted`) and
 * `meta_info.weight_versions` spans (→ `extra_fields.token_versions`, else
 * `weight_version` → `extra_fields.model_version`).
 * With `req.return_routed_experts` it also sends `return_routed_experts:
 * true` and reads `meta_info.routed_experts` (see
 * {@link decodeSglangRoutedExperts}; the server must run with
 * `--enable-return-routed-experts`).
 *
 * @throws ContextOverflowError, EngineUnavailableError, EngineAbortedError, BadEngineResponseError
 * @see https://github.com/sgl-project/sglang `GenerateReqInput` (docs/engines.md §3.1–3.2)
 */
export class SglangClient implements InferenceClient {
  readonly url: string;
  private readonly timeoutMs: number;
  private readonly maxReplyBytes: number | undefined;
  private readonly fetchFn: FetchLike;
  private readonly askMaxLen: () => Promise<number | undefined>;
  private readonly moe?: RoutedExpertsShape;
  private readonly apiKey: string | null;

  constructor(opts: SglangClientOptions) {
    this.url = opts.url;
    if (opts.moe) this.moe = [opts.moe.layers, opts.moe.top_k];
    this.apiKey = opts.apiKey ?? null;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_ENGINE_TIMEOUT_MS;
    this.maxReplyBytes = opts.maxReplyBytes;
    this.fetchFn = opts.fetch ?? ((input, init) => fetch(input, init));
    this.askMaxLen = cachedModelMaxLen(this.fetchFn, this.url, this.timeoutMs, this.apiKey);
  }

  /** The body sent to `POST /generate` for `req`. */
  generateBody(req: GenerateRequest): Record<string, unknown> {
    const sp = req.sampling_params;
    return {
      input_ids: asPlainArray(req.prompt_ids),
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
      ...(req.return_routed_experts ? { return_routed_experts: true } : {}),
      ...(req.image_data && req.image_data.length > 0 ? { image_data: [...req.image_data] } : {}),
    };
  }

  /**
   * One generation call; see the class docs for the error mapping. With
   * `req.on_tokens` it streams (`stream: true`, see {@link SglangStreamState}):
   * each event's new tokens go to the sink as they arrive, and the call
   * resolves with the output the non-streaming call gives; a stream that
   * breaks after ≥ 1 token resolves `finish_reason: "abort"` with the tokens
   * received. With `return_routed_experts` too the call does not stream
   * (the experts' wire form is only known for the whole reply): the sink
   * gets the whole output as one chunk before the call resolves.
   */
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    if (req.return_routed_experts && !this.moe) {
      throw new ConfigError("engine.moe", "rollout.return_routed_experts needs engine.moe {layers, top_k} of the served model: SGLang's meta_info.routed_experts carries no shape");
    }
    const url = joinUrl(this.url, "/generate");
    const headers = engineHeaders(req.routing_key, req.request_id, req.prefix_key, this.apiKey);
    const opts = { timeoutMs: this.timeoutMs, signal: req.signal, ...(this.maxReplyBytes ? { maxReplyBytes: this.maxReplyBytes } : {}) };
    if (req.on_tokens && !req.return_routed_experts) return this.generateStreaming(req, url, headers, opts);
    const reply = await postEngineJson(this.fetchFn, url, this.generateBody(req), headers, opts);
    const out = this.finishReply(req, url, reply);
    if (req.on_tokens && out.token_ids.length > 0) req.on_tokens(out.token_ids, req.sampling_params.logprobs ? (out.log_probs ?? null) : null);
    return out;
  }

  private finishReply(req: GenerateRequest, url: string, reply: EngineHttpReply): TokenOutput {
    if (reply.status < 200 || reply.status >= 300) throw engineErrorFromReply(url, reply);
    if (reply.body === undefined) throw badReply(url, "body is not JSON");
    const experts = req.return_routed_experts ? { shape: this.moe!, promptTokens: req.prompt_ids.length } : undefined;
    return withReplica(parseSglangReply(url, reply.body, req.sampling_params.logprobs, experts), reply);
  }

  private async generateStreaming(req: GenerateRequest, url: string, headers: Record<string, string>, opts: { timeoutMs: number; signal?: AbortSignal; maxReplyBytes?: number }): Promise<TokenOutput> {
    const st = new SglangStreamState(url, req.sampling_params.logprobs);
    return generateStreamed(this.fetchFn, url, { ...this.generateBody(req), stream: true }, headers, opts, req, st, (reply) => this.finishReply(req, url, reply));
  }

  /** `max_model_len` from `GET /v1/models` (cached after the first success); undefined when absent. */
  maxModelLen(): Promise<number | undefined> {
    return this.askMaxLen();
  }

  /**
   * `contextLen − 1`: SGLang refuses `input >= context_len` and `input +
   * max_new_tokens >= context_len` (`TokenizerManager._validate_one_request`),
   * so the longest stream it serves is one token short of its context.
   * @see docs/engines.md §3.3
   */
  servableLength(contextLen: number): number {
    return Math.max(1, contextLen - 1);
  }
}

/**
 * An SGLang `/generate` reply → {@link TokenOutput}. `stop_reason` is
 * `finish_reason.matched` for a stop (token id or stop string), absent otherwise.
 * With `experts` (routed experts were requested) `meta_info.routed_experts`
 * must be present and is decoded ({@link decodeSglangRoutedExperts}).
 * @throws BadEngineResponseError, EngineAbortedError (abort without tokens)
 */
export function parseSglangReply(url: string, body: unknown, wantLogprobs: boolean, experts?: { shape: RoutedExpertsShape; promptTokens: number }): TokenOutput {
  if (Array.isArray(body)) throw badReply(url, "a batch (array) reply to a single request");
  const fast = fastSglangGenerateReply(body);
  const parsed = fast ? { success: true as const, data: fast } : SglangGenerateReply.safeParse(body);
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
    ...(typeof meta.num_retractions === "number" ? { numPreempted: meta.num_retractions } : {}),
    ...(experts ? { routedExperts: decodeSglangRoutedExperts(url, meta.routed_experts, experts.shape, experts.promptTokens, ids.length) } : {}),
  });
  // SGLang reports the weights' version; its unset default ("default") says nothing. Per-token spans
  // (`weight_versions`, a weight update during the call) say more: they become the call's token_versions.
  const spans = engineVersionSpans(meta.weight_versions, ids.length);
  if (spans && spans.some(([, v]) => v !== SGLANG_DEFAULT_WEIGHT_VERSION)) {
    out.extra_fields = { ...out.extra_fields, model_version: spans[spans.length - 1]![1], token_versions: spans.map(([a, v]) => [a, v === SGLANG_DEFAULT_WEIGHT_VERSION ? null : v]) };
    return out;
  }
  const wv = meta.weight_version;
  if (typeof wv === "string" && wv !== "" && wv !== SGLANG_DEFAULT_WEIGHT_VERSION) out.extra_fields = { ...out.extra_fields, model_version: wv };
  return out;
}

/** SGLang's `--weight-version` default: a reply carrying it reports no version. */
export const SGLANG_DEFAULT_WEIGHT_VERSION = "default";

/**
 * SGLang's `meta_info.routed_experts` → a {@link RoutedExpertsSpan}.
 *
 * Wire facts: the request sets `return_routed_experts: true` (the server
 * needs `--enable-return-routed-experts`); the reply's
 * `meta_info.routed_experts` is base64 of the int32 array's raw bytes
 * (`pybase64.b64encode(tensor.numpy().tobytes())`, little-endian on every
 * GPU host), C-order `[seqlen − 1, layers, top_k]` with `seqlen = prompt +
 * completion tokens`: the experts of every token the engine forwarded — the
 * whole input (prefix-cached tokens too: the host buffer is indexed by KV
 * slot and keeps their rows) and every output token but the last, which was
 * sampled and never forwarded. The shape is not sent. A multi-turn call
 * re-sends the whole running stream as `input_ids`, so each reply covers the
 * trajectory so far (slime keeps the last turn's as the complete routing).
 * Accepted: `seqlen − 1` or `seqlen` rows (an engine that also reports the
 * last token), starting at position 0. A top-k row naming one expert twice
 * means `shape` is not the model's ({@link firstRepeatedExpert}).
 * @throws BadEngineResponseError naming `meta_info.routed_experts` when it is absent, not base64 of whole int32 values, of another length, or when a row repeats an expert (engine.moe wrong)
 * @see https://github.com/sgl-project/sglang `RoutedExpertsCapturer.get_routed_experts` (`req_to_token[req_pool_idx][: seqlen - 1]`), `TokenizerManager` (`meta_info["routed_experts"]`), PR #12162; sglang-jax docs/features/return_routed_experts.md; slime `sample.rollout_routed_experts` reshape `(len(sample.tokens) - 1, num_layers, moe_router_topk)`
 */
export function decodeSglangRoutedExperts(url: string, b64: string | null | undefined, shape: RoutedExpertsShape, promptTokens: number, outputTokens: number): RoutedExpertsSpan {
  if (typeof b64 !== "string") throw badReply(url, "meta_info.routed_experts is missing although return_routed_experts was requested (start SGLang with --enable-return-routed-experts)");
  let data: Int32Array;
  try {
    data = decodeInt32(b64);
  } catch (e) {
    throw badReply(url, `meta_info.routed_experts is not base64 of int32 values (${(e as Error).message})`);
  }
  const per = shape[0] * shape[1];
  const seqlen = promptTokens + outputTokens;
  const tokens = data.length / per;
  if (!Number.isInteger(tokens) || (tokens !== seqlen - 1 && tokens !== seqlen)) {
    throw badReply(
      url,
      `meta_info.routed_experts holds ${data.length} int32 values, expected (${promptTokens} + ${outputTokens} − 1) tokens × ${shape[0]} layers × ${shape[1]} top_k = ${Math.max(0, seqlen - 1) * per} (check engine.moe)`,
    );
  }
  const dup = firstRepeatedExpert(data, shape);
  if (dup) {
    throw badReply(
      url,
      `meta_info.routed_experts read as [${shape[0]} layers, top-${shape[1]}] names expert ${dup.expert} twice at token ${dup.token}, layer ${dup.layer}; a router's top-k experts are distinct, so engine.moe does not match the served model (transposed? [${shape[1]}, ${shape[0]}])`,
    );
  }
  return { data, shape: [shape[0], shape[1]], start: 0, tokens };
}

/**
 * The state of one SGLang `/generate` event stream (`stream: true`):
 * `data: {text, output_ids, meta_info}` events, then `data: [DONE]`.
 * By default (`incremental_streaming_output` off) every event is
 * **cumulative** — `output_ids` and `meta_info.output_token_logprobs` hold
 * everything generated so far; with `--incremental-streaming-output` they
 * hold the new tokens only. Each event tells which:
 * `meta_info.completion_tokens` counts all tokens so far either way, so an
 * event whose `output_ids` has that many is cumulative (its first ids must
 * repeat the ones received), one that adds up to it with the ids received is
 * incremental; without the count, ids that extend the received ones are
 * taken as cumulative. `meta_info.finish_reason` is null until the last
 * event; an abort the scheduler gave a status (`finish_reason.status_code`
 * 400, 500 or 503, which the non-streaming reply turns into that HTTP status)
 * arrives there too, and before any token fails as that status would. An
 * `{"error": {"message"}}` event (a `ValueError`, e.g. the context
 * check, which runs inside the stream: the status is already 200) is mapped
 * by {@link streamEventError}. Malformed events are retryable
 * `BadEngineResponseError`s naming the field.
 * @see docs/engines.md §7.1 (SGLang `http_server.py › generate_request`, `OutputProcessor.handle_batch_output`)
 */
class SglangStreamState {
  finished = false;
  private meta: Record<string, unknown> = {};
  private triples: unknown[][] = [];

  constructor(
    private readonly url: string,
    private readonly want: boolean,
  ) {}

  /** One event: its new tokens. `have`: the ids received before it. @throws BadEngineResponseError, the error of an error event */
  event(data: unknown, have: readonly number[]): { ids: number[]; logProbs: number[] | null } | undefined {
    if (isObj(data) && data.error !== undefined && data.meta_info === undefined) throw streamEventError(this.url, data as { error: unknown });
    const bad = (problem: string) => badReply(this.url, `stream event: ${problem}`);
    if (!isObj(data)) throw bad("not an object");
    const raw = data.output_ids ?? data.token_ids;
    if (!optIdArray(raw) || raw == null) throw bad("output_ids is not a list of token ids");
    const ids = raw as number[];
    const m = data.meta_info;
    if (!isObj(m)) throw bad("meta_info is not an object");
    const total = m.completion_tokens;
    if (!nil(total) && !(isInt(total) && (total as number) >= 0)) throw bad("meta_info.completion_tokens is not a count");
    const lps = m.output_token_logprobs;
    if (!nil(lps) && !Array.isArray(lps)) throw bad("meta_info.output_token_logprobs is not a list");
    const n = ids.length;
    const h = have.length;
    const extends_ = n >= h && have.every((v, i) => v === ids[i]);
    let cumulative: boolean;
    if (typeof total === "number") {
      if (n === total && extends_) cumulative = true;
      else if (h + n === total) cumulative = false;
      else throw bad(`meta_info.completion_tokens ${total} fits neither cumulative output_ids (${n}) nor new ones after ${h}`);
    } else cumulative = extends_;
    const from = cumulative ? h : 0;
    const delta = from > 0 ? ids.slice(from) : ids;
    let deltaTriples: unknown[][] = [];
    if (Array.isArray(lps)) {
      if (lps.length !== n) throw bad(`meta_info.output_token_logprobs has ${lps.length} entries for ${n} output_ids`);
      for (let i = from; i < n; i++) {
        const t = lps[i];
        if (!Array.isArray(t) || t.length < 2 || !(t[0] === null || isNum(t[0])) || t[1] !== delta[i - from]) {
          throw bad(`meta_info.output_token_logprobs[${i}] is not a [logprob, ${delta[i - from]}, …] triple`);
        }
        deltaTriples.push(t);
      }
    } else if (this.want && delta.length > 0) throw bad("meta_info.output_token_logprobs is missing (log-probs were requested)");
    if (this.finished && delta.length > 0) throw bad("tokens after the event that carried meta_info.finish_reason");
    // A scheduler abort with a status (`_handle_abort_finish_reason`): without a token it fails as the
    // non-streaming reply does (400 → the request's error, 500/503 → unavailable); after tokens it is an abort.
    const fr = m.finish_reason;
    if (isObj(fr) && fr.type === "abort" && h + delta.length === 0 && (fr.status_code === 400 || fr.status_code === 500 || fr.status_code === 503)) {
      const message = typeof fr.message === "string" ? fr.message : "aborted";
      throw engineErrorFromReply(this.url, { status: fr.status_code as number, body: { error: { message } }, text: message });
    }
    for (const t of deltaTriples) this.triples.push(t);
    this.meta = m;
    if (!nil(m.finish_reason)) this.finished = true;
    if (!this.want) return { ids: delta, logProbs: null };
    const out: number[] = [];
    for (const t of deltaTriples) {
      if (typeof t[0] !== "number") throw bad("a sampled token has a null log-prob in meta_info.output_token_logprobs");
      out.push(t[0]);
    }
    return { ids: delta, logProbs: out };
  }

  /** The output of everything received, as the non-streaming reply would give it (`finish` "abort": the stream broke). */
  build(acc: StreamedTokens, finish: "abort" | null): TokenOutput {
    const meta = {
      ...this.meta,
      output_token_logprobs: this.triples.length === acc.ids.length ? this.triples : null,
      completion_tokens: acc.ids.length,
      ...(finish ? { finish_reason: { type: "abort", message: "the event stream broke" } } : {}),
    };
    return parseSglangReply(this.url, { output_ids: acc.ids, meta_info: meta }, this.want);
  }
}
