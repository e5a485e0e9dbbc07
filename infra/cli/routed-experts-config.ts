import type { AppConfig } from "../../shared/config/app-config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { vllmRoutedExpertsRefused } from "../../shared/inference/vllm-client.ts";

/**
 * Checks `rollout.return_routed_experts` against the engine at start and
 * returns `engine.moe`'s `[layers, top_k]` for the engine client: the vLLM
 * formats are refused (see `vllmRoutedExpertsRefused`), except the
 * in-process sim (one replica), which answers any format; SGLang needs
 * `engine.moe` (its reply carries no shape).
 * @throws ConfigError naming `rollout.return_routed_experts` or `engine.moe`
 */
export function routedExpertsEngineShape(config: AppConfig): { layers: number; top_k: number } | undefined {
  const e = config.engine;
  const moe = e.moe ? { layers: e.moe.layers, top_k: e.moe.top_k } : undefined;
  if (!config.rollout.return_routed_experts) return moe;
  // The in-process sim called directly (format vllm, one replica) returns experts without a wire form.
  const inProcessSim = e.url === "sim" && e.replicas === 1 && e.format === "vllm";
  if (!inProcessSim && e.format !== "sglang") throw vllmRoutedExpertsRefused();
  if (e.url !== "sim" && !moe) throw new ConfigError("engine.moe", "rollout.return_routed_experts with engine.format sglang needs engine.moe {layers, top_k} of the served model (SGLang's meta_info.routed_experts carries no shape)");
  return moe;
}
