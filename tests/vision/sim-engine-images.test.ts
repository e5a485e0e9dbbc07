import { beforeAll, describe, expect, test } from "bun:test";
import sharp from "sharp";
import { createSimEngineApp } from "../../infra/sim-engine/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { ChatMessage } from "../../shared/schema/index.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { buildMultimodalPromptIds, resolveImages } from "../../shared/vision/multimodal-tokens.ts";
import { SglangClient } from "../../shared/inference/sglang-client.ts";
import { VllmClient } from "../../shared/inference/vllm-client.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { BadEngineResponseError, ConfigError } from "../../shared/errors.ts";
import { SamplingParams } from "../../shared/schema/index.ts";

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

  test("engine clients: SGLang sends image_data (absent without images: the body is unchanged), the in-process simulator checks it alike, vLLM refuses images", async () => {
    const png = await sharp({ create: { width: 640, height: 480, channels: 3, background: "blue" } }).png().toBuffer();
    const uri = `data:image/png;base64,${png.toString("base64")}`;
    const m = [ChatMessage.parse({ role: "user", content: [{ type: "image", image: uri }, { type: "text", text: "What is it?" }] })];
    const p = buildMultimodalPromptIds(vl, m, await resolveImages(vl, m, { prefix: "prompt" }), { promptLength: 4096 });
    const app = createSimEngineApp(new SimEngine({ tokenizer: vl, script: SCRIPT, name: "vl" }));
    const bodies: Record<string, unknown>[] = [];
    const fetch = async (input: Request | string | URL, init?: RequestInit) => {
      const req = new Request(input, init);
      if (new URL(req.url).pathname === "/generate") bodies.push(JSON.parse(await req.clone().text()));
      return app.fetch(req);
    };
    const sglang = new SglangClient({ url: "http://sim", fetch });
    const base = { request_id: "r1", routing_key: "k", prompt_ids: p.promptIds, sampling_params: SamplingParams.parse({}), max_tokens: 8 };
    const out = await sglang.generate({ ...base, image_data: [uri] });
    expect(out.token_ids.length).toBeGreaterThan(0);
    expect(bodies[0]!.image_data).toEqual([uri]);
    await sglang.generate({ ...base, image_data: [] });
    expect("image_data" in bodies[1]!).toBe(false);
    const wrong = [...p.promptIds.slice(0, 10), ...p.promptIds.slice(11)];
    await expect(sglang.generate({ ...base, prompt_ids: wrong, image_data: [uri] })).rejects.toThrow(BadEngineResponseError);

    const inProcess = new SimEngineClient(new SimEngine({ tokenizer: vl, script: SCRIPT, name: "vl" }));
    expect((await inProcess.generate({ ...base, image_data: [uri] })).token_ids.length).toBeGreaterThan(0);
    await expect(inProcess.generate({ ...base, prompt_ids: wrong, image_data: [uri] })).rejects.toThrow("answered HTTP 400: image_data[0]: input_ids hold 299 <|image_pad|> tokens at [4, 303), its grid [1, 30, 40] makes 300");

    const vllm = new VllmClient({ url: "http://sim", fetch });
    await expect(vllm.generate({ ...base, image_data: [uri] })).rejects.toThrow(ConfigError);
  });
});
