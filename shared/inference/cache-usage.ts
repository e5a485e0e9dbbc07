import { metrics, type Counter } from "@opentelemetry/api";
import { z } from "zod";

/** What one engine reply says about its prompt and the engine's prefix cache. */
export interface CacheUsage {
  /** Prompt tokens of the request. */
  prompt_tokens: number;
  /** Of them, tokens the engine served from its prefix cache. */
  cached_tokens: number;
}

const Count = z.number().int().min(0);
const VllmUsage = z.looseObject({
  usage: z.looseObject({ prompt_tokens: Count, prompt_tokens_details: z.looseObject({ cached_tokens: Count.nullish() }).nullish() }),
});
const SglangMeta = z.looseObject({ meta_info: z.looseObject({ prompt_tokens: Count, cached_tokens: Count }) });

/**
 * The prefix-cache report of a buffered engine reply, or null when the reply
 * does not carry one. vLLM (`/v1/completions`, `/inference/v1/generate`):
 * `usage.prompt_tokens` and `usage.prompt_tokens_details.cached_tokens`
 * (present when the server runs with `--enable-prompt-tokens-details`; null
 * otherwise, and then no report). SGLang (`/generate`, one reply or a batch
 * array): `meta_info.prompt_tokens` and `meta_info.cached_tokens`, summed over
 * the batch. Never throws.
 * @see vLLM `UsageInfo.prompt_tokens_details` (`PromptTokenUsageInfo.cached_tokens`)
 * @see SGLang `meta_info.cached_tokens` of the native /generate reply
 */
export function cacheUsage(path: string, body: ArrayBuffer | string): CacheUsage | null {
  let json: unknown;
  try {
    json = JSON.parse(typeof body === "string" ? body : new TextDecoder().decode(body));
  } catch {
    return null;
  }
  if (path === "/generate") {
    const items = Array.isArray(json) ? json : [json];
    let prompt = 0;
    let cached = 0;
    for (const item of items) {
      const r = SglangMeta.safeParse(item);
      if (!r.success) return null;
      prompt += r.data.meta_info.prompt_tokens;
      cached += r.data.meta_info.cached_tokens;
    }
    return items.length > 0 ? { prompt_tokens: prompt, cached_tokens: cached } : null;
  }
  const r = VllmUsage.safeParse(json);
  const cached = r.success ? r.data.usage.prompt_tokens_details?.cached_tokens : undefined;
  if (!r.success || cached === undefined || cached === null) return null;
  return { prompt_tokens: r.data.usage.prompt_tokens, cached_tokens: cached };
}

let counters: { prompt: Counter; cached: Counter } | undefined;

/**
 * Adds one reply's report to the OpenTelemetry counters
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
