import { ConfigError } from "../../shared/errors.ts";
/** CLI flags as commander parses them (camelCase), for `rollout` and `serve`. */
export interface ConfigFlags {
  config?: string;
  n?: number;
  engine?: string;
  engineFormat?: "vllm" | "vllm-generate" | "sglang";
  script?: string;
  replicas?: number;
  tools?: string;
  toolsSecret?: string;
  store?: string;
  storePrefix?: string;
  /** Seconds the store may stay unreachable before the process exits non-zero (absent: wait it out). */
  storeTimeout?: number;
  promptLength?: number;
  responseLength?: number;
  maxModelLen?: number;
  maxAssistantTurns?: number;
  defaultAgent?: string;
  seed?: number;
  concurrency?: number;
  model?: string;
  /** agent.url, or `example` for the embedded example agent (rollout). */
  agent?: string;
  agentTimeoutMs?: number;
  agentSecret?: string;
  publicUrl?: string;
}

/**
 * `--agent example` is for `rollout` only (it starts the example agent in that process).
 * @throws ConfigError naming the flag for `serve` and `worker`.
 */
export function refuseExampleAgent(f: ConfigFlags, command: string): void {
  if (f.agent === "example") {
    throw new ConfigError("--agent", `'example' starts the example agent inside \`edgeloop rollout\` only; for ${command}, start it with \`edgeloop agent-example --port P\` and pass --agent http://127.0.0.1:P/tasks`);
  }
}

/** The config overrides the flags stand for, in `AppConfig`'s shape (undefined leaves the file's value). */
export function overridesFromFlags(f: ConfigFlags): Record<string, unknown> {
  return {
    rollout: {
      n: f.n,
      prompt_length: f.promptLength,
      response_length: f.responseLength,
      max_model_len: f.maxModelLen,
      seed: f.seed,
      multi_turn: { max_assistant_turns: f.maxAssistantTurns },
      agent: { default_agent_loop: f.defaultAgent ?? (f.agent ? "openai_agent" : undefined) },
    },
    engine: { url: f.engine, format: f.engineFormat, script: f.script, replicas: f.replicas },
    tools: { file: f.tools, secret: f.toolsSecret },
    store: { url: f.store, prefix: f.storePrefix },
    concurrency: f.concurrency,
    model: f.model,
    agent: { url: f.agent === "example" ? undefined : f.agent, timeout_ms: f.agentTimeoutMs, secret: f.agentSecret, public_url: f.publicUrl },
  };
}
