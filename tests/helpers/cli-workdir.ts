import { afterAll, beforeAll } from "bun:test";
import { cpSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TrajectoryRecord } from "../../shared/schema/index.ts";
import { ROOT } from "./examples.ts";

/** The launcher `npx edgeloop` resolves to. */
export const BIN = join(ROOT, "bin", "edgeloop.mjs");

/** What one `edgeloop` run printed and how it exited (-1 when killed). */
export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** A temporary working directory for real `edgeloop` runs (see {@link cliWorkdir}). */
export interface CliWorkdir {
  /** The directory (read it inside a test or hook: it is created in beforeAll). */
  readonly dir: string;
  /** Runs `node bin/edgeloop.mjs …args` in the directory (NO_COLOR=1), synchronously. */
  edgeloop(args: string[]): CliRun;
  /** The JSONL file `file` (relative to the directory): its lines and each parsed as a TrajectoryRecord (throws on an invalid one). */
  readRecords(file: string): { lines: string[]; records: TrajectoryRecord[] };
}

/**
 * Registers beforeAll (a fresh `<tmp>/<prefix>XXXXXX` directory; with
 * `copyExamples`, the repository's examples/ copied into it; then `setup(dir)`)
 * and afterAll (the directory removed). Call it at a file's top level.
 */
export function cliWorkdir(prefix: string, opts: { copyExamples?: boolean; setup?: (dir: string) => void } = {}): CliWorkdir {
  let dir = "";
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), prefix));
    if (opts.copyExamples) cpSync(join(ROOT, "examples"), join(dir, "examples"), { recursive: true });
    opts.setup?.(dir);
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  return {
    get dir() {
      return dir;
    },
    edgeloop(args) {
      const p = Bun.spawnSync(["node", BIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
      return { code: p.exitCode ?? -1, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
    },
    readRecords(file) {
      const lines = readFileSync(join(dir, file), "utf8").trim().split("\n");
      return { lines, records: lines.map((l) => TrajectoryRecord.parse(JSON.parse(l))) };
    },
  };
}
