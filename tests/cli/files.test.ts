import { describe, expect, test } from "bun:test";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readConfigFile, readRows } from "../../infra/cli/files.ts";
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
