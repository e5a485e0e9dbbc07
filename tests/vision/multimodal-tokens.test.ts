import { beforeAll, describe, expect, test } from "bun:test";
import fc from "fast-check";
// sharp (devDependency) encodes real image files to read back.
import sharp from "sharp";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { InputError } from "../../shared/errors.ts";
import type { ChatMessage, ChatMessageInput, ToolSchema } from "../../shared/schema/index.ts";
import { ChatMessage as ChatMessageSchema, TrajectoryRecord } from "../../shared/schema/index.ts";
import { decodeRecord, encodeRecord, validateRecord } from "../../shared/store/record-codec.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import { readImageHeader } from "../../shared/vision/image-header.ts";
import { decodeDataUri, loadImage } from "../../shared/vision/image-source.ts";
import {
  appendImageObservation,
  buildMultimodalPromptIds,
  encodeImageObservation,
  expandImagePads,
  imageObservationEncoder,
  multiModalField,
  resolveImages,
  visionOf,
} from "../../shared/vision/multimodal-tokens.ts";

const IM_START = 151644, IM_END = 151645, NL = 198, VS = 151652, PAD = 151655, VE = 151653;
const USER = [IM_START, 872, NL];
const GEN = [IM_START, 77091, NL];

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await builtinTokenizer("qwen3_vl");
});

async function image(width: number, height: number, format: "png" | "jpeg" | "webp" | "gif" = "png", seed = 0): Promise<Buffer> {
  return sharp({ create: { width, height, channels: 3, background: { r: seed % 256, g: 40, b: 90 } } })[format]().toBuffer();
}
const uri = (b: Buffer, mime = "image/png") => `data:${mime};base64,${b.toString("base64")}`;
const msgs = (m: ChatMessageInput[]): ChatMessage[] => m.map((x) => ChatMessageSchema.parse(x));

describe("image headers", () => {
  test("dimensions of real PNG, JPEG, WebP and GIF files equal sharp's (sizes 1..1500)", async () => {
    await fc.assert(
      fc.asyncProperty(fc.integer({ min: 1, max: 1500 }), fc.integer({ min: 1, max: 1500 }), fc.constantFrom("png", "jpeg", "webp", "gif"), async (w, h, f) => {
        const b = await image(w, h, f as "png");
        const meta = await sharp(b).metadata();
        expect(readImageHeader(new Uint8Array(b), "x")).toEqual({ mime: `image/${f}` as never, width: meta.width!, height: meta.height! });
      }),
      { numRuns: 60, seed: 5 },
    );
  });

  test("lossless WebP (VP8L) and extended WebP (VP8X, with alpha)", async () => {
    const lossless = await sharp({ create: { width: 301, height: 77, channels: 3, background: "red" } }).webp({ lossless: true }).toBuffer();
    expect(readImageHeader(new Uint8Array(lossless), "x")).toEqual({ mime: "image/webp", width: 301, height: 77 });
    const alpha = await sharp({ create: { width: 123, height: 456, channels: 4, background: { r: 0, g: 0, b: 0, alpha: 0.5 } } }).webp().toBuffer();
    expect(readImageHeader(new Uint8Array(alpha), "x")).toEqual({ mime: "image/webp", width: 123, height: 456 });
  });

  test("progressive JPEG (SOF2) and a JPEG with EXIF and ICC segments before its frame header", async () => {
    const progressive = await sharp({ create: { width: 333, height: 222, channels: 3, background: "green" } }).jpeg({ progressive: true }).toBuffer();
    expect(readImageHeader(new Uint8Array(progressive), "x")).toEqual({ mime: "image/jpeg", width: 333, height: 222 });
    const exif = await sharp({ create: { width: 90, height: 1200, channels: 3, background: "green" } }).withMetadata({ orientation: 6 }).jpeg().toBuffer();
    // Stored size, not the EXIF-rotated one (see readImageHeader).
    expect(readImageHeader(new Uint8Array(exif), "x")).toEqual({ mime: "image/jpeg", width: 90, height: 1200 });
  });

  test("a header declaring more pixels than PIL opens is refused", async () => {
    const png = new Uint8Array(await image(4, 4));
    new DataView(png.buffer, png.byteOffset).setUint32(16, 20000);
    new DataView(png.buffer, png.byteOffset).setUint32(20, 20000);
    await expect(loadImage(`data:image/png;base64,${Buffer.from(png).toString("base64")}`, "f")).rejects.toThrow("f: a 20000x20000 image has more than 178956970 pixels");
  });

  test("errors name the field: unknown format, truncated header, cut data URI, over the cap", () => {
    expect(() => readImageHeader(new TextEncoder().encode("hello world, not an image"), "prompt[0].content[0].image")).toThrow("prompt[0].content[0].image: is not a PNG, JPEG, WebP or GIF image");
    expect(() => readImageHeader(new Uint8Array([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0, 0]), "f")).toThrow("f: the PNG image is truncated (10 bytes)");
    expect(() => readImageHeader(new Uint8Array([0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a]), "f")).toThrow("the JPEG image is truncated");
    expect(() => decodeDataUri("data:image/png;base64,abc", "f")).toThrow("f: the data: URI payload is not base64");
    expect(() => decodeDataUri("data:image/png,plain", "f")).toThrow("is not base64");
    expect(() => decodeDataUri(`data:image/png;base64,${"A".repeat(4000)}`, "f", 1000)).toThrow("larger than 1000 bytes");
  });

  test("http(s) URLs are refused without a fetcher; with one, its bytes are used", async () => {
    await expect(loadImage("https://example.com/cat.png", "prompt[0].content[0].image")).rejects.toThrow("prompt[0].content[0].image: image URLs are not fetched");
    const png = await image(40, 30);
    const got = await loadImage("https://example.com/cat.png", "f", { fetch: async () => new Uint8Array(png) });
    expect([got.mime, got.width, got.height, got.sha256]).toEqual(["image/png", 40, 30, new Bun.CryptoHasher("sha256").update(png).digest("hex")]);
    await expect(loadImage("file:///etc/passwd", "f")).rejects.toThrow("expected a data: URI or an http(s) URL");
  });
});

