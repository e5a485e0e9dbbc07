import type { BatchStats } from "../../shared/rollout/batch-run.ts";

/**
 * The end-of-run summary table of `edgeloop rollout`: sessions (trajectories:
 * one per prompt and session_id) planned, finished and handed back, then the
 * records they emitted (0…k per session) ok/failed/truncated, turns, tokens
 * by kind, tool calls and errors, mean reward, what a store repair put back
 * and what was lost (only when there was any), throughput. Plain text, one
 * figure a line, so tests can read it.
 */
export function formatSummary(s: BatchStats, wallSeconds: number): string {
  const c = s.counts;
  const rows: [string, string][] = [
    ["sessions (trajectories)", String(c.total)],
    ["  finished", String(c.finished)],
    ...(c.reused ? ([["  reused (handed back)", String(c.reused)]] as [string, string][]) : []),
    ["records", String(c.records)],
    ["  ok", String(c.ok)],
    ["  failed", String(c.failed)],
    ["  truncated", String(c.truncated)],
    ["prompts truncated", String(s.prompts_truncated)],
    ["turns", String(s.turns)],
    ["tokens prompt", String(s.tokens.prompt)],
    ["tokens sampled", String(s.tokens.sampled)],
    ["tokens observation", String(s.tokens.observation)],
    ["tool calls", String(s.tool_calls)],
    ["tool errors", String(s.tool_errors)],
    ["mean reward", s.reward.mean === null ? "n/a" : s.reward.mean.toFixed(4)],
    ["reward errors", String(s.reward.errors)],
    ...(s.repaired ? ([["store repairs", `${s.repaired.groups} groups, ${s.repaired.records} records written again (the store lost data)`]] as [string, string][]) : []),
    ...(s.lost ? ([["lost", `${s.lost.count} sessions; groups not delivered: ${s.lost.missing.length}`]] as [string, string][]) : []),
    ["wall time (s)", wallSeconds.toFixed(2)],
    ["sessions/s", ((c.finished - c.reused) / Math.max(wallSeconds, 1e-9)).toFixed(1)],
    ["records/s", (c.records / Math.max(wallSeconds, 1e-9)).toFixed(1)],
    ["turns/s", (s.turns / Math.max(wallSeconds, 1e-9)).toFixed(1)],
  ];
  const w = Math.max(...rows.map(([k]) => k.length));
  const lines = rows.map(([k, v]) => `${k.padEnd(w)}  ${v}`);
  if (s.errors.length) {
    lines.push("", `first errors (${Math.min(s.errors.length, 5)} of ${c.failed}):`);
    for (const e of s.errors.slice(0, 5)) lines.push(`  ${e.key}: ${e.error.slice(0, 200)}`);
  }
  return lines.join("\n");
}
