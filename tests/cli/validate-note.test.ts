import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HANG_MS } from "../helpers/bounds.ts";

// `rollout --validate --n 4` samples val_kwargs.n (verl's validation), not 4: the start lines say so.
const ROOT = join(import.meta.dir, "..", "..");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-valnote-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

test("--validate with --n other than val_kwargs.n prints a note naming both; the batch runs val_kwargs.n", () => {
  writeFileSync(join(dir, "one.jsonl"), readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[0] + "\n");
  const run = (args: string[]) => Bun.spawnSync([process.execPath, join(ROOT, "infra", "cli", "main.ts"), "rollout", "--data", "one.jsonl", "--no-progress", ...args], { cwd: dir, stdout: "pipe", stderr: "pipe" });
  const r = run(["--validate", "--n", "4", "--out", "v.jsonl"]);
  expect(r.exitCode).toBe(0);
  const err = r.stderr.toString();
  expect(err).toMatch(/batch      [0-9a-f-]+: 1 rows x n=1 -> 1 trajectories\n/);
  expect(err).toContain("note       --validate samples rollout.val_kwargs.n = 1 per row (verl's val_kwargs); --n 4 is the training n (set rollout.val_kwargs.n in --config to change it)\n");
  expect(readFileSync(join(dir, "v.jsonl"), "utf8").trim().split("\n").length).toBe(1);
  // Without --validate, or with --n equal to val_kwargs.n, no note.
  expect(run(["--n", "4"]).stderr.toString()).not.toContain("note ");
  expect(run(["--validate", "--n", "1"]).stderr.toString()).not.toContain("note ");
}, HANG_MS);
