import { hasMultimodalContent, type AgentLoopOutput, type FinishReason, type SamplingParams } from "../schema/index.ts";
import { visionPrompt } from "./vision-prompt.ts";
import { buildPromptIds } from "../tokens/prompt.ts";
import { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import { isDeadlineAbort } from "./trajectory-deadline.ts";
import { addPreempted, AgentLoop, emptyMetrics, finalTokenVersions, modelVersionOf, recordTurnVersions, type AgentLoopKwargs, type TokenVersions } from "./agent-loop.ts";

/**
 * `single_turn_agent`: the prompt rendered without tools, one generation,
 * response = the sampled ids (mask all ones, the engine's log-probs),
 * `num_turns = 2`. No request is sent when the prompt leaves no room
 * (`max_tokens` would be 0); the trajectory is then empty and truncated.
 * A `finish_reason: "length"` reply ends it truncated. A generation the
 * trajectory's deadline aborted (`rollout.trajectory_deadline_s`; none is sent
 * once it passed) keeps what the engine returned, as any abort, and ends with
 * `extra_fields.terminated_by: "deadline"`, `finish_reason: "abort"`,
 * truncated (the field is absent otherwise: records are unchanged).
 * @see verl `SingleTurnAgentLoop` (`verl/experimental/agent_loop/single_turn_agent_loop.py`)
 */
export class SingleTurnAgentLoop extends AgentLoop {
  async run(samplingParams: SamplingParams, kwargs: AgentLoopKwargs): Promise<AgentLoopOutput> {
    const { config, tokenizer } = this.ctx;
    const key = this.key(kwargs);
    const messages = this.messages(kwargs);
    // A vision-language family renders images (shared/vision); any other refuses them in buildPromptIds.
    const vision = tokenizer.traits.vision && hasMultimodalContent(messages) ? await visionPrompt(tokenizer, messages, { promptLength: config.prompt_length, chatTemplateKwargs: config.chat_template_kwargs, imageTruncation: config.image_truncation }) : undefined;
    const { promptIds, truncated } = vision ?? buildPromptIds(tokenizer, messages, {
      promptLength: config.prompt_length,
      chatTemplateKwargs: config.chat_template_kwargs,
    });
    const builder = new TrajectoryBuilder({
      promptIds,
      responseLength: config.response_length,
      maxModelLen: await this.maxModelLen(),
      trackLogProbs: samplingParams.logprobs,
      promptLength: config.prompt_length,
      promptTruncated: truncated,
    });
    const metrics = emptyMetrics();
    const extra: Record<string, unknown> = { turn_scores: [], tool_rewards: [] };
    let finishReason: FinishReason = "stop";
    let text = "";
    const out = await this.generate(builder, samplingParams, key, metrics, undefined, undefined, undefined, vision?.imageData);
    if (out === undefined || out === "overflow") {
      builder.markTruncated();
      finishReason = "length";
    } else if (out === "aborted") {
      finishReason = "abort";
    } else {
      addPreempted(metrics, out.num_preempted);
      const version = modelVersionOf(out);
      if (version !== null) extra.model_versions = [version];
      const segs: TokenVersions = [];
      recordTurnVersions(segs, 0, out);
      const r = builder.appendAction(out.token_ids, samplingParams.logprobs ? out.log_probs : null);
      builder.applyRoutedExperts(out.routed_experts);
      if (out.finish_reason === "length" || r.truncated) {
        builder.markTruncated();
        finishReason = "length";
      } else if (out.finish_reason === "abort") {
        finishReason = "abort";
      }
      text = tokenizer.decode(out.token_ids, { skipSpecialTokens: true });
      const tv = finalTokenVersions(segs, builder.responseLength);
      if (tv) extra.token_versions = tv;
    }
    if (finishReason === "abort" && isDeadlineAbort(this.ctx.signal)) {
      builder.markTruncated();
      extra.terminated_by = "deadline";
    }
    const reward = await this.reward(kwargs, key, text);
    metrics.compute_score += reward.seconds;
    if (reward.error) extra.reward_error = reward.error;
    const output = builder.finish({ numTurns: 2, rewardScore: reward.score, metrics, extraFields: extra, finishReason });
    if (vision) output.multi_modal = vision.multiModal;
    return output;
  }
}
