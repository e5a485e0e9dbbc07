import { z } from "zod";
import { PolicyVersionValue } from "./policy-version.ts";
import { formatPath, InputError, inputErrorFromZod } from "../errors.ts";
import { DatasetRow, RolloutConfig as RolloutConfigSchema, Uid, parseTrajectoryKey, trajectoryKey, type AgentLoopOutput, type ModelId, type RolloutConfig, type TrajectoryRecord } from "../schema/index.ts";
import { validateTrajectory } from "../tokens/validate.ts";
import { contentText } from "../tokens/tokenizer.ts";
import { failedRecord as storeFailedRecord } from "../store/record-codec.ts";

/**
 * Body of `POST /v1/rollouts` (and what the CLI builds from a data file).
 * `rows` are validated one by one later, so one bad row fails only its own
 * trajectories. `config` is a partial `AppConfig` (usually `{rollout: {...}}`)
 * merged over the server's. `validate: true` uses `rollout.val_kwargs` and
 * the `val` queue partition (as verl's validation batches).
 */
export const RolloutRequest = z.strictObject({
  rows: z.array(z.unknown()).min(1, "rows must hold at least one row").max(100_000, "rows may hold at most 100000 rows"),
  config: z.record(z.string(), z.unknown()).optional(),
  global_steps: z.number().int().min(-1).default(-1),
  model_version: PolicyVersionValue.nullable().default(null),
  validate: z.boolean().default(false),
  /**
   * Over-sampling: deliver this many complete groups out of the batch's rows
   * and stop the rest (`rollout.partial_rollout`). Default: `ceil(rows /
   * rollout.oversample)` when `oversample` is set, else every row.
   */
  target_groups: z.number().int().min(1, "target_groups must be >= 1").optional(),
});
export type RolloutRequest = z.infer<typeof RolloutRequest>;

/** The sections of `AppConfig` a batch's `config` may name, as written in a config file (for the hint of {@link parseRolloutRequest}). */
const CONFIG_SECTIONS = new Set(["rollout", "engine", "tools", "store", "reward", "gateway", "agent", "openenv", "limits"]);

/**
 * Parses a `POST /v1/rollouts` body (or the CLI's equivalent) with
 * {@link RolloutRequest}.
 * @param field the name of the input in errors: `""` for a body (`rows`, `config`…), `--data` for the CLI.
 * @throws InputError 400 naming the first failing field; a top-level key that
 *   is a rollout setting (`n`, `response_length`, …) or a config section
 *   (`engine`, …) says where it belongs (`config.rollout.n`), since a batch
 *   body holds those only under `config`.
 */
export function parseRolloutRequest(body: unknown, field = ""): RolloutRequest {
  const r = RolloutRequest.safeParse(body);
  if (r.success) return r.data;
  const first = r.error.issues[0];
  if (first?.code === "unrecognized_keys" && first.path.length === 0 && first.keys.length) {
    const key = first.keys[0]!;
    const place = Object.hasOwn(RolloutConfigSchema.shape, key) ? `config.rollout.${key}` : CONFIG_SECTIONS.has(key) ? `config.${key}` : null;
    if (place) {
      const parts = place.split(".").slice(1);
      const nested = parts.map((k) => `{"${k}": `).join("") + "…" + "}".repeat(parts.length);
      throw new InputError(formatPath(field, [key]), `not a field of the batch body; it belongs under config as ${place}: {"config": ${nested}} (the body's fields are ${Object.keys(RolloutRequest.shape).join(", ")})`);
    }
  }
  throw inputErrorFromZod(field, r.error.issues);
}

/** One trajectory to run: the key parts, the row it comes from, and verl's trajectory info. */
export interface PlannedTrajectory {
  key: string;
  uid: string;
  session_id: number;
  row_index: number;
  /** The parsed row, or null when the row was invalid (then `row_error` says why). */
  row: DatasetRow | null;
  row_error: string | null;
  /** Sessions in this trajectory's group (`rollout.n`, `val_kwargs.n` or the row's `__rollout_n__`). */
  group_size: number;
  /** verl's `trajectory_info`: `{step, sample_index, rollout_n, validate}`. */
  trajectory_info: { step: number; sample_index: number; rollout_n: number; validate: boolean };
}