describe("Qwen3-VL prompts with images", () => {
  test("a user image becomes <|vision_start|> + 300 × <|image_pad|> + <|vision_end|> (640x480), exact ids", async () => {
    const m = msgs([{ role: "user", content: [{ type: "image", image: uri(await image(640, 480)) }, { type: "text", text: "What is this?" }] }]);
    const imgs = await resolveImages(tok, m, { prefix: "prompt" });
    const p = buildMultimodalPromptIds(tok, m, imgs, { promptLength: 4096 });
    expect(p.promptIds).toEqual([...USER, VS, ...Array(300).fill(PAD), VE, 3838, 374, 419, 30, IM_END, NL, ...GEN]);
    expect(p.truncated).toBe(false);
    expect(p.images).toHaveLength(1);
    expect(p.images[0]).toMatchObject({ mime: "image/png", width: 640, height: 480, image_grid_thw: [1, 30, 40], span: [4, 304], source: "prompt", field: "prompt[0].content[0].image" });
    expect(p.images[0]!.data).toBe((await image(640, 480)).toString("base64"));
  });

  test("{type: image_url, image_url: {url}} parts render the same ids", async () => {
    const u = uri(await image(640, 480), "image/jpeg");
    const a = msgs([{ role: "user", content: [{ type: "image", image: u }, { type: "text", text: "What is this?" }] }]);
    const b = msgs([{ role: "user", content: [{ type: "image_url", image_url: { url: u } }, { type: "text", text: "What is this?" }] }]);
    const pa = buildMultimodalPromptIds(tok, a, await resolveImages(tok, a, { prefix: "prompt" }), { promptLength: 4096 });
    const pb = buildMultimodalPromptIds(tok, b, await resolveImages(tok, b, { prefix: "prompt" }), { promptLength: 4096 });
    expect(pb.promptIds).toEqual(pa.promptIds);
    expect(pb.images[0]!.field).toBe("prompt[0].content[0].image_url.url");
  });

  test("refusals name the field: text-only family, image in a system message, video part, a text spelling <|image_pad|>, add_vision_id", async () => {
    const u = uri(await image(32, 32));
    const qwen3 = await builtinTokenizer("qwen3");
    const m = msgs([{ role: "user", content: [{ type: "image", image: u }] }]);
    await expect(resolveImages(qwen3, m, { prefix: "prompt" })).rejects.toThrow("prompt[0].content[0].image: holds image parts, and model qwen3 (family qwen3) is text-only");
    await expect(resolveImages(tok, msgs([{ role: "system", content: [{ type: "image", image: u }] }, { role: "user", content: "hi" }]), { prefix: "prompt" })).rejects.toThrow(
      "prompt[0].content[0]: an image in a system message is not rendered",
    );
    await expect(resolveImages(tok, msgs([{ role: "user", content: [{ type: "video", video: "x" }] }]), { prefix: "prompt" })).rejects.toThrow("prompt[0].content[0].type: 'video' parts are not supported");
    const spelled = msgs([{ role: "user", content: [{ type: "image", image: u }, { type: "text", text: "see <|vision_start|><|image_pad|><|vision_end|>" }] }]);
    const imgs = await resolveImages(tok, spelled, { prefix: "prompt" });
    expect(() => buildMultimodalPromptIds(tok, spelled, imgs, { promptLength: 4096 })).toThrow("prompt: renders 2 image placeholder(s) for 1 image(s)");
    expect(() => buildMultimodalPromptIds(tok, m, [], { promptLength: 4096, chatTemplateKwargs: { add_vision_id: true } })).toThrow("rollout.chat_template_kwargs.add_vision_id");
  });
});

