import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, symlinkSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { HANG_MS } from "../helpers/bounds.ts";

// The README's image example, run exactly as written (embedded sim engine and example tools, no external
// services): every record carries multi_modal with the example PNG's grid and a span over its pads.
const ROOT = join(import.meta.dir, "..", "..");
const MAIN = join(ROOT, "infra", "cli", "main.ts");
// The command's paths are relative to the package root: it runs in a temp folder whose examples/ is the package's.
const dir = mkdtempSync(join(tmpdir(), "edgeloop-images-"));
symlinkSync(join(ROOT, "examples"), join(dir, "examples"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Rec {
  agent_name: string;
  prompt_ids: number[];
  response_ids: number[];
  response_mask: number[];
  reward_score: number | null;
  num_turns: number;
  error: string | null;
  multi_modal?: { image_token_id: number; vision_start_id: number; vision_end_id: number; images: { span: [number, number]; image_grid_thw: number[]; source: string; field: string; mime: string; width: number; height: number }[] };
}

test("README: the image example's command gives records whose multi_modal points at the image pads", async () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  const line = readme.split("\n").find((l) => l.startsWith("npx edgeloop rollout --model qwen3_vl"));
  expect(line).toBe("npx edgeloop rollout --model qwen3_vl --data examples/images.jsonl --script examples/policy-images.json --n 2 --out image-rollouts.jsonl");
  const args = line!.split(" ").slice(2);
  const p = Bun.spawn([process.execPath, MAIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe" });
  const [code, stderr] = await Promise.all([p.exited, new Response(p.stderr).text()]);
  expect({ code, stderr: code === 0 ? "" : stderr }).toEqual({ code: 0, stderr: "" });
  const records = readFileSync(join(dir, "image-rollouts.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l) as Rec);
  expect(records).toHaveLength(4);
  expect(records.map((r) => r.agent_name).sort()).toEqual(["single_turn_agent", "single_turn_agent", "tool_agent", "tool_agent"]);
  for (const r of records) {
    expect(r.error).toBeNull();
    expect(r.reward_score).toBe(1);
    const mm = r.multi_modal!;
    expect(mm.images).toHaveLength(1);
    const img = mm.images[0]!;
    // 64x48 scaled up to Qwen3-VL's min pixels: 224x320 → [1, 14, 20] → 70 pads.
    expect([img.image_grid_thw, img.mime, img.width, img.height, img.source]).toEqual([[1, 14, 20], "image/png", 64, 48, "prompt"]);
    expect(img.field).toBe(r.agent_name === "tool_agent" ? "prompt[1].content[0].image" : "prompt[0].content[0].image");
    const [s, e] = img.span;
    expect(e - s).toBe(70);
    expect(r.prompt_ids[s - 1]).toBe(mm.vision_start_id);
    expect(r.prompt_ids[e]).toBe(mm.vision_end_id);
    expect(r.prompt_ids.slice(s, e).every((x) => x === mm.image_token_id)).toBe(true);
    expect(r.num_turns).toBe(r.agent_name === "tool_agent" ? 4 : 2);
  }
}, HANG_MS);
