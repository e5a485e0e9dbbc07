import { z } from "zod";
import { ConfigError, formatPath } from "../errors.ts";
import { AgentRoleName } from "../schema/agent-role.ts";
import { httpUrl, retriesCount, RolloutConfig, timerMs } from "../schema/config.ts";

/** The engine's and the reward webhook's retries bound (0..100, as before the tools' 0..10): their calls are retried through weight updates and restarts. */
const ENGINE_MAX_RETRIES = 100;
import { OpenEnvSettings } from "../schema/openenv.ts";

/** The settings of one engine (the `engine` section, and each of `engine.pools`): see {@link EngineConfig}. */
const engineFields = {
  url: z.union([z.literal("sim"), httpUrl("engine.url must be \"sim\" or an http(s) URL")], { error: "engine.url must be \"sim\" or an http(s) URL" }).default("sim"),
  /** Wire format of the engine behind `url`: vLLM's OpenAI completions (`vllm`), vLLM's token-in/token-out /inference/v1/generate (`vllm-generate`) or SGLang's native /generate. */
  format: z.enum(["vllm", "vllm-generate", "sglang"]).default("vllm"),
  /** Scripted policy file for the simulated engine (refused with a real engine). */
  script: z.string().nullable().default(null),
  /** Simulated replicas behind the embedded gateway (sim only). */
  replicas: z.number().int().min(1).max(64).default(1),
  /** Model name sent to a real engine (`model` field of vLLM requests). */
  model: z.string().nullable().default(null),
  /**
   * The engine's API key (vLLM and SGLang `--api-key`), sent as
   * `Authorization: Bearer` on every generate, tokenize and models call
   * (flag `--engine-api-key`, env `EDGELOOP_ENGINE_API_KEY`); never printed.
   * @see docs/engines.md §2.10 and §3.7
   */
  api_key: z.string().min(1, "engine.api_key must not be empty (omit it for an engine without --api-key)").nullable().default(null),
  /**
   * SGLang's `--admin-api-key`: sent on the pause/resume/flush control calls
   * (which SGLang then refuses with the plain key); absent, control calls send
   * `api_key` (flag `--engine-admin-api-key`, env `EDGELOOP_ENGINE_ADMIN_API_KEY`); never printed.
   */
  admin_api_key: z.string().min(1, "engine.admin_api_key must not be empty").nullable().default(null),
  /** Per-request deadline in milliseconds (at most 2147483647, setTimeout's largest delay). */
  timeout_ms: timerMs().positive().default(600_000),
  /** Retries of a failed engine call (5xx, refused, past `timeout_ms`), each under a fresh request id, with backoff; 0: none; at most 100. */
  max_retries: retriesCount(ENGINE_MAX_RETRIES).default(3),
  /** Cap of one engine reply in bytes, counted while it streams (default 64 MiB: long generations with log-probs are big). */
  max_reply_bytes: z.number().int().positive().default(64 * 1024 * 1024),
  /**
   * The vLLM version the simulated engine plays on its vLLM wire formats
   * (sim only): `main` (newest) or `0.2x` (docs/engines.md §5); null: `main`.
   * Matters with `engine.format` `vllm-generate`, or `vllm` with replicas > 1.
   */
  sim_engine_version: z.enum(["main", "0.2x"]).nullable().default(null),
  /** The simulated engine's prefix KV cache per replica, in blocks of 16 tokens (sim only); null: the simulator's default (16,384 blocks). */
  sim_kv_cache_blocks: z.number().int().min(1).nullable().default(null),
  /**
   * Base URLs of the engine replicas behind `url` when `url` is a router
   * (SMG, vllm-router): `POST /v1/engine/pause` and `/resume` reach each
   * replica's own pause API there. Default: `url` itself (one engine).
   */
  admin_urls: z.array(httpUrl("engine.admin_urls[i] must be an http(s) URL")).nullable().default(null),
  /**
   * Latency model of the simulated engine (sim only): milliseconds per
   * uncached prompt token and per generated token (decoding is token by
   * token, so a pause lands mid-request). Default: none (instant).
   */
  sim_latency: z.strictObject({ prefill_ms_per_token: z.number().min(0).optional(), decode_ms_per_token: z.number().min(0).optional() }).nullable().default(null),
  /**
   * The served model's MoE routing dimensions, for `rollout.return_routed_experts`:
   * `layers` (MoE layers reported), `top_k` (experts per token) and, for the
   * simulated engine, `num_experts`. A real SGLang engine's
   * `meta_info.routed_experts` carries no shape, so it is required there; the
   * sim defaults to `{layers: 4, top_k: 2, num_experts: 16}` (`DEFAULT_SIM_MOE`).
   */
  moe: z
    .strictObject({
      layers: z.number().int().min(1, "engine.moe.layers must be >= 1"),
      top_k: z.number().int().min(1, "engine.moe.top_k must be >= 1"),
      num_experts: z.number().int().min(1).optional(),
    })
    .refine((m) => m.num_experts === undefined || m.num_experts >= m.top_k, { message: "engine.moe.num_experts must be >= top_k", path: ["num_experts"] })
    .nullable()
    .default(null),
};

