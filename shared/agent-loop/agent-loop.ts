import type { SessionLimits } from "./session-limits.ts";
import { ContextOverflowError, EdgeloopError, EngineAbortedError, InputError } from "../errors.ts";
import type { PolicyVersions } from "../inference/policy-versions.ts";
import { servableLength, type GenerateRequest, type InferenceClient } from "../inference/types.ts";
import { computeReward, type RewardOptions, type RewardResult } from "../reward/compute-reward.ts";
import { traceReward } from "../reward/reward-span.ts";
import { ChatMessage, trajectoryKey, type AgentLoopMetrics, type AgentLoopOutput, type RolloutConfig, type SamplingParams, type TokenOutput } from "../schema/index.ts";
import type { ChatTokenizer } from "../tokens/tokenizer.ts";
import type { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import type { InteractionClient } from "../tools/interaction-client.ts";
import type { ToolCallParser } from "../tools/tool-call-parser.ts";
import type { ToolExecutor } from "../tools/webhook-tool-client.ts";
import type { SandboxLeases } from "../tools/sandbox-leases.ts";
import { PREFIX_KEY_MAX_TOKENS, prefixKeyOf } from "../inference/prefix-key.ts";
import { contextSize } from "../inference/context-size.ts";
import { isDeadlineAbort, type TrajectoryDeadlineError } from "./trajectory-deadline.ts";
import { addPreempted, modelVersionOf, pushVersion, recordTurnVersions, finalTokenVersions, type TokenVersions } from "../inference/token-versions.ts";
import { imagePadRuns, visionOf } from "../vision/multimodal-tokens.ts";
// The engine-reply bookkeeping loops use, defined where engine replies live (custom loops import it from here too).
export { contextSize } from "../inference/context-size.ts";
export { addPreempted, finalTokenVersions, modelVersionOf, pushVersion, recordTurnVersions, turnVersions, type TokenVersions } from "../inference/token-versions.ts";

/** A row's initial messages: built once (a zod schema costs more to build than to run). */
const PROMPT_MESSAGES = ChatMessage.array().min(1);

/**
 * What every loop is built with (once per trajectory, cheap to construct).
 * Loops read what they need and ignore the rest.
 */
export interface AgentLoopContext {
  tokenizer: ChatTokenizer;
  client: InferenceClient;
  /** The parsed rollout config (limits, lengths, parser name, default loop). */
  config: RolloutConfig;
  /** Engine context size; defaults to `config.max_model_len`, else the engine's, else `prompt_length + response_length`. */
  maxModelLen?: number;
  /** The configured tools (webhook tools, in the tools file's order). */
  tools?: ToolExecutor;
  /** Overrides the parser named by `config.multi_turn.format`. */
  parser?: ToolCallParser;
  /** Simulated users by name; a row opts in with `extra_info.interaction_kwargs` (`name` picks one). */
  interactions?: Record<string, InteractionClient>;
  /** Reward settings; `false` leaves `reward_score` null for the trainer to fill. */
  reward?: RewardOptions | false;
  /** Monotonic milliseconds for metrics (default `performance.now()`). */
  nowMs?: () => number;
  /** Fresh engine request ids (default `crypto.randomUUID()`). */
  newRequestId?: () => string;
  /**
   * Aborts engine and webhook calls of this trajectory: the batch's cancel or
   * surplus, or the trajectory's deadline (`rollout.trajectory_deadline_s`;
   * reason {@link TrajectoryDeadlineError}, see {@link isDeadlineAbort}): a
   * loop ends a trajectory past its deadline with what it has, as
   * `extra_fields.terminated_by: "deadline"`.
   */
  signal?: AbortSignal;
  /**
   * Aborts the reward of this trajectory (default `signal`). The executors
   * pass the batch's own signal here when `signal` also carries the
   * trajectory's deadline: a trajectory ended by its deadline is still scored.
   */
  scoreSignal?: AbortSignal;
  /**
   * Set by a durable session host: a tool that answers `202 Accepted` is
   * awaited (state `awaiting_tools`, result by callback or an error at the
   * tool's `timeout_ms`) instead of failing at once. `wallClockMs` gives the
   * epoch milliseconds deadlines are set in (default `Date.now()`).
   */
  asyncTools?: { wallClockMs?: () => number };
  /** The deployment's policy versions, for `rollout.max_staleness` (see {@link AgentLoop.checkStaleness}). */
  policy?: PolicyVersions;
  /** The server's per-session limits (config `limits`; default `DEFAULT_SESSION_LIMITS`): the executors enforce them. */
  sessionLimits?: SessionLimits;
  /**
   * The sandboxes of the tools file's `sandbox` lifecycle (`ExecutorDeps.leases`):
   * a loop that plays its trajectory's sandbox itself (`openenv_agent` with
   * `openenv.base_url: "sandbox"`) ensures the trajectory's lease here, by its
   * key; the executor releases it when the trajectory ends. Absent without a
   * sandbox block.
   */
  leases?: SandboxLeases;
}

/** A trajectory that fell more than `rollout.max_staleness` policy versions behind: it fails with this reason. */
export class StaleTrajectoryError extends EdgeloopError {
  override name = "StaleTrajectoryError";
  constructor(message: string) {
    super(message, { status: 409, code: "stale_policy" });
  }
}

/**
 * The keyword arguments of `run`: the dataset row's fields (`prompt`,
 * `data_source`, `reward_model`, `extra_info`, `agent_name`, …) plus the
 * framework's (`uid`, `session_id`, `global_steps`, optional `output_index`
 * and `key`). A loop reads what it needs and ignores the rest.
 */
export interface AgentLoopKwargs {
  uid: string;
  session_id: number;
  global_steps?: number;
  output_index?: number;
  /** The trajectory key; defaults to `{uid}_{session_id}_{output_index}`. */
  key?: string;
  prompt?: unknown;
  /** verl's name for `prompt`; read when `prompt` is absent. */
  raw_prompt?: unknown;
  data_source?: string;
  reward_model?: { style?: string; ground_truth?: unknown } | null;
  extra_info?: Record<string, unknown> | null;
  agent_name?: string | null;
  [field: string]: unknown;
}

/**
 * Base class of agent loops: `run(sampling_params, kwargs)` turns one row into
 * one trajectory (or several, for loops that branch), each an
 * {@link AgentLoopOutput} that passed the trajectory validator. A new instance
 * is made per trajectory, so instance fields may hold per-trajectory state.
 * @see verl `AgentLoopBase` (`verl/experimental/agent_loop/agent_loop.py`)
 */
export abstract class AgentLoop {
  constructor(protected readonly ctx: AgentLoopContext) {}

  /** Runs the loop. Errors thrown are the row's failure (bad prompt, engine failure); tool failures never throw. */
  abstract run(samplingParams: SamplingParams, kwargs: AgentLoopKwargs): Promise<AgentLoopOutput | AgentLoopOutput[]>;

  /** Monotonic milliseconds. */
  protected now(): number {
    return (this.ctx.nowMs ?? (() => performance.now()))();
  }

  /** The trajectory key: `kwargs.key`, else `{uid}_{session_id}_{output_index ?? 0}`. */
  protected key(kwargs: AgentLoopKwargs): string {
    if (typeof kwargs.key === "string" && kwargs.key) return kwargs.key;
    return trajectoryKey(kwargs.uid, kwargs.session_id, kwargs.output_index ?? 0);
  }

  /**
   * The row's initial messages (`prompt`, or verl's `raw_prompt`), validated.
   * @throws InputError naming `prompt[i].field`.
   */
  protected messages(kwargs: AgentLoopKwargs): ChatMessage[] {
    const raw = kwargs.prompt ?? kwargs.raw_prompt;
    const r = PROMPT_MESSAGES.safeParse(raw);
    if (!r.success) {
      const i = r.error.issues[0];
      const path = ["prompt", ...(i?.path ?? [])].map((p, k) => (typeof p === "number" ? `[${p}]` : k === 0 ? String(p) : `.${String(p)}`)).join("");
      throw new InputError(path, i?.message ?? "invalid prompt");
    }
    return r.data;
  }

  /**
   * The context size to budget against: the batch's `rollout.max_model_len`
   * when set (it may be smaller than the server's: a batch can ask for a
   * tighter context), never more than the context the process was given
   * ({@link AgentLoopContext.maxModelLen}, the engine's); else that context;
   * else the engine's answer; else `prompt_length + response_length`.
   */
  protected maxModelLen(): Promise<number> {
    return contextSize(this.ctx.config, this.ctx.maxModelLen, this.ctx.client);
  }

  /**
   * One assistant turn for the builder's current context: an engine call with
   * a fresh request id, the trajectory key as routing key, the prompt's
   * prefix key (`prefixKeyOf`: its leading system+tools block, for the
   * gateway's first-turn placement) and
   * `max_tokens = builder.nextMaxTokens()` (at most `maxTokensCap` when given:
   * a caller's own `max_tokens`), asking for routed experts when
   * `returnRoutedExperts` (default `rollout.return_routed_experts`). Returns `undefined` without
   * sending anything when that budget is 0 (the caller ends the trajectory
   * truncated). An engine `ContextOverflowError` is returned as `"overflow"`.
   *
   * Preemption (DESIGN §4.2, case C11): a reply with `finish_reason: "abort"`
   * (the engine preempted the request or is updating weights) keeps its
   * partial tokens and log-probs, and the turn is resumed with a new request
   * whose prompt is the running stream plus those tokens and whose
   * `max_tokens` is reduced by what was generated; an `EngineAbortedError`
   * (abort before any token, HTTP 499) is resent as it was. At most
   * {@link MAX_RESUMES} resumes per turn, then the turn ends `abort` with
   * what it has (`"aborted"` when that is nothing). The turn's output holds
   * every token and log-prob in order and `num_preempted` = the resumes plus
   * what the engine reported. A cancellation by the loop's own `signal` is
   * never resumed, and past the trajectory's deadline ({@link isDeadlineAbort})
   * no call is sent at all. Other engine errors propagate. Adds the call's seconds to
   * `metrics.generate_sequences`. A resumed turn's output carries
   * `extra_fields.token_versions`: the policy version of each call's tokens as
   * run-length segments over the turn's tokens (see {@link turnVersions});
   * its `extra_fields.model_version` is the last call's, and so are its
   * `routed_experts` (with `rollout.return_routed_experts`: every call
   * re-sends the whole stream, so the last call's cover every token of the
   * earlier ones too). `onTokens` is passed to every engine call as its
   * `on_tokens` sink: across resumes it sees the turn's tokens as one
   * sequence (a call resumed after a preemption continues where the broken
   * one stopped), in order, before this resolves. `imageData` (the images
   * of the running stream's placeholder runs, in order, as data URIs) goes
   * with every call as `image_data`.
   */
  protected async generate(
    builder: TrajectoryBuilder,
    samplingParams: SamplingParams,
    key: string,
    metrics: AgentLoopMetrics,
    maxTokensCap?: number,
    returnRoutedExperts: boolean = this.ctx.config?.return_routed_experts === true,
    onTokens?: GenerateRequest["on_tokens"],
    imageData?: readonly string[],
  ): Promise<TokenOutput | "overflow" | "aborted" | undefined> {
    const maxTokens = maxTokensCap === undefined ? builder.nextMaxTokens() : Math.min(builder.nextMaxTokens(), maxTokensCap);
    if (maxTokens <= 0) return undefined;
    const t0 = this.now();
    const base = builder.contextIds();
    checkImageRuns(this.ctx.tokenizer, base, imageData?.length ?? 0);
    const ids: number[] = [];
    let lps: number[] | null = [];
    let preempted = 0;
    let reported = -1;
    let last: TokenOutput | undefined;
    // The turn's policy versions as run-length segments over its tokens (a resume across a weight update starts one).
    const segs: TokenVersions = [];
    const signal = this.ctx.signal;
    const stopParams = withStopIds(samplingParams, this.ctx.tokenizer.stopTokenIds);
    try {
      for (let attempt = 0; ; attempt++) {
        const canResume = attempt < MAX_RESUMES && !signal?.aborted;
        // Past the trajectory's deadline nothing more is sent: the turn ends with what it has, as an abort would.
        if (isDeadlineAbort(signal)) {
          if (ids.length === 0) return "aborted";
          break;
        }
        let out: TokenOutput;
        try {
          out = await this.ctx.client.generate({
            request_id: (this.ctx.newRequestId ?? (() => crypto.randomUUID()))(),
            routing_key: key,
            prefix_key: builderPrefixKey(builder, base, this.ctx.tokenizer.turnEndIds),
            prompt_ids: ids.length ? base.concat(ids) : base,
            sampling_params: stopParams,
            max_tokens: maxTokens - ids.length,
            signal,
            ...(returnRoutedExperts ? { return_routed_experts: true } : {}),
            ...(onTokens ? { on_tokens: onTokens } : {}),
            ...(imageData && imageData.length > 0 ? { image_data: imageData } : {}),
          });
        } catch (e) {
          if (e instanceof EngineAbortedError && canResume) {
            preempted++;
            continue;
          }
          if (ids.length === 0 || !(e instanceof EngineAbortedError || e instanceof ContextOverflowError)) {
            if (e instanceof ContextOverflowError) return "overflow";
            if (e instanceof EngineAbortedError) return "aborted";
            throw e;
          }
          break;
        }
        last = out;
        if (out.token_ids.length > 0) pushVersion(segs, ids.length, modelVersionOf(out));
        ids.push(...out.token_ids);
        lps = lps && out.log_probs ? lps.concat(out.log_probs) : null;
        if (out.num_preempted >= 0) reported = Math.max(0, reported) + out.num_preempted;
        if (out.finish_reason === "abort" && canResume && ids.length < maxTokens) {
          preempted++;
          continue;
        }
        break;
      }
    } finally {
      metrics.generate_sequences += Math.max(0, (this.now() - t0) / 1000);
    }
    if (preempted === 0 && last) return last;
    const tail = last ?? { finish_reason: "abort" as const, num_preempted: -1, extra_fields: {} };
    const finish = tail.finish_reason === "abort" && ids.length >= maxTokens ? "length" : ids.length && last ? tail.finish_reason : "abort";
    return {
      ...tail,
      token_ids: ids,
      log_probs: lps && lps.length === ids.length ? lps : null,
      finish_reason: finish,
      num_preempted: preempted + Math.max(0, reported),
      extra_fields: { ...(tail.extra_fields ?? {}), token_versions: segs },
    };
  }

  /**
   * Before a turn, with `rollout.staleness_policy: fail` (under the default
   * `admit`, `max_staleness` is admission control instead: see
   * `waitForAdmission`): with `rollout.max_staleness` set and the policy versions
   * known, fails the trajectory when its first turn's version (`versions[0]`)
   * is more than `max_staleness` versions behind the current one.
   * @throws StaleTrajectoryError naming both versions and the limit.
   */
  protected async checkStaleness(versions: readonly unknown[]): Promise<void> {
    const max = this.ctx.config.max_staleness;
    const policy = this.ctx.policy;
    if (max == null || this.ctx.config.staleness_policy !== "fail" || !policy || versions.length === 0 || versions[0] == null) return;
    const [first, cur] = await Promise.all([policy.seqOf(versions[0]), policy.current()]);
    if (first === null || cur === null || cur.seq - first <= max) return;
    throw new StaleTrajectoryError(
      `started at policy version ${JSON.stringify(versions[0])}, now ${JSON.stringify(cur.version)}: ${cur.seq - first} versions behind, over rollout.max_staleness ${max}`,
    );
  }

  /** Scores the trajectory from the last assistant turn's text (see `computeReward`); null when rewards are off or the row has no `reward_model`. */
  protected async reward(kwargs: AgentLoopKwargs, key: string, finalAnswer: string): Promise<RewardResult> {
    if (this.ctx.reward === false || !kwargs.reward_model) return { score: null, seconds: 0 };
    const rm = kwargs.reward_model;
    return traceReward(key, () =>
      computeReward(
        { key, data_source: kwargs.data_source ?? "unknown", reward_model: rm, final_answer: finalAnswer },
        { nowMs: this.ctx.nowMs, signal: this.ctx.scoreSignal ?? this.ctx.signal, ...(this.ctx.reward ?? {}) },
      ),
    );
  }
}

/**
 * `sp` with the model's stop ids merged into `stop_token_ids` (the row's own
 * first, then the model's, without repeats), so that every engine ends a turn
 * on every id of the model's generation-config stop list even when it was
 * started without that config (vLLM `--generation-config vllm`, a bare
 * SGLang). Returns `sp` itself when nothing is added.
 * @see vLLM `stop_token_ids` / SGLang `sampling_params.stop_token_ids` (both a set of ids)
 */
export function withStopIds(sp: SamplingParams, stopIds: readonly number[]): SamplingParams {
  // The same (params, stop list) pair recurs on every turn of a trajectory (and every trajectory of a batch).
  const memo = stopMemo.get(sp);
  if (memo && memo.stopIds === stopIds) return memo.out;
  const own = sp.stop_token_ids ?? [];
  const add = stopIds.filter((id) => !own.includes(id));
  const out = add.length === 0 ? sp : { ...sp, stop_token_ids: [...own, ...add] };
  stopMemo.set(sp, { stopIds, out });
  return out;
}

/** {@link withStopIds} results by params object (the stop list is the tokenizer's own, fixed array). */
const stopMemo = new WeakMap<SamplingParams, { stopIds: readonly number[]; out: SamplingParams }>();

/** Prefix keys that depend on the prompt alone, by builder (see {@link builderPrefixKey}). */
const prefixKeys = new WeakMap<TrajectoryBuilder, string>();

/**
 * `prefixKeyOf(context, turnEndIds)` for a builder's context, computed once
 * per trajectory when it depends on the prompt alone: when the keyed block
 * ends inside the prompt (at a turn-end id, or at the key's token cap) — the
 * usual case, a system or first user turn — every later turn's context has
 * the same block. A prompt without a turn end is keyed afresh each turn (its
 * block runs into the response).
 */
export function builderPrefixKey(builder: TrajectoryBuilder, context: ArrayLike<number>, turnEndIds: readonly number[]): string {
  const cached = prefixKeys.get(builder);
  if (cached !== undefined) return cached;
  const key = prefixKeyOf(context, turnEndIds);
  const n = Number.parseInt(key, 10);
  const p = builder.promptIds;
  if (n <= p.length && (n === PREFIX_KEY_MAX_TOKENS || (n > 0 && turnEndIds.includes(p[n - 1]!)))) prefixKeys.set(builder, key);
  return key;
}

/** Resumes of one turn after preemption before it ends `abort` with what it has. */
export const MAX_RESUMES = 8;

/** Fresh metrics: zero seconds, `num_preempted` −1 (unknown). */
export function emptyMetrics(): AgentLoopMetrics {
  return { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 };
}

/**
 * For a vision-language family: the context must hold exactly one placeholder run
 * (`<|vision_start|><|image_pad|>…<|vision_end|>`) per image sent with the call, as
 * SGLang's processor pairs them (it fails or misaligns otherwise). A run no image part
 * made — text that spells vision tokens (the tokenizer reads special tokens in text), or a
 * turn that sampled them — is refused here, before the engine sees it.
 * @throws InputError (field `messages`) naming the counts.
 */
function checkImageRuns(tok: ChatTokenizer, ids: ArrayLike<number>, images: number): void {
  if (!tok.traits.vision) return;
  const runs = imagePadRuns(ids, visionOf(tok).ids);
  if (typeof runs !== "string" && runs.length === images) return;
  const what = typeof runs === "string" ? runs : `${runs.length} image placeholder run(s) for ${images} image(s)`;
  throw new InputError("messages", `the context holds ${what}: a text part, a tool result or a sampled turn spells vision tokens (<|vision_start|>, <|image_pad|>, <|vision_end|>); send images as image parts`);
}
