import { InputError, TrajectoryInvariantError } from "../errors.ts";
import { ROUTED_EXPERTS_FILL, type AgentLoopMetrics, type AgentLoopOutput, type FinishReason, type RoutedExpertsShape, type RoutedExpertsSpan } from "../schema/index.ts";
import { decodeInt32, encodeInt32 } from "../schema/typed-base64.ts";
import { toPlainArray } from "./plain-array.ts";
import { validateTrajectory } from "./validate.ts";

/** Options for {@link TrajectoryBuilder}. */
export interface BuilderOptions {
  /** The initial prompt ids (already capped at `prompt_length`). */
  promptIds: ArrayLike<number>;
  /** `rollout.response_length`: tokens the whole response (actions + observations) may hold. */
  responseLength: number;
  /** The engine's context size in tokens (`max_model_len`). */
  maxModelLen: number;
  /** Whether log-probs are requested and kept (`rollout.calculate_log_probs`). */
  trackLogProbs: boolean;
  /** `rollout.prompt_length`, checked by the validator when given. */
  promptLength?: number;
  /** The prompt was left-truncated (recorded in `extra_fields.prompt_truncated`). */
  promptTruncated?: boolean;
}

/** What an append did: how many ids were kept, and whether the budget cut it. */
export interface AppendResult {
  appended: number;
  truncated: boolean;
}

/** The builder's state as plain JSON (for durable-session checkpoints). */
export interface BuilderSnapshot {
  prompt_ids: number[];
  response_ids: number[];
  response_mask: (0 | 1)[];
  response_logprobs: number[] | null;
  truncated: boolean;
  prompt_truncated: boolean;
  response_length: number;
  max_model_len: number;
  prompt_length?: number;
  /** Routed experts over prompt ‖ response: base64 of little-endian int32 `[P + R, layers, top_k]` (absent when none were recorded). */
  routed_experts?: string;
  /** `[layers, top_k]` of `routed_experts`. */
  routed_experts_shape?: RoutedExpertsShape;
}

const INITIAL_CAPACITY = 256;

/**
 * Builds one token trajectory: the prompt ids plus a response stream held in
 * typed arrays — ids `Int32Array`, mask `Uint8Array`, log-probs
 * `Float32Array` — that grow geometrically up to `response_length`.
 *
 * Sampled ids are appended exactly as the engine returned them (mask 1, their
 * log-probs); observation ids get mask 0 and log-prob 0.0. `response_length`
 * budgets the whole response and `max_model_len` the whole sequence (prompt ‖
 * response): an append that would exceed either is cut, every per-token array
 * together, and the trajectory is marked truncated (DESIGN §2 invariants 2
 * and 4; cases C8, C11, C12) — a trainer never gets a sequence longer than the
 * model's context. Log-probs are stored as float32,
 * as trainers hold them.
 *
 * Routed experts (R3, {@link applyRoutedExperts}) are held per position of
 * prompt ‖ response in a growing `Int32Array` (`layers × top_k` values a
 * position): each engine call's experts overwrite the positions they cover,
 * so observation tokens get the next call's prefill experts; positions no
 * call covered keep `ROUTED_EXPERTS_FILL` (0). Positions exist only for kept
 * tokens, so every budget cut cuts the experts with the other arrays.
 */
export class TrajectoryBuilder {
  readonly promptIds: Int32Array;
  readonly responseBudget: number;
  readonly maxModelLen: number;
  readonly trackLogProbs: boolean;
  readonly promptLength?: number;
  readonly promptTruncated: boolean;
  private ids: Int32Array;
  private mask: Uint8Array;
  private lps: Float32Array | null;
  private len = 0;
  private cut = false;
  private experts: Int32Array | null = null;
  private expertShape: RoutedExpertsShape | null = null;
  /** First position whose experts changed since {@link markExpertsCommitted} (Infinity: none). */
  private expertsDirty = Infinity;

