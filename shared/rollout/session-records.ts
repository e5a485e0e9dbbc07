import type { PlannedTrajectory } from "./batch.ts";
import { toTrajectoryRecord } from "./batch.ts";
import type { AgentLoopOutput, ModelId, TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import type { SessionInput } from "../session/checkpoint.ts";

/**
 * The transfer-queue records of a finished session's outputs, for hosts
 * where the session writes its own records (Durable Objects, the Deno and
 * worker entries): the same records a batch would write. `trajectory_info`
 * comes from `input.kwargs.trajectory_info` when the planner put it there,
 * `extra_fields.ground_truth` from `input.kwargs.reward_model` as a batch does;
 * `model` (the host's tokenizer) is recorded as each record's `model`.
 */
export function sessionRecords(input: SessionInput, outputs: AgentLoopOutput[], model?: ModelId): TrajectoryRecord[] {
  const k = input.kwargs as Record<string, unknown>;
  const info = (k.trajectory_info ?? { step: k.global_steps ?? -1, sample_index: 0, rollout_n: input.kwargs.session_id, validate: false }) as PlannedTrajectory["trajectory_info"];
  const t: PlannedTrajectory = {
    key: input.key,
    uid: input.kwargs.uid,
    session_id: input.kwargs.session_id,
    row_index: 0,
    // The row fields a record copies: data_source, and reward_model for extra_fields.ground_truth.
    row: { data_source: typeof k.data_source === "string" ? k.data_source : "unknown", reward_model: k.reward_model } as PlannedTrajectory["row"],
    row_error: null,
    group_size: 1,
    trajectory_info: info,
  };
  return outputs.map((o, i) => toTrajectoryRecord(t, input.agent_name, o, input.rollout, i, model));
}

/**
 * A `writeOutputs` for {@link SessionDeps} that puts every output's record
 * into `queue` (idempotent per key): outputs `0..k-1` are written with
 * `last: false` and the last one finishes the session; a session without
 * output is finished with `finishSession(…, 0)`. A rerun after a crash
 * between writes re-sends them all; the stored ones are skipped by put-once.
 * `model`: as {@link sessionRecords}.
 */
export function queueWriter(queue: TransferQueue, model?: ModelId): (input: SessionInput, outputs: AgentLoopOutput[]) => Promise<void> {
  return async (input, outputs) => {
    const records = sessionRecords(input, outputs, model);
    if (records.length === 0) {
      await queue.finishSession(input.kwargs.uid, input.kwargs.session_id, 0);
      return;
    }
    for (let i = 0; i < records.length; i++) await queue.put(records[i]!, { last: i === records.length - 1 });
  };
}
