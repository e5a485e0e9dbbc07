import { ConfigError } from "../errors.ts";
import type { FetchLike } from "./engine-http.ts";
import { SglangClient } from "./sglang-client.ts";
import type { InferenceClient } from "./types.ts";
import { VllmClient } from "./vllm-client.ts";
import { RetryingClient, type RetryOptions } from "./retrying-client.ts";

/** Options of {@link createEngineClient}. */
export interface EngineClientOptions {
  /** Base URL of the engine or of a gateway in front of engines. */
  url: string;
  /** Wire format: `vllm` (`/v1/completions`), `vllm-generate` (`/inference/v1/generate`) or `sglang` (`/generate`). */
  format: "vllm" | "vllm-generate" | "sglang";
  /** vLLM `model` field (ignored by SGLang). */
  model?: string;
  /** Per-request deadline in ms. */
  timeoutMs?: number;
  /** Reply cap in bytes (default 64 MiB, `DEFAULT_ENGINE_MAX_REPLY_BYTES`). */
  maxReplyBytes?: number;
  /** Web-standard fetch (default `globalThis.fetch`). */
  fetch?: FetchLike;
  /** `[layers, top_k]` of the served MoE model (`engine.moe`), for SGLang's routed experts. */
  moe?: { layers: number; top_k: number };
  /** The engine's `--api-key` (`engine.api_key`): `Authorization: Bearer` on every call. */
  apiKey?: string | null;
  /** Retry failed calls (5xx, refused, attempt deadline) with backoff: a {@link RetryingClient} around the adapter. Default: no retries. */
  retry?: RetryOptions;
}

/**
 * The {@link InferenceClient} for an engine's wire format. The same clients
 * work against our gateway (`functions/gateway.ts`), vllm-router and SGLang's
 * model gateway, since they send the routing key in both headers.
 * @throws ConfigError for an unknown format or a URL that does not parse
 */
export function createEngineClient(opts: EngineClientOptions): InferenceClient {
  const client = createAdapter(opts);
  return opts.retry ? new RetryingClient(client, opts.retry) : client;
}

function createAdapter(opts: EngineClientOptions): InferenceClient {
  try {
    new URL(opts.url);
  } catch {
    throw new ConfigError("engine.url", `${JSON.stringify(opts.url)} is not a URL; pass e.g. http://127.0.0.1:8000`);
  }
  switch (opts.format) {
    case "vllm":
      return new VllmClient({ ...opts, endpoint: "completions" });
    case "vllm-generate":
      return new VllmClient({ ...opts, endpoint: "generate" });
    case "sglang":
      return new SglangClient(opts);
    default:
      throw new ConfigError("engine.format", `${JSON.stringify(opts.format)} is not one of vllm, vllm-generate, sglang`);
  }
}
