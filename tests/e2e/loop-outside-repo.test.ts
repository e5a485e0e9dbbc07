import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HANG_MS } from "../helpers/bounds.ts";

// docs/custom-agent-loop.md's complete loop, copied verbatim into a directory outside the repo (no
// node_modules there), imports edgeloop as `edgeloop/shared/...`, is registered through
// rollout.agent.agent_loop_config_path and runs from `edgeloop rollout --config`.
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-own-loop-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The ```ts block that follows `heading` in the doc. */
function docBlock(doc: string, heading: string): string {
  const at = doc.indexOf(heading);
  expect(at).toBeGreaterThan(-1);
  const m = /```ts\n([\s\S]*?)```/.exec(doc.slice(at));
  return m![1]!;
}

test("the documented loop, in a temp dir outside the repo, runs through --config (num_turns 4 per trajectory)", () => {
  const doc = readFileSync(join(ROOT, "docs", "custom-agent-loop.md"), "utf8");
  const code = docBlock(doc, "## 2. A complete loop");
  expect(code).toContain('from "edgeloop/agent-loop"');
  writeFileSync(join(dir, "self-check-loop.ts"), code);
  writeFileSync(join(dir, "agent-loops.yaml"), "- name: self_check_agent\n  module: ./self-check-loop.ts\n  export: SelfCheckAgentLoop\n");
  writeFileSync(
    join(dir, "config.json"),
    JSON.stringify({ rollout: { agent: { agent_loop_config_path: "agent-loops.yaml", default_agent_loop: "self_check_agent" } } }),
  );
  // The example rows name tool_agent; without agent_name they run the default loop, the custom one.
  const rows = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 2).map((l) => ({ ...JSON.parse(l), agent_name: undefined }));
  writeFileSync(join(dir, "rows.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
  const p = Bun.spawnSync([process.execPath, MAIN, "rollout", "--config", "config.json", "--data", "rows.jsonl", "--n", "1", "--out", "out.jsonl", "--no-progress"], {
    cwd: dir,
    stdout: "pipe",
    stderr: "pipe",
    env: { ...process.env, NO_COLOR: "1" },
    timeout: HANG_MS,
  });
  expect({ code: p.exitCode, stderr: p.stderr.toString() }).toMatchObject({ code: 0 });
  const recs = readFileSync(join(dir, "out.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l));
  expect(recs.map((r) => [r.error, r.agent_name, r.num_turns])).toEqual([
    [null, "self_check_agent", 4],
    [null, "self_check_agent", 4],
  ]);
}, HANG_MS);