describe("a tool round whose tool returns an image", () => {
  const tools: ToolSchema[] = [{ type: "function", function: { name: "zoom", description: "Zoom in", parameters: { type: "object", properties: { factor: { type: "integer" } }, required: ["factor"] } } }];

  test("prompt ‖ response equals the family's full render with expanded placeholders; masks exact; spans point at the pads", async () => {
    const first = uri(await image(640, 480));
    const second = uri(await image(100, 900, "webp"), "image/webp");
    const prompt = msgs([{ role: "user", content: [{ type: "image", image: first }, { type: "text", text: "What is this?" }] }]);
    const pImgs = await resolveImages(tok, prompt, { prefix: "prompt" });
    const p = buildMultimodalPromptIds(tok, prompt, pImgs, { promptLength: 4096, tools });
    const b = new TrajectoryBuilder({ promptIds: p.promptIds, responseLength: 4096, maxModelLen: 40960, trackLogProbs: true });

    // Turn 1: the model calls zoom (ids as the engine samples them, mask 1).
    const a1 = [151657, 198, 4913, 606, 788, 330, 28716, 497, 330, 16370, 788, 5212, 37591, 788, 220, 17, 11248, 151658, 151645];
    b.appendAction(a1, a1.map(() => -0.5));
    const call: ChatMessageInput = { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "zoom", arguments: { factor: 2 } } }] };
    const toolMsg = msgs([{ role: "tool", tool_call_id: "c1", content: [{ type: "image", image: second }, { type: "text", text: "zoomed x2" }] }]);
    const oImgs = await resolveImages(tok, toolMsg, { prefix: "turn[1].tool" });
    // 100x900: round(900 / 32) = 28 → 896, round(100 / 32) = 3 → 96; 896·96 ≥ 65536, so no rescale: [1, 56, 6], 84 tokens.
    expect(oImgs[0]!.grid).toEqual({ grid_thw: [1, 56, 6], resized: [896, 96], tokens: 84 });
    const obs = encodeImageObservation(imageObservationEncoder(tok, { tools }), tok, toolMsg, oImgs, a1.at(-1), b.contextLength, "turn[1].tool");
    // \n, <|im_start|>user\n<tool_response>\n, the image, the text, the close and the generation prompt.
    expect(obs.ids).toEqual([NL, ...USER, 151665, NL, VS, ...Array(84).fill(PAD), VE, 28716, 291, 856, 17, NL, 151666, IM_END, NL, ...GEN]);
    const kept = appendImageObservation(b, obs);
    expect(kept.truncated).toBe(false);

    // Turn 2: the answer.
    const a2 = [32, 2518, 9334, 13, 151645];
    b.appendAction(a2, a2.map(() => -0.25));

    const all = [...prompt, ...msgs([call]), ...toolMsg, ...msgs([{ role: "assistant", content: "A red square." }])];
    const want = expandImagePads(tok.encode(tok.renderText(all, { tools })), [...pImgs, ...oImgs], visionOf(tok).ids, "all");
    const ids = [...p.promptIds, ...b.responseIds()];
    // The template writes "<|im_end|>\n" after the last assistant message; the trajectory ends at the sampled <|im_end|>.
    expect([...ids, NL]).toEqual(want.ids);
    expect(b.responseMask() as number[]).toEqual([...a1.map(() => 1), ...obs.ids.map(() => 0), ...a2.map(() => 1)]);
    const lps = b.responseLogprobs()!;
    expect(lps.slice(a1.length, a1.length + obs.ids.length).every((x) => x === 0)).toBe(true);

    const images = [...p.images, ...kept.images];
    expect(images.map((i) => i.span)).toEqual(want.spans);
    for (const img of images) {
      const [s, e] = img.span;
      expect(ids[s - 1]).toBe(VS);
      expect(ids[e]).toBe(VE);
      expect(ids.slice(s, e).every((x) => x === PAD)).toBe(true);
      expect(e - s).toBe((img.image_grid_thw[0] * img.image_grid_thw[1] * img.image_grid_thw[2]) / 4);
    }
    expect(images[1]).toMatchObject({ source: "tool", field: "turn[1].tool[0].content[0].image", mime: "image/webp", image_grid_thw: [1, 56, 6] });
    // Tool-image positions are in the response, under mask 0.
    const P = p.promptIds.length;
    expect(b.responseMask().slice(images[1]!.span[0] - P, images[1]!.span[1] - P).every((x) => x === 0)).toBe(true);
  });

  test("a run of two tool results with two images each: spans at their positions, in order", async () => {
    const u = (w: number, h: number) => image(w, h).then((b) => uri(b));
    const toolMsgs = msgs([
      { role: "tool", tool_call_id: "a", content: [{ type: "image", image: await u(64, 64) }, { type: "text", text: "one" }, { type: "image", image: await u(640, 480) }] },
      { role: "tool", tool_call_id: "b", content: [{ type: "text", text: "two" }, { type: "image_url", image_url: { url: await u(300, 40) } }, { type: "image", image: await u(1, 1) }] },
    ]);
    const imgs = await resolveImages(tok, toolMsgs, { prefix: "turn[1].tool" });
    expect(imgs.map((i) => i.field)).toEqual(["turn[1].tool[0].content[0].image", "turn[1].tool[0].content[2].image", "turn[1].tool[1].content[1].image_url.url", "turn[1].tool[1].content[2].image"]);
    const offset = 1000;
    const obs = encodeImageObservation(imageObservationEncoder(tok), tok, toolMsgs, imgs, IM_END, offset);
    expect(obs.images.map((i) => i.span[1] - i.span[0])).toEqual(imgs.map((i) => i.grid.tokens));
    let prev = offset;
    for (const img of obs.images) {
      expect(img.span[0]).toBeGreaterThan(prev);
      expect(obs.ids[img.span[0] - offset - 1]).toBe(VS);
      expect(obs.ids[img.span[1] - offset]).toBe(VE);
      prev = img.span[1];
    }
    // The observation is the full render's text after the assistant turn, with the same expansion.
    const history = msgs([{ role: "user", content: "go" }, { role: "assistant", content: "", tool_calls: [{ id: "a", type: "function", function: { name: "f", arguments: {} } }, { id: "b", type: "function", function: { name: "f", arguments: {} } }] }]);
    const before = tok.encode(tok.renderText(history));
    const after = expandImagePads(tok.encode(tok.renderText([...history, ...toolMsgs], { addGenerationPrompt: true })), imgs, visionOf(tok).ids, "all");
    // before ends with <|im_end|>\n; the sampled turn ends at <|im_end|>, so the observation starts with \n.
    expect([...before.slice(0, -1), ...obs.ids]).toEqual(after.ids);
  });

  test("an observation over the response budget is cut before the image that does not fit, never inside it", async () => {
    const toolMsg = msgs([{ role: "tool", content: [{ type: "text", text: "zoomed x2" }, { type: "image", image: uri(await image(640, 480)) }] }]);
    const oImgs = await resolveImages(tok, toolMsg, { prefix: "turn[1].tool" });
    const b = new TrajectoryBuilder({ promptIds: [1, 2, 3], responseLength: 50, maxModelLen: 40960, trackLogProbs: false });
    b.appendAction([IM_END]);
    const obs = encodeImageObservation(imageObservationEncoder(tok), tok, toolMsg, oImgs, IM_END, b.contextLength);
    const r = appendImageObservation(b, obs);
    expect(r).toEqual({ images: [], truncated: true, appended: 1 + 3 + 2 + 4 });
    expect(b.responseIds()).toEqual([IM_END, NL, ...USER, 151665, NL, 28716, 291, 856, 17]);
    expect(b.responseIds()).not.toContain(VS);
  });
});

