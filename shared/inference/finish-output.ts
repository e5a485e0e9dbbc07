import { EngineAbortedError } from "../errors.ts";
import { TokenOutput, type RoutedExpertsSpan } from "../schema/index.ts";
import { readTextCapped, redactUrl } from "../http/outbound.ts";
import { badReply, DEADLINE_HEADER, joinUrl, type FetchLike } from "./engine-http.ts";
import { ModelsReply } from "./vllm-wire.ts";

/** What an adapter extracted from a 2xx reply, before the checks every engine shares. */
export interface RawEngineOutput {
  ids: readonly number[];
  /** Per-token log-probs as the engine sent them (may hold nulls, may be absent). */
  logProbs?: readonly (number | null)[] | null;
  /** Whether the caller asked for log-probs (`sampling_params.logprobs`). */
  wantLogprobs: boolean;
  /** The engine's finish reason string (vLLM's, or SGLang's `finish_reason.type`). */
  finishReason?: string | null;
  stopReason?: number | string | null;
  cachedTokens?: number;
  /** Finish reason to assume when the engine sent none (vLLM's generate endpoint says `stop`). */
  defaultFinish?: "stop";
  /** The call's routed experts, already decoded and checked by the adapter. */
  routedExperts?: RoutedExpertsSpan;
  /** Preemptions the engine reports for this call (SGLang `meta_info.num_retractions`); absent: unknown (−1). */
  numPreempted?: number;
}

/**
 * The checks shared by every adapter, then a schema-checked {@link TokenOutput}:
 * log-probs must be one finite number per id (never padded); `finish_reason`
 * must be stop/length/abort (`repetition` is a stop, recorded in
 * `extra_fields.engine_finish_reason`); an abort with no tokens is an
 * {@link EngineAbortedError}, with tokens it is returned for the caller to resume.
 * @throws BadEngineResponseError, EngineAbortedError
 */
export function finishOutput(url: string, raw: RawEngineOutput): TokenOutput {
  const finish = raw.finishReason ?? raw.defaultFinish;
  const extra: Record<string, unknown> = {};
  let reason: "stop" | "length" | "abort";
  if (finish === "stop" || finish === "length" || finish === "abort") reason = finish;
  else if (finish === "repetition") {
    reason = "stop";
    extra.engine_finish_reason = finish;
  } else throw badReply(url, `finish_reason ${JSON.stringify(finish ?? null)} is not stop/length/abort`);

  if (reason === "abort" && raw.ids.length === 0) {
    throw new EngineAbortedError(`engine at ${redactUrl(url)} aborted the request before any token`);
  }

  let logProbs: number[] | undefined;
  if (raw.wantLogprobs) {
    const lps = raw.logProbs ?? (raw.ids.length === 0 ? [] : undefined);
    if (!lps) throw badReply(url, `log-probs were requested but the reply has none for ${raw.ids.length} tokens`);
    if (lps.length !== raw.ids.length) throw badReply(url, `${lps.length} log-probs for ${raw.ids.length} token ids`);
    if (lps.some((v) => typeof v !== "number" || !Number.isFinite(v))) throw badReply(url, "a sampled token has a null or non-finite log-prob");
    logProbs = lps as number[];
  }

  const preempted = raw.numPreempted !== undefined && Number.isSafeInteger(raw.numPreempted) && raw.numPreempted >= 0 ? raw.numPreempted : -1;
  const fast = fastTokenOutput(raw.ids, logProbs, reason, raw.stopReason, raw.cachedTokens, extra, raw.routedExperts);
  if (fast) {
    fast.num_preempted = preempted;
    return fast;
  }
  // Something the fast path does not vouch for: zod decides, and names the field.
  const out = TokenOutput.safeParse({
    token_ids: raw.ids,
    ...(logProbs ? { log_probs: logProbs } : {}),
    finish_reason: reason,
    ...(raw.stopReason !== undefined ? { stop_reason: raw.stopReason } : {}),
    num_preempted: preempted,
    ...(raw.cachedTokens !== undefined ? { cached_tokens: raw.cachedTokens } : {}),
    extra_fields: extra,
    ...(raw.routedExperts ? { routed_experts: raw.routedExperts } : {}),
  });
  if (!out.success) throw badReply(url, `${out.error.issues[0]?.path.join(".")}: ${out.error.issues[0]?.message}`, out.error);
  return out.data;
}

/** Cap of a `GET /v1/models` reply, bytes (1 MiB). */
const MODELS_REPLY_MAX_BYTES = 1024 * 1024;

/**
 * `max_model_len` of the first model listed by `GET {base}/v1/models`, or
 * undefined when the server does not say (or cannot be reached). `apiKey`:
 * sent as `Authorization: Bearer` (vLLM protects every `/v1` path with `--api-key`).
 */