  constructor(opts: BuilderOptions) {
    if (!Number.isInteger(opts.responseLength) || opts.responseLength < 1) {
      throw new InputError("rollout.response_length", "must be an integer >= 1");
    }
    if (!Number.isInteger(opts.maxModelLen) || opts.maxModelLen < 1) {
      throw new InputError("rollout.max_model_len", "must be an integer >= 1");
    }
    this.promptIds = new Int32Array(opts.promptIds);
    this.responseBudget = opts.responseLength;
    this.maxModelLen = opts.maxModelLen;
    this.trackLogProbs = opts.trackLogProbs;
    this.promptLength = opts.promptLength;
    this.promptTruncated = opts.promptTruncated ?? false;
    const cap = Math.min(INITIAL_CAPACITY, this.responseBudget);
    this.ids = new Int32Array(cap);
    this.mask = new Uint8Array(cap);
    this.lps = this.trackLogProbs ? new Float32Array(cap) : null;
  }

  /** Restores a builder from {@link snapshot} output. */
  static fromSnapshot(s: BuilderSnapshot, trackLogProbs: boolean): TrajectoryBuilder {
    const b = new TrajectoryBuilder({
      promptIds: s.prompt_ids,
      responseLength: s.response_length,
      maxModelLen: s.max_model_len,
      trackLogProbs,
      promptLength: s.prompt_length,
      promptTruncated: s.prompt_truncated,
    });
    b.ensure(s.response_ids.length);
    b.ids.set(s.response_ids);
    b.mask.set(s.response_mask);
    if (b.lps && s.response_logprobs) b.lps.set(s.response_logprobs);
    b.len = s.response_ids.length;
    b.cut = s.truncated;
    if (s.routed_experts !== undefined && s.routed_experts_shape) b.restoreRoutedExperts(decodeInt32(s.routed_experts), s.routed_experts_shape);
    return b;
  }

  /**
   * A new builder holding this one's prompt and the first `at − P` response
   * tokens (ids, mask, log-probs, routed experts; `P` = prompt length): a
   * branch of a trajectory tree sharing prompt ‖ response up to `at`, with the
   * same budgets, not truncated. This builder is unchanged.
   * @throws InputError (field `branch_at`) unless `P ≤ at ≤ contextLength`.
   */
  forkAt(at: number): TrajectoryBuilder {
    const P = this.promptIds.length;
    if (!Number.isInteger(at) || at < P || at > this.contextLength) throw new InputError("branch_at", `must be an integer in [${P}, ${this.contextLength}] (the prompt's length to prompt ‖ response's), got ${at}`);
    const b = new TrajectoryBuilder({
      promptIds: this.promptIds,
      responseLength: this.responseBudget,
      maxModelLen: this.maxModelLen,
      trackLogProbs: this.trackLogProbs,
      promptLength: this.promptLength,
      promptTruncated: this.promptTruncated,
    });
    const n = at - P;
    b.ensure(n);
    b.ids.set(this.ids.subarray(0, n));
    b.mask.set(this.mask.subarray(0, n));
    if (b.lps && this.lps) b.lps.set(this.lps.subarray(0, n));
    b.len = n;
    const re = this.routedExperts();
    if (re) b.restoreRoutedExperts(re.data.subarray(0, at * re.shape[0] * re.shape[1]), re.shape);
    return b;
  }

  /** Tokens in the response so far (actions and observations). */
  get responseLength(): number {
    return this.len;
  }

  /** True once any append was cut by the budget, or {@link markTruncated} was called. */
  get truncated(): boolean {
    return this.cut;
  }

  /** The last id of the running stream (response, else prompt), or undefined when both are empty. */
  get lastTokenId(): number | undefined {
    if (this.len > 0) return this.ids[this.len - 1];
    return this.promptIds.length > 0 ? this.promptIds[this.promptIds.length - 1] : undefined;
  }

  /** Response tokens still allowed: `response_length − response so far`. */
  get remainingBudget(): number {
    return this.responseBudget - this.len;
  }

