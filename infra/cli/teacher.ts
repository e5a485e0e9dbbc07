import { createGatewayApp } from "../../functions/gateway.ts";
import { gatewayOptions } from "./gateway-options.ts";
import { ConfigError } from "../../shared/errors.ts";
import type { AppConfig } from "../../shared/config/app-config.ts";
import type { TeacherConfig } from "../../shared/schema/config.ts";
import type { TeacherClientOptions } from "../../shared/inference/teacher-client.ts";
import { cachedTeacherClients, checkTeacherTokenizer, TOKENIZER_PROBE, type TeacherClientFactory } from "../../shared/rollout/teacher-scoring.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { createSimEngineApp } from "../sim-engine/app.ts";
import { SimEngine } from "../sim-engine/sim-engine.ts";

/** `scoreSeed` of the embedded simulated teacher (`rollout.teacher.url: "sim"`): any value other than the policy engine's 0. */
export const SIM_TEACHER_SCORE_SEED = 7919;

/**
 * The process's teacher clients (`rollout.teacher`, including a batch's
 * own): `url` is called directly; `urls` go through an in-process gateway
 * (`createGatewayApp`: the engine replicas' routing policy, sticky per
 * trajectory key, with the `gateway` section's ejection and failover);
 * `url: "sim"` scores with an embedded simulated engine seeded apart from
 * the policy's. Calls are retried (3 retries) like the policy's.
 */
export function teacherClientsFor(config: AppConfig, tokenizer: ChatTokenizer): TeacherClientFactory {
  const g = config.gateway;
  return cachedTeacherClients((cfg: TeacherConfig): TeacherClientOptions => {
    const base = { format: cfg.format, timeoutMs: cfg.timeout_ms, retry: { retries: 3 }, apiKey: process.env.EDGELOOP_TEACHER_API_KEY || null, ...(cfg.model ? { model: cfg.model } : {}) };
    if (cfg.url === "sim") {
      const app = createSimEngineApp(new SimEngine({ tokenizer, name: "teacher-sim", model: "edgeloop/sim-teacher", scoreSeed: SIM_TEACHER_SCORE_SEED }));
      return { ...base, url: "http://teacher-sim.local", fetch: async (input, init) => app.fetch(new Request(input, init)) };
    }
    if (cfg.urls) {
      const gateway = createGatewayApp({
        replicas: cfg.urls,
        policy: "least_inflight_sticky",
        ...gatewayOptions(g),
      });
      return { ...base, url: "http://teacher-gateway.local", fetch: (input, init) => gateway.fetch(new Request(input, init)) };
    }
    return { ...base, url: cfg.url! };
  });
}

/**
 * The start-up check of `rollout.teacher` (once per process, for `rollout`,
 * `serve` and `worker`): the teacher must tokenize a probe text to the
 * policy tokenizer's ids. Returns a warning line when the teacher does not
 * answer yet (it may come up later), null when it passed or no teacher is set.
 * @throws ConfigError naming `rollout.teacher` for a teacher with another tokenizer
 */
export async function checkConfiguredTeacher(config: AppConfig, tokenizer: ChatTokenizer, clients: TeacherClientFactory, timeoutMs: number): Promise<string | null> {
  const cfg = config.rollout.teacher;
  if (!cfg) return null;
  const client = clients(cfg);
  const unreachable = await checkTeacherTokenizer(client, tokenizer.encode(TOKENIZER_PROBE), AbortSignal.timeout(timeoutMs));
  return unreachable === null ? null : `warning    teacher ${client.describe} does not answer (${unreachable}); its tokenizer is unchecked and trajectories ${cfg.on_error === "fail" ? "fail" : "are kept without teacher_log_probs"} until it is up`;
}

/**
 * What a batch's own config (`POST /v1/rollouts` `config.rollout.teacher`)
 * may do with the process's teacher: turn it off (null) or change its
 * `on_error` and `timeout_ms`. Another teacher (url, urls, format, model) is
 * refused: its tokenizer was never checked, and an API caller must not make
 * the server send token streams to a URL of its choosing.
 * @throws ConfigError naming `rollout.teacher`
 */
export function validateBatchTeacher(batch: TeacherConfig | null, configured: TeacherConfig | null): void {
  if (batch === null) return;
  const where = (t: TeacherConfig) => JSON.stringify([t.url ?? null, t.urls ?? null, t.format, t.model]);
  if (configured && where(batch) === where(configured)) return;
  throw new ConfigError(
    "rollout.teacher",
    configured
      ? "a batch may turn the configured teacher off (null) or change its on_error and timeout_ms, not name another teacher: start serve/worker with that teacher (its tokenizer is checked at start)"
      : "no teacher is configured for this process: start serve/worker with rollout.teacher (its tokenizer is checked at start)",
  );
}