describe("prompt truncation never splits an image", () => {
  async function threeImagePrompt(): Promise<{ m: ChatMessage[]; imgs: Awaited<ReturnType<typeof resolveImages>> }> {
    const m = msgs([
      { role: "system", content: "You look at pictures." },
      { role: "user", content: [{ type: "text", text: "first" }, { type: "image", image: uri(await image(1, 1)) }, { type: "text", text: "second" }, { type: "image", image: uri(await image(64, 64, "gif"), "image/gif") }] },
      { role: "assistant", content: "Two pictures." },
      { role: "user", content: [{ type: "image", image: uri(await image(300, 40, "jpeg"), "image/jpeg") }, { type: "text", text: "and a third one: what do the three show?" }] },
    ]);
    return { m, imgs: await resolveImages(tok, m, { prefix: "prompt" }) };
  }

  test("error (default): fails the row naming the image truncation would reach", async () => {
    const { m, imgs } = await threeImagePrompt();
    const full = buildMultimodalPromptIds(tok, m, imgs, { promptLength: 100_000 });
    const firstSpan = full.images[0]!.span;
    // Room for everything but the text before the first image: text-only truncation, no image reached.
    const textOnly = buildMultimodalPromptIds(tok, m, imgs, { promptLength: full.promptIds.length - (firstSpan[0] - 1) });
    expect(textOnly.truncated).toBe(true);
    expect(textOnly.images.map((i) => i.span[0])).toEqual(full.images.map((i) => i.span[0] - (firstSpan[0] - 1)));
    expect(() => buildMultimodalPromptIds(tok, m, imgs, { promptLength: full.promptIds.length - firstSpan[0] })).toThrow(
      /rollout\.prompt_length: the prompt holds \d+ tokens \(\d+ of them in 3 image\(s\)\) and prompt_length is \d+: left truncation would cut image prompt\[1\]\.content\[1\]\.image/,
    );
    try {
      buildMultimodalPromptIds(tok, m, imgs, { promptLength: 10 });
    } catch (e) {
      expect(e).toBeInstanceOf(InputError);
      expect((e as InputError).field).toBe("rollout.prompt_length");
    }
  });

  test("drop: for every prompt_length, the kept prompt is a suffix that starts outside every image, and kept spans hold only pads", async () => {
    const { m, imgs } = await threeImagePrompt();
    const full = buildMultimodalPromptIds(tok, m, imgs, { promptLength: 100_000 });
    const total = full.promptIds.length;
    for (let L = 1; L <= total; L++) {
      let p;
      try {
        p = buildMultimodalPromptIds(tok, m, imgs, { promptLength: L, imageTruncation: "drop" });
      } catch (e) {
        expect((e as InputError).field).toBe("rollout.prompt_length");
        continue;
      }
      expect(p.promptIds.length).toBeLessThanOrEqual(L);
      const cut = total - p.promptIds.length;
      expect(p.promptIds).toEqual(full.promptIds.slice(cut));
      for (const img of full.images) expect(cut > img.span[0] - 1 && cut <= img.span[1]).toBe(false);
      expect(p.images.length + p.dropped.length).toBe(3);
      expect(p.dropped.map((d) => d.field)).toEqual(full.images.slice(0, p.dropped.length).map((i) => i.field));
      for (const img of p.images) {
        expect(p.promptIds[img.span[0] - 1]).toBe(VS);
        expect(p.promptIds[img.span[1]]).toBe(VE);
        expect(p.promptIds.slice(img.span[0], img.span[1]).every((x) => x === PAD)).toBe(true);
      }
      expect(p.truncated).toBe(L < total);
      // The generation prompt always survives.
      expect(p.promptIds.slice(-3)).toEqual(GEN);
    }
  });
});

