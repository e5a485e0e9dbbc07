import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HANG_MS } from "../helpers/bounds.ts";

// `--engine-format` with the embedded simulated engine and one replica (issue 18 item 10: accepted and
// ignored before — every call went to the engine directly). Now a named format other than the default
// sends every call through that format's client and the sim's HTTP app (in-process), so the run
// exercises the wire form; the trajectories equal the direct calls' token for token.
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-simfmt-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const data = join(dir, "rows.jsonl");
writeFileSync(data, readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").split("\n").slice(0, 6).join("\n") + "\n");

interface Rec {
  uid: string;
  session_id: number;
  prompt_ids: number[];
  response_ids: number[];
  response_mask: number[];
  rollout_log_probs: number[];
  routed_experts?: number[];
  routed_experts_shape?: number[];
}

async function rollout(name: string, args: string[]): Promise<{ records: Rec[]; stderr: string }> {
  const out = join(dir, `${name}.jsonl`);
  const p = Bun.spawn([process.execPath, MAIN, "rollout", "--data", data, "--n", "2", "--seed", "7", "--out", out, ...args], { stdout: "pipe", stderr: "pipe" });
  const [code, stderr] = await Promise.all([p.exited, new Response(p.stderr).text()]);
  expect({ code, stderr: code === 0 ? "" : stderr }).toEqual({ code: 0, stderr: "" });
  const records = readFileSync(out, "utf8").trim().split("\n").map((l) => JSON.parse(l) as Rec);
  // uids are fresh per run: order by the prompt, then session_id.
  const key = (r: Rec) => `${r.prompt_ids.join(",")}#${String(r.session_id).padStart(4, "0")}`;
  records.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
  return { records, stderr };
}

const tokens = (r: Rec) => ({ session_id: r.session_id, prompt_ids: r.prompt_ids, response_ids: r.response_ids, response_mask: r.response_mask, rollout_log_probs: r.rollout_log_probs });

describe("--engine-format with one simulated replica", () => {
  test("sglang and vllm-generate go over their wire form in-process; the records equal the direct calls'", async () => {
    const direct = await rollout("direct", []);
    expect(direct.stderr).toContain("engine     simulated, in-process (script");
    expect(direct.records.length).toBe(12);
    for (const format of ["sglang", "vllm-generate"]) {
      const wire = await rollout(format, ["--engine-format", format]);
      expect(wire.stderr).toContain(`engine     simulated, in-process over the ${format} wire format (script`);
      expect(wire.records.map(tokens)).toEqual(direct.records.map(tokens));
    }
  }, HANG_MS);

  test("sglang over the wire returns routed experts with the sim's MoE shape (base64 int32 decoded)", async () => {
    const cfg = join(dir, "experts.yaml");
    writeFileSync(cfg, "rollout: {return_routed_experts: true}\nengine: {format: sglang, moe: {layers: 3, top_k: 2}}\n");
    const wire = await rollout("experts", ["--config", cfg]);
    const direct = await rollout("experts-direct", ["--config", (writeFileSync(join(dir, "d.yaml"), "rollout: {return_routed_experts: true}\nengine: {moe: {layers: 3, top_k: 2}}\n"), join(dir, "d.yaml"))]);
    expect(wire.records[0]!.routed_experts_shape).toEqual([3, 2]);
    const r = wire.records[0]!;
    expect(r.routed_experts!.length).toBe((r.prompt_ids.length + r.response_ids.length) * 6);
    expect(wire.records.map((x) => x.routed_experts)).toEqual(direct.records.map((x) => x.routed_experts));
  }, HANG_MS);
});
