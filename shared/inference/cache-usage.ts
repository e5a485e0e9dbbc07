import { metrics, type Counter } from "@opentelemetry/api";

/** What one engine reply says about its prompt and the engine's prefix cache. */
export interface CacheUsage {
  /** Prompt tokens of the request. */
  prompt_tokens: number;
  /**
   * Of them, tokens the engine served from its prefix cache; null when the
   * reply does not say (vLLM: 0 cached tokens and a server that does not
   * report them look the same, see {@link cacheUsage}).
   */
  cached_tokens: number | null;
}

/** A count as the wire schemas define one: a safe integer ≥ 0 (zod's `z.number().int().min(0)`). */
const isCount = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;
const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/**
 * The prompt and prefix-cache counts of a buffered engine reply, or null when
 * it carries no prompt count. vLLM (`/v1/completions`, `/inference/v1/generate`):
 * `usage.prompt_tokens`, and `usage.prompt_tokens_details.cached_tokens` —
 * vLLM sets `prompt_tokens_details` only when the server runs with
 * `--enable-prompt-tokens-details` **and** the count is non-zero
 * (`if self.enable_prompt_tokens_details and final_res.num_cached_tokens`), so
 * an absent value is `cached_tokens: null` ("0 or not reported"), and the
 * caller decides (the gateway counts it as 0 for a replica that has reported
 * before). SGLang (`/generate`, one reply or a batch array):
 * `meta_info.prompt_tokens` and `meta_info.cached_tokens` (always sent), summed
 * over the batch. Never throws.
 * @see vLLM `entrypoints/openai` serving_completion `UsageInfo.prompt_tokens_details` (`PromptTokenUsageInfo.cached_tokens`)
 * @see SGLang `meta_info.cached_tokens` of the native /generate reply
 */
export function cacheUsage(path: string, body: ArrayBuffer | string): CacheUsage | null {
  let json: unknown;
  try {
    json = JSON.parse(typeof body === "string" ? body : new TextDecoder().decode(body));
  } catch {
    return null;
  }
  return cacheUsageOf(path, json);
}

/**
 * {@link cacheUsage} of a reply body already parsed from JSON (the gateway
 * parses each reply once). Never throws.
 */
export function cacheUsageOf(path: string, json: unknown): CacheUsage | null {
  if (path === "/generate") {
    const items = Array.isArray(json) ? json : [json];
    let prompt = 0;
    let cached = 0;
    for (const item of items) {
      const meta = isObj(item) ? item.meta_info : undefined;
      if (!isObj(meta) || !isCount(meta.prompt_tokens) || !isCount(meta.cached_tokens)) return null;
      prompt += meta.prompt_tokens;
      cached += meta.cached_tokens;
    }
    return items.length > 0 ? { prompt_tokens: prompt, cached_tokens: cached } : null;
  }
  const usage = isObj(json) ? json.usage : undefined;
  if (!isObj(usage) || !isCount(usage.prompt_tokens)) return null;
  const details = usage.prompt_tokens_details;
  if (details === undefined || details === null) return { prompt_tokens: usage.prompt_tokens, cached_tokens: null };
  if (!isObj(details)) return null;
  const c = details.cached_tokens;
  if (c === undefined || c === null) return { prompt_tokens: usage.prompt_tokens, cached_tokens: null };
  return isCount(c) ? { prompt_tokens: usage.prompt_tokens, cached_tokens: c } : null;
}

let counters: { prompt: Counter; cached: Counter } | undefined;

/**
 * Adds one reply's counts to the OpenTelemetry counters
 * `edgeloop.gateway.prompt_tokens` and `edgeloop.gateway.cached_tokens`
 * (attribute `replica`); their ratio per replica is its prefix hit rate.
 * A no-op until an OpenTelemetry SDK registers a meter provider.
 */
export function recordCacheUsage(replica: string, prompt: number, cached: number): void {
  counters ??= (() => {
    const meter = metrics.getMeter("edgeloop");
    return {
      prompt: meter.createCounter("edgeloop.gateway.prompt_tokens", { description: "Prompt tokens of calls served by the replica (replies that report cache use)", unit: "{token}" }),
      cached: meter.createCounter("edgeloop.gateway.cached_tokens", { description: "Prompt tokens the replica served from its prefix cache", unit: "{token}" }),
    };
  })();
  counters.prompt.add(prompt, { replica });
  counters.cached.add(cached, { replica });
}
