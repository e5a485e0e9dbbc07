import type { BatchStats } from "../../shared/rollout/batch-run.ts";
import { terminalSafe } from "./terminal-text.ts";

/**
 * The end-of-run summary table of `edgeloop rollout`: sessions (trajectories:
 * one per prompt and session_id) planned, finished and handed back, then the
 * records they emitted (0…k per session) ok/failed/truncated, turns, tokens
 * by kind, tool calls and errors, mean reward, what a store repair put back
 * and what was lost (only when there was any), over-sampling and dynamic
 * sampling figures (only for such a batch), throughput. Plain text, one
 * figure a line, so tests can read it. Error texts (which may quote model or
 * tool output) are {@link terminalSafe}.
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
    ...oversampleRows(s),
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
    for (const e of s.errors.slice(0, 5)) lines.push(terminalSafe(`  ${e.key}: ${e.error.slice(0, 200)}`, { newlines: false }));
  }
  return lines.join("\n");
}

/**
 * Summary rows of an over-sampled or filtered batch (`target_groups`,
 * `rollout.oversample`, `rollout.filter_groups`): the target and where it
 * came from, groups delivered and filtered, sessions stopped; none for a plain batch.
 */
function oversampleRows(s: BatchStats): [string, string][] {
  const o = s.oversample;
  if (!o) return [];
  const rows: [string, string][] = [
    ["target groups", `${o.target_groups}${o.target_from ? ` (${o.target_from})` : ""}${o.reached ? ", reached" : ""}`],
    ["groups delivered", String(o.delivered)],
    ["  filtered (all equal)", String(o.filtered)],
  ];
  if (o.replacements) rows.push(["  reserve rows started", String(o.replacements)]);
  if (o.cancelled) rows.push(["sessions cancelled", `${o.cancelled} (${o.groups_withdrawn} groups withdrawn)`]);
  if (o.carried) rows.push(["sessions carried", `${o.carried} (${o.groups_carried} groups left open)`]);
  return rows;
}
