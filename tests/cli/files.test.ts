import { describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readConfigFile, readDataFile, readRows } from "../../infra/cli/files.ts";
import { badLineWarnings } from "../../infra/cli/rollout-command.ts";
import { ConfigError, InputError } from "../../shared/errors.ts";

const EX = join(import.meta.dir, "..", "..", "examples");
const tmp = mkdtempSync(join(tmpdir(), "edgeloop-files-"));

describe("readRows", () => {
  test("verl-style Parquet holds the same rows as the JSONL", async () => {
    const jsonl = await readRows(join(EX, "gsm8k-tool.jsonl"));
    const parquet = await readRows(join(EX, "gsm8k-tool.parquet"));
    expect(jsonl.length).toBe(60);
    expect(parquet).toEqual(jsonl);
  });

  test("blank lines are skipped; a line that is not JSON stays as its text so only that row fails", async () => {
    const f = join(tmp, "mixed.jsonl");
    writeFileSync(f, '{"prompt": [{"role": "user", "content": "a"}]}\n\n{oops\n');
    expect(await readRows(f)).toEqual([{ prompt: [{ role: "user", content: "a" }] }, "{oops"]);
  });

  test("readDataFile reports each line that is not JSON with its line number and row index", async () => {
    const f = join(tmp, "lines.jsonl");
    writeFileSync(f, '{"prompt": [{"role": "user", "content": "a"}]}\n\nhello world\n{oops\n');
    const { rows, badLines } = await readDataFile(f);
    expect(rows).toEqual([{ prompt: [{ role: "user", content: "a" }] }, "hello world", "{oops"]);
    expect(badLines.map(({ line, row }) => ({ line, row }))).toEqual([
      { line: 3, row: 1 },
      { line: 4, row: 2 },
    ]);
    expect(badLineWarnings("lines.jsonl", badLines)[0]).toBe(`warning    line 3 of lines.jsonl is not valid JSON: ${badLines[0]!.error}; that row (rows[1]) fails`);
  });

  test("at most 10 warnings about bad lines, then a count", () => {
    const bad = Array.from({ length: 13 }, (_, i) => ({ line: i + 1, row: i, error: "x" }));
    const w = badLineWarnings("d.jsonl", bad);
    expect(w.length).toBe(11);
    expect(w[9]).toBe("warning    line 10 of d.jsonl is not valid JSON: x; that row (rows[9]) fails");
    expect(w[10]).toBe("warning    3 more lines of d.jsonl are not valid JSON (13 in all); their rows fail");
  });

  test("an unknown extension is an InputError naming --data and the accepted ones", async () => {
    const f = join(tmp, "rows.csv");
    writeFileSync(f, "prompt\nhi\n");
    const e = await readRows(f).catch((x) => x);
    expect(e).toBeInstanceOf(InputError);
    expect(e.message).toBe(`--data: ${f}: unknown file type '.csv'; accepted: .jsonl, .ndjson, .json, .parquet`);
  });

  test("a missing file or a .json that is not an array is an InputError naming --data", async () => {
    await expect(readRows(join(tmp, "nope.jsonl"))).rejects.toBeInstanceOf(InputError);
    const f = join(tmp, "obj.json");
    writeFileSync(f, '{"rows": []}');
    const e = await readRows(f).catch((x) => x);
    expect(e).toBeInstanceOf(InputError);
    expect(e.field).toBe("--data");
  });
});

describe("readConfigFile", () => {
  test("YAML and JSON; a broken file is a ConfigError", async () => {
    const y = join(tmp, "c.yaml");
    writeFileSync(y, "rollout:\n  n: 3\n");
    expect(await readConfigFile(y)).toEqual({ rollout: { n: 3 } });
    const bad = join(tmp, "bad.yaml");
    writeFileSync(bad, "rollout: [\n");
    await expect(readConfigFile(bad)).rejects.toBeInstanceOf(ConfigError);
  });
});
