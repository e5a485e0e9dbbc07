import { InputError, inputErrorFromZod, StoreError } from "../errors.ts";
import { BlobPointer, parseTrajectoryKey, RoutedExpertsShape, TrajectoryRecord } from "../schema/index.ts";

/**
 * Record hash fields as stored in Redis (docs/queue-layout.md): `meta` is the
 * JSON of every scalar/object field, token arrays are base64 text of
 * little-endian bytes (`prompt_ids`/`response_ids` Int32, `response_mask`
 * Uint8, `rollout_log_probs` Float32, absent when null; `teacher_log_probs`
 * Float32, absent without a teacher; `routed_experts` `[P + R, layers, top_k]`
 * packed to the narrowest width of its values — `routed_experts_dtype` names
 * it, see {@link RoutedExpertsDtype} — with `routed_experts_shape` = JSON
 * `[layers, top_k]`, all absent unless routed experts were recorded). Base64 text keeps the
 * layout identical over TCP and Upstash REST (JSON bodies cannot carry raw bytes).
 */
export interface EncodedRecord {
  meta: string;
  prompt_ids: string;
  response_ids: string;
  response_mask: string;
  rollout_log_probs?: string;
  routed_experts?: string;
  routed_experts_shape?: string;
  /** How `routed_experts` is packed ({@link RoutedExpertsDtype}); written with every packed record, read as `"int32"` when absent (records of older versions). */
  routed_experts_dtype?: RoutedExpertsDtype;
  /** Base64 little-endian Float32, one per response token; absent without a teacher (`rollout.teacher`). */
  teacher_log_probs?: string;
  /**
   * JSON `{"key","sha256","bytes"}` of the blob holding the packed
   * `routed_experts` bytes (docs/queue-layout.md, "Blobs"), in place of
   * `routed_experts`; `routed_experts_shape` and `routed_experts_dtype` are
   * stored with it as usual. Absent for records whose experts are inline.
   */
  routed_experts_blob?: string;
}

/**
 * The stored width of `routed_experts`, field `routed_experts_dtype`: the
 * narrowest that holds every value of the record. `"uint8"` when every expert
 * id is ≤ 254, `"uint16"` when ≤ 65,534, else `"int32"` (little-endian, as
 * before). In the unsigned widths the all-ones code — 255 (0xFF) in uint8,
 * 65,535 (0xFFFF) in uint16, the low bytes of int32 −1 — is reserved for −1
 * (a layer the engine reported without routed experts); ids are stored as
 * they are. So a model of E experts (ids 0…E−1) packs to uint8 for
 * E ≤ 255 and uint16 for E ≤ 65,535; a record whose largest id is lower packs
 * narrower still (E = 256 gives uint8 for a record that never routes to
 * expert 255). The width follows the record's values, not `engine.moe`: a
 * real engine's expert count is not configured, and the values are never
 * wider than the count implies. A field without `routed_experts_dtype` (a
 * record of an older version) is int32.
 */
export type RoutedExpertsDtype = "uint8" | "uint16" | "int32";

const UINT8_PAD = 0xff;
const UINT16_PAD = 0xffff;

/**
 * `data` (expert ids ≥ −1, `max` = its largest value) packed to the narrowest
 * {@link RoutedExpertsDtype}: base64 of the stored bytes and the width's name.
 */
export function packRoutedExperts(data: Int32Array, max = maxOf(data)): { text: string; dtype: RoutedExpertsDtype } {
  const { bytes, dtype } = packRoutedExpertsBytes(data, max);
  return { text: bytesToBase64(bytes), dtype };
}

/** {@link packRoutedExperts} without the base64: the stored little-endian bytes (what a blob holds) and the width's name. */
export function packRoutedExpertsBytes(data: Int32Array, max = maxOf(data)): { bytes: Uint8Array; dtype: RoutedExpertsDtype } {
  const n = data.length;
  if (max < UINT8_PAD) {
    const out = new Uint8Array(n);
    // −1 & 0xff = 0xff: the typed-array store truncates to the reserved code.
    for (let i = 0; i < n; i++) out[i] = data[i]!;
    return { bytes: out, dtype: "uint8" };
  }
  if (max < UINT16_PAD) {
    const out = new Uint16Array(n);
    for (let i = 0; i < n; i++) out[i] = data[i]!;
    return { bytes: leBytes(out), dtype: "uint16" };
  }
  return { bytes: leBytes(data), dtype: "int32" };
}

/** Bytes per value of a {@link RoutedExpertsDtype}. */
export const ROUTED_EXPERTS_WIDTH: Readonly<Record<RoutedExpertsDtype, number>> = { uint8: 1, uint16: 2, int32: 4 };

