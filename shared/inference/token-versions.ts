import type { AgentLoopMetrics, TokenOutput } from "../schema/index.ts";

/**
 * Adds one engine call's `num_preempted` to the trajectory's: unknown (−1)
 * values are skipped, so the sum is of the known values and stays −1 only when
 * no call reported one. (verl keeps a first-turn −1 as an offset; we don't.)
 */
export function addPreempted(metrics: AgentLoopMetrics, value: number | null | undefined): void {
  if (value == null || value < 0) return;
  metrics.num_preempted = (metrics.num_preempted < 0 ? 0 : metrics.num_preempted) + value;
}

/** The model version an engine reply carries in `extra_fields.model_version`, or null. */
export function modelVersionOf(out: TokenOutput): unknown {
  const v = out.extra_fields?.model_version;
  return v === undefined ? null : v;
}

/**
 * Policy versions as run-length segments `[[start, version], …]`: the
 * tokens from `start` up to the next segment's start were sampled under
 * `version` (null: unknown). Starts are strictly increasing; consecutive
 * segments have different versions.
 */
export type TokenVersions = Array<[number, unknown]>;

/** Appends segment `[start, version]` unless the last segment already has that version. */
export function pushVersion(segs: TokenVersions, start: number, version: unknown): void {
  const last = segs[segs.length - 1];
  if (last && sameVersion(last[1], version)) return;
  if (last && last[0] === start) segs.pop();
  if (segs.length && sameVersion(segs[segs.length - 1]![1], version)) return;
  segs.push([start, version ?? null]);
}

/**
 * Versions compare by their JSON (undefined as null), except that a number
 * and its decimal string are one version (`3` and `"3"`: a trainer's step and
 * SGLang's `weight_version`; see `versionKey`); primitives, the usual case,
 * without serialising.
 */
function sameVersion(a: unknown, b: unknown): boolean {
  const x = a ?? null;
  const y = b ?? null;
  if (x === y) return true;
  if ((typeof x === "number" && typeof y === "string") || (typeof x === "string" && typeof y === "number")) return String(x) === String(y);
  if ((x === null || typeof x !== "object") && (y === null || typeof y !== "object")) {
    // NaN/±Infinity serialise as null; -0 as 0 (=== already equal).
    return typeof x === "number" && typeof y === "number" ? !Number.isFinite(x) && !Number.isFinite(y) : JSON.stringify(x) === JSON.stringify(y);
  }
  return JSON.stringify(x) === JSON.stringify(y);
}

/**
 * The versions of one turn's tokens, relative to the turn: its
 * `extra_fields.token_versions` (a turn resumed after an abort, see
 * `AgentLoop.generate`), else one segment `[[0, model_version]]`.
 */
export function turnVersions(out: TokenOutput): TokenVersions {
  const tv = out.extra_fields?.token_versions;
  if (Array.isArray(tv)) return tv as TokenVersions;
  return [[0, modelVersionOf(out)]];
}

/**
 * Records a turn appended at response index `offset` into a trajectory's
 * segments (observation tokens after an action stay in the action's
 * segment: a segment runs until the next one starts).
 */
export function recordTurnVersions(segs: TokenVersions, offset: number, out: TokenOutput): void {
  if (out.token_ids.length === 0) return;
  for (const [start, v] of turnVersions(out)) pushVersion(segs, offset + start, v);
}

/**
 * The trajectory's `extra_fields.token_versions`: segments cut to the
 * response's length; undefined when no version is known (every segment null)
 * or the response is empty.
 */
export function finalTokenVersions(segs: TokenVersions, responseLength: number): TokenVersions | undefined {
  const kept = segs.filter(([start]) => start < responseLength);
  if (kept.length === 0 || kept.every(([, v]) => v === null)) return undefined;
  return kept.map(([a, b]) => [a, b]);
}
