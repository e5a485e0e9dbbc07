import type { WebhookOptions } from "../tools/webhook-post.ts";
import { ruleReward } from "./rule-reward.ts";
import { webhookReward, type RewardWebhookSpec } from "./webhook-reward.ts";

/** Reward settings a loop is built with. */
export interface RewardOptions extends WebhookOptions {
  /** Where `style: "webhook"` rows are scored. Taken from configuration, never from the row (rows must not choose URLs). */
  webhook?: RewardWebhookSpec;
  /** HMAC secret for the reward webhook. */
  secret?: string;
  /** Monotonic milliseconds; defaults to `performance.now()`. */
  nowMs?: () => number;
}

/** What to score: the row's `reward_model`, `data_source`, the trajectory key, and the last assistant turn's decoded text. */
export interface RewardInput {
  key: string;
  data_source: string;
  reward_model?: { style?: string; ground_truth?: unknown } | null;
  /** Decoded text of the last assistant turn (special tokens skipped). */
  final_answer: string;
}

/** A reward and the time it took (seconds, for `metrics.compute_score`); `error` when it could not be computed (webhook failed, no ground truth). */
export interface RewardResult {
  score: number | null;
  seconds: number;
  error?: string;
}

/**
 * Scores one trajectory (issue 4 §8): `style: "rule"` → {@link ruleReward}
 * (1.0/0.0), or `score: null` with `error` when the row has no
 * `reward_model.ground_truth` (null or absent: nothing to compare with; the
 * loops record it as `extra_fields.reward_error`); `style: "webhook"` → {@link webhookReward}; no `reward_model`,
 * or `style: "model"` (verl's reward-model style, scored later by the trainer) → null; any other style → null
 * with `error` naming it (a misspelled style is not silently unscored). A
 * failing webhook gives `score: null` with `error`, never an exception, so the
 * trajectory is still written.
 */
export async function computeReward(input: RewardInput, opts: RewardOptions = {}): Promise<RewardResult> {
  const now = opts.nowMs ?? (() => performance.now());
  const t0 = now();
  const seconds = () => Math.max(0, (now() - t0) / 1000);
  const style = input.reward_model?.style ?? "rule";
  if (!input.reward_model) return { score: null, seconds: 0 };
  if (style === "rule") {
    // Nothing to compare with: an unscored trajectory, said as such, not a silent 0.0 the trainer would learn from.
    if (input.reward_model.ground_truth === undefined || input.reward_model.ground_truth === null) {
      return { score: null, seconds: seconds(), error: "reward_model.ground_truth is missing: the rule reward compares the final answer with it" };
    }
    const score = ruleReward(input.final_answer, input.reward_model.ground_truth);
    return { score, seconds: seconds() };
  }
  if (style === "webhook") {
    if (!opts.webhook) return { score: null, seconds: seconds(), error: "reward_model.style is 'webhook' but no reward webhook is configured" };
    try {
      const score = await webhookReward(
        opts.webhook,
        { key: input.key, data_source: input.data_source, final_answer: input.final_answer, ground_truth: input.reward_model.ground_truth ?? null },
        opts,
      );
      return { score, seconds: seconds() };
    } catch (e) {
      return { score: null, seconds: seconds(), error: (e as Error).message };
    }
  }
  // `model` (verl's reward-model style) is the trainer's to score; any other style is one edgeloop does not know.
  if (style === "model") return { score: null, seconds: 0 };
  return { score: null, seconds: 0, error: `reward_model.style '${String(style).slice(0, 50)}' is not one edgeloop scores (rule, webhook) or leaves to the trainer (model)` };
}