function maxOf(data: Int32Array): number {
  let max = -1;
  for (let i = 0; i < data.length; i++) if (data[i]! > max) max = data[i]!;
  return max;
}

/**
 * Expert ids of a stored `routed_experts` field packed as `dtype` (absent:
 * int32), the all-ones code of an unsigned width read as −1.
 * @throws StoreError for an unknown dtype or a byte count that is not whole values
 */
export function unpackRoutedExperts(text: string, dtype: string | undefined): number[] {
  if (dtype === undefined || dtype === "int32") return decodeInt32("routed_experts", text);
  return unpackRoutedExpertsBytes(base64ToBytes(text), dtype);
}

/**
 * {@link unpackRoutedExperts} of the raw stored bytes (a blob's), packed as `dtype` (absent: int32).
 * @throws StoreError for an unknown dtype or a byte count that is not whole values
 */
export function unpackRoutedExpertsBytes(bytes: Uint8Array, dtype: string | undefined): number[] {
  if (dtype === undefined || dtype === "int32") return bytesToWords("routed_experts", bytes, false);
  if (dtype === "uint8") {
    const out = new Array<number>(bytes.length);
    for (let i = 0; i < bytes.length; i++) out[i] = bytes[i] === UINT8_PAD ? -1 : bytes[i]!;
    return out;
  }
  if (dtype === "uint16") {
    if (bytes.byteLength % 2 !== 0) throw new StoreError(`stored routed_experts has ${bytes.byteLength} bytes, not a multiple of 2 (uint16)`, { retryable: false });
    const n = bytes.byteLength / 2;
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const v = bytes[2 * i]! | (bytes[2 * i + 1]! << 8);
      out[i] = v === UINT16_PAD ? -1 : v;
    }
    return out;
  }
  throw new StoreError(`stored routed_experts_dtype ${JSON.stringify(dtype.slice(0, 40))} is not uint8, uint16 or int32`, { retryable: false });
}

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;
const INT32_MAX = 2 ** 31 - 1;

type B64Uint8 = { toBase64?: () => string };
type B64Ctor = { fromBase64?: (s: string) => Uint8Array };

/** Standard base64 (with padding) of `bytes`; uses `Uint8Array#toBase64` where the runtime has it. */
export function bytesToBase64(bytes: Uint8Array): string {
  const native = (bytes as unknown as B64Uint8).toBase64;
  if (typeof native === "function") return native.call(bytes);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000) as unknown as number[]);
  }
  return btoa(bin);
}

/** Bytes of standard base64 text. Throws {@link StoreError} on text that is not base64. */
export function base64ToBytes(text: string): Uint8Array {
  const native = (Uint8Array as unknown as B64Ctor).fromBase64;
  try {
    if (typeof native === "function") return native(text);
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  } catch (cause) {
    throw new StoreError("stored token array is not valid base64", { cause, retryable: false });
  }
}

function leBytes(view: Int32Array | Float32Array | Uint16Array): Uint8Array {
  if (LITTLE_ENDIAN) return new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  const out = new Uint8Array(view.byteLength);
  const dv = new DataView(out.buffer);
  for (let i = 0; i < view.length; i++) {
    if (view instanceof Int32Array) dv.setInt32(i * 4, view[i]!, true);
    else if (view instanceof Uint16Array) dv.setUint16(i * 2, view[i]!, true);
    else dv.setFloat32(i * 4, view[i]!, true);
  }
  return out;
}

/** Base64 of the little-endian Int32 bytes of `ids`. Throws {@link InputError} for ids above 2^31−1. */
export function encodeInt32(field: string, ids: readonly number[]): string {
  const arr = new Int32Array(ids.length);
  for (let i = 0; i < ids.length; i++) {
    const v = ids[i]!;
    if (v > INT32_MAX) throw new InputError(`${field}[${i}]`, `token id ${v} does not fit in int32`);
    arr[i] = v;
  }
  return bytesToBase64(leBytes(arr));
}

/** Base64 of the little-endian Float32 bytes of `values` (rounded to float32; −0 keeps its sign). */
export function encodeFloat32(values: readonly number[]): string {
  // A plain loop: `Float32Array.from(array)` takes the iterator path, ~10× slower on 1,024 values.
  const arr = new Float32Array(values.length);
  for (let i = 0; i < values.length; i++) arr[i] = values[i]!;
  return bytesToBase64(leBytes(arr));
}

/** Base64 of one byte per mask entry (0 or 1). */
export function encodeUint8(values: readonly number[]): string {
  const arr = new Uint8Array(values.length);
  for (let i = 0; i < values.length; i++) arr[i] = values[i]!;
  return bytesToBase64(arr);
}

