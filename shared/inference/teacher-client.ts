import { z } from "zod";
import { BadEngineResponseError, ConfigError } from "../errors.ts";
import { badReply, DEFAULT_ENGINE_TIMEOUT_MS, engineErrorFromReply, engineHeaders, joinUrl, postEngineJson, type FetchLike } from "./engine-http.ts";
import { redactUrl } from "../http/outbound.ts";
import { retryEngineCall, type RetryOptions } from "./retrying-client.ts";

/**
 * One prefill-only scoring call: the teacher's log-prob of every response
 * token given everything before it, on the token stream `prompt_ids ‖
 * response_ids` (token-in, nothing re-encoded). `routing_key` is the
 * trajectory key (sticky routing, as policy calls); `request_id` is fresh.
 */
export interface TeacherScoreRequest {
  request_id: string;
  routing_key: string;
  prompt_ids: ArrayLike<number>;
  response_ids: ArrayLike<number>;
  signal?: AbortSignal;
}

/**
 * A teacher engine: scores token streams and tokenizes text (for the
 * start-up check that it shares the policy's tokenizer).
 */
export interface TeacherClient {
  /**
   * The teacher's log-prob of each response token, `log p(response_ids[i] |
   * prompt_ids ‖ response_ids[<i])`, one per response token (length =
   * `response_ids.length`), as the engine returned them (not rounded).
   * @throws EngineUnavailableError, BadEngineResponseError (the reply lacks a position or names another token), ContextOverflowError
   */
  score(req: TeacherScoreRequest): Promise<number[]>;
  /**
   * Token ids of `text` without special tokens added (vLLM `POST /tokenize`,
   * SGLang `POST /v1/tokenize`).
   * @throws EngineUnavailableError, BadEngineResponseError
   */
  tokenize(text: string, signal?: AbortSignal): Promise<number[]>;
  /** Where the teacher is, for messages (`vllm at http://…`). */
  readonly describe: string;
}

/** Wire format of a teacher, as `engine.format`. */
export type TeacherFormat = "vllm" | "vllm-generate" | "sglang";

/** Options of {@link createTeacherClient}. */
export interface TeacherClientOptions {
  /** Base URL of the teacher engine (or of a gateway in front of its replicas). */
  url: string;
  format: TeacherFormat;
  /** vLLM `model` field (ignored by SGLang). */
  model?: string;
  /** Per-attempt deadline in ms (default {@link DEFAULT_ENGINE_TIMEOUT_MS}). */
  timeoutMs?: number;
  /** Reply cap in bytes, counted while the reply streams (default 64 MiB, `DEFAULT_ENGINE_MAX_REPLY_BYTES`). */
  maxReplyBytes?: number;
  /** Web-standard fetch (default `globalThis.fetch`); an in-process gateway's `fetch` routes among replicas. */
  fetch?: FetchLike;
  /** Retries of failed calls (5xx, refused, deadline, garbled 2xx), as the policy's engine client (default 3 retries). */
  retry?: RetryOptions;
  /** The teacher server's `--api-key` (env `EDGELOOP_TEACHER_API_KEY`), sent as `Authorization: Bearer`; never logged. */
  apiKey?: string | null;
}

/** One `{logprob, rank, decoded_token}` of vLLM's `prompt_logprobs` (only `logprob` is read). */
const VllmLogprob = z.looseObject({ logprob: z.number().nullable() });
/** vLLM `prompt_logprobs`: one entry per prompt position, entry 0 null, others `{"<token_id>": Logprob}` (JSON keys are strings). */
const VllmPromptLogprobs = z.array(z.record(z.string(), VllmLogprob).nullable());
const VllmCompletionScoreReply = z.looseObject({ choices: z.array(z.looseObject({ prompt_logprobs: VllmPromptLogprobs.nullish() })).min(1) });
const VllmGenerateScoreReply = z.looseObject({ prompt_logprobs: VllmPromptLogprobs.nullish() });
/** SGLang `meta_info.input_token_logprobs`: `[logprob|null, token_id, text|null]` per scored input position. */
const SglangScoreReply = z.looseObject({
  meta_info: z.looseObject({ input_token_logprobs: z.array(z.tuple([z.number().nullable(), z.number().int()]).rest(z.unknown())).nullish() }),
});
const TokenizeReply = z.looseObject({ tokens: z.array(z.number().int().min(0)) });

