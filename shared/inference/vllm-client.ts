import { asPlainArray } from "../tokens/plain-array.ts";
import { ConfigError } from "../errors.ts";
import { TokenOutput } from "../schema/index.ts";
import {
  badReply,
  DEFAULT_ENGINE_TIMEOUT_MS,
  engineErrorFromReply,
  withReplica,
  engineHeaders,
  engineTopK,
  joinUrl,
  postEngineJson,
  VLLM_GENERATE_PATH,
  type EngineHttpReply,
  type FetchLike,
} from "./engine-http.ts";
import { CachedTokensNotice, cachedModelMaxLen, engineVersionSpans, finishOutput } from "./finish-output.ts";
import { generateStreamed, streamEventError, type StreamedTokens } from "./engine-stream.ts";
import { isObj } from "./fast-check.ts";
import type { GenerateRequest, InferenceClient } from "./types.ts";
import { fastVllmCompletionReply, fastVllmGenerateReply, idsFromTokenIdStrings, VllmCompletionReply, VllmGenerateReply } from "./vllm-wire.ts";

/** Options of {@link VllmClient}. */
export interface VllmClientOptions {
  /** Base URL of the server (or of a gateway in front of it), e.g. `http://127.0.0.1:8000`. */
  url: string;
  /** `model` field of the body; omitted when unset (the server then uses its only model). */
  model?: string;
  /** Per-request deadline in ms (default {@link DEFAULT_ENGINE_TIMEOUT_MS}). */
  timeoutMs?: number;
  /** Reply cap in bytes, counted while the reply streams (default `DEFAULT_ENGINE_MAX_REPLY_BYTES`, 64 MiB). */
  maxReplyBytes?: number;
  /** Web-standard fetch (default `globalThis.fetch`). */
  fetch?: FetchLike;
  /**
   * `completions` (default): `POST /v1/completions` with a token-id prompt.
   * `generate`: `POST /inference/v1/generate`, the tokens-only endpoint, which the
   * server must switch on (`--enable-scale-out` on vLLM main,
   * `VLLM_ENABLE_SCALE_OUT_ENDPOINTS=1` on 0.2x; a 404 names both).
   */
  endpoint?: "completions" | "generate";
  /** The server's `--api-key` (`engine.api_key`), sent as `Authorization: Bearer` on every call; never logged. */
  apiKey?: string | null;
}

/**
 * Token-in/token-out client for a vLLM OpenAI-compatible server.
 *
 * Sends the prompt as token ids with `max_tokens` always set, `logprobs: 0`,
 * `return_token_ids: true` and `return_tokens_as_token_ids: true` (and `stop`
 * when the request has stop strings; the matched string comes back as
 * `stop_reason`, the tokens are kept whole), so that a
 * server too old for `token_ids` still names each sampled id in
 * `logprobs.tokens` (`"token_id:<id>"`). A reply from which the ids cannot be
 * recovered is a {@link BadEngineResponseError}: text is never re-encoded and
 * log-probs are never padded. A `finish_reason: "abort"` reply with partial
 * tokens is returned as such (the caller keeps them and resumes); without
 * tokens it is an {@link EngineAbortedError}.
 *
 * @throws ContextOverflowError, EngineUnavailableError, EngineAbortedError, BadEngineResponseError
 * @see https://github.com/vllm-project/vllm `CompletionRequest` (docs/engines.md §2.2–2.5)
 */
export class VllmClient implements InferenceClient {
  readonly url: string;
  private readonly model?: string;
  private readonly timeoutMs: number;
  private readonly maxReplyBytes: number | undefined;
  private readonly fetchFn: FetchLike;
  private readonly endpoint: "completions" | "generate";
  private readonly askMaxLen: () => Promise<number | undefined>;
  private readonly apiKey: string | null;
  private readonly cachedTokens = new CachedTokensNotice("vLLM", "start vLLM with --enable-prompt-tokens-details");

  constructor(opts: VllmClientOptions) {
    this.url = opts.url;
    this.model = opts.model;
    this.apiKey = opts.apiKey ?? null;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_ENGINE_TIMEOUT_MS;
    this.maxReplyBytes = opts.maxReplyBytes;
    this.fetchFn = opts.fetch ?? ((input, init) => fetch(input, init));
    this.askMaxLen = cachedModelMaxLen(this.fetchFn, this.url, this.timeoutMs, this.apiKey);
    this.endpoint = opts.endpoint ?? "completions";
  }