function decodeWords(field: string, text: string, float: boolean): number[] {
  return bytesToWords(field, base64ToBytes(text), float);
}

function bytesToWords(field: string, bytes: Uint8Array, float: boolean): number[] {
  if (bytes.byteLength % 4 !== 0) {
    throw new StoreError(`stored ${field} has ${bytes.byteLength} bytes, not a multiple of 4`, { retryable: false });
  }
  const n = bytes.byteLength / 4;
  if (LITTLE_ENDIAN) {
    const aligned = bytes.byteOffset % 4 === 0 ? bytes : bytes.slice();
    const view = float
      ? new Float32Array(aligned.buffer, aligned.byteOffset, n)
      : new Int32Array(aligned.buffer, aligned.byteOffset, n);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) out[i] = view[i]!;
    return out;
  }
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) out[i] = float ? dv.getFloat32(i * 4, true) : dv.getInt32(i * 4, true);
  return out;
}

/** Token ids from base64 little-endian Int32 text. */
export function decodeInt32(field: string, text: string): number[] {
  return decodeWords(field, text, false);
}

/** Float32 values (as JS numbers, exactly the stored float32) from base64 little-endian Float32 text. */
export function decodeFloat32(field: string, text: string): number[] {
  return decodeWords(field, text, true);
}

/** Mask values from base64 Uint8 text. */
export function decodeUint8(text: string): number[] {
  const bytes = base64ToBytes(text);
  const out = new Array<number>(bytes.length);
  for (let i = 0; i < bytes.length; i++) out[i] = bytes[i]!;
  return out;
}

/** The record schema without its token arrays (and side channels), which {@link validateAndEncode} checks with plain loops. */
const RecordMeta = TrajectoryRecord.omit({ prompt_ids: true, response_ids: true, response_mask: true, rollout_log_probs: true, teacher_log_probs: true, routed_experts: true, routed_experts_shape: true, routed_experts_blob: true });

function arrayOf(field: string, v: unknown): ArrayLike<unknown> {
  if (Array.isArray(v) || (ArrayBuffer.isView(v) && !(v instanceof DataView))) return v as ArrayLike<unknown>;
  throw new InputError(`record.${field}`, "expected an array");
}

/**
 * A record's place in a trajectory tree, checked against the record itself:
 * `parent_key` and `branch_at` are both set (a branch) or both null/absent (a
 * root, or a loop that builds no trees); a parent is a record of the same
 * `uid` and `session_id` with a smaller `output_index` (`treeFields` writes
 * no other); `branch_at` is at most the record's own `P + R` tokens, which
 * repeat the parent's before it. Whether the parent really is that long is
 * checked where both are read (`resolveTree`).
 * @throws InputError naming `record.parent_key` or `record.branch_at`
 */
function checkTreePlace(data: RecordHead, tokens: number): void {
  const parent = data.parent_key ?? null;
  const at = data.branch_at ?? null;
  if ((parent === null) !== (at === null)) {
    throw new InputError(parent === null ? "record.branch_at" : "record.parent_key", `is set without ${parent === null ? "parent_key" : "branch_at"}: a branch sets both, a root neither`, { key: data.key });
  }
  if (parent === null || at === null) return;
  const m = /^([A-Za-z0-9.-]{1,128})_(\d+)_(\d+)$/.exec(parent);
  if (!m || m[1] !== data.uid || Number(m[2]) !== data.session_id || !(Number(m[3]) < data.output_index)) {
    throw new InputError("record.parent_key", `'${parent.slice(0, 200)}' must name an earlier record of the same session, ${data.uid}_${data.session_id}_{i} with i < ${data.output_index}`, { key: data.key });
  }
  if (at > tokens) throw new InputError("record.branch_at", `is ${at}, past the record's own ${tokens} prompt + response tokens (those before branch_at are the parent's)`, { key: data.key });
}

/**
 * Parses and checks a record at the queue boundary: the `TrajectoryRecord`
 * zod schema for every scalar/object field, plain loops for the token arrays
 * (the same rules — ids integers ≥ 0, also ≤ 2^31−1 to fit Int32; mask 0/1;
 * log-probs finite — about 20× faster than zod on 2,048 tokens), the key
 * equal to `{uid}_{session_id}_{output_index}`, and equal lengths of
 * `response_ids`/`response_mask`/`rollout_log_probs`. Log-probs are rounded
 * to float32 here so every adapter stores and returns the same values.
 * Returns a fresh record (no arrays shared with the input). Throws
 * {@link InputError} naming the field (`record.key`, `record.prompt_ids[3]`, …).
 */
export function validateRecord(input: unknown): TrajectoryRecord {
  // One set of checks for both paths: validate into the stored encoding, then read that back.
  return decodeRecord({ ...validateAndEncode(input).encoded });
}

