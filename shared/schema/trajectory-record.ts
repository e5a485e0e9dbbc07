import { z } from "zod";
import { AgentLoopMetrics, FinishReason } from "./agent-loop-output.ts";
import { AgentRoleName } from "./agent-role.ts";
import { RoutedExpertsShape } from "./routed-experts.ts";
import { MultiModal } from "./multi-modal.ts";
import { BlobPointer } from "./blob-pointer.ts";
import { InputError } from "../errors.ts";

/**
 * A prompt-group id: 1–128 characters of `[A-Za-z0-9.-]`. `_` is reserved as
 * the trajectory-key separator and `:` as the Redis key separator (a uid
 * `g:keys` would otherwise name group `g`'s key set); verl's uids are UUIDs.
 */
const UID_PATTERN = /^[A-Za-z0-9.-]+$/;
export const Uid = z
  .string()
  .min(1)
  .max(128)
  .regex(UID_PATTERN, "uid may only hold letters, digits, '.' and '-' ('_' separates key parts, ':' Redis key words)");

/**
 * The model a record's token ids belong to: `name` (the model family or
 * directory, e.g. `qwen3`, `llama3_1`) and `fingerprint`, 16 hex digits of
 * SHA-256 over what decides the ids and their rendering (vocabulary size,
 * added and stop tokens, chat template text; see `modelIdOf`). Two processes
 * with the same fingerprint tokenize and render alike.
 */
export const ModelId = z.strictObject({
  name: z.string().min(1).max(1024),
  fingerprint: z.string().regex(/^[0-9a-f]{16}$/, "fingerprint must be 16 lowercase hex digits"),
});
export type ModelId = z.infer<typeof ModelId>;

/**
 * One finished trajectory as stored in the transfer queue (DESIGN §4.5),
 * ragged (no padding). `rollout_log_probs` is null when log-probs were not
 * requested; `teacher_log_probs` is absent (not null) without a teacher.
 * Readers derive `loss_mask = response_mask`,
 * `input_ids = prompt_ids ‖ response_ids`, `position_ids = 0..len−1`.
 * `error` is set (and the arrays may be empty) when the trajectory failed.
 */