/** A planned batch: one uid per row, `group_size` sessions per uid. */
export interface BatchPlan {
  batch_id: string;
  validate: boolean;
  global_steps: number;
  model_version: string | number | null;
  trajectories: PlannedTrajectory[];
  /** uid → group size, for `TransferQueue.expectGroup`. */
  groups: Map<string, number>;
  /** uid → the prompt group's fingerprint (`groupFingerprint`), registered with the group; absent for invalid rows and when not computed. */
  fingerprints?: Map<string, string>;
  /** Over-sampling and dynamic sampling of the batch (see {@link OversamplePlan}); null for a plain batch. */
  oversample?: OversamplePlan | null;
}

/**
 * How an over-sampled or filtered batch runs. Of the batch's R rows (one
 * group each), the first `eager_rows` start at once; the rest are the
 * reserve, started one row per group that dynamic sampling filters out.
 * Once `target_groups` groups are delivered (complete, not filtered) the
 * rest of the batch is stopped per `partial_rollout`.
 * - `target_groups` = the request's `target_groups` (it wins over
 *   `rollout.oversample`; `target_from` says which applied), else `ceil(R /
 *   rollout.oversample)`, else (only `filter_groups` set) R;
 * - `eager_rows` = `target_groups` with `filter_groups` (the rows beyond the
 *   target are the reserve, as DAPO draws more prompts when filtering left
 *   too few), else R (every row starts; the stragglers are stopped).
 */
export interface OversamplePlan {
  target_groups: number;
  eager_rows: number;
  partial_rollout: "cancel" | "carry";
  filter: { metric: "reward"; drop_if: "all_equal" } | null;
  /**
   * Where `target_groups` came from: the request's `target_groups` (which wins
   * when `rollout.oversample` is also set), `rollout.oversample`, or
   * `filter_groups` alone (every row). Absent in plans stored by older versions.
   */
  target_from?: "target_groups" | "rollout.oversample" | "filter_groups";
}

/** A fresh id that cannot be guessed from outside and holds no `_` (safe as a uid). */
export function newId(): string {
  return crypto.randomUUID();
}

/**
 * The characters (UTF-16 code units) of text a prompt's messages hold: every
 * message's text content, reasoning and tool-call arguments; the bound
 * `limits.max_prompt_chars` applies to it before anything is rendered or
 * tokenized (issue 26, S18).
 *
 * Why characters: they are known in one pass, and rendering plus tokenizing
 * costs time linear in them (about 0.5 µs per character for Qwen3 here, up to
 * 5 µs inside one unbroken word). No character count can stand for a token
 * count in both directions: a byte-level BPE token spells 1 to
 * `maxTokenChars()` bytes (128 for Qwen3) and a UTF-16 unit is 1 to 3 UTF-8
 * bytes, so a text of c units holds between c / maxTokenChars and 3c tokens
 * (chars ≥ tokens does not hold for CJK text). A token limit is therefore
 * enforced by tokenizing (left truncation to `rollout.prompt_length`, only the
 * tail of a longer text; `buildPromptIds`), and once per row: the n sessions
 * of a row reuse its ids.
 */
export function promptChars(messages: DatasetRow["prompt"]): number {
  let chars = 0;
  for (const m of messages) {
    chars += contentText(m.content).length;
    if (typeof m.reasoning_content === "string") chars += m.reasoning_content.length;
    for (const c of m.tool_calls ?? []) chars += c.function.name.length + (typeof c.function.arguments === "string" ? c.function.arguments.length : JSON.stringify(c.function.arguments).length);
  }
  return chars;
}