/** The cross-key checks of one engine's settings (`where`: `engine`, or `engine.pools.{name}`, for the messages). */
function checkEngine(where: string) {
  return (e: z.infer<z.ZodObject<typeof engineFields>>, ctx: z.RefinementCtx) => {
    // The simulated engine's settings mean nothing to a real engine, and a key means nothing to the embedded
    // simulator: refused, never ignored (a simulator with keys runs as `edgeloop sim-engine --api-key`).
    if (e.url === "sim") {
      for (const key of ["api_key", "admin_api_key"] as const) {
        if (e[key] !== null) ctx.addIssue({ code: "custom", path: [key], message: `${where}.${key} applies to a real engine (engine.url an http(s) URL); the embedded simulated engine takes no key` });
      }
      return;
    }
    const set: [keyof typeof e, boolean][] = [
      ["script", e.script !== null],
      ["replicas", e.replicas !== 1],
      ["sim_latency", e.sim_latency !== null],
      ["sim_kv_cache_blocks", e.sim_kv_cache_blocks !== null],
      ["sim_engine_version", e.sim_engine_version !== null],
    ];
    for (const [key, isSet] of set) {
      if (isSet) ctx.addIssue({ code: "custom", path: [key], message: `${where}.${key} applies to the simulated engine only (engine.url "sim"), not to ${e.url}` });
    }
    if (e.moe?.num_experts !== undefined) {
      ctx.addIssue({ code: "custom", path: ["moe", "num_experts"], message: `${where}.moe.num_experts sizes the simulated engine's experts only; a real engine's replies carry their expert ids (not to ${e.url})` });
    }
  };
}

/** One named engine pool of `engine.pools`: a whole engine section (its own defaults, nothing inherited from `engine`). */
export const EnginePoolConfig = z.strictObject(engineFields).superRefine(checkEngine("engine.pools.*"));
export type EnginePoolConfig = z.infer<typeof EnginePoolConfig>;

/** The pool name config `agent.roles` uses for the top-level `engine` section (so not a key of `engine.pools`). */
export const DEFAULT_POOL = "default";

/**
 * Where generation happens: `"sim"` (the embedded simulated engine) or an
 * engine/gateway base URL. `pools` names further engines (each a whole engine
 * section: `{pool_a: {url: sim, script: planner.json}, pool_b: {url: http://…, model: solver}}`)
 * that config `agent.roles` sends agent roles to; the section itself is the
 * pool `default`, what every call without a mapped role uses. Default: no pools.
 */