/** A record's fields other than its token arrays, checked (what the queue needs to route and count a write). */
export type RecordHead = Omit<TrajectoryRecord, "prompt_ids" | "response_ids" | "response_mask" | "rollout_log_probs" | "teacher_log_probs" | "routed_experts" | "routed_experts_shape" | "routed_experts_blob">;

/** Record fields stored as their own hash fields, not in `meta`. */
const ARRAY_FIELDS = new Set<string>(["prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "teacher_log_probs", "routed_experts", "routed_experts_shape", "routed_experts_blob"]);

/** `meta`'s keys in the schema's order, as `encodeRecord` writes them (byte-identical JSON). */
const META_FIELDS = (Object.keys(TrajectoryRecord.shape) as (keyof TrajectoryRecord)[]).filter((k) => !ARRAY_FIELDS.has(k)) as (keyof RecordHead)[];

function idsInto(field: string, v: unknown): Int32Array {
  const a = arrayOf(field, v);
  const out = new Int32Array(a.length);
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    // (x | 0) === x: an integer in int32 range (a plain test; Number.isInteger is ~4x slower per id here).
    if (typeof x !== "number" || (x | 0) !== x || x < 0) {
      throw new InputError(`record.${field}[${i}]`, `token id must be an integer in 0..${INT32_MAX}, got ${String(x)}`);
    }
    out[i] = x;
  }
  return out;
}

function maskInto(v: unknown): Uint8Array {
  const a = arrayOf("response_mask", v);
  const out = new Uint8Array(a.length);
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (x !== 0 && x !== 1) throw new InputError(`record.response_mask[${i}]`, `must be 0 or 1, got ${String(x)}`);
    out[i] = x;
  }
  return out;
}

function logprobsInto(v: unknown, field = "rollout_log_probs"): Float32Array | null {
  if (v === null) return null;
  const a = arrayOf(field, v);
  const out = new Float32Array(a.length);
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (typeof x !== "number" || !Number.isFinite(x)) {
      throw new InputError(`record.${field}[${i}]`, `must be a finite number, got ${String(x)}`);
    }
    out[i] = x;
  }
  return out;
}

/**
 * A record's routed experts, checked: both `routed_experts` and
 * `routed_experts_shape` or neither; the shape `[layers ≥ 1, top_k ≥ 1]`;
 * `(P + R) · layers · top_k` int32 values ≥ −1. Null when absent.
 * @throws InputError naming `record.routed_experts` / `record.routed_experts_shape`
 */
function routedExpertsInto(o: Record<string, unknown>, tokens: number, key: string): { data: Int32Array; shape: [number, number]; max: number } | null {
  const re = o.routed_experts;
  const shape = o.routed_experts_shape;
  if (re === undefined && shape === undefined) return null;
  if (o.routed_experts_blob !== undefined) {
    if (re !== undefined) throw new InputError("record.routed_experts_blob", "is set together with routed_experts: a record holds its experts inline or in a blob, not both", { key });
    return null;
  }
  if (re === undefined) throw new InputError("record.routed_experts", "is missing although routed_experts_shape is set", { key });
  const sh = RoutedExpertsShape.safeParse(shape);
  if (!sh.success) throw new InputError("record.routed_experts_shape", `must be [layers >= 1, top_k >= 1], got ${JSON.stringify(shape ?? null)}`, { key });
  const [layers, topK] = sh.data;
  const a = arrayOf("routed_experts", re);
  const want = tokens * layers * topK;
  if (a.length !== want) {
    throw new InputError("record.routed_experts", `has ${a.length} values, expected (prompt + response) ${tokens} tokens × ${layers} layers × ${topK} top_k = ${want}`, { key });
  }
  const out = new Int32Array(a.length);
  let max = -1;
  for (let i = 0; i < a.length; i++) {
    const x = a[i];
    if (typeof x !== "number" || (x | 0) !== x || x < -1) throw new InputError(`record.routed_experts[${i}]`, `must be an int32 expert id >= -1, got ${String(x)}`, { key });
    out[i] = x;
    if (x > max) max = x;
  }
  return { data: out, shape: [layers, topK], max };
}

/**
 * The images of `multi_modal` against the ids they index: spans in order,
 * without overlap, inside `prompt_ids ‖ response_ids`; each span exactly
 * `t·h·w / merge²` image tokens between `vision_start_id` and
 * `vision_end_id`; a `prompt` image inside the prompt, a `tool` image inside
 * the response under mask 0. One pass over the spans' ids.
 * @throws InputError naming `record.multi_modal.images[i]`.
 */
