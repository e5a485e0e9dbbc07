import { extractFinalAnswer, parseAnswerNumber } from "./final-answer.ts";

/**
 * The `rule` reward: 1.0 when the final answer of the last assistant turn
 * ({@link extractFinalAnswer}) equals `ground_truth`, else 0.0. Both sides are
 * compared as numbers (commas, `$`, negatives, decimals understood; equal
 * within 1e-9 relative); a ground truth that is not a number is compared as
 * trimmed text with the extracted answer.
 */
export function ruleReward(lastAssistantText: string, groundTruth: unknown): number {
  const answer = extractFinalAnswer(lastAssistantText);
  if (answer === null || groundTruth === undefined || groundTruth === null) return 0.0;
  const a = parseAnswerNumber(answer);
  const g = typeof groundTruth === "number" ? groundTruth : parseAnswerNumber(String(groundTruth));
  if (a !== null && g !== null) return Math.abs(a - g) <= 1e-9 * Math.max(1, Math.abs(g)) ? 1.0 : 0.0;
  return answer.trim() === String(groundTruth).trim() ? 1.0 : 0.0;
}