  /** The body sent to `POST /v1/completions` for `req` (exported for tests and docs). */
  completionsBody(req: GenerateRequest): Record<string, unknown> {
    const sp = req.sampling_params;
    return {
      ...(this.model ? { model: this.model } : {}),
      prompt: asPlainArray(req.prompt_ids),
      max_tokens: req.max_tokens,
      temperature: sp.temperature,
      top_p: sp.top_p,
      top_k: engineTopK(sp.top_k, "vllm"),
      n: 1,
      ...(sp.seed !== undefined ? { seed: sp.seed } : {}),
      ...(sp.stop_token_ids ? { stop_token_ids: sp.stop_token_ids } : {}),
      ...(sp.stop?.length ? { stop: sp.stop } : {}),
      logprobs: 0,
      return_token_ids: true,
      return_tokens_as_token_ids: true,
      skip_special_tokens: false,
      include_stop_str_in_output: false,
      stream: false,
      request_id: req.request_id,
    };
  }

  /**
   * The body sent to `POST /inference/v1/generate` for `req`. `detokenize` is
   * false unless the request has stop strings, which vLLM only matches on
   * detokenized text (a `--tokens-only` server cannot honour them).
   */
  generateBody(req: GenerateRequest): Record<string, unknown> {
    const sp = req.sampling_params;
    const stop = sp.stop?.length ? sp.stop : undefined;
    return {
      ...(this.model ? { model: this.model } : {}),
      request_id: req.request_id,
      token_ids: asPlainArray(req.prompt_ids),
      sampling_params: {
        max_tokens: req.max_tokens,
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: engineTopK(sp.top_k, "vllm"),
        ...(sp.seed !== undefined ? { seed: sp.seed } : {}),
        ...(sp.stop_token_ids ? { stop_token_ids: sp.stop_token_ids } : {}),
        ...(stop ? { stop } : {}),
        logprobs: 0,
        skip_special_tokens: false,
        include_stop_str_in_output: false,
        // vLLM refuses stop strings without detokenization ("stop strings are only supported when detokenize is True").
        detokenize: stop !== undefined,
      },
      stream: false,
    };
  }

  /**
   * One generation call; see the class docs for the error mapping. With
   * `req.on_tokens` it streams ({@link streamingBody}): each event's new
   * tokens go to the sink as they arrive, and the call resolves with the
   * output the non-streaming call gives; a stream that breaks after ≥ 1
   * token resolves `finish_reason: "abort"` with the tokens received.
   */
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    if (req.return_routed_experts) throw vllmRoutedExpertsRefused();
    if (req.image_data && req.image_data.length > 0) {
      throw new ConfigError("engine.format", "images (a vision-language prompt) are sent with engine.format sglang only: edgeloop's vLLM adapters send token-id prompts, which carry no images");
    }
    const path = this.endpoint === "generate" ? VLLM_GENERATE_PATH : "/v1/completions";
    const url = joinUrl(this.url, path);
    const headers = engineHeaders(req.routing_key, req.request_id, req.prefix_key, this.apiKey);
    const opts = { timeoutMs: this.timeoutMs, signal: req.signal, ...(this.maxReplyBytes ? { maxReplyBytes: this.maxReplyBytes } : {}) };
    if (req.on_tokens) return this.generateStreaming(req, url, headers, opts);
    const body = this.endpoint === "generate" ? this.generateBody(req) : this.completionsBody(req);
    const reply = await postEngineJson(this.fetchFn, url, body, headers, opts);
    return this.finishReply(req, url, reply);
  }

  /**
   * The streaming form of {@link completionsBody} / {@link generateBody}:
   * `stream: true` and `stream_options: {include_usage: true}` (vLLM sends
   * `usage` — with `prompt_tokens_details.cached_tokens` — only in a last
   * event with `choices: []`, and only when asked).
   * @see docs/engines.md §7.2–7.3
   */
  streamingBody(req: GenerateRequest): Record<string, unknown> {
    const body = this.endpoint === "generate" ? this.generateBody(req) : this.completionsBody(req);
    return { ...body, stream: true, stream_options: { include_usage: true } };
  }

  private finishReply(req: GenerateRequest, url: string, reply: EngineHttpReply): TokenOutput {
    if (reply.status < 200 || reply.status >= 300) throw engineErrorFromReply(url, reply);
    if (reply.body === undefined) throw badReply(url, "body is not JSON");
    const out =
      this.endpoint === "generate"
        ? parseGenerateReply(url, reply.body, req.sampling_params.logprobs)
        : parseCompletionReply(url, reply.body, req.sampling_params.logprobs);
    this.cachedTokens.saw(out.cached_tokens !== undefined);
    return withReplica(out, reply);
  }

  private async generateStreaming(req: GenerateRequest, url: string, headers: Record<string, string>, opts: { timeoutMs: number; signal?: AbortSignal; maxReplyBytes?: number }): Promise<TokenOutput> {
    const st = new VllmStreamState(url, this.endpoint, req.sampling_params.logprobs);
    const out = await generateStreamed(this.fetchFn, url, this.streamingBody(req), headers, opts, req, st, (reply) => this.finishReply(req, url, reply));
    // What the server reports is learnt from whole replies (finishReply) and finished streams (an aborted one may lack usage).
    if (st.finished) this.cachedTokens.saw(out.cached_tokens !== undefined);
    return out;
  }

  /** Whether a reply lacked `cached_tokens` (the server runs without `--enable-prompt-tokens-details`); said once per client. */
  get cachedTokensNotice(): CachedTokensNotice {
    return this.cachedTokens;
  }

  /** `max_model_len` from `GET /v1/models` (cached after the first success); undefined when absent. */
  maxModelLen(): Promise<number | undefined> {
    return this.askMaxLen();
  }
}