function checkImageSpans(mm: NonNullable<TrajectoryRecord["multi_modal"]>, prompt: Int32Array, response: Int32Array, mask: Uint8Array, key: string): void {
  const P = prompt.length;
  const total = P + response.length;
  const at = (i: number) => (i < P ? prompt[i]! : response[i - P]!);
  const merge2 = mm.processor.merge_size * mm.processor.merge_size;
  let prev = 0;
  for (let i = 0; i < mm.images.length; i++) {
    const img = mm.images[i]!;
    const field = `record.multi_modal.images[${i}]`;
    const [s, e] = img.span;
    const [t, h, w] = img.image_grid_thw;
    const fail = (msg: string): never => {
      throw new InputError(field, msg, { key });
    };
    if (s <= prev || e >= total || e < s) fail(`span [${s}, ${e}) must lie inside prompt_ids ‖ response_ids (${total} tokens) after the previous image, with room for <|vision_start|> and <|vision_end|>`);
    if ((t * h * w) % merge2 !== 0 || e - s !== (t * h * w) / merge2) fail(`span [${s}, ${e}) holds ${e - s} tokens; image_grid_thw [${t}, ${h}, ${w}] makes ${(t * h * w) / merge2}`);
    if (img.source === "prompt" ? e >= P : s - 1 < P) fail(`a ${img.source} image must lie in the ${img.source === "prompt" ? "prompt" : "response"}, span [${s}, ${e}) with ${P} prompt tokens`);
    if (at(s - 1) !== mm.vision_start_id || at(e) !== mm.vision_end_id) fail(`span [${s}, ${e}) is not between vision_start_id ${mm.vision_start_id} and vision_end_id ${mm.vision_end_id}`);
    for (let j = s; j < e; j++) {
      if (at(j) !== mm.image_token_id) fail(`position ${j} holds ${at(j)}, not image_token_id ${mm.image_token_id}`);
      if (j >= P && mask[j - P] !== 0) fail(`position ${j} is an image token under response_mask 1`);
    }
    prev = e;
  }
}

/**
 * A record's routed experts checked as `put` checks them (both fields or
 * neither, the shape, `(P + R) · layers · top_k` int32 ids ≥ −1) and packed
 * to their stored bytes, for the blob layer; null when the record has none
 * (or holds a `routed_experts_blob` instead).
 * @throws InputError naming `record.routed_experts…`, as `put` does
 */
export function packedRoutedExpertsOf(input: TrajectoryRecord): { bytes: Uint8Array; dtype: RoutedExpertsDtype; shape: [number, number] } | null {
  const o = input as unknown as Record<string, unknown>;
  const tokens = arrayOf("prompt_ids", o.prompt_ids).length + arrayOf("response_ids", o.response_ids).length;
  const fast = o.routed_experts_blob === undefined && Array.isArray(o.routed_experts) ? packChecked(o.routed_experts as unknown[]) : null;
  if (fast) {
    // The common case (ids ≤ 65,534): checked and packed in one pass; the shape and count as routedExpertsInto checks them.
    const sh = RoutedExpertsShape.safeParse(o.routed_experts_shape);
    if (sh.success && (o.routed_experts as unknown[]).length === tokens * sh.data[0] * sh.data[1]) return { ...fast, shape: sh.data };
  }
  const experts = routedExpertsInto(o, tokens, String(o.key ?? ""));
  if (!experts) return null;
  return { ...packRoutedExpertsBytes(experts.data, experts.max), shape: experts.shape };
}

/**
 * `a` packed to uint8 (−1 as 0xff), or to uint16 (−1 as 0xffff) from the first id above 254 on, checking
 * each id as {@link routedExpertsInto} does, in one pass; null at the first value that is not an id in
 * −1…65,534 (the caller then takes the general path, which names it or packs int32).
 */
function packChecked(a: unknown[]): { bytes: Uint8Array; dtype: "uint8" | "uint16" } | null {
  const n = a.length;
  const u8 = new Uint8Array(n);
  let i = 0;
  for (; i < n; i++) {
    const x = a[i];
    if (typeof x !== "number" || (x | 0) !== x || x < -1) return null;
    if (x >= UINT8_PAD) break;
    u8[i] = x;
  }
  if (i === n) return { bytes: u8, dtype: "uint8" };
  const u16 = new Uint16Array(n);
  for (let j = 0; j < i; j++) u16[j] = u8[j] === UINT8_PAD ? UINT16_PAD : u8[j]!;
  for (; i < n; i++) {
    const x = a[i];
    if (typeof x !== "number" || (x | 0) !== x || x < -1 || x >= UINT16_PAD) return null;
    u16[i] = x;
  }
  return { bytes: leBytes(u16), dtype: "uint16" };
}

