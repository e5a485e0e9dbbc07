import { beforeAll, describe, expect, test } from "bun:test";
import sharp from "sharp";
import { createSimEngineApp } from "../../infra/sim-engine/app.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { SimEngineClient } from "../../infra/sim-engine/sim-engine-client.ts";
import { SingleTurnAgentLoop } from "../../shared/agent-loop/single-turn-agent.ts";
import { InputError } from "../../shared/errors.ts";
import { SglangClient } from "../../shared/inference/sglang-client.ts";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { toTrajectoryRecord } from "../../shared/rollout/batch.ts";
import { DatasetRow, type ChatMessage } from "../../shared/schema/index.ts";
import { packOutput, unpackOutput } from "../../shared/session/checkpoint.ts";
import { decodeRecord, encodeRecord, validateRecord } from "../../shared/store/record-codec.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { config, ctxOf, SP } from "../agent-loop/helpers.ts";

// single_turn_agent with a Qwen3-VL row whose prompt holds an image: ids with expanded placeholders, image_data to
// the engine, multi_modal through the output, the checkpoint form and the stored record.
const SCRIPT = { seed: 5, rules: [], default: ["It is a blue rectangle."] };
let vl: ChatTokenizer;
let uri: string;
beforeAll(async () => {
  vl = await builtinTokenizer("qwen3_vl");
  const png = await sharp({ create: { width: 640, height: 480, channels: 3, background: "blue" } }).png().toBuffer();
  uri = `data:image/png;base64,${png.toString("base64")}`;
});
const row = (): { uid: string; session_id: number; data_source: string; prompt: ChatMessage[] } => ({
  uid: "u1",
  session_id: 0,
  data_source: "t",
  prompt: [{ role: "user", content: [{ type: "image", image: uri }, { type: "text", text: "What is this?" }] }] as ChatMessage[],
});

describe("single_turn_agent with images (qwen3_vl)", () => {
  test("over SGLang /generate: the engine gets the expanded ids and image_data; the output and its record carry multi_modal", async () => {
    const app = createSimEngineApp(new SimEngine({ tokenizer: vl, script: SCRIPT, name: "vl" }));
    const bodies: Record<string, unknown>[] = [];
    const fetch = async (input: Request | string | URL, init?: RequestInit) => {
      const req = new Request(input, init);
      if (new URL(req.url).pathname === "/generate") bodies.push(JSON.parse(await req.clone().text()));
      return app.fetch(req);
    };
    const cfg = config();
    const o = await new SingleTurnAgentLoop(ctxOf(vl, new SglangClient({ url: "http://sim", fetch }), cfg)).run(SP, row());
    expect(o.prompt_ids.slice(0, 5)).toEqual([151644, 872, 198, 151652, 151655]);
    expect(o.prompt_ids.filter((x) => x === 151655)).toHaveLength(300);
    expect(o.multi_modal!.images.map((i) => [i.span, i.image_grid_thw, i.source])).toEqual([[[4, 304], [1, 30, 40], "prompt"]]);
    expect(bodies).toHaveLength(1);
    expect(bodies[0]!.input_ids).toEqual(o.prompt_ids);
    expect(bodies[0]!.image_data).toEqual([uri]);
    expect(vl.decode(o.response_ids)).toBe("It is a blue rectangle.<|im_end|>");

    // The checkpoint form and the record keep it; the record's spans are checked against its ids.
    expect(unpackOutput(packOutput(o)).multi_modal).toEqual(o.multi_modal);
    const planned = { key: "u1_0_0", uid: "u1", session_id: 0, row_index: 0, row: DatasetRow.parse(row()), row_error: null, group_size: 1, trajectory_info: { step: 0, sample_index: 0, rollout_n: 1, validate: false } };
    const rec = validateRecord(toTrajectoryRecord(planned, "single_turn_agent", o, cfg));
    expect(decodeRecord({ ...encodeRecord(rec) }).multi_modal).toEqual(o.multi_modal);
  });

  test("in process, a text-only row keeps its record unchanged (no multi_modal); an image over prompt_length fails the row naming it", async () => {
    const client = new SimEngineClient(new SimEngine({ tokenizer: vl, script: SCRIPT, name: "vl" }));
    const text = await new SingleTurnAgentLoop(ctxOf(vl, client, config())).run(SP, { ...row(), prompt: [{ role: "user", content: "What is this?" }] as ChatMessage[] });
    expect("multi_modal" in text).toBe(false);
    const withImage = await new SingleTurnAgentLoop(ctxOf(vl, client, config())).run(SP, row());
    expect(withImage.multi_modal!.images).toHaveLength(1);
    const err = await new SingleTurnAgentLoop(ctxOf(vl, client, config({ prompt_length: 100 }))).run(SP, row()).catch((e) => e);
    expect(err).toBeInstanceOf(InputError);
    expect((err as InputError).message).toContain("left truncation would cut image prompt[0].content[0].image");
    // A text-only family still refuses image rows, as before.
    const qwen3 = await builtinTokenizer("qwen3");
    await expect(new SingleTurnAgentLoop(ctxOf(qwen3, client, config())).run(SP, row())).rejects.toThrow("prompt[0].content[0]: holds image parts, and model qwen3 (family qwen3) is text-only; use a vision-language family (--model qwen3_vl)");
  });
});