export const EngineConfig = z
  .strictObject({
    ...engineFields,
    pools: z
      .record(z.string(), EnginePoolConfig)
      .superRefine((pools, ctx) => {
        // Checked here, not as the record's key schema: zod reports a bad key only as "Invalid key in record".
        for (const name of Object.keys(pools)) {
          if (name === DEFAULT_POOL) ctx.addIssue({ code: "custom", path: [name], message: `must not be named "${DEFAULT_POOL}": that is the engine section itself (name the pool otherwise)` });
          else if (!/^[A-Za-z0-9._-]{1,64}$/.test(name)) ctx.addIssue({ code: "custom", path: [name], message: "a pool name is 1 to 64 characters of letters, digits, '.', '_' and '-'" });
        }
      })
      .nullable()
      .default(null),
  })
  .superRefine(checkEngine("engine"));
export type EngineConfig = z.infer<typeof EngineConfig>;

/** Tool webhooks: a tools file, or (none given) the example tool server started in-process. */
export const ToolsConfig = z.strictObject({
  file: z.string().nullable().default(null),
  /** HMAC secret for webhook signatures (`x-edgeloop-signature`). */
  secret: z.string().nullable().default(null),
});

const DAY_S = 24 * 3600;

/**
 * How long a Redis/Upstash store keeps what edgeloop wrote, in seconds
 * (docs/queue-layout.md, "Retention"). `sessions` and `batches` are the
 * expiries set when a durable session finishes and when a batch is
 * submitted; `records` and `groups` carry no expiry (a trainer may read
 * late) and are removed by `edgeloop gc` once their group is complete,
 * delivered and acknowledged (or withdrawn / filtered) for that long.
 * `null` for records or groups: `gc` never removes them.
 */
export const RetentionConfig = z.strictObject({
  /** Records (`traj:{key}`) of a finished, acknowledged group (default 7 days). */
  records: z.number().int().min(1, "store.retention.records must be >= 1 (seconds) or null").nullable().default(7 * DAY_S),
  /** The group's hash, key set and stream entry, after the same condition (default 7 days; its records go with it). */
  groups: z.number().int().min(1, "store.retention.groups must be >= 1 (seconds) or null").nullable().default(7 * DAY_S),
  /** Finished durable sessions (`session:{key}`, `session:agent:{key}`): expiry after done/failed (default 7 days). */
  sessions: z.number().int().min(1, "store.retention.sessions must be >= 1 (seconds)").default(7 * DAY_S),
  /** Batch metadata (`jobs:batch:{id}` and its rows, done stream, over-sampling keys): expiry after submission (default 7 days). */
  batches: z.number().int().min(1, "store.retention.batches must be >= 1 (seconds)").default(7 * DAY_S),
});
export type RetentionConfig = z.infer<typeof RetentionConfig>;

/**
 * Where record parts too large for Redis go (docs/queue-layout.md, "Blobs"):
 * `url` `file:///abs/dir` (one machine or a shared mount) or
 * `s3://bucket[/prefix]` (endpoint, region and credentials from the standard
 * AWS environment: `AWS_ENDPOINT_URL_S3`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
 * …); null (default) keeps every part in the record. On Workers the R2
 * binding `EDGELOOP_BLOBS` plays this role.
 */
export const BlobsConfig = z.strictObject({
  url: z
    .string()
    .nullable()
    .default(null)
    .refine((s) => s === null || /^file:\/\/\/./.test(s) || /^s3:\/\/[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](\/.*)?$/.test(s), "store.blobs.url must be file:///absolute/dir or s3://bucket[/prefix]"),
  /** Packed bytes at and above which a record's routed experts go to the blob store (default 1 MiB; 0: always). */
  threshold_bytes: z.number().int().min(0, "store.blobs.threshold_bytes must be >= 0 (bytes)").default(1_048_576),
});

