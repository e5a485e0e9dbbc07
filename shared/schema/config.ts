import { z } from "zod";

/**
 * An absolute `http:` or `https:` URL (engines, webhooks, public URLs): zod's
 * `url()` alone accepts any scheme (`ftp://…`, `mailto:…`), which would pass
 * at start and fail every request later.
 */
export function httpUrl(message: string) {
  return z.string().refine((s) => {
    try {
      const u = new URL(s);
      return u.protocol === "http:" || u.protocol === "https:";
    } catch {
      return false;
    }
  }, message);
}

/**
 * setTimeout's largest delay, milliseconds (2^31 − 1, about 24.8 days): a
 * larger delay fires at once (Bun and Node warn `TimeoutOverflowWarning` and
 * use 1 ms), so every request would time out immediately.
 */
export const MAX_TIMER_MS = 2_147_483_647;

/** The largest seconds value that ends in a timer: {@link MAX_TIMER_MS} in whole seconds (2 147 483 s, about 24.8 days). */
export const MAX_TIMER_SECONDS = Math.floor(MAX_TIMER_MS / 1000);

/** Default `rollout.trajectory_deadline_s`: one hour of wall-clock time per trajectory. */
export const DEFAULT_TRAJECTORY_DEADLINE_S = 3600;

/** The most retries after the first attempt any retries field takes (tools, interactions, MCP servers, engine, reward). */
export const MAX_RETRIES = 10;

/**
 * A duration in milliseconds that ends in a timer (`setTimeout`,
 * `AbortSignal.timeout`): an integer at most {@link MAX_TIMER_MS}. Add
 * `.positive()` / `.min()` for the lower bound.
 */
export function timerMs() {
  return z.number().int().max(MAX_TIMER_MS, `must be <= ${MAX_TIMER_MS} (milliseconds; setTimeout's largest delay)`);
}

/** A retries count: an integer in 0..`max` (default {@link MAX_RETRIES}), retries after the first attempt. */
export function retriesCount(max: number = MAX_RETRIES) {
  return z.number().int().min(0).max(max, `must be <= ${max} (retries after the first attempt)`);
}

/** `rollout.val_kwargs`: sampling used for validation batches (verl defaults: greedy, n = 1). */
export const ValKwargs = z.strictObject({
  temperature: z.number().min(0).default(0),
  top_p: z.number().gt(0).max(1).default(1.0),
  top_k: z.number().int().min(-1).default(-1),
  n: z.number().int().min(1, "rollout.val_kwargs.n must be >= 1").default(1),
  /** false (verl's default): validation decodes greedily (temperature 0, top_p 1, top_k -1) whatever the values above say; true: it samples with them. */
  do_sample: z.boolean().default(false),
});

/** `rollout.multi_turn` limits of the tool agent (verl's names and defaults). */
export const MultiTurnConfig = z.strictObject({
  /** false: `tool_agent`'s first assistant turn is final (its calls are not run, no simulated user; `terminated_by: "multi_turn_disabled"`). */
  enable: z.boolean().default(true),
  max_assistant_turns: z.number().int().min(1).nullable().default(null),
  max_user_turns: z.number().int().min(1).nullable().default(null),
  max_parallel_calls: z.number().int().min(1).default(1),
  /** Characters (code points), not tokens, as in verl. */
  max_tool_response_length: z.number().int().min(1).default(256),
  /** `left` keeps the tail, `right` keeps the head, `middle` keeps head and tail. */
  tool_response_truncate_side: z.enum(["left", "right", "middle"]).default("middle"),
  /**
   * Tool-call parser name (`hermes`, `qwen3_coder`, `llama3_json`, …); null =
   * the model family's default parser (`ChatTokenizer.traits.defaultParser`:
   * `hermes` for Qwen3 and model directories).
   */
  format: z.string().nullable().default(null),
  /** What a turn that ended with `finish_reason: "length"` does with complete calls: verl-compatible default is none. */
  execute_calls_on_length: z.boolean().default(false),
});

/** `rollout.agent`: loop routing. */
export const AgentConfig = z.strictObject({
  default_agent_loop: z.string().default("single_turn_agent"),
  agent_loop_config_path: z.string().nullable().default(null),
});