/**
 * A vLLM `/v1/completions` reply → {@link TokenOutput}. Ids come from
 * `choices[0].token_ids`, else from `"token_id:<id>"` strings in
 * `logprobs.tokens`; when both are present they must agree.
 * @throws BadEngineResponseError, EngineAbortedError (abort without tokens)
 */
export function parseCompletionReply(url: string, body: unknown, wantLogprobs: boolean): TokenOutput {
  const fast = fastVllmCompletionReply(body);
  const parsed = fast ? { success: true as const, data: fast } : VllmCompletionReply.safeParse(body);
  if (!parsed.success) throw badReply(url, `not a completion reply (${parsed.error.issues[0]?.path.join(".")}: ${parsed.error.issues[0]?.message})`);
  const choice = parsed.data.choices[0];
  const fromStrings = choice.logprobs?.tokens ? idsFromTokenIdStrings(choice.logprobs.tokens) : undefined;
  const ids = choice.token_ids ?? fromStrings;
  if (!ids) {
    throw badReply(
      url,
      "no token ids: choices[0].token_ids is missing and logprobs.tokens are not 'token_id:<id>' strings (needs vLLM ≥ 0.10.2 or return_tokens_as_token_ids)",
    );
  }
  if (choice.token_ids && fromStrings && !sameIds(choice.token_ids, fromStrings)) {
    throw badReply(url, "choices[0].token_ids disagree with the ids in logprobs.tokens");
  }
  const lps = choice.logprobs?.token_logprobs ?? undefined;
  return finishOutput(url, {
    ids,
    logProbs: lps,
    wantLogprobs,
    finishReason: choice.finish_reason,
    stopReason: choice.stop_reason,
    cachedTokens: parsed.data.usage?.prompt_tokens_details?.cached_tokens ?? undefined,
    defaultFinish: undefined,
  });
}

/**
 * A vLLM `/inference/v1/generate` reply → {@link TokenOutput}. `finish_reason`
 * defaults to `"stop"` when missing, as the server does.
 * @throws BadEngineResponseError, EngineAbortedError (abort without tokens)
 */
