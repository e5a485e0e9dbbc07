/**
 * Images benchmark (issue 33): the CPU edgeloop spends per image — reading
 * the data URI, the header, SHA-256, the processor's resize math, expanding
 * the placeholders and the engine's `image_data` URI; not the pixel work the
 * engine does — beside a text observation of the same token count through
 * the same encoder, and the bytes a record stores per image token (inline
 * up to 64 KiB per image, else referenced by sha256 only).
 *
 *   bun bench/images.ts [--reps 200]
 */
import sharp from "sharp";
import { imageDataUri } from "../shared/agent-loop/vision-prompt.ts";
import { builtinTokenizer } from "../shared/models/index.ts";
import { ChatMessage, type TrajectoryRecord } from "../shared/schema/index.ts";
import { encodeRecord, encodedFields } from "../shared/store/record-codec.ts";
import { encodeImageObservation, imageObservationEncoder, multiModalField, resolveImages } from "../shared/vision/multimodal-tokens.ts";
import { ObservationEncoder } from "../shared/tokens/observation.ts";
import { arg, median, printTable } from "./util.ts";

const REPS = Number(arg("--reps", "200"));
const tok = await builtinTokenizer("qwen3_vl");
const sizes: [number, number, "png" | "jpeg"][] = [
  [64, 48, "png"],
  [640, 480, "png"],
  [640, 480, "jpeg"],
  [1280, 960, "jpeg"],
  [1920, 1080, "jpeg"],
];

async function image(w: number, h: number, fmt: "png" | "jpeg"): Promise<string> {
  // Noise, so the encoded file has a realistic size (a flat colour compresses to nothing).
  const raw = Buffer.alloc(w * h * 3);
  let x = 12345;
  for (let i = 0; i < raw.length; i++) raw[i] = (x = (x * 1103515245 + 12345) >>> 0) >>> 24;
  const img = sharp(raw, { raw: { width: w, height: h, channels: 3 } });
  const buf = fmt === "png" ? await img.png().toBuffer() : await img.jpeg({ quality: 85 }).toBuffer();
  return `data:image/${fmt};base64,${buf.toString("base64")}`;
}

function timeUs(fn: () => unknown | Promise<unknown>): Promise<number> {
  return (async () => {
    const xs: number[] = [];
    for (let i = 0; i < 5; i++) await fn();
    for (let i = 0; i < REPS; i++) {
      const t = performance.now();
      await fn();
      xs.push((performance.now() - t) * 1000);
    }
    return median(xs);
  })();
}

const rows: string[][] = [["image", "file bytes", "image tokens", "image obs µs", "text obs µs (same tokens)", "ratio", "stored B / image token"]];
for (const [w, h, fmt] of sizes) {
  const uri = await image(w, h, fmt);
  const msgs = ChatMessage.array().parse([{ role: "tool", name: "zoom", content: [{ type: "image", image: uri }, { type: "text", text: "zoomed" }] }]);
  const enc = imageObservationEncoder(tok);
  const last = tok.tokenId("<|im_end|>")!;
  let tokens = 0;
  let stored = 0;
  const imgUs = await timeUs(async () => {
    const images = await resolveImages(tok, msgs, { prefix: "turn[1].tool" });
    const obs = encodeImageObservation(enc, tok, msgs, images, last, 1000, "turn[1].tool");
    tokens = images[0]!.grid.tokens;
    imageDataUri(images[0]!);
    return obs;
  });
  // A text observation of as many tokens, through the same (render-path) encoder and the default (formula) one.
  const words = Array.from({ length: tokens }, (_, i) => ` w${i % 97}`).join("");
  const text = ChatMessage.array().parse([{ role: "tool", name: "zoom", content: words }]);
  const formula = new ObservationEncoder(tok, {});
  const textUs = await timeUs(() => formula.encode(text, last));
  // Bytes a record holds for the image: the record with the image minus the same record without it, per image token.
  const images = await resolveImages(tok, msgs, { prefix: "turn[1].tool" });
  const obs = encodeImageObservation(enc, tok, msgs, images, last, 4, "turn[1].tool");
  const base: TrajectoryRecord = {
    key: "img_0_0", uid: "img", session_id: 0, output_index: 0, agent_name: "tool_agent", data_source: "bench",
    prompt_ids: [1, 2, 3, 4], response_ids: obs.ids, response_mask: obs.ids.map(() => 0), rollout_log_probs: obs.ids.map(() => 0),
    reward_score: 1, num_turns: 2, truncated: false, finish_reason: "stop", error: null,
    metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: {},
  };
  const bytes = (r: TrajectoryRecord) => {
    const f = encodedFields(encodeRecord(r));
    let n = 0;
    for (let i = 0; i < f.length; i++) n += f[i]!.length;
    return n;
  };
  const textOnly = { ...base, response_ids: obs.ids.map(() => 9707) };
  stored = bytes({ ...base, multi_modal: multiModalField(tok, obs.images) }) - bytes(textOnly);
  const fileBytes = Math.round(((uri.length - uri.indexOf(",") - 1) * 3) / 4);
  rows.push([`${w}x${h} ${fmt}`, String(fileBytes), String(tokens), imgUs.toFixed(0), textUs.toFixed(0), (imgUs / textUs).toFixed(2), (stored / tokens).toFixed(1)]);
}
printTable(`Images (qwen3_vl, medians of ${REPS}): CPU per image observation vs a text observation of the same token count; record bytes per image token`, rows);
console.log("\nstored B / image token: the record's bytes with the image (multi_modal entry, inline base64 when the file is ≤ 64 KiB) minus a text-only record of the same token count (same ids array length).");
