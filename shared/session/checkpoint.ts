import { toPlainArray } from "../tokens/plain-array.ts";
import { z } from "zod";
import type { ToolAgentData, ToolAgentLoop, ToolCallOutcome } from "../agent-loop/tool-agent.ts";
import type { AgentLoopKwargs } from "../agent-loop/agent-loop.ts";
import { StoreError } from "../errors.ts";
import { AgentLoopMetrics, AgentLoopOutput, ChatMessage, FinishReason, ModelId, MultiModal, RolloutConfig, RoutedExpertsShape, SamplingParams } from "../schema/index.ts";
import { ToolContentPart } from "../tools/webhook-tool-client.ts";
import { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import type { ParsedCall, ParseError } from "../tools/tool-call-parser.ts";
import { decodeFloat32, decodeFloat64, decodeInt32, decodeUint8, encodeFloat32, encodeFloat64, encodeInt32, encodeUint8 } from "../schema/typed-base64.ts";

/** Version of the checkpoint layout; a stored checkpoint of another version is refused, never guessed at. */
export const CHECKPOINT_VERSION = 3;

/** What a trajectory builder's budgets and flags are (the non-token part of a {@link BuilderDelta}). */
const BuilderLimits = z.object({
  truncated: z.boolean(),
  prompt_truncated: z.boolean(),
  response_length: z.number().int().min(1),
  max_model_len: z.number().int().min(1),
  prompt_length: z.number().int().min(1).optional(),
});

const AwaitedCall = z.object({
  awaiting: z.literal(true),
  call_id: z.string(),
  name: z.string(),
  accepted_ms: z.number(),
  deadline_ms: z.number(),
  timeout_ms: z.number(),
  /** An MCP task's id: the resumed session polls it, never re-sending the call. */
  task_id: z.string().optional(),
});

const ToolResultState = z.object({
  ok: z.boolean(),
  content: z.string(),
  /** A reply with images: its parts (text and data: URI images, in order). */
  parts: z.array(ToolContentPart).optional(),
  reward: z.number().optional(),
  metrics: z.record(z.string(), z.unknown()).optional(),
  call_id: z.string(),
  attempts: z.number().int(),
  pending: z.boolean().optional(),
  timeout_ms: z.number().optional(),
});

const PendingCall = z.union([
  z.object({ index: z.number().int(), name: z.string(), arguments: z.record(z.string(), z.unknown()), raw: z.string() }),
  z.object({ index: z.number().int(), name: z.string().optional(), message: z.string(), raw: z.string() }),
]);

/**
 * `tool_agent`'s small run state, stored whole in every commit
 * ({@link ToolAgentData} without what grows — messages, tokens — and what is
 * rebuilt on resume: tools, encoder, simulated user).
 */
export const ToolAgentFields = z.object({
  assistant_turns: z.number().int().min(0),
  user_turns: z.number().int().min(0),
  pending: z.array(PendingCall),
  tool_results: z.array(z.union([AwaitedCall, ToolResultState]).nullable()).nullable(),
  last_assistant_text: z.string(),
  metrics: AgentLoopMetrics,
  tool_rewards: z.array(z.number()),
  /** `metrics` of tool replies (`extra_fields.tool_metrics`); absent when none came or in checkpoints written before it existed. */
  tool_metrics: z.array(z.object({ turn: z.number().int(), name: z.string(), metrics: z.record(z.string(), z.unknown()) })).optional(),
  turn_scores: z.array(z.number()),
  model_versions: z.array(z.unknown()),
  /** Run-length policy versions over the response (`[[start, version], …]`); absent in checkpoints written before it existed. */
  token_versions: z.array(z.tuple([z.number().int().min(0), z.unknown()])).optional(),
  dropped_tool_calls: z.number().int().min(0),
  tool_calls: z.number().int().min(0),
  tool_errors: z.number().int().min(0),
  finish_reason: FinishReason,
  terminated_by: z.string(),
  error: z.string().nullable(),
  /**
   * Vision-language families, once the trajectory holds an image: the record's
   * `multi_modal` so far and the images as the engine's `image_data` (data
   * URIs, in placeholder order). Absent for text trajectories and in
   * checkpoints written before images existed.
   */
  multi_modal: MultiModal.optional(),
  image_data: z.array(z.string()).optional(),
});
export type ToolAgentFields = z.infer<typeof ToolAgentFields>;

/**
 * Where a session is: `running` (a step is due), `waiting` (tool calls
 * await callbacks; nothing runs), `finished` (outputs computed, record not
 * yet confirmed written), `done` (record written; terminal), `failed` (the
 * trajectory failed; `error` says why; terminal).
 */
export const SessionPhase = z.enum(["running", "waiting", "finished", "done", "failed"]);
export type SessionPhase = z.infer<typeof SessionPhase>;

/** A builder's new tokens since the previous commit: base64 typed arrays (ids int32, mask bytes, log-probs float32 — bit-exact). */
export const BuilderDelta = BuilderLimits.extend({
  /** The prompt ids: present when the builder is new (first commit after the prompt was built). */
  prompt_ids: z.string().optional(),
  /** Response tokens of the previous state kept before `response_ids` is appended (the previous length, normally). */
  from: z.number().int().min(0),
  response_ids: z.string(),
  response_mask: z.string(),
  response_logprobs: z.string().nullable(),
  /**
   * Routed experts of prompt ‖ response from position `routed_experts_from`
   * on (base64 little-endian int32 `[tokens, layers, top_k]`), replacing what
   * the previous state held there — a later engine call re-covers earlier
   * positions (observations get the next call's prefill experts). Absent:
   * unchanged (or never recorded).
   */
  routed_experts: z.string().optional(),
  routed_experts_from: z.number().int().min(0).optional(),
  routed_experts_shape: RoutedExpertsShape.optional(),
});
export type BuilderDelta = z.infer<typeof BuilderDelta>;

/**
 * The append-only image lists of a vision trajectory's state, written as
 * deltas like {@link DELTA_LISTS} (a commit holds only the images added since
 * the previous one, so a session whose tools keep returning images does not
 * write every earlier image again): `image_data` (the engine's data URIs) and
 * `multi_modal_images` (`multi_modal.images`, the record's image entries,
 * with their bytes inline up to 64 KiB). Kept items are found by identity
 * (the loop only appends to both), not by comparing their contents. A
 * delta without these `lists_from` keys (written before them) holds both
 * lists whole.
 */
export const VISION_LISTS = ["image_data", "multi_modal_images"] as const;

/**
 * `tool_agent`'s run state as a delta: the messages and tokens added since
 * the previous commit (`messages_from` / `builder.from` say how much of the
 * previous state is kept), plus the small fields (counters, pending calls,
 * metrics) whole.
 */
export const LoopDelta = ToolAgentFields.extend({
  /**
   * Version 3: how many items of each per-turn list of the previous state are
   * kept ({@link DELTA_LISTS}); the list field then holds only the items
   * after them. Absent (version 2): the list fields are whole.
   */
  lists_from: z.partialRecord(z.enum(["tool_rewards", "tool_metrics", "turn_scores", "model_versions", "token_versions", ...VISION_LISTS]), z.number().int().min(0)).optional(),
  messages_from: z.number().int().min(0),
  messages: z.array(ChatMessage),
  builder: BuilderDelta.nullable(),
});
export type LoopDelta = z.infer<typeof LoopDelta>;

/**
 * The fields of {@link ToolAgentFields} that grow by one item per turn (or per
 * tool reply): a version-3 delta writes only their new items, so a commit's
 * bytes do not grow with the turns before it (issue 32 item 3).
 */
export const DELTA_LISTS = ["tool_rewards", "tool_metrics", "turn_scores", "model_versions", "token_versions"] as const;

/**
 * A finished output as a checkpoint stores it: {@link AgentLoopOutput} with
 * its token arrays as base64 (ids int32, mask bytes, log-probs float32 — or
 * float64, `logprobs_f64`, when a value is not a float32), bit-exact and
 * about a third of the JSON numbers' size.
 */
export const StoredOutput = AgentLoopOutput.extend({
  prompt_ids: z.string(),
  response_ids: z.string(),
  response_mask: z.string(),
  response_logprobs: z.string().nullable(),
  logprobs_f64: z.literal(true).optional(),
  /** Routed experts as base64 little-endian int32 (not a JSON number array). */
  routed_experts: z.string().optional(),
  /** Teacher log-probs (already float32) as base64 Float32; absent without them. */
  teacher_log_probs: z.string().optional(),
});
export type StoredOutput = z.infer<typeof StoredOutput>;

/** An output packed for a checkpoint ({@link StoredOutput}). */
export function packOutput(o: AgentLoopOutput): StoredOutput {
  const { teacher_log_probs: teacher, ...rest } = o;
  const lp = o.response_logprobs;
  const f32 = !lp || lp.every((x) => Math.fround(x) === x);
  return {
    ...rest,
    prompt_ids: encodeInt32(o.prompt_ids),
    response_ids: encodeInt32(o.response_ids),
    response_mask: encodeUint8(o.response_mask),
    response_logprobs: lp ? (f32 ? encodeFloat32(lp) : encodeFloat64(lp)) : null,
    ...(f32 ? {} : { logprobs_f64: true as const }),
    routed_experts: o.routed_experts !== undefined ? encodeInt32(o.routed_experts) : undefined,
    ...(teacher ? { teacher_log_probs: encodeFloat32(teacher) } : {}),
  } as StoredOutput;
}

/** The output a {@link packOutput} result stands for (the same values, bit for bit). */
export function unpackOutput(s: StoredOutput): AgentLoopOutput {
  const { logprobs_f64, teacher_log_probs, ...rest } = s;
  const lp = s.response_logprobs;
  if (rest.routed_experts === undefined) delete rest.routed_experts;
  return {
    ...rest,
    ...(teacher_log_probs === undefined ? {} : { teacher_log_probs: toPlainArray(decodeFloat32(teacher_log_probs)) }),
    prompt_ids: toPlainArray(decodeInt32(s.prompt_ids)),
    response_ids: toPlainArray(decodeInt32(s.response_ids)),
    response_mask: toPlainArray(decodeUint8(s.response_mask)) as (0 | 1)[],
    response_logprobs: lp === null ? null : toPlainArray(logprobs_f64 ? decodeFloat64(lp) : decodeFloat32(lp)),
    ...(s.routed_experts !== undefined ? { routed_experts: toPlainArray(decodeInt32(s.routed_experts)) } : {}),
  } as AgentLoopOutput;
}

/**
 * One committed step of a durable trajectory session, as stored (JSON): the
 * step's head and the run state's delta. Storage keeps every commit's delta
 * in order (append-only); a session is the fold of its deltas
 * ({@link foldCheckpoint}), so a commit costs O(turn), not O(trajectory).
 * `step` grows by one per commit; storage refuses a commit whose step is
 * not newer than the stored one (a stale owner cannot overwrite progress).
 * `loop_state`/`loop` hold the agent loop's state machine (`tool_agent`);
 * loops that cannot resume mid-way run whole (`loop_state: "whole"`).
 * `loop`/`outputs` absent: unchanged since the previous commit; null: dropped.
 */
export const CheckpointDelta = z.object({
  /** 3 (written); 2 is still read: its per-turn lists are whole ({@link LoopDelta.lists_from}). */
  v: z.union([z.literal(2), z.literal(CHECKPOINT_VERSION)]),
  key: z.string().min(1),
  step: z.number().int().min(0),
  phase: SessionPhase,
  agent_name: z.string(),
  loop_state: z.string(),
  loop: LoopDelta.nullable().optional(),
  /** Every output of the session (a loop may return several; packed), set when it finishes; null once done. */
  outputs: z.array(StoredOutput).nullable().optional(),
  error: z.string().nullable(),
  /** Earliest deadline (epoch ms) of the tool calls awaited, or null. */
  deadline_ms: z.number().nullable(),
  /**
   * The trajectory's own deadline (epoch ms of the session's wall clock:
   * `rollout.trajectory_deadline_s` after its first start), written with
   * every commit so a resume keeps it; null: no deadline. Absent in
   * checkpoints written before it existed: such a session's deadline counts
   * from its first resume (and is stored from its next commit on).
   */
  trajectory_deadline_ms: z.number().nullable().optional(),
  /** Wall-clock epoch ms of the commit. */
  updated_ms: z.number(),
});
export type CheckpointDelta = z.infer<typeof CheckpointDelta>;

/**
 * A session's committed head as held in memory: the last commit's fields,
 * the outputs as of that commit, and `loop` — the last commit's loop delta
 * (null when the run state was dropped or never built).
 */
export type SessionCheckpoint = Omit<CheckpointDelta, "loop" | "outputs"> & { loop: LoopDelta | null; outputs: AgentLoopOutput[] | null };

/**
 * What a session is started with (stored once, at creation): the key, the
 * loop to run, the sampling parameters, the loop's kwargs (the row's fields
 * plus `uid`, `session_id`, `global_steps`, `key`), the rollout config and
 * the policy version. A resumed session needs nothing else.
 */
export const SessionInput = z.object({
  key: z.string().min(1),
  agent_name: z.string().min(1),
  sampling_params: SamplingParams,
  kwargs: z.looseObject({ uid: z.string(), session_id: z.number().int() }),
  /** The batch's effective rollout config (per-batch overrides applied), so a session resumes without its batch. */
  rollout: RolloutConfig,
  /** The batch's policy version, stamped on turns whose engine reports none. */
  model_version: z.union([z.string(), z.number()]).nullable().default(null),
  /**
   * The model the batch was submitted with (`modelIdOf` the submitter's
   * tokenizer): a host whose model has another fingerprint fails the
   * session instead of running it. Absent in inputs of older versions.
   */
  model: ModelId.optional(),
});
export type SessionInput = z.infer<typeof SessionInput>;
export type SessionInputArg = z.input<typeof SessionInput>;

/**
 * Parses one stored checkpoint delta (JSON text).
 * @throws StoreError (not retryable): another checkpoint version (naming both), or the field that is invalid.
 */
export function parseDelta(text: string, key: string): CheckpointDelta {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new StoreError(`session '${key}': stored checkpoint is not JSON: ${(e as Error).message}`, { retryable: false });
  }
  const v = (json as { v?: unknown } | null)?.v;
  if (v !== CHECKPOINT_VERSION && v !== 2) {
    throw new StoreError(`session '${key}': stored checkpoint is version ${JSON.stringify(v)}; this edgeloop reads versions 2 and ${CHECKPOINT_VERSION} only (finish or drop sessions before upgrading)`, {
      retryable: false,
      code: "checkpoint_version",
    });
  }
  const r = CheckpointDelta.safeParse(json);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new StoreError(`session '${key}': stored checkpoint is invalid at ${i?.path.join(".") || "(root)"}: ${i?.message}`, { retryable: false });
  }
  return r.data;
}

