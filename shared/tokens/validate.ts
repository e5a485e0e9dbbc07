import { TrajectoryInvariantError } from "../errors.ts";

/** The arrays and counters of a trajectory that the invariants speak of (an `AgentLoopOutput` or a `TrajectoryRecord`). */
export interface TrajectoryShape {
  prompt_ids: ArrayLike<number>;
  response_ids: ArrayLike<number>;
  response_mask: ArrayLike<number>;
  /** `response_logprobs` (AgentLoopOutput) or `rollout_log_probs` (TrajectoryRecord). */
  logprobs: ArrayLike<number> | null | undefined;
  /** The teacher's log-probs (`rollout.teacher`), when recorded. */
  teacher_log_probs?: ArrayLike<number> | null | undefined;
  num_turns: number;
  metrics: { generate_sequences: number; tool_calls: number; compute_score: number; num_preempted: number };
  /** Flat int32 `[P + R, layers, top_k]` routed experts, when recorded. */
  routed_experts?: ArrayLike<number>;
  /** `[layers, top_k]`, present exactly when `routed_experts` is. */
  routed_experts_shape?: readonly [number, number] | readonly number[];
}

/** Limits the trajectory was built under. */
export interface ValidateOptions {
  /** `rollout.response_length`: the whole response (actions and observations) fits in it. */
  responseLength: number;
  /** `rollout.prompt_length`: the initial prompt fits in it. */
  promptLength?: number;
  /** Whether log-probs were requested; then they must be present and aligned. */
  trackLogProbs: boolean;
  /** The model's context size, when known: prompt ‖ response fits in it. */
  maxModelLen?: number;
}

/**
 * The one validator every trajectory passes through before it leaves the
 * agent loop (DESIGN §2). Checks, in order:
 *
 * - `token_ids`: every id is an integer ≥ 0;
 * - `mask_values`: every mask entry is 0 or 1;
 * - `aligned_lengths` (invariant 2): `len(response_ids) == len(response_mask)`
 *   and `== len(logprobs)` when log-probs are tracked (present otherwise
 *   is also an error: they would be unaligned by construction);
 * - `observation_logprob_zero` (invariant 2): mask-0 tokens have log-prob 0.0;
 * - `sampled_logprob_range`: mask-1 log-probs are finite and ≤ 0;
 * - teacher log-probs, when present: `aligned_lengths` (one per response
 *   token), `observation_logprob_zero` (0.0 under mask 0) and
 *   `teacher_logprob_finite` (a finite value under mask 1);
 * - `response_budget` (invariant 4): `len(response_ids) ≤ response_length`;
 * - `prompt_length` (invariant 5): `len(prompt_ids) ≤ prompt_length`;
 * - `context_length`: `len(prompt_ids) + len(response_ids) ≤ max_model_len`, when given;
 * - `num_preempted` (invariant 6): an integer ≥ −1 (−1 = unknown);
 * - `metrics_nonnegative`: timing metrics are finite seconds ≥ 0;
 * - `num_turns`: an integer ≥ 1 once a prompt exists;
 * - `routed_experts` (when present): `routed_experts_shape` is `[layers ≥ 1,
 *   top_k ≥ 1]` and the array holds exactly `(P + R) · layers · top_k`
 *   integers ≥ −1 (−1: SGLang's placeholder for a layer without routed
 *   experts), aligned with `prompt_ids ‖ response_ids`; both or neither.
 *
 * @throws TrajectoryInvariantError naming the broken invariant and, for
 *   per-token checks, the first index where it breaks.
 */