/**
 * Expands a request into trajectories: for row `i`, its `uid` (the row's own
 * `uid` field when it has one, as trainers that assign uids per prompt do;
 * otherwise — absent or null — a server-chosen random one) and `n` sessions with keys
 * `{uid}_{s}_0`. A row whose `uid` is malformed or repeats an earlier row's
 * fails on its own (a malformed one under a server-chosen uid, its error
 * naming the refused value). An invalid row still gets its
 * keys (with `row_error` naming the field, e.g. `rows[3].prompt`), so that
 * it fails on its own and its group completes, flagged.
 * @throws InputError (`rows`) over `maxTrajectories`; (`rows[i].prompt`) when a
 *   row's {@link promptChars} are over `maxPromptChars` (`limits.max_prompt_chars`).
 */
export function planBatch(req: RolloutRequest, rollout: RolloutConfig, maxTrajectories = 100_000, maxPromptChars = Number.POSITIVE_INFINITY): BatchPlan {
  const trajectories: PlannedTrajectory[] = [];
  const groups = new Map<string, number>();
  const defaultN = req.validate ? rollout.val_kwargs.n : rollout.n;
  let total = 0;
  for (const raw of req.rows) {
    const n = (raw as { __rollout_n__?: unknown } | null)?.__rollout_n__;
    total += typeof n === "number" && Number.isInteger(n) && n >= 1 ? n : defaultN;
  }
  if (total > maxTrajectories) {
    throw new InputError(
      "rows",
      `${req.rows.length} rows x n make ${total} trajectories; a batch may hold at most ${maxTrajectories} (config max_batch_trajectories): split the batch or lower n`,
    );
  }
  req.rows.forEach((raw, i) => {
    const parsed = DatasetRow.safeParse(withRawPrompt(raw));
    let row: DatasetRow | null = null;
    let rowError: string | null = null;
    if (parsed.success) row = parsed.data;
    else {
      const issue = parsed.error.issues[0]!;
      rowError = `${formatPath(`rows[${i}]`, issue.path)}: ${issue.message}`;
    }
    if (row) {
      const chars = promptChars(row.prompt);
      if (chars > maxPromptChars) {
        throw new InputError(`rows[${i}].prompt`, `holds ${chars} characters of text; a row's prompt may hold at most ${maxPromptChars} (limits.max_prompt_chars)`);
      }
    }
    const n = row?.__rollout_n__ ?? defaultN;
    let uid = newId();
    const given = (raw as { uid?: unknown } | null)?.uid;
    // A null uid (a Parquet column with gaps) is no uid: the server picks one, as for a null agent_name.
    if (row && given !== undefined && given !== null) {
      const u = Uid.safeParse(given);
      // The refused value is named (JSON, at most 80 characters): the failed record is keyed by a server-chosen uid,
      // so its error is where a trainer finds which of its uids it was.
      if (!u.success) rowError = `rows[${i}].uid: ${JSON.stringify(given).slice(0, 80)} refused: ${u.error.issues[0]!.message}; this row's record is keyed by a server-chosen uid`;
      else if (groups.has(u.data)) rowError = `rows[${i}].uid: '${u.data}' repeats the uid of an earlier row`;
      else uid = u.data;
    }
    groups.set(uid, n);
    const sampleIndex = row?.extra_info?.index ?? i;
    for (let s = 0; s < n; s++) {
      trajectories.push({
        key: trajectoryKey(uid, s, 0),
        uid,
        session_id: s,
        row_index: i,
        row,
        row_error: rowError,
        group_size: n,
        trajectory_info: { step: req.global_steps, sample_index: sampleIndex, rollout_n: s, validate: req.validate },
      });
    }
  });
  return { batch_id: newId(), validate: req.validate, global_steps: req.global_steps, model_version: req.model_version, trajectories, groups, oversample: oversamplePlan(req, rollout) };
}

/**
 * The {@link OversamplePlan} of a request, or null when it asks for neither
 * over-sampling nor filtering.
 * @throws InputError (`target_groups`) when it names more groups than the batch has rows.
 */