  /** Length of the engine input: prompt + response so far. */
  get contextLength(): number {
    return this.promptIds.length + this.len;
  }

  /** The engine input: prompt ‖ response so far, as a plain array for the JSON boundary. */
  contextIds(): number[] {
    const out = new Array<number>(this.promptIds.length + this.len);
    for (let i = 0; i < this.promptIds.length; i++) out[i] = this.promptIds[i]!;
    for (let i = 0; i < this.len; i++) out[this.promptIds.length + i] = this.ids[i]!;
    return out;
  }

  /**
   * `max_tokens` for the next engine request:
   * `min(response_length − response so far, max_model_len − input length)`,
   * or 0 when that is ≤ 0 — then no request may be sent and the trajectory
   * ends truncated (cases C11, C12).
   */
  nextMaxTokens(): number {
    return Math.max(0, Math.min(this.remainingBudget, this.maxModelLen - this.contextLength));
  }

  /**
   * Appends ids the policy sampled, exactly as returned (mask 1).
   * @param logprobs one per id; required when log-probs are tracked, ignored otherwise.
   * @throws TrajectoryInvariantError when log-probs are tracked but missing or misaligned.
   */
  appendAction(ids: ArrayLike<number>, logprobs?: ArrayLike<number> | null): AppendResult {
    if (this.lps) {
      if (logprobs == null) throw new TrajectoryInvariantError("aligned_lengths", "log-probs are tracked but the action has none");
      if (logprobs.length !== ids.length) {
        throw new TrajectoryInvariantError("aligned_lengths", `action has ${ids.length} ids but ${logprobs.length} log-probs`);
      }
    }
    return this.append(ids, 1, logprobs ?? null);
  }

  /** Appends observation ids (tool results, user turns, template boundaries): mask 0, log-prob 0.0. */
  appendObservation(ids: ArrayLike<number>): AppendResult {
    return this.append(ids, 0, null);
  }

  /** Records that the trajectory ended because a budget was reached (e.g. `nextMaxTokens()` is 0). */
  markTruncated(): void {
    this.cut = true;
  }

  /** The response ids so far, as a plain array. */
  responseIds(): number[] {
    return toPlainArray(this.ids.subarray(0, this.len));
  }

  /** The response mask so far (1 = sampled by the policy). */
  responseMask(): (0 | 1)[] {
    return toPlainArray(this.mask.subarray(0, this.len)) as (0 | 1)[];
  }

  /** The response log-probs so far (float32 values), or null when not tracked. */
  responseLogprobs(): number[] | null {
    return this.lps ? toPlainArray(this.lps.subarray(0, this.len)) : null;
  }

  /**
   * Views (no copy) of the response from token `from` on: ids, mask and
   * log-probs (null when not tracked). For append-only checkpoints; valid
   * until the next append.
   */
  responseSlice(from: number): { ids: Int32Array; mask: Uint8Array; logprobs: Float32Array | null } {
    const f = Math.min(Math.max(0, from), this.len);
    return { ids: this.ids.subarray(f, this.len), mask: this.mask.subarray(f, this.len), logprobs: this.lps ? this.lps.subarray(f, this.len) : null };
  }

  /** Bytes held by the typed arrays (capacity, not length). */
  get byteSize(): number {
    return this.promptIds.byteLength + this.ids.byteLength + this.mask.byteLength + (this.lps?.byteLength ?? 0) + (this.experts?.byteLength ?? 0);
  }

  /** `[layers, top_k]` of the routed experts held, or null when no engine call returned any. */
  get routedExpertsShape(): RoutedExpertsShape | null {
    return this.expertShape;
  }

