import type { TrajectoryRecord } from "../shared/schema/index.ts";
/** Small helpers shared by the benchmarks. */

/** The median of a non-empty list. */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** The value after `flag` on the command line, or `fallback`. */
export function arg(flag: string, fallback: string): string {
  const i = process.argv.indexOf(flag);
  return i >= 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : fallback;
}

/** Prints a titled table with padded columns. */
export function printTable(title: string, rows: string[][]): void {
  const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => (r[c] ?? "").length)));
  console.log(`\n## ${title}`);
  for (const [i, r] of rows.entries()) {
    console.log(r.map((v, c) => (v ?? "").padEnd(widths[c]!)).join("  "));
    if (i === 0) console.log(widths.map((w) => "-".repeat(w)).join("  "));
  }
}

/**
 * A synthetic 2-turn-tool-style record for the queue benchmarks: `prompt`
 * as given, `half` random response ids (5 of every 7 sampled), float32-ish
 * log-probs, fixed scalars — drawn from `rnd` in this order: response ids,
 * then log-probs.
 */
export function syntheticRecord(uid: string, sessionId: number, prompt: number[], half: number, rnd: () => number): TrajectoryRecord {
  return {
    key: `${uid}_${sessionId}_0`,
    uid,
    session_id: sessionId,
    output_index: 0,
    agent_name: "tool_agent",
    data_source: "gsm8k",
    prompt_ids: prompt,
    response_ids: Array.from({ length: half }, () => Math.floor(rnd() * 151000)),
    response_mask: Array.from({ length: half }, (_, j) => (j % 7 < 5 ? 1 : 0)),
    rollout_log_probs: Array.from({ length: half }, () => Math.log(rnd() + 1e-9)),
    reward_score: 1,
    num_turns: 3,
    truncated: false,
    finish_reason: "stop",
    error: null,
    metrics: { generate_sequences: 1.5, tool_calls: 0.2, compute_score: 0.01, num_preempted: -1 },
    extra_fields: { model_versions: [7, 7], tool_rewards: [0], turn_scores: [0, 1] },
  };
}
