import type { TrajectoryRecord } from "../schema/index.ts";

/**
 * One trajectory as the viewer's list shows it (`GET /v1/rollouts/{batch_id}/summaries`):
 * the record's identity, outcome and sizes, without its token arrays.
 * Lengths are token counts: `response_length` = `len(response_ids)`,
 * `sampled` = tokens with `response_mask` 1 (the rest are observations).
 */
export interface TrajectorySummary {
  key: string;
  uid: string;
  session_id: number;
  output_index: number;
  /** `failed` when the record carries an `error`. */
  status: "ok" | "failed";
  reward_score: number | null;
  num_turns: number;
  truncated: boolean;
  finish_reason: string;
  prompt_length: number;
  response_length: number;
  sampled: number;
  /** The record's error, cut to 300 characters; null when ok. */
  error: string | null;
}

/** A record's {@link TrajectorySummary}. */
export function summarizeTrajectory(r: TrajectoryRecord): TrajectorySummary {
  let sampled = 0;
  for (const m of r.response_mask) sampled += m;
  return {
    key: r.key,
    uid: r.uid,
    session_id: r.session_id,
    output_index: r.output_index,
    status: r.error === null ? "ok" : "failed",
    reward_score: r.reward_score,
    num_turns: r.num_turns,
    truncated: r.truncated,
    finish_reason: r.finish_reason,
    prompt_length: r.prompt_ids.length,
    response_length: r.response_ids.length,
    sampled,
    error: r.error === null ? null : r.error.slice(0, 300),
  };
}

/** Which records a page holds (every field optional: absent matches all). */
export interface SummaryFilter {
  status?: "ok" | "failed";
  truncated?: boolean;
  /** Inclusive bounds on `reward_score`; a record without a reward matches neither. */
  reward_min?: number;
  reward_max?: number;
  uid?: string;
}

/** Whether a record passes a {@link SummaryFilter}. */
export function matchesFilter(r: TrajectoryRecord, f: SummaryFilter): boolean {
  if (f.status === "ok" && r.error !== null) return false;
  if (f.status === "failed" && r.error === null) return false;
  if (f.truncated !== undefined && r.truncated !== f.truncated) return false;
  if (f.reward_min !== undefined && (r.reward_score === null || r.reward_score < f.reward_min)) return false;
  if (f.reward_max !== undefined && (r.reward_score === null || r.reward_score > f.reward_max)) return false;
  if (f.uid !== undefined && r.uid !== f.uid) return false;
  return true;
}

/** One page of summaries: see {@link pageSummaries}. */
export interface SummaryPage {
  summaries: TrajectorySummary[];
  /** Pass as `cursor` for the next page; null when no record after this page matches yet. */
  next_cursor: string | null;
  /** Records of the batch so far, and how many of them match the filter. */
  total: number;
  matched: number;
}

/**
 * One page of a batch's records, in completion order (the order `records`
 * holds them, append-only), filtered. `cursor` is the previous page's
 * `next_cursor`: the position in `records` after that page's last record, as
 * decimal text, so pages stay stable while a running batch appends records
 * (they arrive on later pages). Without a cursor the page starts at the first
 * record. `next_cursor` is null when nothing after the page matches now; a
 * running batch may still add records, which `cursor = String(total)` reads
 * later (every record before `total` was scanned).
 * A cursor past the end gives an empty page.
 */
export function pageSummaries(records: readonly TrajectoryRecord[], opts: { limit: number; cursor?: string | null; filter?: SummaryFilter }): SummaryPage {
  const f = opts.filter ?? {};
  const from = opts.cursor ? Number(opts.cursor) : 0;
  const summaries: TrajectorySummary[] = [];
  let matched = 0;
  let last = -1;
  let more = false;
  for (let i = 0; i < records.length; i++) {
    const r = records[i]!;
    if (!matchesFilter(r, f)) continue;
    matched++;
    if (i < from) continue;
    if (summaries.length < opts.limit) {
      summaries.push(summarizeTrajectory(r));
      last = i;
    } else more = true;
  }
  const next = more ? String(last + 1) : null;
  return { summaries, next_cursor: next, total: records.length, matched };
}