/**
 * The request body of a scoring call for `ids = prompt ‖ response` whose
 * first response token is at position `start` (= `prompt_ids.length`).
 *
 * - `vllm`: `POST /v1/completions` with the token-id prompt, `max_tokens: 1`
 *   (vLLM refuses 0: `SamplingParams` wants `max_tokens >= 1`, vllm-project/vllm
 *   issue #9336), `prompt_logprobs: 1` (0 is enough on current vLLM, but older
 *   V1 builds treated 0 as off; 1 also returns the prompt token itself) and
 *   `temperature: 1`; reply `choices[0].prompt_logprobs`.
 * - `vllm-generate`: `POST /inference/v1/generate` with `token_ids` and the
 *   same `sampling_params`; reply top-level `prompt_logprobs`
 *   (`vllm/entrypoints/serve/disagg/protocol.py` `GenerateResponse`).
 * - `sglang`: `POST /generate` with `input_ids`, `max_new_tokens: 0`,
 *   `return_logprob: true`, `logprob_start_len: start − 1`; reply
 *   `meta_info.input_token_logprobs`.
 *
 * So that the teacher scores a full context, its context must hold
 * `len(ids) + 1` tokens: vLLM generates one token, and SGLang refuses
 * `input >= context_len` (docs/engines.md §3.3).
 * @see docs/engines.md §2.8 (vLLM) and §3.2 (SGLang, teacher scoring)
 */
export function teacherScoreBody(format: TeacherFormat, ids: number[], start: number, requestId: string, model?: string): { path: string; body: Record<string, unknown> } {
  if (format === "sglang") {
    return {
      path: "/generate",
      body: {
        input_ids: ids,
        sampling_params: { max_new_tokens: 0, temperature: 1.0 },
        return_logprob: true,
        logprob_start_len: Math.max(0, start - 1),
        top_logprobs_num: 0,
        return_text_in_logprobs: false,
        stream: false,
        rid: requestId,
      },
    };
  }
  const sampling = { max_tokens: 1, temperature: 1.0, prompt_logprobs: 1, skip_special_tokens: false };
  if (format === "vllm-generate") {
    return {
      path: "/inference/v1/generate",
      body: { ...(model ? { model } : {}), request_id: requestId, token_ids: ids, sampling_params: { ...sampling, detokenize: false }, stream: false },
    };
  }
  return { path: "/v1/completions", body: { ...(model ? { model } : {}), prompt: ids, ...sampling, n: 1, stream: false, request_id: requestId } };
}

/**
 * The response tokens' log-probs (positions `start … ids.length − 1`) from
 * vLLM's `prompt_logprobs`: entry `j` scores `ids[j]` given `ids[<j]`
 * (entry 0 is null: the first token has no context), as a dict keyed by
 * token id that always holds the prompt token itself (vLLM injects it with
 * rank k+1 when it is not among the top k; `vllm/v1/engine/logprobs.py`).
 * @throws BadEngineResponseError (retryable) when the list does not cover every position or an entry lacks its token
 */
export function vllmPromptLogprobs(url: string, list: z.infer<typeof VllmPromptLogprobs> | null | undefined, ids: readonly number[], start: number): number[] {
  if (!list) throw badReply(url, "no prompt_logprobs in the reply (the teacher must honour prompt_logprobs)");
  if (list.length !== ids.length) throw badReply(url, `prompt_logprobs has ${list.length} entries for ${ids.length} input tokens`);
  const out: number[] = new Array(ids.length - start);
  for (let j = start; j < ids.length; j++) {
    const lp = list[j]?.[String(ids[j])]?.logprob;
    if (typeof lp !== "number" || !Number.isFinite(lp)) throw badReply(url, `prompt_logprobs[${j}] has no log-prob for token ${ids[j]}`);
    out[j - start] = lp;
  }
  return out;
}

/**
 * The response tokens' log-probs from SGLang's `input_token_logprobs`. With
 * `logprob_start_len = L` current SGLang returns one entry per input
 * position `L … n−1`, the first with a null log-prob
 * (`scheduler_output_processor_mixin.py`: "Always pad the first one with
 * None", ids `origin_input_ids[L:]`); older builds returned positions
 * `L+1 … n−1` without the null. Entries are therefore aligned from the end
 * (the last entry is always position `n−1`), and every entry's token id must
 * equal the input's at its position — an off-by-one cannot pass silently.
 * @throws BadEngineResponseError (retryable) when an entry names another token or a response position has no log-prob
 */
export function sglangInputLogprobs(url: string, entries: readonly (readonly [number | null, number, ...unknown[]])[] | null | undefined, ids: readonly number[], start: number): number[] {
  if (!entries) throw badReply(url, "no meta_info.input_token_logprobs in the reply (return_logprob must be honoured)");
  const first = ids.length - entries.length;
  if (first < 0) throw badReply(url, `input_token_logprobs has ${entries.length} entries for ${ids.length} input tokens`);
  if (first > start) throw badReply(url, `input_token_logprobs starts at position ${first}, after the first response token (${start})`);
  for (let k = 0; k < entries.length; k++) {
    if (entries[k]![1] !== ids[first + k]) throw badReply(url, `input_token_logprobs[${k}] names token ${entries[k]![1]}, the input has ${ids[first + k]} at position ${first + k}`);
  }
  const out: number[] = new Array(ids.length - start);
  for (let j = start; j < ids.length; j++) {
    const lp = entries[j - first]![0];
    if (typeof lp !== "number" || !Number.isFinite(lp)) throw badReply(url, `input_token_logprobs has no log-prob for position ${j}`);
    out[j - start] = lp;
  }
  return out;
}

