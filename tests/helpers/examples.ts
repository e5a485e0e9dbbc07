import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { ToolSchema } from "../../shared/schema/index.ts";
import { parseToolsFile } from "../../shared/tools/tools-file.ts";

/** The repository's root directory (no trailing slash). */
export const ROOT = join(import.meta.dir, "..", "..");

/** A fresh parse of the example policy script (examples/policy.json) for the sim engine. */
export function examplePolicy(): Record<string, unknown> {
  return JSON.parse(readFileSync(join(ROOT, "examples", "policy.json"), "utf8"));
}

/** Row `i` (0-based) of examples/gsm8k-tool.jsonl, parsed fresh. @throws when the file has no such row. */
export function exampleRow(i: number): any {
  const line = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n")[i];
  if (!line) throw new Error(`examples/gsm8k-tool.jsonl has no row ${i}`);
  return JSON.parse(line);
}

/** The tool schemas of infra/tools/tools.example.json, its `{port}` placeholders set to `port` (default 1: never called). */
export function exampleToolSchemas(port = 1): ToolSchema[] {
  return parseToolsFile(readFileSync(join(ROOT, "infra", "tools", "tools.example.json"), "utf8"), { vars: { port } }).tools.map((t) => t.schema);
}

/** Every row of examples/gsm8k-tool.jsonl, parsed fresh, in file order. */
export function exampleRows(): any[] {
  return readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8")
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l));
}