export function oversamplePlan(req: RolloutRequest, rollout: RolloutConfig): OversamplePlan | null {
  const rows = req.rows.length;
  if (req.target_groups !== undefined && req.target_groups > rows) {
    throw new InputError("target_groups", `target_groups ${req.target_groups} is more than the batch's ${rows} rows (one group per row)`);
  }
  const filter = rollout.filter_groups;
  const from: OversamplePlan["target_from"] | null =
    req.target_groups !== undefined ? "target_groups" : rollout.oversample != null ? "rollout.oversample" : filter ? "filter_groups" : null;
  if (from === null) return null;
  const target = from === "target_groups" ? req.target_groups! : from === "rollout.oversample" ? Math.ceil(rows / rollout.oversample!) : rows;
  return { target_groups: target, eager_rows: filter ? target : rows, partial_rollout: rollout.partial_rollout, filter, target_from: from };
}

/**
 * The queue record of a finished trajectory. Runs `validateTrajectory` on the
 * loop's output first — the one validator every output passes through, also
 * for custom loops that did not use the TrajectoryBuilder. `model` (the
 * tokenizer that produced the ids) is recorded as the record's `model`.
 * @throws TrajectoryInvariantError when the output breaks an invariant.
 */
export function toTrajectoryRecord(
  t: PlannedTrajectory,
  agentName: string,
  out: AgentLoopOutput,
  rollout: RolloutConfig,
  outputIndex = 0,
  model?: ModelId,
): TrajectoryRecord {
  validateTrajectory(
    { ...out, logprobs: out.response_logprobs },
    {
      responseLength: rollout.response_length,
      promptLength: rollout.prompt_length,
      trackLogProbs: rollout.calculate_log_probs,
      ...(rollout.max_model_len != null ? { maxModelLen: rollout.max_model_len } : {}),
    },
  );
  return {
    key: trajectoryKey(t.uid, t.session_id, outputIndex),
    uid: t.uid,
    session_id: t.session_id,
    output_index: outputIndex,
    agent_name: agentName,
    data_source: t.row?.data_source ?? "unknown",
    ...(model ? { model } : {}),
    ...(out.agent_role !== undefined ? { agent_role: out.agent_role } : {}),
    ...(out.served_model !== undefined ? { served_model: out.served_model } : {}),
    prompt_ids: out.prompt_ids,
    response_ids: out.response_ids,
    response_mask: out.response_mask,
    rollout_log_probs: out.response_logprobs,
    ...(out.teacher_log_probs ? { teacher_log_probs: out.teacher_log_probs } : {}),
    reward_score: out.reward_score,
    num_turns: out.num_turns,
    truncated: out.truncated,
    finish_reason: out.finish_reason,
    error: null,
    metrics: out.metrics,
    // ground_truth before trajectory_info: a record rebuilt from a stored one (outputOfRecord) keeps its key order, byte for byte.
    extra_fields: { ...out.extra_fields, ...groundTruthField(t.row), trajectory_info: t.trajectory_info },
    ...routedExpertsFields(out),
    ...(out.multi_modal ? { multi_modal: out.multi_modal } : {}),
    ...treeFields(t, out, outputIndex),
  };
}

/**
 * `parent_key` and `branch_at` of a loop output that names its place in a
 * trajectory tree (`parent_output_index`, `branch_at`), as an object to
 * spread: empty when the output names none (the record keeps neither key).
 * @throws InputError (field `parent_output_index` / `branch_at`) for a parent that is not an earlier
 *   output of the session, or a `branch_at` given without it (or the reverse).
 */
export function treeFields(t: { uid: string; session_id: number }, out: Pick<AgentLoopOutput, "parent_output_index" | "branch_at">, outputIndex: number): Pick<TrajectoryRecord, "parent_key" | "branch_at"> {
  if (out.parent_output_index === undefined && out.branch_at === undefined) return {};
  const parent = out.parent_output_index ?? null;
  const at = out.branch_at ?? null;
  if ((parent === null) !== (at === null)) throw new InputError(parent === null ? "parent_output_index" : "branch_at", "parent_output_index and branch_at are set together (a branch) or both null (a root)");
  if (parent !== null && parent >= outputIndex) throw new InputError("parent_output_index", `output ${outputIndex} can only branch from an earlier output of its session, got ${parent}`);
  return { parent_key: parent === null ? null : trajectoryKey(t.uid, t.session_id, parent), branch_at: at };
}

