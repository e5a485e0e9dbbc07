import { SpanStatusCode } from "@opentelemetry/api";
import type { RewardResult } from "./compute-reward.ts";
import { SpanAttr, withSpan } from "../telemetry/tracer.ts";
import { sessionWaits } from "../telemetry/waits.ts";

/**
 * Runs a reward computation inside a `reward.compute` span (child of the
 * active `agent_loop.run`): the trajectory key, the score, and ERROR status
 * when the result carries an `error` (a failed reward webhook). Counted as a
 * `reward` wait ({@link sessionWaits}) while it runs.
 */
export function traceReward(key: string, compute: () => Promise<RewardResult>): Promise<RewardResult> {
  return withSpan("reward.compute", { [SpanAttr.key]: key }, async (span) => {
    const end = sessionWaits.begin({ kind: "reward" });
    const r = await compute().finally(end);
    if (span.isRecording()) {
      if (r.score !== null) span.setAttribute(SpanAttr.reward, r.score);
      if (r.error) span.setStatus({ code: SpanStatusCode.ERROR, message: r.error.slice(0, 500) });
    }
    return r;
  });
}
