/**
 * `edgeloop/engines` — the inference layer's public surface: the
 * `InferenceClient` contract, token-in/token-out engine clients for vLLM and
 * SGLang (`createEngineClient`), reply checks, routing policies (sticky
 * routing keys, bounded-load hashing, round robin), the replica pool and the
 * shared routing state.
 */
export * from "./types.ts";
export * from "./engine-http.ts";
export * from "./finish-output.ts";
export * from "./vllm-wire.ts";
export * from "./vllm-client.ts";
export * from "./sglang-client.ts";
export * from "./create-engine-client.ts";
export * from "./routing-policy.ts";
export * from "./round-robin-router.ts";
export * from "./sticky-router.ts";
export * from "./bounded-load-hash.ts";
export * from "./replica-pool.ts";
export * from "./hash.ts";
export { RetryingClient, type RetryOptions } from "./retrying-client.ts";
export * from "./routing-state.ts";
export * from "./redis-routing-state.ts";
export * from "./prefix-key.ts";
export * from "./cache-usage.ts";
