import { readFile } from "node:fs/promises";
import { dirname, resolve } from "node:path";

/**
 * Reads a scripted policy file (`--script`, `engine.script`) as a JSON object.
 * A file may name another with `"extends": "other.json"` (resolved against its
 * own folder): the result is the other file's script with this file's keys
 * on top, and `rules` = this file's rules, then the other's — the first
 * matching rule wins, so this file's rules override the prompts they match
 * (e.g. `examples/policy-dapo.json` gives some of `examples/policy.json`'s
 * prompts sample variants). Chains are followed; a cycle is an error.
 * Validation is the sim engine's (`parseSimScript`), on the merged object.
 * @throws Error with the path for an unreadable file, invalid JSON, a non-object,
 *   a non-string `extends`, or a cycle.
 */
export async function readSimScriptFile(path: string, seen: readonly string[] = []): Promise<Record<string, unknown>> {
  const abs = resolve(path);
  if (seen.includes(abs)) throw new Error(`extends cycle: ${[...seen, abs].join(" -> ")}`);
  const value = JSON.parse(await readFile(abs, "utf8")) as unknown;
  if (value === null || typeof value !== "object" || Array.isArray(value)) throw new Error(`${abs}: a script is a JSON object`);
  const { extends: base, ...own } = value as Record<string, unknown>;
  if (base === undefined) return own;
  if (typeof base !== "string" || base === "") throw new Error(`${abs}: extends must be a file path (a string)`);
  const parent = await readSimScriptFile(resolve(dirname(abs), base), [...seen, abs]);
  const rules = [...(Array.isArray(own.rules) ? own.rules : []), ...(Array.isArray(parent.rules) ? parent.rules : [])];
  return { ...parent, ...own, rules };
}