  /**
   * Records one engine call's routed experts (a no-op for `undefined`):
   * positions `span.start …` of prompt ‖ response are overwritten with the
   * call's rows — a call re-sends the whole running stream, so position 0 is
   * the prompt's first token. Rows for positions the builder does not hold
   * (tokens a budget cut, or past the stream) are dropped. The first span
   * fixes `[layers, top_k]`; positions never covered hold 0.
   * Call it after appending the call's action, so its tokens have positions.
   * @throws TrajectoryInvariantError (`routed_experts`) when a span's shape differs from the first one's.
   */
  applyRoutedExperts(span: RoutedExpertsSpan | undefined): void {
    if (!span) return;
    const [layers, topK] = span.shape;
    if (this.expertShape && (this.expertShape[0] !== layers || this.expertShape[1] !== topK)) {
      throw new TrajectoryInvariantError("routed_experts", `an engine call returned routed experts of shape [${layers}, ${topK}], earlier calls [${this.expertShape.join(", ")}]`);
    }
    if (!this.expertShape) this.expertShape = [layers, topK];
    const per = layers * topK;
    const total = this.promptIds.length + this.len;
    this.ensureExperts(total);
    const from = Math.min(span.start, total);
    const to = Math.min(span.start + span.tokens, total);
    if (to <= from) return;
    const src = span.data.subarray(0, (to - span.start) * per).subarray((from - span.start) * per);
    const dst = this.experts!.subarray(from * per, to * per);
    if (this.expertsDirty > from) {
      let i = 0;
      while (i < src.length && src[i] === dst[i]) i++;
      if (i < src.length) this.expertsDirty = Math.min(this.expertsDirty, from + Math.floor(i / per));
    }
    dst.set(src);
  }

  /**
   * The routed experts held: int32 `[P + R, layers, top_k]` (a view, valid
   * until the next append) and their shape; null when none were recorded.
   * Positions past the last covered one hold 0.
   */
  routedExperts(): { data: Int32Array; shape: RoutedExpertsShape } | null {
    if (!this.expertShape) return null;
    const total = this.promptIds.length + this.len;
    this.ensureExperts(total);
    return { data: this.experts!.subarray(0, total * this.expertShape[0] * this.expertShape[1]), shape: [this.expertShape[0], this.expertShape[1]] };
  }

  /**
   * For append-only checkpoints: the first position of prompt ‖ response
   * whose routed experts changed (a later call overwrote them) since the
   * last {@link markExpertsCommitted}, or `committedTokens` (the prompt ‖
   * response length then) when only new positions were added.
   */
  routedExpertsChangedFrom(committedTokens: number): number {
    return Math.min(this.expertsDirty, committedTokens);
  }

  /** Marks the routed experts as committed (see {@link routedExpertsChangedFrom}). */
  markExpertsCommitted(): void {
    this.expertsDirty = Infinity;
  }

  /** Restores routed experts (`[P + R', layers, top_k]`, R' ≤ R; the rest hold 0) from a checkpoint. */
  restoreRoutedExperts(data: Int32Array, shape: RoutedExpertsShape): void {
    const per = shape[0] * shape[1];
    if (data.length % per !== 0) throw new TrajectoryInvariantError("routed_experts", `checkpointed routed experts hold ${data.length} values, not a multiple of ${shape[0]} × ${shape[1]}`);
    this.expertShape = [shape[0], shape[1]];
    const total = this.promptIds.length + this.len;
    this.experts = null;
    this.ensureExperts(Math.max(total, data.length / per));
    this.experts!.set(data.subarray(0, Math.min(data.length, total * per)));
  }

  /** The state as plain JSON, for checkpoints. */
  snapshot(): BuilderSnapshot {
    return {
      prompt_ids: toPlainArray(this.promptIds),
      response_ids: this.responseIds(),
      response_mask: this.responseMask(),
      response_logprobs: this.responseLogprobs(),
      truncated: this.cut,
      prompt_truncated: this.promptTruncated,
      response_length: this.responseBudget,
      max_model_len: this.maxModelLen,
      ...(this.promptLength !== undefined ? { prompt_length: this.promptLength } : {}),
      ...this.routedExpertsSnapshot(),
    };
  }

  private routedExpertsSnapshot(): Pick<BuilderSnapshot, "routed_experts" | "routed_experts_shape"> {
    const re = this.routedExperts();
    return re ? { routed_experts: encodeInt32(re.data), routed_experts_shape: re.shape } : {};
  }