export async function modelMaxLen(fetchFn: FetchLike, base: string, timeoutMs: number, apiKey?: string | null): Promise<number | undefined> {
  const url = joinUrl(base, "/v1/models");
  try {
    const ms = Math.min(timeoutMs, 30_000);
    const res = await fetchFn(url, { headers: { [DEADLINE_HEADER]: String(ms), ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) }, signal: AbortSignal.timeout(ms), redirect: "manual" });
    if (!res.ok) {
      await res.body?.cancel().catch(() => undefined);
      return undefined;
    }
    // A model list is small: 1 MiB is plenty, and a redirect (not followed) reads as "does not say".
    const parsed = ModelsReply.safeParse(JSON.parse(await readTextCapped(res, MODELS_REPLY_MAX_BYTES, "engine /v1/models")));
    return parsed.success ? (parsed.data.data[0]?.max_model_len ?? undefined) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * A `maxModelLen()` for an engine client: {@link modelMaxLen}, cached after the
 * first answer that names a length; a miss (undefined or unreachable) is asked
 * again next time.
 */
export function cachedModelMaxLen(fetchFn: FetchLike, base: string, timeoutMs: number, apiKey?: string | null): () => Promise<number | undefined> {
  let pending: Promise<number | undefined> | undefined;
  return () => {
    if (!pending) {
      pending = modelMaxLen(fetchFn, base, timeoutMs, apiKey);
      pending.then((v) => v === undefined && (pending = undefined), () => (pending = undefined));
    }
    return pending;
  };
}

/** An integer id ≥ 0 that `z.number().int().min(0)` accepts (safe integers only; anything else goes to zod). */
function isId(v: unknown): boolean {
  return typeof v === "number" && Number.isSafeInteger(v) && v >= 0;
}

/**
 * The {@link TokenOutput} that `TokenOutput.safeParse` would return for these
 * fields, built without zod when every field is one zod surely accepts
 * (ids: safe integers ≥ 0; log-probs: already checked finite, one per id;
 * `stop_reason` a string, finite number or null; `cached_tokens` a safe
 * integer ≥ 0; no routed experts); otherwise undefined and the caller runs
 * zod, so errors are zod's, naming the field, as before. Same keys in the
 * schema's order; the id and log-prob arrays are the reply's own (not copied:
 * nothing downstream writes to a TokenOutput's arrays).
 */
function fastTokenOutput(
  ids: readonly number[],
  logProbs: number[] | undefined,
  reason: "stop" | "length" | "abort",
  stopReason: number | string | null | undefined,
  cachedTokens: number | undefined,
  extra: Record<string, unknown>,
  routedExperts: RoutedExpertsSpan | undefined,
): TokenOutput | undefined {
  if (routedExperts !== undefined || !Array.isArray(ids)) return undefined;
  for (let i = 0; i < ids.length; i++) if (!isId(ids[i])) return undefined;
  if (stopReason !== undefined && stopReason !== null && typeof stopReason !== "string" && !(typeof stopReason === "number" && Number.isFinite(stopReason))) return undefined;
  if (cachedTokens !== undefined && !isId(cachedTokens)) return undefined;
  const out: TokenOutput = { token_ids: ids as number[] } as TokenOutput;
  if (logProbs) out.log_probs = logProbs;
  out.finish_reason = reason;
  if (stopReason !== undefined) out.stop_reason = stopReason;
  out.num_preempted = -1;
  if (cachedTokens !== undefined) out.cached_tokens = cachedTokens;
  out.extra_fields = extra;
  return out;
}

/**
 * Says once that an engine's replies carry no `cached_tokens` (vLLM reports
 * `usage.prompt_tokens_details.cached_tokens` only when started with
 * `--enable-prompt-tokens-details`), so prefix-hit metrics stay empty for a
 * reason the operator can see. {@link saw} is called per reply; the first
 * reply without the field calls `warn` (default `console.warn`) with one line
 * naming the fix; later replies are silent.
 * @see docs/engines.md §2.11
 */
export class CachedTokensNotice {
  /** Whether a reply without `cached_tokens` was seen. */
  missing = false;
  constructor(
    private readonly engine: string,
    private readonly fix: string,
    private readonly warn: (line: string) => void = (line) => console.warn(line),
  ) {}
  /** One reply: `present` is whether it carried `cached_tokens`. */
  saw(present: boolean): void {
    if (present || this.missing) return;
    this.missing = true;
    this.warn(`edgeloop: warning: the ${this.engine} engine does not report cached prompt tokens, so prefix-cache hit metrics stay empty (${this.fix})`);
  }
}

/**
 * An engine's per-token weight-version spans → run-length `token_versions`
 * `[[start, version], …]` over the call's `outputTokens` output tokens
 * (positions relative to the call), or undefined when absent or unusable
 * (then the client's stamp stays the version). Spans are half-open
 * `[start, end)` over output positions, as SGLang (`meta_info.weight_versions`,
 * `WeightVersionSpan {version, start, end}`, serialised as an object or as a
 * `[version, start, end]` array) and vLLM (`choices[].weight_versions`) send
 * them; they must start at 0, be contiguous and end at `outputTokens`.
 * Linear in the number of spans.
 * @see docs/engines.md §2.5 and §3.2
 */
export function engineVersionSpans(raw: unknown, outputTokens: number): Array<[number, string]> | undefined {
  if (!Array.isArray(raw) || raw.length === 0 || outputTokens === 0) return undefined;
  const out: Array<[number, string]> = [];
  let at = 0;
  for (const span of raw) {
    let version: unknown, start: unknown, end: unknown;
    if (Array.isArray(span)) [version, start, end] = span;
    else if (span && typeof span === "object") ({ version, start, end } = span as Record<string, unknown>);
    else return undefined;
    if (typeof version === "number" && Number.isFinite(version)) version = String(version);
    if (typeof version !== "string" || version === "" || start !== at || !Number.isSafeInteger(end) || (end as number) <= at) return undefined;
    if (out.length === 0 || out[out.length - 1]![1] !== version) out.push([at, version]);
    at = end as number;
  }
  return at === outputTokens ? out : undefined;
}
