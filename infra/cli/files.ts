import { readFile } from "node:fs/promises";
import { extname } from "node:path";
import { parse as parseYaml } from "yaml";
import { parquetReadObjects } from "hyparquet";
import { ConfigError, InputError } from "../../shared/errors.ts";

/**
 * Reads a config file (YAML or JSON; JSON is valid YAML) into a plain object.
 * @throws ConfigError naming the file when it is missing or does not parse.
 */
export async function readConfigFile(path: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    throw new ConfigError("--config", `cannot read ${path}: ${(e as Error).message}`);
  }
  try {
    return parseYaml(text) ?? {};
  } catch (e) {
    throw new ConfigError("--config", `${path} is not valid YAML/JSON: ${(e as Error).message}`);
  }
}

/**
 * Reads dataset rows: `.jsonl` (one JSON object a line; blank lines skipped),
 * `.json` (an array) or verl-style `.parquet` (read with hyparquet; JSON
 * columns come back as objects). Rows are not validated here: each is
 * validated on its own so that one bad row fails only its trajectories; a
 * line that is not JSON is passed on as its text, so that row fails ("expected object") and the rest run.
 * @throws InputError (field `--data`) when the file cannot be read at all.
 */
export async function readRows(path: string): Promise<unknown[]> {
  let buf: Buffer;
  try {
    buf = await readFile(path);
  } catch (e) {
    throw new InputError("--data", `cannot read ${path}: ${(e as Error).message}`);
  }
  const ext = extname(path).toLowerCase();
  if (ext === ".parquet") {
    try {
      const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength) as ArrayBuffer;
      const rows = await parquetReadObjects({ file: ab });
      return rows.map(jsonColumns);
    } catch (e) {
      throw new InputError("--data", `${path} is not a readable Parquet file: ${(e as Error).message}`);
    }
  }
  const text = buf.toString("utf8");
  if (ext === ".json") {
    try {
      const v = JSON.parse(text);
      if (!Array.isArray(v)) throw new Error("expected an array of rows");
      return v;
    } catch (e) {
      throw new InputError("--data", `${path}: ${(e as Error).message}`);
    }
  }
  return text
    .split("\n")
    .map((l) => ({ l: l.trim() }))
    .filter(({ l }) => l.length > 0)
    .map(({ l }) => {
      try {
        return JSON.parse(l);
      } catch {
        return l;
      }
    });
}

/** Parquet files written by pandas often hold nested columns as JSON strings; parse those that look like JSON. */
function jsonColumns(row: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(row)) {
    if (typeof v === "string" && (k === "prompt" || k === "reward_model" || k === "extra_info") && /^[[{]/.test(v.trim())) {
      try {
        out[k] = JSON.parse(v);
        continue;
      } catch {
        /* keep the string; the row schema will name the field */
      }
    }
    out[k] = typeof v === "bigint" ? Number(v) : v;
  }
  return out;
}