/** Parses a stored session input. @throws StoreError (not retryable) when it is malformed. */
export function parseSessionInput(json: unknown, key: string): SessionInput {
  const r = SessionInput.safeParse(json);
  if (!r.success) {
    const i = r.error.issues[0];
    throw new StoreError(`session '${key}': stored input is invalid at ${i?.path.join(".") || "(root)"}: ${i?.message}`, { retryable: false });
  }
  return r.data;
}

/** `tool_agent`'s run state as checkpoint JSON, without the parts that grow (messages, builder). */
export function saveToolAgentFields(d: ToolAgentData): ToolAgentFields {
  return {
    assistant_turns: d.assistantTurns,
    user_turns: d.userTurns,
    pending: d.pending,
    tool_results: d.toolResults ?? null,
    last_assistant_text: d.lastAssistantText,
    metrics: { ...d.metrics },
    tool_rewards: d.toolRewards,
    ...(d.toolMetrics?.length ? { tool_metrics: d.toolMetrics } : {}),
    turn_scores: d.turnScores,
    model_versions: d.modelVersions,
    token_versions: d.tokenVersions,
    dropped_tool_calls: d.droppedToolCalls,
    tool_calls: d.toolCalls,
    tool_errors: d.toolErrors,
    finish_reason: d.finishReason,
    terminated_by: d.terminatedBy,
    error: d.error ?? null,
    ...(d.vision ? { multi_modal: d.vision.multiModal, image_data: d.vision.imageData } : {}),
  };
}