describe("records carry multi_modal", () => {
  test("the field validates, round-trips through the stored encoding, and is absent (byte for byte) without images", async () => {
    const m = msgs([{ role: "user", content: [{ type: "image", image: uri(await image(640, 480)) }, { type: "text", text: "What is this?" }] }]);
    const p = buildMultimodalPromptIds(tok, m, await resolveImages(tok, m, { prefix: "prompt" }), { promptLength: 4096 });
    const base = {
      key: "u-1_0_0", uid: "u-1", session_id: 0, output_index: 0, agent_name: "single_turn_agent", data_source: "t",
      prompt_ids: p.promptIds, response_ids: [32, IM_END], response_mask: [1, 1] as (0 | 1)[], rollout_log_probs: null,
      reward_score: null, num_turns: 2, truncated: false, finish_reason: "stop" as const, error: null,
      metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: {},
    };
    const mm = multiModalField(tok, p.images);
    expect(mm).toMatchObject({ processor: { name: "qwen_vl", patch_size: 16, merge_size: 2, temporal_patch_size: 2, min_pixels: 65536, max_pixels: 16777216 }, image_token_id: PAD, vision_start_id: VS, vision_end_id: VE });
    const rec = validateRecord({ ...base, multi_modal: mm });
    expect(rec.multi_modal).toEqual(mm);
    expect(decodeRecord({ ...encodeRecord(rec) }).multi_modal).toEqual(mm);
    expect(JSON.parse(encodeRecord(rec).meta).multi_modal.images[0].span).toEqual([4, 304]);
    const plain = validateRecord(base);
    expect(encodeRecord(plain).meta).not.toContain("multi_modal");
    expect(() => validateRecord({ ...base, multi_modal: { ...mm, images: [{ ...mm.images[0], sha256: "xyz" }] } })).toThrow(/multi_modal/);
    expect(TrajectoryRecord.safeParse({ ...base, multi_modal: mm }).success).toBe(true);
    const img = mm.images[0]!;
    const bad = (patch: Partial<typeof img>) => validateRecord({ ...base, multi_modal: { ...mm, images: [{ ...img, ...patch }] } });
    expect(() => bad({ span: [5, 305] })).toThrow("record.multi_modal.images[0]: span [5, 305) is not between vision_start_id 151652 and vision_end_id 151653");
    expect(() => bad({ image_grid_thw: [1, 30, 42] })).toThrow("span [4, 304) holds 300 tokens; image_grid_thw [1, 30, 42] makes 315");
    expect(() => bad({ source: "tool" })).toThrow("a tool image must lie in the response");
    expect(() => bad({ span: [4000, 4300] })).toThrow("must lie inside prompt_ids ‖ response_ids");
  });
});

describe("base64 of image bytes", () => {
  test("bytesToBase64 (the runtime's toBase64, and the chunked btoa fallback) equals Node's encoding; a data URI's payload is kept as sent", async () => {
    const { bytesToBase64, loadImage } = await import("../../shared/vision/image-source.ts");
    for (const n of [0, 1, 2, 3, 4, 0x8000 - 1, 0x8000, 0x8000 + 5, 200_003]) {
      const bytes = new Uint8Array(n);
      for (let i = 0; i < n; i++) bytes[i] = (i * 131 + 7) & 255;
      const want = Buffer.from(bytes).toString("base64");
      expect(bytesToBase64(bytes)).toBe(want);
      const plain = new Uint8Array(bytes);
      Object.defineProperty(plain, "toBase64", { value: undefined });
      expect(bytesToBase64(plain)).toBe(want);
    }
    // A 1x1 PNG: the loaded image keeps the payload it was decoded from.
    const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    const img = await loadImage(`data:image/png;base64,${png}`, "f");
    expect([img.base64, img.mime, img.width, img.height, Buffer.from(img.data).toString("base64")]).toEqual([png, "image/png", 1, 1, png]);
  });
});