/**
 * {@link validateRecord} and {@link encodeRecord} in one pass, for the write
 * path: the same checks and errors, the same stored bytes, but the token
 * arrays go straight into typed arrays (no intermediate copies), about 4×
 * cheaper on a 2,048-token record. Returns the checked head (scalars) and
 * the stored hash fields.
 * @throws InputError naming the field, as {@link validateRecord}.
 */
export function validateAndEncode(input: unknown): { head: RecordHead; encoded: EncodedRecord } {
  if (typeof input !== "object" || input === null) throw new InputError("record", "expected an object");
  const r = RecordMeta.safeParse(input);
  if (!r.success) throw inputErrorFromZod("record", r.error.issues);
  const o = input as Record<string, unknown>;
  const prompt = idsInto("prompt_ids", o.prompt_ids);
  const response = idsInto("response_ids", o.response_ids);
  const mask = maskInto(o.response_mask);
  const logprobs = logprobsInto(o.rollout_log_probs);
  // Teacher log-probs (rollout.teacher): absent without a teacher; null is not a stored value.
  const teacher = o.teacher_log_probs === undefined ? null : logprobsInto(arrayOf("teacher_log_probs", o.teacher_log_probs), "teacher_log_probs");
  const data = r.data as RecordHead;
  const parsed = parseTrajectoryKey(data.key);
  if (parsed.uid !== data.uid || parsed.session_id !== data.session_id || parsed.output_index !== data.output_index) {
    throw new InputError(
      "record.key",
      `'${data.key}' must equal {uid}_{session_id}_{output_index} = '${data.uid}_${data.session_id}_${data.output_index}'`,
      { key: data.key },
    );
  }
  if (data.tree_prompt_length !== undefined) {
    throw new InputError("record.tree_prompt_length", "is set only on records read as trajectory-tree nodes (deliver: tree); put whole records (resolveTree gives them back)", { key: data.key });
  }
  const n = response.length;
  checkTreePlace(data, prompt.length + n);
  if (mask.length !== n) throw new InputError("record.response_mask", `has ${mask.length} entries, response_ids has ${n}`, { key: data.key });
  if (logprobs && logprobs.length !== n) {
    throw new InputError("record.rollout_log_probs", `has ${logprobs.length} entries, response_ids has ${n}`, { key: data.key });
  }
  const experts = routedExpertsInto(o, prompt.length + n, data.key);
  const blob = o.routed_experts_blob === undefined ? null : blobPointerOf(o, prompt.length + n, data.key);
  if (teacher && teacher.length !== n) {
    throw new InputError("record.teacher_log_probs", `has ${teacher.length} entries, response_ids has ${n}`, { key: data.key });
  }
  if (data.multi_modal) checkImageSpans(data.multi_modal, prompt, response, mask, data.key);
  const head = {} as Record<string, unknown>;
  for (const k of META_FIELDS) head[k] = data[k];
  const encoded: EncodedRecord = {
    meta: JSON.stringify(head),
    prompt_ids: bytesToBase64(leBytes(prompt)),
    response_ids: bytesToBase64(leBytes(response)),
    response_mask: bytesToBase64(mask),
  };
  if (logprobs) encoded.rollout_log_probs = bytesToBase64(leBytes(logprobs));
  if (experts) {
    const packed = packRoutedExperts(experts.data, experts.max);
    encoded.routed_experts = packed.text;
    encoded.routed_experts_shape = JSON.stringify(experts.shape);
    encoded.routed_experts_dtype = packed.dtype;
  }
  if (blob) Object.assign(encoded, blobFields(blob.pointer, blob.shape));
  if (teacher) encoded.teacher_log_probs = bytesToBase64(leBytes(teacher));
  return { head: head as RecordHead, encoded };
}

/**
 * A record's `routed_experts_blob`, checked: a {@link BlobPointer}, with
 * `routed_experts_shape` set and `bytes` = tokens × layers × top_k × the
 * dtype's width.
 * @throws InputError naming `record.routed_experts_blob…` / `record.routed_experts_shape`
 */
function blobPointerOf(o: Record<string, unknown>, tokens: number, key: string): { pointer: BlobPointer; shape: [number, number] } {
  const p = BlobPointer.safeParse(o.routed_experts_blob);
  if (!p.success) throw inputErrorFromZod("record.routed_experts_blob", p.error.issues);
  const sh = RoutedExpertsShape.safeParse(o.routed_experts_shape);
  if (!sh.success) throw new InputError("record.routed_experts_shape", `must be [layers >= 1, top_k >= 1] with routed_experts_blob, got ${JSON.stringify(o.routed_experts_shape ?? null)}`, { key });
  const [layers, topK] = sh.data;
  const want = tokens * layers * topK * ROUTED_EXPERTS_WIDTH[p.data.dtype];
  if (p.data.bytes !== want) {
    throw new InputError("record.routed_experts_blob.bytes", `is ${p.data.bytes}, expected (prompt + response) ${tokens} tokens × ${layers} layers × ${topK} top_k × ${ROUTED_EXPERTS_WIDTH[p.data.dtype]} bytes (${p.data.dtype}) = ${want}`, { key });
  }
  return { pointer: p.data, shape: sh.data };
}