/**
 * `tool_agent`'s run state from a checkpoint's small fields (the loop's
 * fresh data for the row, then the stored counters, pending calls and
 * metrics); messages and builder are the caller's.
 */
export function restoreToolAgentFields(loop: ToolAgentLoop, s: ToolAgentFields, input: SessionInput): ToolAgentData {
  const kwargs = input.kwargs as AgentLoopKwargs;
  const d = loop.initData(input.sampling_params, kwargs);
  d.assistantTurns = s.assistant_turns;
  d.userTurns = s.user_turns;
  d.pending = s.pending as Array<ParsedCall | ParseError>;
  d.toolResults = s.tool_results ? (s.tool_results as Array<ToolCallOutcome | null>) : undefined;
  d.lastAssistantText = s.last_assistant_text;
  d.metrics = { ...s.metrics };
  d.toolRewards = s.tool_rewards;
  if (s.tool_metrics?.length) d.toolMetrics = s.tool_metrics;
  d.turnScores = s.turn_scores;
  d.modelVersions = s.model_versions;
  d.tokenVersions = (s.token_versions ?? []) as ToolAgentData["tokenVersions"];
  d.droppedToolCalls = s.dropped_tool_calls;
  d.toolCalls = s.tool_calls;
  d.toolErrors = s.tool_errors;
  d.finishReason = s.finish_reason;
  d.terminatedBy = s.terminated_by as ToolAgentData["terminatedBy"];
  if (s.error !== null) d.error = s.error;
  if (s.multi_modal) d.vision = { multiModal: structuredClone(s.multi_modal), imageData: [...(s.image_data ?? [])] };
  return d;
}