/** The longest ground truth a record copies, in characters of its JSON text: a larger one (test cases, documents) stays in the dataset row only. */
export const MAX_RECORDED_GROUND_TRUTH_CHARS = 2048;

/**
 * `{ground_truth}` to spread into a record's `extra_fields`: the row's
 * `reward_model.ground_truth` (any JSON value), what the reward compared the
 * answer with, so that a reward read beside the record (the viewer, `inspect`)
 * can be explained; empty when the row has none (absent, null) or its JSON text
 * is longer than {@link MAX_RECORDED_GROUND_TRUTH_CHARS}.
 */
export function groundTruthField(row: { reward_model?: { style?: string; ground_truth?: unknown } | null } | null | undefined): { ground_truth?: unknown } {
  const gt = row?.reward_model?.ground_truth;
  if (gt === undefined || gt === null) return {};
  const text = JSON.stringify(gt);
  return text !== undefined && text.length <= MAX_RECORDED_GROUND_TRUTH_CHARS ? { ground_truth: gt } : {};
}

/**
 * The record of a trajectory that failed before or during its loop: empty
 * arrays, `error` set, `finish_reason: "error"` — the same record the
 * transfer queue's `markFailed` stores for it; `model` as in {@link toTrajectoryRecord}.
 */
export function failedRecord(t: PlannedTrajectory, agentName: string, error: string, model?: ModelId): TrajectoryRecord {
  return storeFailedRecord(t.key, error, {
    agent_name: agentName,
    data_source: t.row?.data_source ?? "unknown",
    ...(model ? { model } : {}),
    extra_fields: { trajectory_info: t.trajectory_info },
  });
}

/** `routed_experts` and `routed_experts_shape` of an output or record, as an object to spread: empty when absent (so the record keeps neither key). */
export function routedExpertsFields(o: { routed_experts?: number[]; routed_experts_shape?: [number, number] }): { routed_experts?: number[]; routed_experts_shape?: [number, number] } {
  return o.routed_experts !== undefined && o.routed_experts_shape !== undefined ? { routed_experts: o.routed_experts, routed_experts_shape: o.routed_experts_shape } : {};
}

/**
 * A row that carries its messages only as verl's `raw_prompt` (what verl's
 * `RLHFDataset` stores with `return_raw_chat: true`), with `prompt` absent,
 * is read with `prompt = raw_prompt`; the row is otherwise unchanged (the
 * stored row keeps both as given). A row with a `prompt` is never touched.
 */
export function withRawPrompt(raw: unknown): unknown {
  if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return raw;
  const r = raw as Record<string, unknown>;
  return r.prompt === undefined && r.raw_prompt !== undefined ? { ...r, prompt: r.raw_prompt } : raw;
}

/** The loop output a stored record was made from (`trajectory_info` removed; the batch adds it back). */
export function outputOfRecord(r: TrajectoryRecord): AgentLoopOutput {
  const { trajectory_info: _info, ...extra } = r.extra_fields as Record<string, unknown>;
  return {
    prompt_ids: r.prompt_ids,
    response_ids: r.response_ids,
    response_mask: r.response_mask,
    response_logprobs: r.rollout_log_probs,
    ...(r.teacher_log_probs ? { teacher_log_probs: r.teacher_log_probs } : {}),
    reward_score: r.reward_score,
    num_turns: r.num_turns,
    truncated: r.truncated,
    finish_reason: r.finish_reason,
    metrics: r.metrics,
    extra_fields: extra,
    ...routedExpertsFields(r),
    ...(r.multi_modal ? { multi_modal: r.multi_modal } : {}),
    ...(r.agent_role !== undefined ? { agent_role: r.agent_role } : {}),
    ...(r.served_model !== undefined ? { served_model: r.served_model } : {}),
    ...(r.parent_key !== undefined || r.branch_at !== undefined ? { parent_output_index: r.parent_key == null ? null : parseTrajectoryKey(r.parent_key).output_index, branch_at: r.branch_at ?? null } : {}),
  };
}
