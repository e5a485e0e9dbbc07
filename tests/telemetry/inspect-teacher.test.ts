import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { summaryLine, teacherSummary } from "../../infra/cli/inspect-command.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";

// `edgeloop inspect` on records with teacher log-probs (rollout.teacher): the summary names the means over sampled tokens.
const BIN = join(import.meta.dir, "..", "..", "bin", "edgeloop.mjs");
let dir: string;

const rec: TrajectoryRecord = {
  key: "t-1_0_0",
  uid: "t-1",
  session_id: 0,
  output_index: 0,
  agent_name: "tool_agent",
  data_source: "fixture",
  prompt_ids: [151644, 872, 198],
  response_ids: [9707, 151645, 198, 151644, 22],
  response_mask: [1, 1, 0, 0, 1],
  rollout_log_probs: [-0.5, -0.25, 0, 0, -0.75],
  teacher_log_probs: [-1.5, -0.5, 0, 0, -2.5],
  reward_score: 1,
  num_turns: 4,
  truncated: false,
  finish_reason: "stop",
  error: null,
  metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
  extra_fields: {},
};

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-inspect-teacher-"));
  const kept = { ...rec, key: "t-2_0_0", uid: "t-2", teacher_log_probs: undefined, extra_fields: { teacher_error: "rollout.teacher (vllm at http://t) could not score output 0: down" } };
  writeFileSync(join(dir, "rollouts.jsonl"), [rec, kept].map((r) => JSON.stringify(r)).join("\n") + "\n");
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("the summary gives the teacher's and the rollout's mean log-prob over the 3 sampled tokens", () => {
  // (−1.5 − 0.5 − 2.5) / 3 = −1.5; (−0.5 − 0.25 − 0.75) / 3 = −0.5
  expect(teacherSummary(rec)).toBe("teacher lp mean=-1.5000 (rollout -0.5000)");
  expect(summaryLine(rec).endsWith("  teacher lp mean=-1.5000 (rollout -0.5000)")).toBe(true);
  const { teacher_log_probs: _t, ...plain } = rec;
  expect(teacherSummary(plain as TrajectoryRecord)).toBeNull();
  expect(summaryLine(plain as TrajectoryRecord)).not.toContain("teacher");
});

test("edgeloop inspect prints it; a record kept without teacher log-probs shows the teacher's error", () => {
  const run = (key: string) => Bun.spawnSync(["node", BIN, "inspect", key, "--file", "rollouts.jsonl", "--no-color", "--no-prompt"], { cwd: dir, stdout: "pipe", stderr: "pipe" });
  const a = run("t-1_0_0");
  expect(a.exitCode).toBe(0);
  expect(a.stdout.toString().trimEnd().split("\n").at(-1)).toBe(
    "t-1_0_0  agent=tool_agent  reward=1  turns=4  finish=stop  truncated=no  tokens prompt=3 sampled=3 observation=2  teacher lp mean=-1.5000 (rollout -0.5000)",
  );
  const b = run("t-2_0_0");
  expect(b.stdout.toString().trimEnd().split("\n").at(-1)).toEndWith('  teacher_error="rollout.teacher (vllm at http://t) could not score output 0: down"');
});