export function validateTrajectory(t: TrajectoryShape, opts: ValidateOptions): void {
  const n = t.response_ids.length;
  for (let i = 0; i < t.prompt_ids.length; i++) {
    const v = t.prompt_ids[i]!;
    if (!Number.isInteger(v) || v < 0) throw new TrajectoryInvariantError("token_ids", `prompt id ${v} is not an integer >= 0`, i);
  }
  for (let i = 0; i < n; i++) {
    const v = t.response_ids[i]!;
    if (!Number.isInteger(v) || v < 0) throw new TrajectoryInvariantError("token_ids", `response id ${v} is not an integer >= 0`, i);
  }
  for (let i = 0; i < t.response_mask.length; i++) {
    const m = t.response_mask[i];
    if (m !== 0 && m !== 1) throw new TrajectoryInvariantError("mask_values", `response_mask entry ${m} is not 0 or 1`, i);
  }
  if (t.response_mask.length !== n) {
    throw new TrajectoryInvariantError(
      "aligned_lengths",
      `response_mask has ${t.response_mask.length} entries for ${n} response ids`,
      Math.min(n, t.response_mask.length),
    );
  }
  const lp = t.logprobs;
  if (opts.trackLogProbs) {
    if (lp == null) throw new TrajectoryInvariantError("aligned_lengths", "log-probs were requested but are missing");
    if (lp.length !== n) {
      throw new TrajectoryInvariantError("aligned_lengths", `log-probs have ${lp.length} entries for ${n} response ids`, Math.min(n, lp.length));
    }
    for (let i = 0; i < n; i++) {
      const v = lp[i]!;
      if (t.response_mask[i] === 0) {
        if (v !== 0) throw new TrajectoryInvariantError("observation_logprob_zero", `observation token has log-prob ${v}, expected 0.0`, i);
      } else if (!Number.isFinite(v) || v > 0) {
        throw new TrajectoryInvariantError("sampled_logprob_range", `sampled token has log-prob ${v}, expected a finite value <= 0`, i);
      }
    }
  } else if (lp != null) {
    throw new TrajectoryInvariantError("aligned_lengths", "log-probs are present although they were not requested");
  }
  const tlp = t.teacher_log_probs;
  if (tlp != null) {
    if (tlp.length !== n) throw new TrajectoryInvariantError("aligned_lengths", `teacher log-probs have ${tlp.length} entries for ${n} response ids`, Math.min(n, tlp.length));
    for (let i = 0; i < n; i++) {
      const v = tlp[i]!;
      if (t.response_mask[i] === 0) {
        if (v !== 0) throw new TrajectoryInvariantError("observation_logprob_zero", `observation token has teacher log-prob ${v}, expected 0.0`, i);
      } else if (!Number.isFinite(v)) throw new TrajectoryInvariantError("teacher_logprob_finite", `sampled token has teacher log-prob ${v}, expected a finite value`, i);
    }
  }
  if (n > opts.responseLength) {
    throw new TrajectoryInvariantError("response_budget", `response has ${n} tokens, more than response_length ${opts.responseLength}`, opts.responseLength);
  }
  if (opts.promptLength !== undefined && t.prompt_ids.length > opts.promptLength) {
    throw new TrajectoryInvariantError(
      "prompt_length",
      `prompt has ${t.prompt_ids.length} tokens, more than prompt_length ${opts.promptLength}`,
      opts.promptLength,
    );
  }
  if (opts.maxModelLen !== undefined && t.prompt_ids.length + n > opts.maxModelLen) {
    throw new TrajectoryInvariantError(
      "context_length",
      `prompt (${t.prompt_ids.length}) + response (${n}) tokens exceed max_model_len ${opts.maxModelLen}`,
      Math.max(0, opts.maxModelLen - t.prompt_ids.length),
    );
  }
  const pre = t.metrics.num_preempted;
  if (!Number.isInteger(pre) || pre < -1) {
    throw new TrajectoryInvariantError("num_preempted", `num_preempted ${pre} is not an integer >= -1 (-1 = unknown)`);
  }
  for (const k of ["generate_sequences", "tool_calls", "compute_score"] as const) {
    const v = t.metrics[k];
    if (!Number.isFinite(v) || v < 0) throw new TrajectoryInvariantError("metrics_nonnegative", `metrics.${k} is ${v}, expected seconds >= 0`);
  }
  if (!Number.isInteger(t.num_turns) || (t.prompt_ids.length > 0 && t.num_turns < 1)) {
    throw new TrajectoryInvariantError("num_turns", `num_turns ${t.num_turns} is not an integer >= 1`);
  }
  validateRoutedExperts(t);
}

/** The `routed_experts` check of {@link validateTrajectory}. */
function validateRoutedExperts(t: TrajectoryShape): void {
  const re = t.routed_experts;
  const shape = t.routed_experts_shape;
  if (re === undefined && shape === undefined) return;
  if (re === undefined || shape === undefined) {
    throw new TrajectoryInvariantError("routed_experts", `routed_experts and routed_experts_shape go together; only ${re === undefined ? "routed_experts_shape" : "routed_experts"} is present`);
  }
  const [layers, topK] = shape;
  if (shape.length !== 2 || !Number.isInteger(layers) || !Number.isInteger(topK) || layers! < 1 || topK! < 1) {
    throw new TrajectoryInvariantError("routed_experts", `routed_experts_shape ${JSON.stringify(shape)} is not [layers >= 1, top_k >= 1]`);
  }
  const tokens = t.prompt_ids.length + t.response_ids.length;
  const want = tokens * layers! * topK!;
  if (re.length !== want) {
    throw new TrajectoryInvariantError("routed_experts", `routed_experts has ${re.length} values, expected (${t.prompt_ids.length} + ${t.response_ids.length}) tokens × ${layers} × ${topK} = ${want}`);
  }
  for (let i = 0; i < re.length; i++) {
    const v = re[i]!;
    if ((v | 0) !== v || v < -1) throw new TrajectoryInvariantError("routed_experts", `routed_experts[${i}] = ${v} is not an int32 expert id >= -1`, Math.floor(i / (layers! * topK!)));
  }
}
