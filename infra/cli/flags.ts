import { ConfigError, InputError } from "../../shared/errors.ts";
import { secretFromEnv } from "./secrets.ts";
/** CLI flags as commander parses them (camelCase), for `rollout` and `serve`. */
export interface ConfigFlags {
  config?: string;
  n?: number;
  engine?: string;
  engineFormat?: "vllm" | "vllm-generate" | "sglang";
  engineApiKey?: string;
  engineAdminApiKey?: string;
  script?: string;
  replicas?: number;
  tools?: string;
  toolsSecret?: string;
  store?: string;
  storePrefix?: string;
  /** store.shards */
  storeShards?: number;
  /** store.durability */
  storeDurability?: "primary" | "replicated";
  /** store.blobs.url: `file:///dir` or `s3://bucket/prefix`. */
  blobStore?: string;
  /** store.blobs.threshold_bytes. */
  blobThreshold?: number;
  /** Seconds the store may stay unreachable before the process exits non-zero (absent: wait it out). */
  storeTimeout?: number;
  promptLength?: number;
  responseLength?: number;
  maxModelLen?: number;
  maxAssistantTurns?: number;
  /** rollout.trajectory_deadline_s (whole seconds). */
  trajectoryDeadline?: number;
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

/**
 * The config overrides the flags stand for, in `AppConfig`'s shape (undefined
 * leaves the file's value). The secrets also come from the environment, below
 * a flag (`EDGELOOP_ENGINE_API_KEY`, `EDGELOOP_ENGINE_ADMIN_API_KEY`,
 * `EDGELOOP_TOOLS_SECRET`, `EDGELOOP_AGENT_SECRET`, each also as `<NAME>_FILE`
 * naming a file that holds it: {@link secretFromEnv}): a secret in the
 * environment stays out of `ps` and shell history.
 * @throws InputError naming the variable for an unreadable or empty `_FILE`
 */
export function overridesFromFlags(f: ConfigFlags, env: Record<string, string | undefined> = process.env): Record<string, unknown> {
  return {
    rollout: {
      n: f.n,
      prompt_length: f.promptLength,
      response_length: f.responseLength,
      max_model_len: f.maxModelLen,
      seed: f.seed,
      multi_turn: { max_assistant_turns: f.maxAssistantTurns },
      trajectory_deadline_s: f.trajectoryDeadline,
      agent: { default_agent_loop: f.defaultAgent ?? (f.agent ? "openai_agent" : undefined) },
    },
    engine: {
      url: f.engine,
      format: f.engineFormat,
      script: f.script,
      replicas: f.replicas,
      api_key: f.engineApiKey ?? (secretFromEnv("EDGELOOP_ENGINE_API_KEY", env) || undefined),
      admin_api_key: f.engineAdminApiKey ?? (secretFromEnv("EDGELOOP_ENGINE_ADMIN_API_KEY", env) || undefined),
    },
    tools: { file: f.tools, secret: f.toolsSecret ?? (secretFromEnv("EDGELOOP_TOOLS_SECRET", env) || undefined) },
    store: { url: f.store, prefix: f.storePrefix, shards: f.storeShards, durability: f.storeDurability, blobs: { url: f.blobStore, threshold_bytes: f.blobThreshold } },
    concurrency: f.concurrency,
    model: f.model,
    agent: { url: f.agent === "example" ? undefined : f.agent, timeout_ms: f.agentTimeoutMs, secret: f.agentSecret ?? (secretFromEnv("EDGELOOP_AGENT_SECRET", env) || undefined), public_url: f.publicUrl },
  };
}

/** The flag that sets each config path (for errors about a value that came from a flag). */
export const FLAG_OF_PATH: Readonly<Record<string, { flag: string; key: keyof ConfigFlags }>> = {
  "rollout.n": { flag: "--n", key: "n" },
  "rollout.prompt_length": { flag: "--prompt-length", key: "promptLength" },
  "rollout.response_length": { flag: "--response-length", key: "responseLength" },
  "rollout.max_model_len": { flag: "--max-model-len", key: "maxModelLen" },
  "rollout.seed": { flag: "--seed", key: "seed" },
  "rollout.multi_turn.max_assistant_turns": { flag: "--max-assistant-turns", key: "maxAssistantTurns" },
  "rollout.trajectory_deadline_s": { flag: "--trajectory-deadline", key: "trajectoryDeadline" },
  "rollout.agent.default_agent_loop": { flag: "--default-agent", key: "defaultAgent" },
  "engine.url": { flag: "--engine", key: "engine" },
  "engine.format": { flag: "--engine-format", key: "engineFormat" },
  "engine.script": { flag: "--script", key: "script" },
  "engine.replicas": { flag: "--replicas", key: "replicas" },
  "engine.api_key": { flag: "--engine-api-key", key: "engineApiKey" },
  "engine.admin_api_key": { flag: "--engine-admin-api-key", key: "engineAdminApiKey" },
  "tools.file": { flag: "--tools", key: "tools" },
  "tools.secret": { flag: "--tools-secret", key: "toolsSecret" },
  "store.url": { flag: "--store", key: "store" },
  "store.prefix": { flag: "--store-prefix", key: "storePrefix" },
  "store.shards": { flag: "--store-shards", key: "storeShards" },
  "store.durability": { flag: "--store-durability", key: "storeDurability" },
  "store.blobs.url": { flag: "--blob-store", key: "blobStore" },
  "store.blobs.threshold_bytes": { flag: "--blob-threshold", key: "blobThreshold" },
  concurrency: { flag: "--concurrency", key: "concurrency" },
  model: { flag: "--model", key: "model" },
  "agent.url": { flag: "--agent", key: "agent" },
  "agent.timeout_ms": { flag: "--agent-timeout-ms", key: "agentTimeoutMs" },
  "agent.secret": { flag: "--agent-secret", key: "agentSecret" },
  "agent.public_url": { flag: "--public-url", key: "publicUrl" },
};

/** Flags whose values are secrets: never echoed in an error. */
const SECRET_FLAGS: ReadonlySet<keyof ConfigFlags> = new Set(["toolsSecret", "agentSecret", "engineApiKey", "engineAdminApiKey"]);

/**
 * Names the flag in a config error about a value the flag set: `--engine
 * 'ftp://x': engine.url must be "sim" or an http(s) URL` rather than the
 * config path alone, so the one line says what to change on the command line.
 * Errors about values from the config file, or about paths no flag sets, are
 * returned unchanged. Secrets are never echoed.
 */
export function flagConfigError(e: unknown, f: ConfigFlags): unknown {
  if (!(e instanceof ConfigError) || !e.field) return e;
  const by = FLAG_OF_PATH[e.field];
  const v = by ? f[by.key] : undefined;
  if (!by || v === undefined) return e;
  const shown = SECRET_FLAGS.has(by.key) ? "" : ` (got '${String(v)}')`;
  const reason = e.message.replace(/^config [^:]+: /, "").replace(/ \(in [^()]*\)$/, "");
  return new InputError(by.flag, `${reason}${shown}`, { cause: e });
}