/** The transfer queue: `memory` (embedded default), a `redis://` URL, a `redis+cluster://host:port,host:port` URL (Redis/Valkey Cluster), or `upstash` (reads UPSTASH_REDIS_REST_URL/TOKEN). */
export const StoreConfig = z.strictObject({
  url: z
    .string()
    .default("memory")
    .refine((s) => s === "memory" || s === "upstash" || /^rediss?(\+cluster)?:\/\//.test(s), "store.url must be memory, upstash, a redis:// URL or a redis+cluster://host:port,host:port URL"),
  /** Key prefix of every Redis key edgeloop writes. */
  prefix: z.string().min(1, "must not be empty: an empty prefix writes edgeloop's keys unprefixed into the database (and gc would scan all of it)").default("edgeloop:"),
  /**
   * Stream shards of each partition's group stream (docs/queue-layout.md, "Shards and Redis
   * Cluster"): a group goes to shard CRC16(uid) mod shards; readers read all. Default 1 (one
   * stream, today's key names on a single server). Every writer and reader of a prefix must agree.
   */
  shards: z.number().int().min(1, "store.shards must be >= 1").max(1024, "store.shards must be <= 1024").default(1),
  /**
   * Largest request to the store, bytes: one Upstash REST body (default 10 MB, Upstash's limit —
   * set your plan's) or one Redis TCP command / pipeline write (default 64 MiB). Pipelines are
   * split to fit; a single value too large for it is refused (413) before anything is written.
   */
  max_request_bytes: z.number().int().min(64 * 1024).nullable().default(null),
  /** What is kept how long (seconds); see {@link RetentionConfig}. */
  retention: RetentionConfig.default(RetentionConfig.parse({})),
  /** The blob store for large record parts; see {@link BlobsConfig}. */
  blobs: BlobsConfig.default(BlobsConfig.parse({})),
  /**
   * When a write counts as done (docs/queue-layout.md, "Failover and durability"). `primary`
   * (default): once the primary answered; Redis replicates asynchronously, so a failover may
   * lose the writes of the last moments. `replicated`: each write is followed on its own
   * connection by `WAIT {wait_replicas} {wait_timeout_ms}`, and a write fewer replicas
   * acknowledged in time fails as a store outage (held and retried, never taken as done).
   * Redis over TCP (one server or a cluster) only: Upstash REST refuses it.
   */
  durability: z.enum(["primary", "replicated"]).default("primary"),
  /** With `durability: replicated` (refused otherwise): replicas that must acknowledge each write (absent: 1). */
  wait_replicas: z.number().int().min(1, "must be >= 1").max(16, "must be <= 16").optional(),
  /** With `durability: replicated` (refused otherwise): milliseconds WAIT waits for them (absent: 1000). */
  wait_timeout_ms: z.number().int().min(1, "must be >= 1").max(60_000, "must be <= 60000").optional(),
});

/**
 * The inference gateway's failure handling (`edgeloop gateway`, and the
 * embedded gateway in front of simulated replicas): a per-attempt deadline,
 * the circuit breaker's ejection threshold and cool-down, and how many
 * replicas one call may try. See `createGatewayApp`.
 */
export const GatewayConfig = z.strictObject({
  /** Deadline of one attempt at one replica in ms; past it the call moves on (null: none, the caller's deadline applies). Keep it below `engine.timeout_ms`. */
  attempt_timeout_ms: timerMs().positive().nullable().default(null),
  /** Consecutive failures (timeouts, client aborts at their deadline, refused connections, 5xx, garbled 2xx) that eject a replica. */
  eject_after: z.number().int().min(1).default(3),
  /** Cool-down of an ejected replica, in ms, before one half-open probe call is let through. */
  cooldown_ms: timerMs().min(0).default(10_000),
  /** Replicas one call may try. */
  max_attempts: z.number().int().min(1).default(3),
  /** Period of the replicas' `GET /health` probes, in ms (run lazily, on traffic); 0: only when a call finds no healthy replica. */
  health_interval_ms: timerMs().min(0).default(5_000),
  /**
   * ε of the bounded-load cap (a replica takes at most (1 + ε) × the mean load):
   * `bounded_load_hash`'s, and with a shared state the cap new sessions are
   * placed under. null: the default (0.25; 0.2 with a shared state).
   */
  epsilon: z.number().positive().nullable().default(null),
  /** Shared state: ε past which a pinned session moves to a less loaded replica (never below 16 calls at its replica); null: the default, 1. */
  sticky_epsilon: z.number().positive().nullable().default(null),
  /** Sticky keys (trajectories) a per-process gateway remembers, least recently used dropped first. */
  max_sticky_keys: z.number().int().min(1).default(10_000),
  /**
   * With a Redis or Upstash store, route through routing state shared by every
   * gateway instance (session pins, in-flight leases, ejections in the store;
   * see `RedisRoutingState`); false keeps each process's own state.
   */
  shared_state: z.boolean().default(true),
  /** Shared state: lifetime of an in-flight lease whose instance stopped renewing it (a crashed gateway's load is gone after it), ms. */
  lease_ttl_ms: timerMs().min(300).default(30_000),
  /** Shared state: lifetime of a session's pin after its last call, ms. */
  pin_ttl_ms: timerMs().min(1_000).default(3_600_000),
});
export type GatewayConfig = z.infer<typeof GatewayConfig>;

/**
 * The agent webhook of the `openai_agent` loop (agent gateway): where each
 * trajectory's task is POSTed, how long the agent has (from the task to the
 * session's deadline), the HMAC secret tasks are signed with, and the URL
 * agents reach edgeloop's API at (`base_url` of the task; default: the
 * address `serve` listens on, or the loopback server of `rollout --agent`).
 */
export const AgentConfig = z.strictObject({
  url: httpUrl("agent.url must be an http(s) URL").nullable().default(null),
  timeout_ms: timerMs().positive().default(600_000),
  secret: z.string().nullable().default(null),
  public_url: httpUrl("agent.public_url must be an http(s) URL").nullable().default(null),
  /** Cap of the task webhook's answer in bytes (default 4 MiB). */
  max_reply_bytes: z.number().int().positive().default(4 * 1024 * 1024),
  /**
   * A policy per agent role: role name → engine pool (`{planner: pool_a,
   * solver: pool_b}`; a pool of `engine.pools`, or `default`, the `engine`
   * section). A call's role is its `X-Agent-Role` header, else its row's
   * `agent_role`; a role not listed is refused (400). null (default): no
   * roles configured — a call's role is still recorded, served by the
   * default pool (docs/agent-roles.md).
   */
  /**
   * The mask of an abandoned turn's tokens (a turn whose client disconnected
   * before receiving it, and that the agent did not continue from): `zero`
   * (default) masks them 0, so the policy is never trained on a turn nobody
   * acted on; `keep` keeps the sampled mask (1) for trainers that want them.
   * Either way the record has `extra_fields.abandoned` and `reward_score` null.
   */
  abandoned_mask: z.enum(["zero", "keep"]).default("zero"),
  roles: z
    .record(z.string(), z.string().min(1, "a role names an engine pool"))
    .superRefine((roles, ctx) => {
      for (const role of Object.keys(roles)) {
        const r = AgentRoleName.safeParse(role);
        if (!r.success) ctx.addIssue({ code: "custom", path: [role], message: r.error.issues[0]!.message });
      }
    })
    .nullable()
    .default(null),
});
export type AgentWebhookSection = z.infer<typeof AgentConfig>;

/**
 * A webhook reward used for rows whose `reward_model.style` is `webhook`:
 * its URL, the deadline of one call in ms, the retries of a failed call and
 * the reply cap in bytes (default 4 MiB, counted while the reply streams).
 */
export const RewardConfig = z.strictObject({
  url: httpUrl("reward.url must be an http(s) URL").nullable().default(null),
  timeout_ms: timerMs().positive().default(30_000),
  max_retries: retriesCount(ENGINE_MAX_RETRIES).default(2),
  max_reply_bytes: z.number().int().positive().default(4 * 1024 * 1024),
});

/**
 * Server-side limits no batch and no agent can raise (issue 26, S5/S18):
 * - `max_outputs_per_session` (default 128): outputs (records) one session may
 *   produce — an agent-gateway session's chat calls that open a new output, a
 *   custom loop's returned list. Past it the session fails (`session_limit`), so
 *   a group of `n` sessions never holds more than `n × max_outputs_per_session` records.
 * - `max_engine_calls_per_session` (default 1024): generation calls of one
 *   session (agent-gateway chat calls, a loop's engine requests); past it the session fails.
 * - `reward_min` / `reward_max` (default null: unbounded): the range of a
 *   self-reported reward (an agent's finish, a task's answer); outside it is a 400 naming `reward`.
 * - `max_prompt_length` / `max_response_length` (default 131072 tokens each):
 *   the largest `rollout.prompt_length` / `rollout.response_length` a batch may ask (a 400 naming it).
 * - `max_prompt_chars` (default 8388608, i.e. 8 Mi UTF-16 code units): the most characters of text
 *   one row's prompt messages may hold; a row over it refuses the whole batch with a 400 naming
 *   `rows[i].prompt`, before anything is rendered or tokenized. See `promptChars` in
 *   `shared/rollout/batch.ts` for why the bound is on characters.
 */
export const LimitsConfig = z
  .strictObject({
    max_outputs_per_session: z.number().int().min(1).default(128),
    max_engine_calls_per_session: z.number().int().min(1).default(1024),
    reward_min: z.number().nullable().default(null),
    reward_max: z.number().nullable().default(null),
    max_prompt_length: z.number().int().min(1).default(131_072),
    max_response_length: z.number().int().min(1).default(131_072),
    max_prompt_chars: z.number().int().min(1).default(8 * 1024 * 1024),
    /**
     * Back-pressure (issue 32): while this process's recent event-loop lag
     * (a 20 ms timer's lateness, the largest of its last 5 samples) is above
     * this many ms, new sessions wait to start (one always runs; queue-mode
     * workers claim no new job meanwhile), and at most 64 sessions start
     * between two samples, instead of making every running session's calls
     * later still. null: never hold by lag (only `concurrency` bounds).
     */
    max_event_loop_lag_ms: z.number().int().min(1).max(60_000).nullable().default(250),
  })
  .refine((l) => l.reward_min === null || l.reward_max === null || l.reward_min <= l.reward_max, { message: "limits.reward_min must be <= limits.reward_max", path: ["reward_min"] });
export type LimitsConfig = z.infer<typeof LimitsConfig>;

/**
 * The whole edgeloop configuration: verl's `rollout` section plus where the
 * engine, tools, store and reward live. One YAML/JSON file; every value can
 * be overridden by a CLI flag.
 */
export const AppConfig = z.strictObject({
  rollout: RolloutConfig.default(RolloutConfig.parse({})),
  engine: EngineConfig.default(EngineConfig.parse({})),
  tools: ToolsConfig.default(ToolsConfig.parse({})),
  store: StoreConfig.default(StoreConfig.parse({})),
  reward: RewardConfig.default(RewardConfig.parse({})),
  gateway: GatewayConfig.default(GatewayConfig.parse({})),
  agent: AgentConfig.default(AgentConfig.parse({})),
  /** The `openenv_agent` loop's environment: URL, transport, mappings, reward (docs/environments.md). */
  openenv: OpenEnvSettings.default(OpenEnvSettings.parse({})),
  limits: LimitsConfig.default(LimitsConfig.parse({})),
  /** The most trajectories (rows × n) one batch may hold; a larger batch is refused with a 400 before anything is planned. */
  max_batch_trajectories: z.number().int().min(1).max(10_000_000).default(100_000),
  /** Trajectories run at once in one process: every batch of the process (and a worker's jobs) shares these slots. */
  concurrency: z.number().int().min(1).max(100_000).default(256),
  /**
   * The model whose tokens edgeloop writes (tokenizer, chat template, stop ids,
   * default tool-call parser): a built-in family name (`qwen3`, `llama3_1`,
   * `deepseek_v3`, `gpt_oss`, `gemma3`) or a Hugging Face model directory
   * (`tokenizer.json`, `tokenizer_config.json`, optional `chat_template.jinja`
   * and `generation_config.json`); null = `qwen3`. Not to be confused with
   * `engine.model`, the served model name sent to a real engine.
   */
  model: z.string().nullable().default(null),
}).superRefine((c, ctx) => {
  // Every role names a pool that exists: a typo would send a role's calls nowhere.
  for (const [role, pool] of Object.entries(c.agent.roles ?? {})) {
    if (pool === DEFAULT_POOL || c.engine.pools?.[pool]) continue;
    const known = [DEFAULT_POOL, ...Object.keys(c.engine.pools ?? {})].map((p) => `"${p}"`).join(", ");
    ctx.addIssue({ code: "custom", path: ["agent", "roles", role], message: `unknown pool "${pool}" (known pools: ${known}; "${DEFAULT_POOL}" is the engine section, the others engine.pools)` });
  }
  // The server's maxima bound every rollout config, the file's and each batch's (S18).
  if (c.rollout.prompt_length > c.limits.max_prompt_length) {
    ctx.addIssue({ code: "custom", path: ["rollout", "prompt_length"], message: `must be <= limits.max_prompt_length ${c.limits.max_prompt_length}` });
  }
  if (c.rollout.response_length > c.limits.max_response_length) {
    ctx.addIssue({ code: "custom", path: ["rollout", "response_length"], message: `must be <= limits.max_response_length ${c.limits.max_response_length}` });
  }
});
export type AppConfig = z.infer<typeof AppConfig>;

/**
 * Validates a parsed config object eagerly.
 * @throws ConfigError naming the path (e.g. `rollout.n`) and what is expected.
 */
export function parseAppConfig(raw: unknown, source = "config"): AppConfig {
  const r = AppConfig.safeParse(raw ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  const path = formatPath("", issue.path) || "(root)";
  throw new ConfigError(path, `${issue.message} (in ${source})`);
}

/**
 * A config file with the CLI flags over it: the merged config, parsed. The
 * file is checked on its own first, so a value it holds is never accepted
 * unchecked because a flag replaced it (`rollout.n: "four"` with `--n 1` is
 * still an error naming the file's key); only cross-key checks (code
 * `custom`, e.g. a sim-only key beside a real `engine.url` that a flag
 * changes) are left to the merged config.
 * @throws ConfigError naming the first invalid path and `source`.
 */
export function parseLayeredConfig(file: unknown, overrides: unknown, source = "config"): AppConfig {
  checkConfigFile(file, source);
  return parseAppConfig(mergeConfig(file, overrides), source);
}

/**
 * The per-key checks of {@link parseLayeredConfig} on a config file alone
 * (types, ranges, unknown keys; cross-key checks are left to the merged config).
 * @throws ConfigError naming the first invalid path and `source`.
 */
export function checkConfigFile(file: unknown, source = "config"): void {
  const alone = AppConfig.safeParse(file ?? {});
  if (alone.success) return;
  const issue = alone.error.issues.find((i) => i.code !== "custom");
  if (issue) throw new ConfigError(formatPath("", issue.path) || "(root)", `${issue.message} (in ${source})`);
}

/**
 * Deep-merges `override` into `base` (objects merge, everything else
 * replaces); used for CLI flags and per-batch config. A `base` that is
 * neither an object, null nor absent where `override` holds a section (a
 * config file whose `rollout:` is a list or a number, or a whole file that
 * is not a mapping) is kept as it is, so that parsing names it instead of the
 * override silently replacing it.
 */
export function mergeConfig(base: unknown, override: unknown): unknown {
  if (override === undefined) return base;
  if (!isPlainObject(override)) return override;
  if (base !== undefined && base !== null && !isPlainObject(base)) return base;
  const out: Record<string, unknown> = { ...(base ?? {}) };
  for (const [k, v] of Object.entries(override)) {
    if (v === undefined) continue;
    out[k] = mergeConfig(isPlainObject(base) ? base[k] : undefined, v);
  }
  return out;
}

function isPlainObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}
