import { describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { TrajectoryRecord as Rec } from "../../shared/schema/index.ts";
import { cliWorkdir } from "../helpers/cli-workdir.ts";
import { ROOT } from "../helpers/examples.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The README's agent-gateway command, run for real: `npx edgeloop rollout --agent example --data … --out …`,
// compared with the same rows through tool_agent (rows whose policy makes only well-formed calls: there the
// example agent executes the same tools with the same texts, so the token streams must be identical).
const { edgeloop, readRecords } = cliWorkdir("edgeloop-agent-cli-", {
  setup(dir) {
    // Rows 0, 1, 2 (one well-formed calc call each) and 3 (a lookup, then calc).
    const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 4);
    writeFileSync(join(dir, "rows.jsonl"), rows.map((l, i) => JSON.stringify({ ...JSON.parse(l), uid: `row${i}` })).join("\n") + "\n");
  },
});

const records = (file: string): Rec[] => readRecords(file).records;

describe("rollout --agent example", () => {
  test("every row runs through openai_agent with the example agent; tokens equal tool_agent's", () => {
    const a = edgeloop(["rollout", "--data", "rows.jsonl", "--n", "2", "--agent", "example", "--out", "agent.jsonl", "--no-progress"]);
    expect(a.stderr).toContain("loops      openai_agent, openenv_agent, single_turn_agent, tool_agent (default openai_agent)");
    expect(a.stderr).toMatch(/agent      example agent \(openai SDK\) on http:\/\/127\.0\.0\.1:\d+\/tasks/);
    expect(a.code).toBe(0);
    const t = edgeloop(["rollout", "--data", "rows.jsonl", "--n", "2", "--out", "tool.jsonl", "--no-progress"]);
    expect(t.code).toBe(0);
    const byKey = (rs: Rec[]) => new Map(rs.map((r) => [r.key, r]));
    const ra = byKey(records("agent.jsonl"));
    const rt = byKey(records("tool.jsonl"));
    expect([...ra.keys()].sort()).toEqual(["row0_0_0", "row0_1_0", "row1_0_0", "row1_1_0", "row2_0_0", "row2_1_0", "row3_0_0", "row3_1_0"]);
    for (const [k, r] of ra) {
      const ref = rt.get(k)!;
      expect(r.agent_name).toBe("openai_agent");
      expect(r.error).toBeNull();
      expect(r.prompt_ids).toEqual(ref.prompt_ids);
      expect(r.response_ids).toEqual(ref.response_ids);
      expect(r.response_mask).toEqual(ref.response_mask);
      expect(r.rollout_log_probs).toEqual(ref.rollout_log_probs);
      expect(r.reward_score).toBe(ref.reward_score);
      expect(r.num_turns).toBe(ref.num_turns);
      expect((r.extra_fields as { agent_metadata?: { steps?: number } }).agent_metadata?.steps).toBe(ref.num_turns / 2);
    }
  }, HANG_MS);

  test("serve refuses --agent example naming the flag (exit 2)", () => {
    const r = edgeloop(["serve", "--port", "0", "--agent", "example"]);
    expect(r.code).toBe(2);
    expect(r.stderr.trim()).toBe(
      "edgeloop: config --agent: 'example' starts the example agent inside `edgeloop rollout` only; for serve, start it with `edgeloop agent-example --port P` and pass --agent http://127.0.0.1:P/tasks",
    );
  });
});