/** The stored fields of a blob pointer: `routed_experts_blob` JSON `{key, sha256, bytes}`, the shape and the dtype. */
function blobFields(p: BlobPointer, shape: readonly [number, number]): Pick<EncodedRecord, "routed_experts_blob" | "routed_experts_shape" | "routed_experts_dtype"> {
  return { routed_experts_blob: JSON.stringify({ key: p.key, sha256: p.sha256, bytes: p.bytes }), routed_experts_shape: JSON.stringify(shape), routed_experts_dtype: p.dtype };
}

/** The stored hash fields of a validated record. */
export function encodeRecord(rec: TrajectoryRecord): EncodedRecord {
  const { prompt_ids, response_ids, response_mask, rollout_log_probs, teacher_log_probs, routed_experts, routed_experts_shape, routed_experts_blob, ...meta } = rec;
  const out: EncodedRecord = {
    meta: JSON.stringify(meta),
    prompt_ids: encodeInt32("prompt_ids", prompt_ids),
    response_ids: encodeInt32("response_ids", response_ids),
    response_mask: encodeUint8(response_mask),
  };
  if (rollout_log_probs) out.rollout_log_probs = encodeFloat32(rollout_log_probs);
  if (routed_experts !== undefined && routed_experts_shape !== undefined) {
    const packed = packRoutedExperts(Int32Array.from(routed_experts));
    out.routed_experts = packed.text;
    out.routed_experts_shape = JSON.stringify(routed_experts_shape);
    out.routed_experts_dtype = packed.dtype;
  }
  if (routed_experts_blob !== undefined && routed_experts_shape !== undefined) Object.assign(out, blobFields(routed_experts_blob, routed_experts_shape));
  if (teacher_log_probs) out.teacher_log_probs = encodeFloat32(teacher_log_probs);
  return out;
}

/** Flattened `field, value, …` arguments for HSET. */
export function encodedFields(enc: EncodedRecord): string[] {
  const out = ["meta", enc.meta, "prompt_ids", enc.prompt_ids, "response_ids", enc.response_ids, "response_mask", enc.response_mask];
  if (enc.rollout_log_probs !== undefined) out.push("rollout_log_probs", enc.rollout_log_probs);
  if (enc.routed_experts !== undefined && enc.routed_experts_shape !== undefined) {
    out.push("routed_experts", enc.routed_experts, "routed_experts_shape", enc.routed_experts_shape);
    if (enc.routed_experts_dtype !== undefined) out.push("routed_experts_dtype", enc.routed_experts_dtype);
  }
  if (enc.routed_experts_blob !== undefined && enc.routed_experts_shape !== undefined) {
    out.push("routed_experts_blob", enc.routed_experts_blob, "routed_experts_shape", enc.routed_experts_shape, "routed_experts_dtype", enc.routed_experts_dtype ?? "int32");
  }
  if (enc.teacher_log_probs !== undefined) out.push("teacher_log_probs", enc.teacher_log_probs);
  return out;
}

/** A record from its stored hash fields. Throws {@link StoreError} when the stored data is corrupt. */
export function decodeRecord(fields: Record<string, string>): TrajectoryRecord {
  if (fields.meta === undefined) throw new StoreError("stored record has no meta field", { retryable: false });
  let meta: Record<string, unknown>;
  try {
    meta = JSON.parse(fields.meta);
  } catch (cause) {
    throw new StoreError("stored record meta is not JSON", { cause, retryable: false });
  }
  return inSchemaOrder({
    ...(meta as RecordHead),
    prompt_ids: decodeInt32("prompt_ids", fields.prompt_ids ?? ""),
    response_ids: decodeInt32("response_ids", fields.response_ids ?? ""),
    response_mask: decodeUint8(fields.response_mask ?? "") as (0 | 1)[],
    rollout_log_probs: fields.rollout_log_probs === undefined ? null : decodeFloat32("rollout_log_probs", fields.rollout_log_probs),
    ...(fields.teacher_log_probs === undefined ? {} : { teacher_log_probs: decodeFloat32("teacher_log_probs", fields.teacher_log_probs) }),
    ...decodeRoutedExperts(fields),
  });
}

