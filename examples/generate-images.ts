/**
 * Writes the image example (deterministic; rerun after editing):
 * `bun examples/generate-images.ts`.
 *
 * - `images.jsonl`: two rows whose prompts hold a small PNG as a data URI
 *   (`{type: "image", image: "data:image/png;base64,…"}`, verl's row form):
 *   a `tool_agent` row that uses the calc tool and a `single_turn_agent` row.
 * - `policy-images.json`: the simulated engine's policy for them (it extends
 *   `policy.json`).
 *
 * Run with a vision-language family: `--model qwen3_vl` (README, *Images*).
 */
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import sharp from "sharp";

const DIR = import.meta.dir;
/** A solid 64×48 PNG (no metadata, so the bytes depend on the pixels only). */
async function png(r: number, g: number, b: number): Promise<string> {
  const bytes = await sharp({ create: { width: 64, height: 48, channels: 3, background: { r, g, b } } }).png({ compressionLevel: 9 }).toBuffer();
  return `data:image/png;base64,${bytes.toString("base64")}`;
}

const SYSTEM = "You are a careful assistant. Use the calc tool for arithmetic. End your reply with the final answer after '####'.";
const COUNT = "The picture is a grid of 4 rows of 6 tiles. How many tiles are there?";
const CORNERS = "The picture is one red rectangle. How many corners does it have?";

const rows = [
  {
    data_source: "edgeloop/images",
    agent_name: "tool_agent",
    prompt: [
      { role: "system", content: SYSTEM },
      { role: "user", content: [{ type: "image", image: await png(30, 90, 200) }, { type: "text", text: COUNT }] },
    ],
    reward_model: { style: "rule", ground_truth: "24" },
    extra_info: { index: 0, split: "train" },
  },
  {
    data_source: "edgeloop/images",
    agent_name: "single_turn_agent",
    prompt: [{ role: "user", content: [{ type: "image", image: await png(200, 30, 30) }, { type: "text", text: CORNERS }] }],
    reward_model: { style: "rule", ground_truth: "4" },
    extra_info: { index: 1, split: "train" },
  },
];
writeFileSync(join(DIR, "images.jsonl"), rows.map((r) => JSON.stringify(r)).join("\n") + "\n");

const policy = {
  extends: "policy.json",
  rules: [
    {
      when: COUNT,
      turns: [
        '<think>\nThe grid has 4 rows of 6 tiles: 4*6.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "4*6"}}\n</tool_call>',
        "<think>\nThe tool says 24.\n</think>\n\nThere are 24 tiles.\n#### 24",
      ],
    },
    { when: CORNERS, turns: ["<think>\nA rectangle has 4 corners.\n</think>\n\nIt has 4 corners.\n#### 4"] },
  ],
};
writeFileSync(join(DIR, "policy-images.json"), JSON.stringify(policy, null, 1) + "\n");
