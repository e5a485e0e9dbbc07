import type { ToolAgentData, ToolAgentLoop } from "../agent-loop/tool-agent.ts";
import { StoreError } from "../errors.ts";
import { ROUTED_EXPERTS_FILL, type ChatMessage } from "../schema/index.ts";
import { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import { DELTA_LISTS, VISION_LISTS, parseDelta, restoreToolAgentFields, unpackOutput, saveToolAgentFields, type BuilderDelta, type LoopDelta, type SessionCheckpoint, type SessionInput, type ToolAgentFields } from "./checkpoint.ts";
import { decodeFloat32, decodeInt32, decodeUint8, encodeFloat32, encodeInt32, encodeUint8 } from "../schema/typed-base64.ts";

type DeltaList = (typeof DELTA_LISTS)[number];

/** A per-turn list of `f` as an array (`tool_metrics`/`token_versions` may be absent: none). */
function listOf(f: ToolAgentFields, name: DeltaList): readonly unknown[] {
  return (f[name] as readonly unknown[] | undefined) ?? [];
}

/** A list item as committed: a primitive itself, an object as its JSON (so a later in-place change is seen). */
function committedItem(x: unknown): unknown {
  return x !== null && typeof x === "object" ? JSON.stringify(x) : x;
}

/** How many leading items of `now` are the committed ones themselves (same references). */
function keptRefs(committed: readonly unknown[], now: readonly unknown[]): number {
  let k = 0;
  const m = Math.min(committed.length, now.length);
  while (k < m && committed[k] === now[k]) k++;
  return k;
}

/** How many leading items of `now` equal the committed ones ({@link committedItem} form). */
function keptItems(committed: readonly unknown[], now: readonly unknown[]): number {
  let k = 0;
  const m = Math.min(committed.length, now.length);
  while (k < m && committed[k] === committedItem(now[k])) k++;
  return k;
}

/**
 * What the last commit held of `tool_agent`'s growing state, so the next
 * commit writes only what was added: the message objects (by identity —
 * the loop only appends messages), the builder with its response length
 * (the builder only appends tokens), and the per-turn lists
 * ({@link DELTA_LISTS}, kept as far as their items are equal to the
 * committed ones).
 */
export class DeltaTracker {
  private messages: readonly ChatMessage[] = [];
  private builder: TrajectoryBuilder | null = null;
  private tokens = 0;
  private lists: Record<DeltaList, unknown[]> = emptyLists();
  /** The vision lists as last committed (item references: both lists are append-only). */
  private images: readonly unknown[] = [];
  private imageData: readonly string[] = [];

  /** The loop delta of `d` against the last {@link accept}ed state. */
  delta(d: ToolAgentData): LoopDelta {
    let keep = 0;
    const n = Math.min(this.messages.length, d.messages.length);
    while (keep < n && this.messages[keep] === d.messages[keep]) keep++;
    const fields = saveToolAgentFields(d);
    const listsFrom: Partial<Record<DeltaList, number>> = {};
    const tails: Partial<Record<DeltaList, unknown[]>> = {};
    for (const name of DELTA_LISTS) {
      const now = listOf(fields, name);
      const k = keptItems(this.lists[name], now);
      listsFrom[name] = k;
      tails[name] = now.slice(k);
    }
    const { tool_metrics: _m, token_versions: _t, multi_modal: _mm, image_data: _id, ...rest } = fields;
    // Vision: only the images added since the last commit (the lists' kept prefix by identity).
    const vis = d.vision;
    const ki = vis ? keptRefs(this.images, vis.multiModal.images) : 0;
    const kd = vis ? keptRefs(this.imageData, vis.imageData) : 0;
    if (vis) Object.assign(listsFrom, { multi_modal_images: ki, image_data: kd });
    return {
      ...rest,
      ...(vis ? { multi_modal: { ...vis.multiModal, images: vis.multiModal.images.slice(ki) }, image_data: vis.imageData.slice(kd) } : {}),
      tool_rewards: tails.tool_rewards as number[],
      turn_scores: tails.turn_scores as number[],
      model_versions: tails.model_versions!,
      ...(tails.tool_metrics!.length ? { tool_metrics: tails.tool_metrics as ToolAgentFields["tool_metrics"] } : {}),
      ...(tails.token_versions!.length ? { token_versions: tails.token_versions as ToolAgentFields["token_versions"] } : {}),
      lists_from: listsFrom,
      messages_from: keep,
      messages: d.messages.slice(keep),
      builder: d.builder ? this.builderDelta(d.builder) : null,
    };
  }

  /** Records `d` as committed (after the storage accepted the delta). */
  accept(d: ToolAgentData | undefined): void {
    d?.builder?.markExpertsCommitted();
    this.messages = d ? d.messages.slice() : [];
    this.builder = d?.builder ?? null;
    this.tokens = d?.builder?.responseLength ?? 0;
    this.images = d?.vision ? d.vision.multiModal.images.slice() : [];
    this.imageData = d?.vision ? d.vision.imageData.slice() : [];
    if (!d) {
      this.lists = emptyLists();
      return;
    }
    const fields = saveToolAgentFields(d);
    for (const name of DELTA_LISTS) {
      // Only the items past the kept prefix change: the committed copy is extended, not rebuilt (O(turn)).
      const now = listOf(fields, name);
      const was = this.lists[name];
      const k = keptItems(was, now);
      was.length = k;
      for (let i = k; i < now.length; i++) was.push(committedItem(now[i]));
    }
  }

  private builderDelta(b: TrajectoryBuilder): BuilderDelta {
    const fresh = b !== this.builder;
    const from = fresh ? 0 : Math.min(this.tokens, b.responseLength);
    const s = b.responseSlice(from);
    const snap = { truncated: b.truncated, prompt_truncated: b.promptTruncated, response_length: b.responseBudget, max_model_len: b.maxModelLen };
    return {
      ...(fresh ? { prompt_ids: encodeInt32(b.promptIds) } : {}),
      from,
      response_ids: encodeInt32(s.ids),
      response_mask: encodeUint8(s.mask),
      response_logprobs: s.logprobs ? encodeFloat32(s.logprobs) : null,
      ...snap,
      ...(b.promptLength !== undefined ? { prompt_length: b.promptLength } : {}),
      ...expertsDelta(b, fresh ? 0 : b.promptIds.length + from),
    };
  }
}

/** The routed experts of `b` that changed since its last commit (`committedTokens` = prompt ‖ response length then), or nothing. */
function expertsDelta(b: TrajectoryBuilder, committedTokens: number): Pick<BuilderDelta, "routed_experts" | "routed_experts_from" | "routed_experts_shape"> {
  const re = b.routedExperts();
  if (!re) return {};
  const per = re.shape[0] * re.shape[1];
  const total = re.data.length / per;
  const from = Math.min(b.routedExpertsChangedFrom(committedTokens), total);
  if (from >= total) return {};
  return { routed_experts: encodeInt32(re.data.subarray(from * per)), routed_experts_from: from, routed_experts_shape: re.shape };
}

interface Chunk {
  ids: Int32Array;
  mask: Uint8Array;
  lps: Float32Array | null;
}

/** A builder folded from its deltas: the prompt and the response as chunks (concatenated once, on restore). */
interface FoldedBuilder {
  delta: BuilderDelta;
  prompt: Int32Array;
  chunks: Chunk[];
  length: number;
  /** Routed experts of prompt ‖ response as folded so far (`[tokens, layers, top_k]`), or null. */
  experts: { data: Int32Array; shape: [number, number] } | null;
}

/** `tool_agent`'s state folded from every committed delta. */
export interface FoldedLoop {
  fields: LoopDelta;
  messages: ChatMessage[];
  builder: FoldedBuilder | null;
}

/**
 * Folds a session's committed deltas (oldest first) into its head and its
 * run state. Each delta is checked ({@link parseDelta}); a delta whose step
 * is not the next one is refused (the log is damaged).
 * @throws StoreError (not retryable) for another checkpoint version, a malformed delta or a gap in the steps.
 */
export function foldCheckpoint(deltas: readonly string[], key: string): { cp: SessionCheckpoint; loop: FoldedLoop | null } {
  let cp: SessionCheckpoint | null = null;
  let loop: FoldedLoop | null = null;
  for (const text of deltas) {
    const d = parseDelta(text, key);
    const prev = cp as SessionCheckpoint | null;
    if (prev && d.step !== prev.step + 1) throw new StoreError(`session '${key}': stored checkpoint steps jump from ${prev.step} to ${d.step}`, { retryable: false });
    // A log that does not begin at step 0 lost its beginning (deltas are relative to what came before): folding it
    // would resume from a partial prompt and history, so it is refused rather than read.
    if (!prev && d.step !== 0) throw new StoreError(`session '${key}': stored checkpoint begins at step ${d.step}, not 0 (its earlier steps are gone)`, { retryable: false, code: "session_gap" });
    if (d.loop === null) loop = null;
    else if (d.loop !== undefined) loop = applyLoop(loop, d.loop, key);
    const { loop: _l, outputs, ...head } = d;
    cp = { ...head, loop: d.loop === undefined ? (prev?.loop ?? null) : d.loop, outputs: outputs !== undefined ? (outputs === null ? null : outputs.map(unpackOutput)) : (prev?.outputs ?? null) };
  }
  if (!cp) throw new StoreError(`session '${key}': no checkpoint stored`, { retryable: false });
  return { cp, loop };
}

function emptyLists(): Record<DeltaList, unknown[]> {
  return { tool_rewards: [], tool_metrics: [], turn_scores: [], model_versions: [], token_versions: [] };
}

/**
 * A delta's small fields with its per-turn lists made whole: a version-3
 * delta's list holds the items after `lists_from[name]` items of the previous
 * state's (version 2: whole already).
 */
function wholeFields(prev: LoopDelta | null, d: LoopDelta, key: string): LoopDelta {
  if (!d.lists_from) return d;
  const out: Record<string, unknown> = { ...d };
  for (const name of DELTA_LISTS) {
    const from = d.lists_from[name] ?? 0;
    const base = prev ? listOf(prev, name) : [];
    if (from > base.length) throw new StoreError(`session '${key}': stored checkpoint keeps ${from} items of loop.${name}, but the state before it holds ${base.length}`, { retryable: false });
    out[name] = base.slice(0, from).concat(listOf(d, name));
  }
  const whole = out as LoopDelta;
  if (!whole.tool_metrics?.length) delete whole.tool_metrics;
  // Vision lists: a delta that names them holds the images after the kept ones; one that does not holds them whole.
  const visionFrom = (name: (typeof VISION_LISTS)[number], base: readonly unknown[]): number => {
    const from = d.lists_from![name]!;
    if (from > base.length) throw new StoreError(`session '${key}': stored checkpoint keeps ${from} items of loop.${name}, but the state before it holds ${base.length}`, { retryable: false });
    return from;
  };
  if (d.lists_from.multi_modal_images !== undefined && d.multi_modal) {
    const base = prev?.multi_modal?.images ?? [];
    whole.multi_modal = { ...d.multi_modal, images: base.slice(0, visionFrom("multi_modal_images", base)).concat(d.multi_modal.images) };
  }
  if (d.lists_from.image_data !== undefined) {
    const base = prev?.image_data ?? [];
    whole.image_data = base.slice(0, visionFrom("image_data", base)).concat(d.image_data ?? []);
  }
  delete whole.lists_from;
  return whole;
}

function applyLoop(prev: FoldedLoop | null, d: LoopDelta, key: string): FoldedLoop {
  const fields = wholeFields(prev?.fields ?? null, d, key);
  const messages = (prev?.messages ?? []).slice(0, d.messages_from).concat(d.messages);
  let builder: FoldedBuilder | null = null;
  if (d.builder) {
    const bd = d.builder;
    const base: FoldedBuilder | null = bd.prompt_ids !== undefined ? null : (prev?.builder ?? null);
    const prompt = bd.prompt_ids !== undefined ? decodeInt32(bd.prompt_ids) : (base?.prompt ?? new Int32Array(0));
    const chunks = base ? cut(base.chunks, bd.from) : [];
    const c: Chunk = { ids: decodeInt32(bd.response_ids), mask: decodeUint8(bd.response_mask), lps: bd.response_logprobs === null ? null : decodeFloat32(bd.response_logprobs) };
    if (c.ids.length) chunks.push(c);
    builder = { delta: bd, prompt, chunks, length: chunks.reduce((n, x) => n + x.ids.length, 0), experts: foldExperts(base?.experts ?? null, bd) };
  }
  return { fields, messages, builder };
}

/** `prev` with a delta's routed experts applied: positions before `routed_experts_from` kept (the fill value where `prev` had none), the rest replaced. */
function foldExperts(prev: FoldedBuilder["experts"], bd: BuilderDelta): FoldedBuilder["experts"] {
  if (bd.routed_experts === undefined || !bd.routed_experts_shape) return prev;
  const shape: [number, number] = [bd.routed_experts_shape[0], bd.routed_experts_shape[1]];
  const per = shape[0] * shape[1];
  const add = decodeInt32(bd.routed_experts);
  const from = bd.routed_experts_from ?? 0;
  const data = new Int32Array(from * per + add.length);
  const kept = prev ? Math.min(prev.data.length, from * per) : 0;
  if (prev) data.set(prev.data.subarray(0, kept));
  if (ROUTED_EXPERTS_FILL !== 0) data.fill(ROUTED_EXPERTS_FILL, kept, from * per);
  data.set(add, from * per);
  return { data, shape };
}

/** The first `n` tokens of `chunks` (a new array; chunks past `n` dropped, the one across `n` trimmed). */
function cut(chunks: readonly Chunk[], n: number): Chunk[] {
  const out: Chunk[] = [];
  let left = n;
  for (const c of chunks) {
    if (left <= 0) break;
    if (c.ids.length <= left) out.push(c);
    else out.push({ ids: c.ids.subarray(0, left), mask: c.mask.subarray(0, left), lps: c.lps ? c.lps.subarray(0, left) : null });
    left -= c.ids.length;
  }
  return out;
}

function concat<T extends Int32Array | Uint8Array | Float32Array>(parts: T[], make: (n: number) => T): T {
  const out = make(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) {
    out.set(p as never, o);
    o += p.length;
  }
  return out;
}

/** The builder of a folded state (the same ids, mask and float32 log-probs as committed). */
export function restoreFoldedBuilder(b: FoldedBuilder, trackLogProbs: boolean): TrajectoryBuilder {
  const ids = concat(b.chunks.map((c) => c.ids), (n) => new Int32Array(n));
  const mask = concat(b.chunks.map((c) => c.mask), (n) => new Uint8Array(n));
  const lps = b.chunks.length && b.chunks.every((c) => c.lps) ? concat(b.chunks.map((c) => c.lps!), (n) => new Float32Array(n)) : null;
  const s = b.delta;
  const builder = TrajectoryBuilder.fromSnapshot(
    {
      prompt_ids: b.prompt as unknown as number[],
      response_ids: ids as unknown as number[],
      response_mask: mask as unknown as (0 | 1)[],
      response_logprobs: lps as unknown as number[] | null,
      truncated: s.truncated,
      prompt_truncated: s.prompt_truncated,
      response_length: s.response_length,
      max_model_len: s.max_model_len,
      ...(s.prompt_length !== undefined ? { prompt_length: s.prompt_length } : {}),
    },
    trackLogProbs,
  );
  if (b.experts) builder.restoreRoutedExperts(b.experts.data, b.experts.shape);
  return builder;
}

/**
 * Rebuilds `tool_agent`'s run state from a folded checkpoint: messages,
 * counters and the builder, then what the loop derives from the row (tools,
 * encoder, simulated user) via `loop.reattach` — unless the prompt was never
 * built, in which case the loop builds everything itself.
 */
export function restoreFoldedLoop(loop: ToolAgentLoop, f: FoldedLoop, input: SessionInput): ToolAgentData {
  const d = restoreToolAgentFields(loop, f.fields, input);
  d.messages = f.messages;
  if (f.builder) {
    d.builder = restoreFoldedBuilder(f.builder, input.sampling_params.logprobs);
    loop.reattach(d);
  }
  return d;
}
