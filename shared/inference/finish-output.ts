import { EngineAbortedError } from "../errors.ts";
import { TokenOutput, type RoutedExpertsSpan } from "../schema/index.ts";
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
    throw new EngineAbortedError(`engine at ${url} aborted the request before any token`);
  }

  let logProbs: number[] | undefined;
  if (raw.wantLogprobs) {
    const lps = raw.logProbs ?? (raw.ids.length === 0 ? [] : undefined);
    if (!lps) throw badReply(url, `log-probs were requested but the reply has none for ${raw.ids.length} tokens`);
    if (lps.length !== raw.ids.length) throw badReply(url, `${lps.length} log-probs for ${raw.ids.length} token ids`);
    if (lps.some((v) => typeof v !== "number" || !Number.isFinite(v))) throw badReply(url, "a sampled token has a null or non-finite log-prob");
    logProbs = lps as number[];
  }

  const out = TokenOutput.safeParse({
    token_ids: raw.ids,
    ...(logProbs ? { log_probs: logProbs } : {}),
    finish_reason: reason,
    ...(raw.stopReason !== undefined ? { stop_reason: raw.stopReason } : {}),
    num_preempted: -1,
    ...(raw.cachedTokens !== undefined ? { cached_tokens: raw.cachedTokens } : {}),
    extra_fields: extra,
    ...(raw.routedExperts ? { routed_experts: raw.routedExperts } : {}),
  });
  if (!out.success) throw badReply(url, `${out.error.issues[0]?.path.join(".")}: ${out.error.issues[0]?.message}`, out.error);
  return out.data;
}

/**
 * `max_model_len` of the first model listed by `GET {base}/v1/models`, or
 * undefined when the server does not say (or cannot be reached).
 */
export async function modelMaxLen(fetchFn: FetchLike, base: string, timeoutMs: number): Promise<number | undefined> {
  const url = joinUrl(base, "/v1/models");
  try {
    const ms = Math.min(timeoutMs, 30_000);
    const res = await fetchFn(url, { headers: { [DEADLINE_HEADER]: String(ms) }, signal: AbortSignal.timeout(ms) });
    if (!res.ok) return undefined;
    const parsed = ModelsReply.safeParse(await res.json());
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
export function cachedModelMaxLen(fetchFn: FetchLike, base: string, timeoutMs: number): () => Promise<number | undefined> {
  let pending: Promise<number | undefined> | undefined;
  return () => {
    if (!pending) {
      pending = modelMaxLen(fetchFn, base, timeoutMs);
      pending.then((v) => v === undefined && (pending = undefined), () => (pending = undefined));
    }
    return pending;
  };
}
