import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HANG_MS } from "../helpers/bounds.ts";

// The README's dynamic-sampling example, verbatim: the example data with examples/policy-dapo.json (10 prompts whose
// samples disagree) and examples/dapo.yaml (filter_groups). Groups with mixed rewards are delivered, the rest filtered;
// the figures repeat run to run (the variant draw ignores the fresh uids).
const ROOT = join(import.meta.dir, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-dapo-ex-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("rollout --config examples/dapo.yaml --script examples/policy-dapo.json: 9 groups delivered, 51 filtered", async () => {
  const out = join(dir, "dapo.jsonl");
  const p = Bun.spawn([process.execPath, join(ROOT, "infra", "cli", "main.ts"), "rollout", "--data", "examples/gsm8k-tool.jsonl", "--config", "examples/dapo.yaml", "--script", "examples/policy-dapo.json", "--out", out], {
    cwd: ROOT,
    stdout: "pipe",
    stderr: "pipe",
  });
  const [code, stdout] = await Promise.all([p.exited, new Response(p.stdout).text()]);
  expect(code).toBe(0);
  const line = (k: string) => stdout.split("\n").find((l) => l.startsWith(k))?.slice(k.length).trim();
  expect([line("target groups"), line("groups delivered"), line("  filtered (all equal)"), line("mean reward")]).toEqual(["60 (filter_groups)", "9", "51", "0.7417"]);
  // Every record is written (--out holds all 240); the delivered groups are exactly those whose 4 rewards differ.
  const groups = new Map<string, number[]>();
  for (const l of readFileSync(out, "utf8").trim().split("\n")) {
    const r = JSON.parse(l) as { uid: string; reward_score: number };
    groups.set(r.uid, [...(groups.get(r.uid) ?? []), r.reward_score]);
  }
  expect(groups.size).toBe(60);
  expect([...groups.values()].filter((v) => new Set(v).size > 1).length).toBe(9);
}, HANG_MS);