/**
 * `rollout.teacher`: a teacher engine that scores every finished trajectory
 * with one prefill-only call on `prompt_ids ‖ response_ids` (on-policy
 * distillation); the record then carries `teacher_log_probs`. `url` (or
 * `urls`, replicas routed as engine replicas are: sticky per trajectory key,
 * failed replicas ejected), `format` as `engine.format`, `model` the vLLM
 * `model` field, `timeout_ms` per call. `on_error`: `fail` (default) fails a
 * trajectory the teacher could not score after retries; `keep` stores it
 * without `teacher_log_probs` and with `extra_fields.teacher_error`. `url:
 * "sim"` scores with an embedded simulated engine (its own log-probs, seeded
 * apart from the policy's). null (default) = no teacher.
 */
export const TeacherConfig = z
  .strictObject({
    url: z.union([z.literal("sim"), httpUrl("rollout.teacher.url must be \"sim\" or an http(s) URL")], { error: "rollout.teacher.url must be \"sim\" or an http(s) URL" }).nullish(),
    urls: z.array(httpUrl("rollout.teacher.urls[i] must be an http(s) URL")).min(1, "rollout.teacher.urls must name at least one replica").nullish(),
    format: z.enum(["vllm", "vllm-generate", "sglang"]).default("vllm"),
    model: z.string().nullable().default(null),
    timeout_ms: timerMs().positive().default(600_000),
    on_error: z.enum(["fail", "keep"]).default("fail"),
  })
  .refine((t) => (t.url == null) !== (t.urls == null), { message: "rollout.teacher needs exactly one of url or urls (the other null or absent)" });
export type TeacherConfig = z.infer<typeof TeacherConfig>;

/**
 * The rollout section, with verl's names, nesting and defaults
 * (`verl/trainer/config/rollout/rollout.yaml`): a config file reads
 * `{"rollout": {"n": 4, "multi_turn": {…}, "agent": {…}}}`.
 * `max_model_len` null means "the engine's" (asked at start) and falls back
 * to `prompt_length + response_length`.
 */
