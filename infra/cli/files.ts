import { isBuiltinModel } from "../../shared/models/index.ts";
import { readFile } from "node:fs/promises";
import { dirname, extname, isAbsolute, resolve } from "node:path";
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
 * Makes the paths inside a config file relative to the file's own directory
 * (not the working directory), so a config works wherever it is run from:
 * `engine.script` (and each `engine.pools.{name}.script`), `tools.file`, `rollout.agent.agent_loop_config_path` and
 * `model` (except the built-in name `qwen3`). Absolute paths, URLs and
 * non-strings are left alone. Returns a new object.
 */
export function resolveConfigPaths(raw: unknown, configPath: string): unknown {
  if (!isObject(raw)) return raw;
  const dir = dirname(resolve(configPath));
  const fix = (v: unknown) => (typeof v === "string" && v !== "" && !isAbsolute(v) && !/^[a-z][a-z0-9+.-]*:\/\//i.test(v) ? resolve(dir, v) : v);
  const out: Record<string, unknown> = { ...raw };
  const section = (k: string, f: (o: Record<string, unknown>) => void) => {
    if (isObject(out[k])) {
      const copy = { ...out[k] };
      f(copy);
      out[k] = copy;
    }
  };
  section("engine", (e) => {
    if ("script" in e) e.script = fix(e.script);
    // Each engine pool is a whole engine section, with its own script.
    if (isObject(e.pools)) e.pools = Object.fromEntries(Object.entries(e.pools).map(([name, p]) => [name, isObject(p) && "script" in p ? { ...p, script: fix(p.script) } : p]));
  });
  section("tools", (t) => "file" in t && (t.file = fix(t.file)));
  section("rollout", (r) => {
    if (isObject(r.agent) && "agent_loop_config_path" in r.agent) r.agent = { ...r.agent, agent_loop_config_path: fix(r.agent.agent_loop_config_path) };
  });
  // A built-in model name is a name, not a path (write `./gemma3` for a directory of that name).
  if (typeof out.model === "string" && !isBuiltinModel(out.model)) out.model = fix(out.model);
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/** File extensions `--data` accepts. */
export const DATA_EXTENSIONS = [".jsonl", ".ndjson", ".json", ".parquet"] as const;

/** A `.jsonl` line that is not JSON: its row is kept as a string (so it fails alone) and reported. */
export interface BadDataLine {
  /** 1-based line number in the file. */
  line: number;
  /** Index of the row it became (`rows[i]` in row errors; blank lines are not rows). */
  row: number;
  /** The JSON parser's message. */
  error: string;
}

/**
 * {@link readRows} plus the `.jsonl` lines that are not JSON, with their
 * line numbers and row indices, for start-up warnings.
 * @throws InputError (field `--data`) when the file cannot be read or its extension is not one of {@link DATA_EXTENSIONS}.
 */
export async function readDataFile(path: string): Promise<{ rows: unknown[]; badLines: BadDataLine[] }> {
  const ext = extname(path).toLowerCase();
  if (!(DATA_EXTENSIONS as readonly string[]).includes(ext)) {
    throw new InputError("--data", `${path}: unknown file type '${ext || "(no extension)"}'; accepted: ${DATA_EXTENSIONS.join(", ")}`);
  }
  let buf: Buffer;
  try {
    buf = await readFile(path);
  } catch (e) {
    throw new InputError("--data", `cannot read ${path}: ${(e as Error).message}`);
  }
  if (ext === ".parquet") {
    try {
      const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength) as ArrayBuffer;
      const rows = await parquetReadObjects({ file: ab });
      return { rows: rows.map(jsonColumns), badLines: [] };
    } catch (e) {
      throw new InputError("--data", `${path} is not a readable Parquet file: ${(e as Error).message}`);
    }
  }
  const text = buf.toString("utf8");
  if (ext === ".json") {
    try {
      const v = JSON.parse(text);
      if (!Array.isArray(v)) throw new Error("expected an array of rows");
      return { rows: v, badLines: [] };
    } catch (e) {
      throw new InputError("--data", `${path}: ${(e as Error).message}`);
    }
  }
  const rows: unknown[] = [];
  const badLines: BadDataLine[] = [];
  for (const [i, raw] of text.split("\n").entries()) {
    const l = raw.trim();
    if (!l) continue;
    try {
      rows.push(JSON.parse(l));
    } catch (e) {
      badLines.push({ line: i + 1, row: rows.length, error: (e as Error).message });
      rows.push(l);
    }
  }
  return { rows, badLines };
}

/**
 * Reads dataset rows: `.jsonl`/`.ndjson` (one JSON object a line; blank lines skipped),
 * `.json` (an array) or verl-style `.parquet` (read with hyparquet; JSON
 * columns come back as objects). Rows are not validated here: each is
 * validated on its own so that one bad row fails only its trajectories; a
 * line that is not JSON is passed on as its text, so that row fails ("expected object") and the rest run.
 * @throws InputError (field `--data`) when the file cannot be read at all or its extension is unknown.
 */
export async function readRows(path: string): Promise<unknown[]> {
  return (await readDataFile(path)).rows;
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
