import type { TrajectoryRecord } from "../shared/schema/index.ts";
import { ObservationEncoder } from "../shared/tokens/observation.ts";
import { ChatTokenizer } from "../shared/tokens/tokenizer.ts";
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

/** What {@link installTokenCoreMeter} counts while `on`. CPU in µs (`process.cpuUsage()`, user + system). */
export interface TokenCoreMeter {
  on: boolean;
  depth: number;
  /** CPU inside `ObservationEncoder.encode`. */
  obsUs: number;
  /** CPU inside the tokenizer's `renderText` / `encode` outside an observation encode (the initial prompt). */
  promptUs: number;
  /** Observations encoded. */
  observations: number;
  /** The first 500 observations' ids (for the floor: raw tokenization of their text). */
  sample: number[][];
  reset(): void;
}

/**
 * Wraps `ObservationEncoder.prototype.encode` and `ChatTokenizer.prototype`'s
 * `renderText` / `encode` (once per process) so that, while the meter is
 * `on`, the CPU spent inside them — the token core's share of a run — is
 * summed (outermost call only, so nested calls count once). The wrapper's own
 * cost (two `cpuUsage()` calls per outermost call) falls on the token core's side.
 */
export function installTokenCoreMeter(): TokenCoreMeter {
  if (meter) return meter;
  const m: TokenCoreMeter = {
    on: false,
    depth: 0,
    obsUs: 0,
    promptUs: 0,
    observations: 0,
    sample: [],
    reset() {
      Object.assign(m, { depth: 0, obsUs: 0, promptUs: 0, observations: 0, sample: [] });
    },
  };
  const wrap = <T extends object>(proto: T, name: keyof T, into: "obsUs" | "promptUs") => {
    const inner = proto[name] as unknown as (...a: unknown[]) => unknown;
    (proto as Record<string, unknown>)[name as string] = function (this: unknown, ...a: unknown[]) {
      if (!m.on || m.depth > 0) return inner.apply(this, a);
      m.depth++;
      const c0 = process.cpuUsage();
      try {
        const out = inner.apply(this, a);
        if (into === "obsUs") {
          m.observations++;
          if (m.sample.length < 500) m.sample.push(out as number[]);
        }
        return out;
      } finally {
        const c = process.cpuUsage(c0);
        m[into] += c.user + c.system;
        m.depth--;
      }
    };
  };
  wrap(ObservationEncoder.prototype, "encode", "obsUs");
  wrap(ChatTokenizer.prototype, "renderText", "promptUs");
  wrap(ChatTokenizer.prototype, "encode", "promptUs");
  meter = m;
  return m;
}
let meter: TokenCoreMeter | undefined;
