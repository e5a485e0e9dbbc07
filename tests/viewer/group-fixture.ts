import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

// Groups whose samples really differ, for the viewer's group view and the divergence tests: the
// simulated engine plays `default` for prompts no rule matches, at a length drawn per trajectory key
// (`lengths`, deterministic in seed, key and turn), so the n samples of a prompt share a prefix and
// part where the shorter one emits <|im_end|>; the rule reward scores the ones long enough to say "#### 4".

/** The default turn: repeated to the drawn length. */
export const GROUP_TEXT = "#### 4 is the answer. ";

/**
 * Writes a sim-engine script: the example policy's rules (so the example rows play as usual), plus
 * `lengths` and {@link GROUP_TEXT} for every other prompt. Returns its path (in a fresh temp dir).
 */
export function writeGroupScript(): string {
  const base = JSON.parse(readFileSync(join(import.meta.dir, "..", "..", "examples", "policy.json"), "utf8")) as Record<string, unknown>;
  const path = join(mkdtempSync(join(tmpdir(), "edgeloop-group-")), "policy.json");
  writeFileSync(path, JSON.stringify({ ...base, lengths: { median: 10, sigma: 0.7, min: 3, max: 40 }, default: [GROUP_TEXT] }));
  return path;
}

/** `count` rows with fixed uids (`{prefix}-0`, …) that no rule matches, ground truth "4". */
export function groupRows(count: number, prefix = "grp"): Record<string, unknown>[] {
  return Array.from({ length: count }, (_, i) => ({
    uid: `${prefix}-${i}`,
    data_source: "edge",
    agent_name: "single_turn_agent",
    prompt: [{ role: "user", content: `What is 2+2? (variant ${i})` }],
    reward_model: { style: "rule", ground_truth: "4" },
  }));
}