export const RolloutConfig = z
  .strictObject({
    n: z.number().int().min(1, "rollout.n must be >= 1").default(1),
    prompt_length: z.number().int().min(1).default(512),
    response_length: z.number().int().min(1).default(512),
    max_model_len: z.number().int().min(2).nullable().default(null),
    calculate_log_probs: z.boolean().default(true),
    /**
     * Routed experts (MoE routing replay, R3): ask the engine for the experts
     * its router picked for every token (SGLang `return_routed_experts`) and
     * record them as `routed_experts` int32 `[prompt+response tokens, layers,
     * top_k]` with `routed_experts_shape: [layers, top_k]` (`engine.moe` gives
     * the shape of a real engine). Default false: the fields are absent.
     */
    return_routed_experts: z.boolean().default(false),
    temperature: z.number().min(0).default(1.0),
    top_p: z.number().gt(0).max(1).default(1.0),
    top_k: z.number().int().min(-1).default(-1),
    seed: z.number().int().optional(),
    val_kwargs: ValKwargs.default(ValKwargs.parse({})),
    multi_turn: MultiTurnConfig.default(MultiTurnConfig.parse({})),
    agent: AgentConfig.default(AgentConfig.parse({})),
    /**
     * Vision-language families: what left truncation of a prompt over
     * `prompt_length` does when it reaches an image. `error` (default, verl
     * and DESIGN §2 invariant 5) fails the row naming the image; `drop` drops
     * every image it reaches whole and lists them in `multi_modal.dropped_images`.
     * An image is never cut. @see shared/vision/multimodal-tokens.ts `buildMultimodalPromptIds`
     */
    image_truncation: z.enum(["error", "drop"], { error: 'rollout.image_truncation must be "error" or "drop"' }).default("error"),
    /** Extra kwargs for the chat template, e.g. `{enable_thinking: false}` (verl's `apply_chat_template_kwargs`). */
    chat_template_kwargs: z.record(z.string(), z.unknown()).default({}),
    /**
     * Admission control (AReaL's `rollout.max_head_offpolicyness`): a
     * trajectory STARTS only while `current.seq − consumed.seq ≤
     * max_staleness`, where `current` is the policy version (`POST
     * /v1/model-version`) and `consumed` the newest version the trainer
     * reported consuming (`POST /v1/consumed-version`); held trajectories wait
     * (no engine call) and start once the bound is met again. Trajectories
     * already running finish. null = no limit. With `staleness_policy: fail`
     * the old rule applies instead: before each turn, a trajectory whose first
     * turn ran more than this many versions ago fails with the reason recorded.
     */
    max_staleness: z.number().int().min(0).nullable().default(null),
    /** What `max_staleness` does: `admit` (default) holds new trajectories; `fail` fails running ones that fell behind (the old behaviour). */
    staleness_policy: z.enum(["admit", "fail"]).default("admit"),
    /**
     * Over-sampling (AReaL/slime "over-sample and cancel the stragglers"): a
     * batch of R rows delivers `target_groups = ceil(R / oversample)` groups
     * (unless the request names `target_groups`); once that many groups are
     * complete the rest of the batch is stopped (see `partial_rollout`).
     * null (default) = every row is delivered. Must be >= 1.
     */
    oversample: z.number().min(1, "rollout.oversample must be >= 1 (rows per delivered group)").nullable().default(null),
    /**
     * What happens to the trajectories still running once a batch's
     * `target_groups` are delivered: `cancel` (default) aborts them (engine
     * requests aborted, tool calls abandoned, no records, their groups
     * withdrawn); `carry` suspends them at their last checkpoint (durable
     * sessions; in-process with the memory store) and leaves their groups
     * open, so the next batch naming the same uids resumes them.
     */
    partial_rollout: z.enum(["cancel", "carry"]).default("cancel"),
    /**
     * Dynamic sampling (DAPO, Yu et al. 2025, arXiv:2503.14476 §3.2: "over-sample
     * and filter out prompts with the accuracy equal to 1 and 0"): a complete
     * group whose records' `metric` values are all equal is not delivered to
     * trainers (kept as filtered, readable with `GET /v1/groups?include_filtered=1`),
     * and a reserve row of the batch is started in its place. null = off.
     */
    /**
     * Hard wall-clock deadline per trajectory, whole seconds (default
     * {@link DEFAULT_TRAJECTORY_DEADLINE_S} = 3600, one hour; at most
     * {@link MAX_TIMER_SECONDS}; null = no deadline), counted from the
     * trajectory's first start — a durable session resumed later (another
     * worker, a carried partial rollout) keeps the deadline it was given.
     * Past it the trajectory's engine and tool calls are aborted and it ends
     * with what it has sampled so far: a stored record with
     * `extra_fields.terminated_by: "deadline"`, `finish_reason: "abort"`,
     * `truncated: true` (its slot is freed and it counts as finished).
     */
    trajectory_deadline_s: z
      .number()
      .int("rollout.trajectory_deadline_s must be a whole number of seconds (or null: no deadline)")
      .min(1, "rollout.trajectory_deadline_s must be >= 1 (seconds) or null (no deadline)")
      .max(MAX_TIMER_SECONDS, `rollout.trajectory_deadline_s must be <= ${MAX_TIMER_SECONDS} (seconds; setTimeout's largest delay)`)
      .nullable()
      .default(DEFAULT_TRAJECTORY_DEADLINE_S),
    /** On-policy distillation teacher (see {@link TeacherConfig}); null = none. */
    teacher: TeacherConfig.nullable().default(null),
    filter_groups: z
      .strictObject({ metric: z.literal("reward").default("reward"), drop_if: z.literal("all_equal").default("all_equal") })
      .nullable()
      .default(null),
  })
  .refine((c) => c.max_model_len == null || c.max_model_len > c.prompt_length, {
    message: "rollout.max_model_len must be greater than rollout.prompt_length",
    path: ["max_model_len"],
  });
export type RolloutConfig = z.infer<typeof RolloutConfig>;
export type RolloutConfigInput = z.input<typeof RolloutConfig>;