  /**
   * The finished trajectory, validated (`validateTrajectory`). `truncated` is
   * the builder's; `extra_fields.prompt_truncated` is set when the prompt was cut.
   * @throws TrajectoryInvariantError when an invariant is broken.
   */
  finish(o: {
    numTurns: number;
    rewardScore: number | null;
    metrics: AgentLoopMetrics;
    extraFields: Record<string, unknown>;
    finishReason: FinishReason;
  }): AgentLoopOutput {
    const out: AgentLoopOutput = {
      prompt_ids: toPlainArray(this.promptIds),
      response_ids: this.responseIds(),
      response_mask: this.responseMask(),
      response_logprobs: this.responseLogprobs(),
      reward_score: o.rewardScore,
      num_turns: o.numTurns,
      truncated: this.cut,
      finish_reason: o.finishReason,
      metrics: { ...o.metrics },
      extra_fields: { ...o.extraFields, ...(this.promptTruncated ? { prompt_truncated: true } : {}) },
    };
    const re = this.routedExperts();
    if (re) {
      out.routed_experts = toPlainArray(re.data);
      out.routed_experts_shape = re.shape;
    }
    validateTrajectory(
      { ...out, logprobs: out.response_logprobs },
      { responseLength: this.responseBudget, promptLength: this.promptLength, trackLogProbs: this.trackLogProbs, maxModelLen: this.maxModelLen },
    );
    return out;
  }

  private append(ids: ArrayLike<number>, maskValue: 0 | 1, logprobs: ArrayLike<number> | null): AppendResult {
    // Cut by both budgets: the response budget and the context (prompt ‖ response ≤ max_model_len).
    const take = Math.max(0, Math.min(ids.length, this.remainingBudget, this.maxModelLen - this.contextLength));
    this.ensure(this.len + take);
    for (let i = 0; i < take; i++) {
      const id = ids[i]!;
      if (!Number.isInteger(id) || id < 0 || id > 0x7fffffff) {
        throw new TrajectoryInvariantError("token_ids", `id ${id} is not a token id`, this.len + i);
      }
      this.ids[this.len + i] = id;
      this.mask[this.len + i] = maskValue;
      if (this.lps) this.lps[this.len + i] = maskValue === 1 && logprobs ? logprobs[i]! : 0;
    }
    this.len += take;
    const truncated = take < ids.length;
    if (truncated) this.cut = true;
    return { appended: take, truncated };
  }

  /** Grows the experts array (new positions hold `ROUTED_EXPERTS_FILL`) to hold `tokens` positions. */
  private ensureExperts(tokens: number): void {
    if (!this.expertShape) return;
    const per = this.expertShape[0] * this.expertShape[1];
    const have = this.experts ? this.experts.length / per : 0;
    if (tokens <= have) return;
    const P = this.promptIds.length;
    const cap = Math.max(tokens, Math.min(P + this.responseBudget, Math.max(have * 2, P + Math.min(INITIAL_CAPACITY, this.responseBudget))));
    const next = new Int32Array(cap * per);
    if (this.experts) next.set(this.experts);
    if (ROUTED_EXPERTS_FILL !== 0) next.fill(ROUTED_EXPERTS_FILL, this.experts?.length ?? 0);
    this.experts = next;
  }

  private ensure(capacity: number): void {
    if (capacity <= this.ids.length) return;
    const cap = Math.min(this.responseBudget, Math.max(capacity, this.ids.length * 2));
    const ids = new Int32Array(cap);
    ids.set(this.ids.subarray(0, this.len));
    const mask = new Uint8Array(cap);
    mask.set(this.mask.subarray(0, this.len));
    this.ids = ids;
    this.mask = mask;
    if (this.lps) {
      const lps = new Float32Array(cap);
      lps.set(this.lps.subarray(0, this.len));
      this.lps = lps;
    }
  }
}
