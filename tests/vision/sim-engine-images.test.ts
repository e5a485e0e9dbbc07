import { beforeAll, describe, expect, test } from "bun:test";
import sharp from "sharp";
import { createSimEngineApp } from "../../infra/sim-engine/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { ChatMessage } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { buildMultimodalPromptIds, resolveImages } from "../../shared/vision/multimodal-tokens.ts";

// SGLang's /generate with pre-expanded input_ids and image_data, as the simulator plays it (docs/engines.md §3.8).
const SCRIPT = { seed: 3, rules: [], default: ["A blue square."] };
let vl: ChatTokenizer;
let text: ChatTokenizer;
beforeAll(async () => {
  vl = await builtinTokenizer("qwen3_vl");
  text = await builtinTokenizer("qwen3");
});

const post = (tok: ChatTokenizer, body: unknown) =>
  createSimEngineApp(new SimEngine({ tokenizer: tok, script: SCRIPT, name: "vl" })).fetch(new Request("http://sim/generate", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) }));

describe("sim engine: SGLang /generate with image_data", () => {
  test("pre-expanded input_ids with one image per run are served; a wrong run length, run count or a text-only model is a 400 naming why", async () => {
    const png = await sharp({ create: { width: 400, height: 300, channels: 3, background: "blue" } }).png().toBuffer();
    const uri = `data:image/png;base64,${png.toString("base64")}`;
    const m = [ChatMessage.parse({ role: "user", content: [{ type: "image", image: uri }, { type: "text", text: "What is it?" }] })];
    const p = buildMultimodalPromptIds(vl, m, await resolveImages(vl, m, { prefix: "prompt" }), { promptLength: 4096 });
    const sp = { max_new_tokens: 16, stop_token_ids: [151645] };

    const ok = await post(vl, { input_ids: p.promptIds, image_data: [uri], sampling_params: sp, return_logprob: true });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { meta_info: { prompt_tokens: number } }).meta_info.prompt_tokens).toBe(p.promptIds.length);
    // Bare base64 (SGLang's other string form) is the same image.
    expect((await post(vl, { input_ids: p.promptIds, image_data: png.toString("base64"), sampling_params: sp })).status).toBe(200);

    // 400x300 is 108 tokens under transformers' rule (transformers.js's port would say 117); one pad fewer is refused.
    const [s, e] = p.images[0]!.span;
    expect(e - s).toBe(108);
    const short = [...p.promptIds.slice(0, s), ...p.promptIds.slice(s + 1)];
    const r1 = await post(vl, { input_ids: short, image_data: [uri], sampling_params: sp });
    expect(r1.status).toBe(400);
    expect(JSON.stringify(await r1.json())).toContain("image_data[0]: input_ids hold 107 <|image_pad|> tokens at [4, 111), its grid [1, 18, 24] makes 108");

    const r2 = await post(vl, { input_ids: p.promptIds, image_data: [uri, uri], sampling_params: sp });
    expect(r2.status).toBe(400);
    expect(JSON.stringify(await r2.json())).toContain("input_ids hold 1 image placeholder run(s) for 2 image_data entries");

    const r3 = await post(text, { input_ids: p.promptIds, image_data: [uri], sampling_params: sp });
    expect(r3.status).toBe(400);
    expect(JSON.stringify(await r3.json())).toContain("model qwen3 is not a multimodal model");

    const r4 = await post(vl, { input_ids: p.promptIds, image_data: ["https://example.com/x.png"], sampling_params: sp });
    expect(r4.status).toBe(400);
  });
});
