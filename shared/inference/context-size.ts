import type { RolloutConfig } from "../schema/index.ts";
import { servableLength, type InferenceClient } from "./types.ts";

/**
 * The context size a trajectory of `config` is budgeted against (see
 * {@link AgentLoop.maxModelLen}): `config.max_model_len` capped by the
 * process's context `processLen`; else `processLen`; else the engine's
 * answer; else `prompt_length + response_length`; then cut to what the
 * engine serves ({@link InferenceClient.servableLength}: SGLang one token
 * less). Tokens.
 */
export async function contextSize(config: RolloutConfig, processLen: number | undefined, client: InferenceClient): Promise<number> {
  return servableLength(client, await modelContext(config, processLen, client));
}

/** The model's context before the engine's own rule ({@link contextSize}). */
async function modelContext(config: RolloutConfig, processLen: number | undefined, client: InferenceClient): Promise<number> {
  if (config.max_model_len) return processLen ? Math.min(config.max_model_len, processLen) : config.max_model_len;
  if (processLen) return processLen;
  const engine = await client.maxModelLen?.();
  return engine ?? config.prompt_length + config.response_length;
}