/**
 * A {@link TeacherClient} for a vLLM or SGLang teacher (see
 * {@link teacherScoreBody} for the wire forms). Calls carry the routing key
 * in `X-Session-ID`/`X-SMG-Routing-Key` like policy calls, and are retried
 * by the policy client's retry loop ({@link retryEngineCall}); put a gateway
 * (`fetch` of an in-process `createGatewayApp` over the replicas) in front
 * for several replicas.
 * @throws ConfigError for a URL that does not parse or an unknown format
 */
export function createTeacherClient(opts: TeacherClientOptions): TeacherClient {
  try {
    new URL(opts.url);
  } catch {
    throw new ConfigError("rollout.teacher.url", `${JSON.stringify(opts.url)} is not a URL; pass e.g. http://127.0.0.1:8001`);
  }
  if (opts.format !== "vllm" && opts.format !== "vllm-generate" && opts.format !== "sglang") {
    throw new ConfigError("rollout.teacher.format", `${JSON.stringify(opts.format)} is not one of vllm, vllm-generate, sglang`);
  }
  const fetchFn: FetchLike = opts.fetch ?? ((input, init) => fetch(input, init));
  const timeoutMs = opts.timeoutMs ?? DEFAULT_ENGINE_TIMEOUT_MS;
  const retry = opts.retry ?? { retries: 3 };
  const format = opts.format;

  async function scoreOnce(req: TeacherScoreRequest, requestId: string, signal: AbortSignal | undefined): Promise<number[]> {
    const ids = [...Array.from(req.prompt_ids), ...Array.from(req.response_ids)];
    const start = req.prompt_ids.length;
    if (req.response_ids.length === 0) return [];
    if (start === 0) throw new BadEngineResponseError("a trajectory without prompt tokens cannot be scored (position 0 has no context)");
    const { path, body } = teacherScoreBody(format, ids, start, requestId, opts.model);
    const url = joinUrl(opts.url, path);
    const reply = await postEngineJson(fetchFn, url, body, engineHeaders(req.routing_key, requestId, undefined, opts.apiKey), { timeoutMs, ...(signal ? { signal } : {}), ...(opts.maxReplyBytes ? { maxReplyBytes: opts.maxReplyBytes } : {}) });
    if (reply.status < 200 || reply.status >= 300) throw engineErrorFromReply(url, reply);
    if (reply.body === undefined) throw badReply(url, "body is not JSON");
    if (format === "sglang") {
      const r = SglangScoreReply.safeParse(reply.body);
      if (!r.success) throw badReply(url, `not a /generate reply (${r.error.issues[0]?.path.join(".")}: ${r.error.issues[0]?.message})`);
      return sglangInputLogprobs(url, r.data.meta_info.input_token_logprobs, ids, start);
    }
    if (format === "vllm-generate") {
      const r = VllmGenerateScoreReply.safeParse(reply.body);
      if (!r.success) throw badReply(url, `not a generate reply (${r.error.issues[0]?.path.join(".")}: ${r.error.issues[0]?.message})`);
      return vllmPromptLogprobs(url, r.data.prompt_logprobs, ids, start);
    }
    const r = VllmCompletionScoreReply.safeParse(reply.body);
    if (!r.success) throw badReply(url, `not a completion reply (${r.error.issues[0]?.path.join(".")}: ${r.error.issues[0]?.message})`);
    return vllmPromptLogprobs(url, r.data.choices[0].prompt_logprobs, ids, start);
  }

  return {
    describe: `${format} at ${redactUrl(opts.url)}`,
    score: (req) => retryEngineCall(req, retry, (requestId, signal) => scoreOnce(req, requestId, signal)),
    async tokenize(text, signal) {
      // vLLM serves POST /tokenize (bare path); SGLang POST /v1/tokenize (docs/engines.md §2.4, §3.9).
      const url = joinUrl(opts.url, format === "sglang" ? "/v1/tokenize" : "/tokenize");
      const body = { ...(opts.model && format !== "sglang" ? { model: opts.model } : {}), prompt: text, add_special_tokens: false };
      const requestId = crypto.randomUUID();
      const reply = await retryEngineCall({ request_id: requestId, ...(signal ? { signal } : {}) }, retry, (rid, sig) =>
        postEngineJson(fetchFn, url, body, engineHeaders("edgeloop-teacher-check", rid, undefined, opts.apiKey), { timeoutMs, ...(sig ? { signal: sig } : {}), ...(opts.maxReplyBytes ? { maxReplyBytes: opts.maxReplyBytes } : {}) }).then((r) => {
          if (r.status < 200 || r.status >= 300) throw engineErrorFromReply(url, r);
          return r;
        }),
      );
      const r = TokenizeReply.safeParse(reply.body);
      if (!r.success) throw badReply(url, "not a tokenize reply (expected {tokens: [ids]})");
      return r.data.tokens;
    },
  };
}