export function parseGenerateReply(url: string, body: unknown, wantLogprobs: boolean): TokenOutput {
  const fast = fastVllmGenerateReply(body);
  const parsed = fast ? { success: true as const, data: fast } : VllmGenerateReply.safeParse(body);
  if (!parsed.success) throw badReply(url, `not a generate reply (${parsed.error.issues[0]?.path.join(".")}: ${parsed.error.issues[0]?.message})`);
  const choice = parsed.data.choices[0];
  const content = choice.logprobs?.content ?? undefined;
  // vLLM main names each entry's id (`token_id`); older servers a `token_id:<id>` string.
  const fromEntries = content?.length && content.every((c) => typeof c.token_id === "number") ? content.map((c) => c.token_id as number) : undefined;
  const fromStrings = fromEntries ?? (content ? idsFromTokenIdStrings(content.map((c) => c.token)) : undefined);
  const ids = choice.token_ids ?? fromStrings;
  if (!ids) throw badReply(url, "no token ids: choices[0].token_ids is missing and logprobs.content names no token ids (token_id or 'token_id:<id>')");
  if (choice.token_ids && fromStrings && !sameIds(choice.token_ids, fromStrings)) {
    throw badReply(url, "choices[0].token_ids disagree with the ids in logprobs.content");
  }
  const out = finishOutput(url, {
    ids,
    logProbs: content?.map((c) => c.logprob),
    wantLogprobs,
    finishReason: choice.finish_reason,
    stopReason: choice.stop_reason,
    cachedTokens: parsed.data.usage?.prompt_tokens_details?.cached_tokens ?? undefined,
    defaultFinish: "stop",
  });
  // vLLM main reports per-token weight-version spans: they are the call's token_versions.
  const spans = engineVersionSpans(choice.weight_versions, ids.length);
  if (spans) out.extra_fields = { ...out.extra_fields, model_version: spans[spans.length - 1]![1], token_versions: spans };
  return out;
}

