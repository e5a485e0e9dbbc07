import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { startSandboxProvider, type SandboxProvider } from "../../infra/sandbox/provider.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { BIN, cliWorkdir } from "../helpers/cli-workdir.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The sandbox example (examples/sandbox-*.json*, docs/environments.md "The example provider") through the real
// CLI on the embedded defaults (simulated engine, memory store), against the example provider on a free port:
// the temp copy of examples/sandbox-tools.json has its 8125 URLs pointed at that port.
// Started at load, before cliWorkdir's beforeAll rewrites the tools file with its URL.
const provider: SandboxProvider = startSandboxProvider({ port: 0 });
let tok: ChatTokenizer;
const wd = cliWorkdir("edgeloop-sandbox-example-", {
  copyExamples: true,
  setup: (dir) => {
    const file = join(dir, "examples", "sandbox-tools.json");
    writeFileSync(file, readFileSync(file, "utf8").replaceAll("http://127.0.0.1:8125/", `${provider.url}/`));
  },
});
beforeAll(async () => {
  tok = await defaultTokenizer();
});
afterAll(async () => {
  await provider.stop();
});

/** The value each trajectory writes and reads back, by row index then session id (examples/policy-sandbox.json, seed 5). */
const GUESSES = [
  ["6", "5"],
  ["10", "30"],
  ["3", "9"],
];

/** Runs `edgeloop …args` in the work directory without blocking this process (the provider answers from it). */
async function edgeloop(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const p = Bun.spawn(["node", BIN, ...args], { cwd: wd.dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, stdout, stderr };
}

describe("the sandbox example", () => {
  test("each trajectory writes a file in its own sandbox and reads back what it wrote; every sandbox is created once and released at the end", async () => {
    const run = await edgeloop(["rollout", "--data", "examples/sandbox-notes.jsonl", "--tools", "examples/sandbox-tools.json", "--script", "examples/policy-sandbox.json", "--n", "2", "--out", "sandbox.jsonl"]);
    expect(run.stderr + run.stdout).toContain("wrote 6 records to sandbox.jsonl");
    expect(run.code).toBe(0);
    expect(run.stderr + run.stdout).toContain(`sandbox    create ${provider.url}/sandboxes/create (first_use), lease ttl 30 s, lifetime 3630 s ≥ trajectory deadline 3600 s, ≤ 10/s (burst 2), ≤ 16 live\n`);

    const { records } = wd.readRecords("sandbox.jsonl");
    expect(records.length).toBe(6);
    const rows = readFileSync(join(wd.dir, "examples", "sandbox-notes.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l));
    for (const r of records) {
      expect(r.error).toBeNull();
      const text = tok.decode(r.response_ids, { skipSpecialTokens: false });
      // The tool observations, in order: the write's confirmation, then the read's file text.
      const observations = [...text.matchAll(/<tool_response>\n([\s\S]*?)\n<\/tool_response>/g)].map((m) => m[1]);
      const calls = [...text.matchAll(/<tool_call>\n([\s\S]*?)\n<\/tool_call>/g)].map((m) => JSON.parse(m[1]!) as { name: string; arguments: Record<string, string> });
      expect(calls.map((c) => c.name)).toEqual(["sbx_write", "sbx_read"]);
      const { path, content } = calls[0]!.arguments as { path: string; content: string };
      expect(calls[1]!.arguments).toEqual({ path: path! });
      expect(observations).toEqual([`Wrote ${content!.length} bytes to ${path}.`, content!]);
      const ef = r.extra_fields as Record<string, unknown>;
      expect((ef.sandbox as { lease_id: string }).lease_id).toBe(`${r.key}~1`);
      expect(ef.tool_calls).toBe(2);
      expect(ef.tool_errors).toBe(0);
      // The script's variant is drawn by session index: these are the guesses of seed 5; the rule reward is 1
      // exactly when the guess is the row's ground truth (a batch with mixed rewards).
      const index = (ef.trajectory_info as { sample_index: number }).sample_index;
      expect(content).toBe(GUESSES[index]![r.session_id]!);
      expect(ef.ground_truth).toBe(rows[index].reward_model.ground_truth);
      expect(r.reward_score).toBe(content === rows[index].reward_model.ground_truth ? 1 : 0);
    }
    expect(records.map((r) => r.reward_score).reduce((a, b) => a! + b!, 0)).toBe(2);
    const sandboxIds = records.map((r) => ((r.extra_fields as Record<string, unknown>).sandbox as { sandbox_id: string }).sandbox_id);
    expect(new Set(sandboxIds).size).toBe(6);

    const stats = provider.stats();
    expect({ created: stats.created, live: stats.live, creating: stats.creating, releases: stats.releases, destroyed_released: stats.destroyed_released, duplicate_creates: stats.duplicate_creates, tool_calls: stats.tool_calls }).toEqual({
      created: 6,
      live: 0,
      creating: 0,
      releases: 6,
      destroyed_released: 6,
      duplicate_creates: 0,
      tool_calls: 12,
    });
  }, HANG_MS);
});