export const TrajectoryRecord = z.object({
  key: z.string(),
  uid: Uid,
  session_id: z.number().int().min(0),
  output_index: z.number().int().min(0),
  agent_name: z.string(),
  data_source: z.string(),
  /**
   * The model whose tokenizer produced `prompt_ids`/`response_ids` (see
   * {@link ModelId}); readers decode with it or say they cannot. Absent in
   * records written before models were recorded (and by embedders that give none).
   */
  model: ModelId.optional(),
  /**
   * The agent role whose calls produced the record (agent gateway: the call's
   * `X-Agent-Role` header, else the row's `agent_role`); absent without a
   * role. Readers deliver per role by it (`agent_role` read option).
   */
  agent_role: AgentRoleName.optional(),
  /**
   * The model that sampled `response_ids`: the serving engine pool's model
   * name (`engine.pools.{pool}.model`, else the pool's name; the default
   * pool: `engine.model`, else the model family). Present with `agent_role`.
   */
  served_model: z.string().min(1).max(1024).optional(),
  prompt_ids: z.array(z.number().int().min(0)),
  response_ids: z.array(z.number().int().min(0)),
  response_mask: z.array(z.union([z.literal(0), z.literal(1)])),
  rollout_log_probs: z.array(z.number()).nullable(),
  /** The teacher's log-prob of each response token (float32, 0.0 under mask 0); absent without a teacher (`rollout.teacher`). */
  teacher_log_probs: z.array(z.number()).optional(),
  reward_score: z.number().nullable(),
  num_turns: z.number().int().min(0),
  truncated: z.boolean(),
  finish_reason: FinishReason,
  error: z.string().nullable(),
  metrics: AgentLoopMetrics,
  extra_fields: z.record(z.string(), z.unknown()),
  /**
   * Routed experts over `prompt_ids ‖ response_ids`: int32 expert ids ≥ −1,
   * row-major `[tokens, layers, top_k]` (stored as base64 packed to uint8 /
   * uint16 / int32 by the record's largest id, the width in field
   * `routed_experts_dtype`, −1 as the all-ones code: `RoutedExpertsDtype` in
   * shared/store/record-codec.ts); absent (not null) unless
   * `rollout.return_routed_experts`.
   */
  routed_experts: z.array(z.number().int()).optional(),
  /** `[layers, top_k]`; present when `routed_experts` or `routed_experts_blob` is (stored as JSON, field `routed_experts_shape`). */
  routed_experts_shape: RoutedExpertsShape.optional(),
  /**
   * Images the model saw (vision-language families): per image its hash,
   * grid and pad-token span in `prompt_ids ‖ response_ids` (see
   * {@link MultiModal}). Absent for text-only trajectories (records unchanged
   * byte for byte). Stored in `meta`.
   */
  multi_modal: MultiModal.optional(),
  /**
   * Where `routed_experts` went when they were larger than the blob
   * threshold (`store.blobs`, docs/queue-layout.md "Blobs"): the blob's key,
   * SHA-256 and byte count plus the width it is packed in. Set only on
   * records written or read *without* the blob layer (a raw view of the
   * stored pointer); the blob layer (`BlobOffloadQueue`) writes it in place of
   * `routed_experts` and reads the bytes back in its place. Never both.
   */
  routed_experts_blob: BlobPointer.optional(),
  /**
   * Trajectory trees (agent gateway sessions): the key of the record this one
   * branched from — a record of the same session, `{uid}_{session_id}_{i}`
   * with a smaller `i` — or null for a root. Absent in records of loops that
   * build no trees and of older versions (read as null). Stored in `meta`.
   */
  parent_key: z.string().nullable().optional(),
  /**
   * Token index into the parent's `prompt_ids ‖ response_ids` where this
   * record branches off: its own `prompt_ids ‖ response_ids` before it are
   * the parent's, token for token (a trainer that counts each sampled token
   * once trains this record from `branch_at` on). Null exactly when
   * `parent_key` is; absent with it. Stored in `meta`.
   */
  branch_at: z.number().int().min(0).nullable().optional(),
  /**
   * Present only in a record read with `deliver: "tree"` that is a tree node
   * (never stored): the whole trajectory's `prompt_ids` length, its arrays
   * holding only the tokens from `branch_at` on (see `treeNode` in
   * shared/store/tree-delivery.ts; `resolveTree` gives the whole record back).
   */
  tree_prompt_length: z.number().int().min(0).optional(),
});
export type TrajectoryRecord = z.infer<typeof TrajectoryRecord>;

/** The trajectory key `{uid}_{session_id}_{output_index}`. Throws {@link InputError} for a bad uid. */
export function trajectoryKey(uid: string, sessionId: number, outputIndex = 0): string {
  // The common case checked by hand (the same three rules as Uid); anything else goes to zod for its message.
  const plain = typeof uid === "string" && uid.length >= 1 && uid.length <= 128 && UID_PATTERN.test(uid);
  const r = plain ? null : Uid.safeParse(uid);
  if (r && !r.success) throw new InputError("uid", r.error.issues[0]?.message ?? "invalid uid");
  if (!Number.isInteger(sessionId) || sessionId < 0) throw new InputError("session_id", "must be an integer >= 0");
  if (!Number.isInteger(outputIndex) || outputIndex < 0) throw new InputError("output_index", "must be an integer >= 0");
  return `${uid}_${sessionId}_${outputIndex}`;
}

/** Splits a trajectory key into its parts. Throws {@link InputError} when it is not `{uid}_{int}_{int}`. */
export function parseTrajectoryKey(key: string): { uid: string; session_id: number; output_index: number } {
  const m = /^([A-Za-z0-9.-]{1,128})_(\d+)_(\d+)$/.exec(key);
  if (!m) throw new InputError("key", `'${key.slice(0, 200)}' is not a trajectory key {uid}_{session_id}_{output_index}`);
  return { uid: m[1]!, session_id: Number(m[2]), output_index: Number(m[3]) };
}
