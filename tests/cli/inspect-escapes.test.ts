import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { renderTrajectory, summaryLine } from "../../infra/cli/inspect-command.ts";
import { terminalSafe, terminalSafeJson } from "../../infra/cli/terminal-text.ts";
import { TrajectoryRecord } from "../../shared/schema/index.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// S14: model/tool text printed by the CLI must not reach the terminal as control sequences.
const BIN = join(import.meta.dir, "..", "..", "bin", "edgeloop.mjs");
/** The audit's repro turn: OSC 0 (window title), ESC[2J (clear screen), OSC 52 (set clipboard). */
const HOSTILE = "hello \u001b]0;PWNED-TITLE\u0007\u001b[2J\u001b]52;c;ZWNobyBwd25lZA==\u0007 world";
const SHOWN = "hello \\x1b]0;PWNED-TITLE\\x07\\x1b[2J\\x1b]52;c;ZWNobyBwd25lZA==\\x07 world";
/** Characters a terminal acts on: C0 but \n and \t, DEL, C1, bidi controls. */
const RAW_CONTROL = /[\u0000-\u0008\u000b-\u001a\u001c-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;
const ESC = "\u001b";

describe("terminalSafe", () => {
  test("escapes C0 (not newline/tab), DEL, C1 and bidi controls; leaves other text as is", () => {
    expect(terminalSafe(HOSTILE)).toBe(SHOWN);
    expect(terminalSafe("a\nb\tc\rd\u0000e\u007ff\u009bg\u202eh\u2066i\u200fj é 🙂")).toBe("a\nb\tc\\rd\\x00e\\x7ff\\x9bg\\u202eh\\u2066i\\u200fj é 🙂");
    expect(terminalSafe("a\nb\tc", { newlines: false })).toBe("a\\nb\\tc");
    expect(terminalSafeJson(JSON.stringify({ t: "x\u009b\u202ey\u001b" }))).toBe('{"t":"x\\u009b\\u202ey\\u001b"}');
    expect(JSON.parse(terminalSafeJson(JSON.stringify({ t: "x\u009b\u202ey" })))).toEqual({ t: "x\u009b\u202ey" });
  });
});

describe("edgeloop inspect: the audit's repro (sim script turn with OSC/CSI sequences, rollout --out, inspect --file)", () => {
  let dir: string;
  let key: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "edgeloop-s14-"));
    writeFileSync(join(dir, "s.json"), JSON.stringify({ seed: 1, rules: [], default: [HOSTILE] }));
    writeFileSync(join(dir, "rows.jsonl"), JSON.stringify({ prompt: [{ role: "user", content: `say hi \u001b[31mred\u009b1m \u202eevil` }] }) + "\n");
    const r = Bun.spawnSync(["node", BIN, "rollout", "--data", "rows.jsonl", "--n", "1", "--script", "s.json", "--out", "out.jsonl", "--no-progress"], { cwd: dir, stdout: "pipe", stderr: "pipe" });
    expect(r.exitCode).toBe(0);
    const rec = TrajectoryRecord.parse(JSON.parse(readFileSync(join(dir, "out.jsonl"), "utf8").trim().split("\n")[0]!));
    key = rec.key;
  }, HANG_MS);
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const inspect = (args: string[]) => {
    const p = Bun.spawnSync(["node", BIN, "inspect", key, "--file", "out.jsonl", ...args], { cwd: dir, stdout: "pipe", stderr: "pipe" });
    return { code: p.exitCode, stdout: p.stdout.toString() };
  };

  test("text output: the sequences are shown escaped, with stdout redirected and with --color", () => {
    for (const args of [[], ["--color"]]) {
      const { code, stdout } = inspect(args);
      expect(code).toBe(0);
      expect(stdout).toContain(SHOWN);
      expect(stdout).toContain("say hi \\x1b[31mred\\x9b1m \\u202eevil");
      expect(RAW_CONTROL.test(stdout)).toBe(false);
      // Only edgeloop's own colour codes (ESC [ digits ; m) remain, and only with --color.
      const escs = stdout.split(ESC).slice(1);
      expect(escs.every((s) => /^\[[0-9;]*m/.test(s))).toBe(true);
      expect(escs.length > 0).toBe(args.length > 0);
    }
  }, HANG_MS);

  test("--json output: the same record as JSON, no raw C1 or bidi character", () => {
    const { code, stdout } = inspect(["--json"]);
    expect(code).toBe(0);
    expect(RAW_CONTROL.test(stdout)).toBe(false);
    expect(stdout.includes(ESC)).toBe(false);
    const rec = TrajectoryRecord.parse(JSON.parse(stdout));
    expect(rec.key).toBe(key);
  }, HANG_MS);
});

describe("other CLI text of records", () => {
  const rec = TrajectoryRecord.parse({
    key: "u_0_0",
    uid: "u",
    session_id: 0,
    output_index: 0,
    agent_name: "tool_agent",
    data_source: "x",
    prompt_ids: [1],
    response_ids: [2, 3],
    response_mask: [1, 0],
    rollout_log_probs: [-1, 0],
    reward_score: null,
    num_turns: 2,
    truncated: true,
    finish_reason: "length",
    error: "tool said \u001b]0;x\u0007\u009b\u202e",
    metrics: {},
    extra_fields: { terminated_by: "tool \u001b[2J" },
  });
  test("renderTrajectory and the summary line escape pieces, errors and terminated_by", () => {
    const out = renderTrajectory(rec, { prompt: ["\u001b[2Jp"], response: ["a\u0007", "\u202eb"] }, { color: false });
    expect(RAW_CONTROL.test(out)).toBe(false);
    expect(out.includes(ESC)).toBe(false);
    expect(out).toContain("\\x1b[2Jp");
    expect(out).toContain("a\\x07");
    expect(out).toContain("\\u202eb");
    expect(summaryLine(rec)).toContain('error="tool said \\u001b]0;x\\u0007\\x9b\\u202e"');
  });
});