/**
 * `routed_experts` and `routed_experts_shape` of stored hash fields (both or
 * neither), unpacked by `routed_experts_dtype` (absent: int32).
 * @throws StoreError when only one is stored, the shape is not `[layers, top_k]` JSON or the dtype is unknown
 */
function decodeRoutedExperts(fields: Record<string, string>): Pick<TrajectoryRecord, "routed_experts" | "routed_experts_shape" | "routed_experts_blob"> {
  const re = fields.routed_experts;
  const shape = fields.routed_experts_shape;
  if (re === undefined && shape === undefined) return {};
  if (fields.routed_experts_blob !== undefined) {
    if (re !== undefined) throw new StoreError("stored record has both routed_experts and routed_experts_blob", { retryable: false });
    return decodeBlobPointer(fields);
  }
  if (re === undefined || shape === undefined) throw new StoreError("stored record has only one of routed_experts and routed_experts_shape", { retryable: false });
  let parsed: unknown;
  try {
    parsed = JSON.parse(shape);
  } catch (cause) {
    throw new StoreError("stored routed_experts_shape is not JSON", { cause, retryable: false });
  }
  const sh = RoutedExpertsShape.safeParse(parsed);
  if (!sh.success) throw new StoreError(`stored routed_experts_shape ${shape.slice(0, 60)} is not [layers, top_k]`, { retryable: false });
  return { routed_experts: unpackRoutedExperts(re, fields.routed_experts_dtype), routed_experts_shape: sh.data };
}

/**
 * `routed_experts_blob` (with `routed_experts_dtype`, absent: int32) and the shape of stored hash fields.
 * @throws StoreError when the pointer is not `{key, sha256, bytes}` JSON or the shape is missing
 */
function decodeBlobPointer(fields: Record<string, string>): Pick<TrajectoryRecord, "routed_experts_shape" | "routed_experts_blob"> {
  let ptr: unknown;
  let shape: unknown;
  try {
    ptr = { ...JSON.parse(fields.routed_experts_blob!), dtype: fields.routed_experts_dtype ?? "int32" };
    shape = JSON.parse(fields.routed_experts_shape ?? "null");
  } catch (cause) {
    throw new StoreError("stored routed_experts_blob or routed_experts_shape is not JSON", { cause, retryable: false });
  }
  const p = BlobPointer.safeParse(ptr);
  if (!p.success) throw new StoreError(`stored routed_experts_blob ${fields.routed_experts_blob!.slice(0, 120)} is not {key, sha256, bytes}: ${p.error.issues[0]?.message ?? ""}`, { retryable: false });
  const sh = RoutedExpertsShape.safeParse(shape);
  if (!sh.success) throw new StoreError(`stored routed_experts_shape ${String(fields.routed_experts_shape).slice(0, 60)} is not [layers, top_k]`, { retryable: false });
  return { routed_experts_shape: sh.data, routed_experts_blob: p.data };
}

const FIELD_ORDER = Object.keys(TrajectoryRecord.shape) as (keyof TrajectoryRecord)[];

/**
 * The record with its fields in the `TrajectoryRecord` schema's order, so that
 * `JSON.stringify` of a record read back from any adapter is byte-identical to
 * that of the record written (and to the CLI's JSONL output).
 */
export function inSchemaOrder(rec: TrajectoryRecord): TrajectoryRecord {
  const out = {} as Record<string, unknown>;
  for (const k of FIELD_ORDER) {
    // Optional side channels are absent, not undefined, when not recorded.
    if (rec[k] === undefined && OPTIONAL_FIELDS.has(k)) continue;
    out[k] = rec[k];
  }
  return out as TrajectoryRecord;
}

/** Side channels that are absent (no key at all) when not recorded. */
const OPTIONAL_FIELDS = new Set<string>(["model", "agent_role", "served_model", "teacher_log_probs", "routed_experts", "routed_experts_shape", "routed_experts_blob", "parent_key", "branch_at", "tree_prompt_length"]);

/** The empty record `markFailed` stores for `key`, with `error = reason` and `finish_reason = "error"`. */
export function failedRecord(key: string, reason: string, fields: Partial<TrajectoryRecord> = {}): TrajectoryRecord {
  const { uid, session_id, output_index } = parseTrajectoryKey(key);
  return validateRecord({
    agent_name: "",
    data_source: "",
    prompt_ids: [],
    response_ids: [],
    response_mask: [],
    rollout_log_probs: null,
    reward_score: null,
    num_turns: 0,
    truncated: false,
    finish_reason: "error",
    metrics: {},
    extra_fields: {},
    ...fields,
    key,
    uid,
    session_id,
    output_index,
    error: reason,
  });
}
