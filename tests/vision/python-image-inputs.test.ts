import { beforeAll, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import sharp from "sharp";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { ChatMessage } from "../../shared/schema/index.ts";
import { encodeRecord, validateRecord } from "../../shared/store/record-codec.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { appendImageObservation, buildMultimodalPromptIds, encodeImageObservation, imageObservationEncoder, multiModalField, resolveImages } from "../../shared/vision/multimodal-tokens.ts";

// The Python reader (clients/python) on a record edgeloop wrote: decode_record + image_inputs give back the grids and spans.
const PKG = join(import.meta.dir, "..", "..", "clients", "python");
const PY = process.env.EDGELOOP_PYTHON ?? (existsSync("/usr/bin/python3") ? "/usr/bin/python3" : "python3");

function numpyMissing(): string | null {
  const p = Bun.spawnSync([PY, "-c", "import numpy"], { stdout: "pipe", stderr: "pipe" });
  const why = p.exitCode === 0 ? null : `${PY} cannot import numpy`;
  if (why && process.env.CI) throw new Error(`CI is set and the Python image test cannot run: ${why}`);
  if (why) console.warn(`skipping the Python image test: ${why}`);
  return why;
}
const missing = numpyMissing();

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await builtinTokenizer("qwen3_vl");
});

const png = (w: number, h: number) => sharp({ create: { width: w, height: h, channels: 3, background: "blue" } }).png().toBuffer();

describe("the Python reader's image_inputs", () => {
  test.skipIf(missing !== null)("reconstructs every image's grid, span and inline bytes from a stored record (a prompt image and a tool image)", async () => {
    const small = await png(64, 48);
    const prompt = [ChatMessage.parse({ role: "user", content: [{ type: "image", image: `data:image/png;base64,${small.toString("base64")}` }, { type: "text", text: "Zoom in." }] })];
    const pImgs = await resolveImages(tok, prompt, { prefix: "prompt" });
    const p = buildMultimodalPromptIds(tok, prompt, pImgs, { promptLength: 2048 });
    const b = new TrajectoryBuilder({ promptIds: p.promptIds, responseLength: 4096, maxModelLen: 40960, trackLogProbs: false });
    b.appendAction([32, 151645]);
    // Noise: a file over the 64 KiB inline cap, so the record carries its hash only.
    const big = await sharp({ create: { width: 700, height: 500, channels: 3, background: "black", noise: { type: "gaussian", mean: 128, sigma: 40 } } }).jpeg({ quality: 100 }).toBuffer();
    expect(big.length).toBeGreaterThan(64 * 1024);
    const tool = [ChatMessage.parse({ role: "tool", content: [{ type: "image", image: `data:image/jpeg;base64,${big.toString("base64")}` }] })];
    const oImgs = await resolveImages(tok, tool, { prefix: "turn[1].tool" });
    const obs = appendImageObservation(b, encodeImageObservation(imageObservationEncoder(tok), tok, tool, oImgs, 151645, b.contextLength));
    const images = [...p.images, ...obs.images];
    const rec = validateRecord({
      key: "vl-1_0_0", uid: "vl-1", session_id: 0, output_index: 0, agent_name: "tool_agent", data_source: "t",
      prompt_ids: p.promptIds, response_ids: b.responseIds(), response_mask: b.responseMask(), rollout_log_probs: null,
      reward_score: null, num_turns: 3, truncated: false, finish_reason: "stop", error: null,
      metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: {},
      multi_modal: multiModalField(tok, images),
    });
    const hash = encodeRecord(rec);
    const script = [
      "import json, sys, hashlib",
      `sys.path.insert(0, ${JSON.stringify(PKG)})`,
      "from edgeloop import decode_record, image_inputs",
      "rec = decode_record(json.loads(sys.stdin.read()))",
      "mm = image_inputs(rec)",
      "print(json.dumps({'grid': mm['image_grid_thw'].tolist(), 'spans': mm['image_spans'].tolist(), 'dtype': str(mm['image_grid_thw'].dtype),",
      "  'sha': [hashlib.sha256(i['data']).hexdigest() if i['data'] is not None else None for i in mm['images']], 'source': [i['source'] for i in mm['images']], 'pad': mm['image_token_id'],",
      "  'none': image_inputs({'key': 'k'}) is None}))",
    ].join("\n");
    const run = Bun.spawnSync([PY, "-c", script], { stdin: Buffer.from(JSON.stringify(hash)), stdout: "pipe", stderr: "pipe" });
    expect(run.exitCode, run.stderr.toString()).toBe(0);
    const got = JSON.parse(run.stdout.toString());
    expect(got).toEqual({
      grid: images.map((i) => i.image_grid_thw),
      spans: images.map((i) => i.span),
      dtype: "int64",
      sha: [images[0]!.sha256, null],
      source: ["prompt", "tool"],
      pad: 151655,
      none: true,
    });
    // 64x48: 64·64 < 256², so β = √(65536 / 3072): ⌈48β / 32⌉ = 7, ⌈64β / 32⌉ = 10 → [1, 14, 20]. 700x500: round(15.625) = 16, round(21.875) = 22 → [1, 32, 44].
    expect(images.map((i) => i.image_grid_thw)).toEqual([[1, 14, 20], [1, 32, 44]]);
    expect(images[1]!.data).toBeUndefined();

    // A corrupted span is refused, naming the field.
    const bad = JSON.parse(hash.meta);
    bad.multi_modal.images[1].span = [bad.multi_modal.images[1].span[0] + 1, bad.multi_modal.images[1].span[1] + 1];
    const run2 = Bun.spawnSync([PY, "-c", script.replace("mm = image_inputs(rec)", "mm = None\ntry:\n  image_inputs(rec)\nexcept Exception as e:\n  print(type(e).__name__, e.field, str(e)); sys.exit(0)")], {
      stdin: Buffer.from(JSON.stringify({ ...hash, meta: JSON.stringify(bad) })),
      stdout: "pipe",
      stderr: "pipe",
    });
    expect(run2.stdout.toString()).toStartWith("LayoutError multi_modal image 1: ids at span");
  });
});