function sameIds(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

/**
 * Why the vLLM adapters refuse `rollout.return_routed_experts`. Current vLLM
 * returns routed experts behind a server switch (`--enable-return-routed-experts`,
 * no per-request flag) on both endpoints in one form —
 * `CompletionResponseChoice.routed_experts` and `GenerateChoiceBase.routed_experts`:
 * base64 of an `.npy` array shaped `(num_tokens − 1, layers, top_k)`, dtype
 * uint8, uint16 or int32 by expert count, with `routed_experts_prompt_start`
 * on the request — but edgeloop has not contract-tested that form yet, so it
 * asks for experts only over SGLang's `/generate` (and the simulator).
 * @see docs/engines.md §2.11; vLLM `CompletionResponseChoice.routed_experts`
 */
export function vllmRoutedExpertsRefused(): ConfigError {
  return new ConfigError(
    "rollout.return_routed_experts",
    "is not supported with engine.format vllm or vllm-generate (vLLM returns routed experts only behind a server flag, in version-specific wire forms); use engine.format sglang (SGLang's return_routed_experts) or the simulated engine",
  );
}

/**
 * The state of one vLLM event stream: the events of `POST /v1/completions`
 * or `/inference/v1/generate` with `stream: true`. Every event carries the
 * **new** tokens only (`RequestOutputKind.DELTA`): `choices[0].token_ids`
 * (with `return_token_ids`; completions also name them in
 * `logprobs.tokens` as `token_id:N`, generate in `logprobs.content[].token_id`),
 * their log-probs (`logprobs.token_logprobs`, resp. `logprobs.content[].logprob`),
 * and `finish_reason` / `stop_reason` on the event of the last tokens
 * (completions may send it on an event with no tokens; the tokens endpoint
 * skips empty events, so an abort there ends with `[DONE]` and no finish
 * reason). A last event with `choices: []` carries `usage` when
 * `stream_options.include_usage`. An `{"error": …}` event is mapped by
 * {@link streamEventError}. Malformed events are retryable
 * `BadEngineResponseError`s naming the field.
 * @see docs/engines.md §7.2–7.3
 */
class VllmStreamState {
  finished = false;
  private finish: string | null = null;
  private stopReason: number | string | null | undefined = undefined;
  private usage: unknown = null;
  private logProbs: (number | null)[] | null = [];

  constructor(
    private readonly url: string,
    private readonly endpoint: "completions" | "generate",
    private readonly want: boolean,
  ) {}

  /** One event: its new tokens (none for a usage or finish-only event). @throws BadEngineResponseError, the error of an error event */
  event(data: unknown): { ids: number[]; logProbs: number[] | null } | undefined {
    if (isObj(data) && data.error !== undefined && data.choices === undefined) throw streamEventError(this.url, data as { error: unknown });
    // Older servers' flat error body (`{"object": "error", "message", "code"}`).
    if (isObj(data) && data.object === "error") throw streamEventError(this.url, { error: { message: data.message, code: data.code } });
    if (isObj(data) && Array.isArray(data.choices) && data.choices.length === 0) {
      this.usage = data.usage ?? null;
      return undefined;
    }
    const bad = (problem: string) => badReply(this.url, `stream event: ${problem}`);
    let ids: number[] | undefined;
    let lps: (number | null)[] | undefined;
    let choice: { finish_reason?: string | null; stop_reason?: number | string | null };
    if (this.endpoint === "completions") {
      const fast = fastVllmCompletionReply(data);
      const parsed = fast ? { success: true as const, data: fast } : VllmCompletionReply.safeParse(data);
      if (!parsed.success) throw bad(`not a completion event (${parsed.error.issues[0]?.path.join(".")}: ${parsed.error.issues[0]?.message})`);
      const c = parsed.data.choices[0];
      const fromStrings = c.logprobs?.tokens ? idsFromTokenIdStrings(c.logprobs.tokens) : undefined;
      ids = c.token_ids ?? fromStrings;
      if (!ids) throw bad("choices[0].token_ids is missing and logprobs.tokens are not 'token_id:<id>' strings");
      if (c.token_ids && fromStrings && !sameIds(c.token_ids, fromStrings)) throw bad("choices[0].token_ids disagree with the ids in logprobs.tokens");
      lps = c.logprobs?.token_logprobs ?? undefined;
      choice = c;
    } else {
      const fast = fastVllmGenerateReply(data);
      const parsed = fast ? { success: true as const, data: fast } : VllmGenerateReply.safeParse(data);
      if (!parsed.success) throw bad(`not a generate event (${parsed.error.issues[0]?.path.join(".")}: ${parsed.error.issues[0]?.message})`);
      const c = parsed.data.choices[0];
      const content = c.logprobs?.content ?? undefined;
      const fromEntries = content?.length && content.every((e) => typeof e.token_id === "number") ? content.map((e) => e.token_id as number) : undefined;
      const fromStrings = fromEntries ?? (content ? idsFromTokenIdStrings(content.map((e) => e.token)) : undefined);
      ids = c.token_ids ?? fromStrings;
      if (!ids) throw bad("choices[0].token_ids is missing and logprobs.content names no token ids");
      if (c.token_ids && fromStrings && !sameIds(c.token_ids, fromStrings)) throw bad("choices[0].token_ids disagree with the ids in logprobs.content");
      lps = content?.map((e) => e.logprob);
      choice = c;
    }
    if (this.finished && ids.length > 0) throw bad("tokens after the event that carried finish_reason");
    let checked: number[] | null = null;
    if (this.want) {
      const what = this.endpoint === "completions" ? "choices[0].logprobs.token_logprobs" : "choices[0].logprobs.content[].logprob";
      if (!lps || lps.length !== ids.length) throw bad(`${what} has ${lps?.length ?? 0} log-probs for ${ids.length} token ids`);
      if (lps.some((v) => typeof v !== "number" || !Number.isFinite(v))) throw bad(`${what}: a sampled token has a null or non-finite log-prob`);
      checked = lps as number[];
    }
    if (this.logProbs && lps && lps.length === ids.length) for (const v of lps) this.logProbs.push(v);
    else if (ids.length > 0) this.logProbs = null;
    if (choice.finish_reason != null) {
      this.finished = true;
      this.finish = choice.finish_reason;
      this.stopReason = choice.stop_reason;
    }
    return { ids, logProbs: checked };
  }

  /** The output of everything received, as the non-streaming reply would give it (`finish` "abort": the stream broke). */
  build(acc: StreamedTokens, finish: "abort" | null): TokenOutput {
    const finishReason = finish ?? this.finish;
    const stopReason = finish ? undefined : this.stopReason;
    if (this.endpoint === "completions") {
      const choice = { token_ids: acc.ids, logprobs: this.logProbs ? { token_logprobs: this.logProbs } : null, finish_reason: finishReason, stop_reason: stopReason };
      return parseCompletionReply(this.url, { choices: [choice], usage: this.usage }, this.want);
    }
    const content = this.logProbs ? this.logProbs.map((logprob) => ({ logprob })) : null;
    const choice = { token_ids: acc.ids, logprobs: content ? { content } : null, finish_reason: finishReason, stop_reason: stopReason };
    return parseGenerateReply(this.url, { choices: [choice], usage: this.usage }, this.want);
  }
}
