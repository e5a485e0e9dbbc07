import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import sharp from "sharp";
import { z } from "zod";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { listen } from "../../infra/cli/listen.ts";
import { serveMcpHttp, type McpHttpServer } from "../../infra/tools/mcp-server.ts";
import { defaultAgentLoopRegistry } from "../../shared/agent-gateway/builtin-loops.ts";
import { ToolAgentLoop } from "../../shared/agent-loop/tool-agent.ts";
import { InputError } from "../../shared/errors.ts";
import { SglangClient } from "../../shared/inference/sglang-client.ts";
import { builtinTokenizer } from "../../shared/models/index.ts";
import { sessionLoopFactory, type ExecutorDeps } from "../../shared/rollout/executor.ts";
import { ChatMessage, McpServerSpec, RolloutConfig, ToolSpec, type AgentLoopOutput, type ChatMessageInput, type ToolSchema } from "../../shared/schema/index.ts";
import { MemorySessionStorage, type SessionStorage } from "../../shared/session/session-storage.ts";
import { TrajectorySession } from "../../shared/session/trajectory-session.ts";
import type { ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { McpToolClient } from "../../shared/tools/mcp-tool-client.ts";
import { WebhookToolClient, type ToolExecutor } from "../../shared/tools/webhook-tool-client.ts";
import { expandImagePads, resolveImages, visionOf } from "../../shared/vision/multimodal-tokens.ts";
import { call, config, ctxOf, SP } from "../agent-loop/helpers.ts";

// tool_agent with a vision family (qwen3_vl): a prompt image and a tool reply holding an image, through the real
// sim engine over loopback HTTP (SGLang /generate, which checks every image_data entry against its placeholder run)
// and real tool servers (a webhook, an MCP server over Streamable HTTP).
const VS = 151652;
const VE = 151653;
const PAD = 151655;
const ZOOM: ToolSchema = { type: "function", function: { name: "zoom", description: "Zoom into the picture", parameters: { type: "object", properties: { factor: { type: "integer" } }, required: ["factor"] } } };
const QUESTION = "What is in the picture?";
const THRICE = "Zoom in three times.";
const SCRIPT = {
  seed: 3,
  rules: [
    { when: QUESTION, turns: [call("zoom", { factor: 2 }), "A red square."] },
    { when: THRICE, turns: [call("zoom", { factor: 2 }), call("zoom", { factor: 3 }), call("zoom", { factor: 4 }), "Still a red square."] },
  ],
  default: ["I cannot help with that."],
};

let vl: ChatTokenizer;
let promptUri: string;
let toolUri: string;
let sim: RunningSimEngine;
let webhook: { url: string; stop: () => void };
let mcp: McpHttpServer;
/** Every /generate body the engine received, in order. */
const wire: Record<string, unknown>[] = [];

const png = async (w: number, h: number, background: string) => `data:image/png;base64,${(await sharp({ create: { width: w, height: h, channels: 3, background } }).png().toBuffer()).toString("base64")}`;

beforeAll(async () => {
  vl = await builtinTokenizer("qwen3_vl");
  promptUri = await png(640, 480, "blue");
  toolUri = await png(100, 900, "red");
  sim = await startSimEngine({ tokenizer: vl, script: SCRIPT });
  const server = listen({
    hostname: "127.0.0.1",
    port: 0,
    fetch: () => Response.json({ content: [{ type: "image", image: toolUri }, { type: "text", text: "zoomed x2" }] }),
  });
  webhook = { url: `http://127.0.0.1:${server.port}/tools/zoom`, stop: () => void server.stop(true) };
  const b64 = toolUri.slice("data:image/png;base64,".length);
  mcp = serveMcpHttp(() => {
    const s = new McpServer({ name: "pictures", version: "1.0.0" });
    s.registerTool("zoom", { description: "Zoom into the picture", inputSchema: { factor: z.number().int() } }, () => ({
      content: [{ type: "image", data: b64, mimeType: "image/png" }, { type: "text", text: "zoomed x2" }],
    }));
    return s;
  });
});
afterAll(async () => {
  webhook.stop();
  await mcp.stop();
  await sim.stop();
});

function engine(): SglangClient {
  return new SglangClient({
    url: sim.urls[0]!,
    fetch: async (input, init) => {
      const req = new Request(input, init);
      if (new URL(req.url).pathname === "/generate") wire.push(JSON.parse(await req.clone().text()));
      return fetch(req);
    },
  });
}

const webhookTools = () => new WebhookToolClient([ToolSpec.parse({ name: "zoom", url: webhook.url, schema: ZOOM, timeout_ms: 10_000, max_retries: 0 })]);
const row = (content: ChatMessageInput["content"] = [{ type: "image", image: promptUri }, { type: "text", text: QUESTION }]) => ({
  uid: "img",
  session_id: 0,
  data_source: "t",
  prompt: [{ role: "user", content }] as ChatMessage[],
});

/** The family's own render of the whole conversation with expanded placeholders: what prompt ‖ response must equal. */
async function fullRender(tools: readonly ToolSchema[], toolMessage: ChatMessageInput) {
  const msgs = ChatMessage.array().parse([
    row().prompt[0],
    { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "zoom", arguments: { factor: 2 } } }] },
    toolMessage,
    { role: "assistant", content: "A red square." },
  ]);
  const images = [...(await resolveImages(vl, msgs.slice(0, 1), { prefix: "prompt" })), ...(await resolveImages(vl, msgs.slice(2, 3), { prefix: "turn[1].tool" }))];
  return expandImagePads(vl.encode(vl.renderText(msgs, { tools })), images, visionOf(vl).ids, "all");
}

/** Checks one finished two-turn round; returns the engine bodies it sent. */
async function checkRound(o: AgentLoopOutput, tools: readonly ToolSchema[], sent: Record<string, unknown>[]) {
  const want = await fullRender(tools, { role: "tool", name: "zoom", content: [{ type: "image", image: toolUri }, { type: "text", text: "zoomed x2" }] });
  const ids = [...o.prompt_ids, ...o.response_ids];
  // The template writes "<|im_end|>\n" after the last assistant message; the trajectory ends at the sampled <|im_end|>.
  expect([...ids, 198]).toEqual(want.ids);
  expect(o.extra_fields.terminated_by).toBe("model");
  expect(o.truncated).toBe(false);

  // Masks: turn 1 (mask 1), the observation with the tool image (mask 0), turn 2 (mask 1).
  const a1 = [...vl.encode(call("zoom", { factor: 2 })), 151645];
  const a2 = [...vl.encode("A red square."), 151645];
  const P = o.prompt_ids.length;
  const obsLen = o.response_ids.length - a1.length - a2.length;
  expect(o.response_ids.slice(0, a1.length)).toEqual(a1);
  expect(o.response_ids.slice(-a2.length)).toEqual(a2);
  expect(o.response_mask).toEqual([...a1.map(() => 1), ...Array(obsLen).fill(0), ...a2.map(() => 1)]);
  expect(o.response_logprobs!.slice(a1.length, a1.length + obsLen).every((x) => x === 0)).toBe(true);

  // Spans: the prompt image (640x480: [1, 30, 40], 300 tokens) and the tool image (100x900: [1, 56, 6], 84 tokens).
  const mm = o.multi_modal!;
  expect(mm.images.map((i) => [i.span, i.image_grid_thw, i.source, i.field])).toEqual([
    [want.spans[0], [1, 30, 40], "prompt", "prompt[0].content[0].image"],
    [want.spans[1], [1, 56, 6], "tool", "turn[1].tool[0].content[0].image"],
  ]);
  expect(want.spans[0]![1] - want.spans[0]![0]).toBe(300);
  expect(want.spans[1]![1] - want.spans[1]![0]).toBe(84);
  expect(want.spans[1]![0]).toBeGreaterThan(P + a1.length);
  for (const [s, e] of want.spans) {
    expect(ids[s - 1]).toBe(VS);
    expect(ids[e]).toBe(VE);
    expect(ids.slice(s, e).every((x) => x === PAD)).toBe(true);
  }
  expect(mm.images[1]!.data).toBe(toolUri.slice("data:image/png;base64,".length));

  // The engine wire: turn 1 with the prompt image, turn 2 with the prompt image then the tool image.
  expect(sent).toHaveLength(2);
  expect(sent[0]!.image_data).toEqual([promptUri]);
  expect(sent[1]!.image_data).toEqual([promptUri, toolUri]);
  expect(sent[1]!.input_ids).toEqual(ids.slice(0, P + a1.length + obsLen));
}

describe("tool_agent with images (qwen3_vl)", () => {
  test("a webhook tool replying with an image: prompt ‖ response is the full render, masks exact, image_data in order, spans exact", async () => {
    const tools = webhookTools();
    const before = wire.length;
    const o = await new ToolAgentLoop(ctxOf(vl, engine(), config({ response_length: 1024 }), { tools })).run(SP, row());
    await checkRound(o, [ZOOM], wire.slice(before));
  });

  test("the same round through an MCP tool (ImageContent {type: image, data, mimeType})", async () => {
    const tools = await McpToolClient.connect([McpServerSpec.parse({ name: "pictures", url: mcp.url, timeout_ms: 10_000 })]);
    try {
      const before = wire.length;
      const o = await new ToolAgentLoop(ctxOf(vl, engine(), config({ response_length: 1024 }), { tools })).run(SP, row());
      await checkRound(o, tools.schemas, wire.slice(before));
    } finally {
      await tools.close();
    }
  });

  test("an observation over the response budget is cut before the <|vision_start|> of the image that does not fit", async () => {
    const a1 = [...vl.encode(call("zoom", { factor: 2 })), 151645];
    const before = wire.length;
    // Room for turn 1 and 20 tokens of the observation: the tool image (84 pads) cannot fit whole.
    const o = await new ToolAgentLoop(ctxOf(vl, engine(), config({ response_length: a1.length + 20 }), { tools: webhookTools() })).run(SP, row());
    expect(o.truncated).toBe(true);
    expect(o.extra_fields.terminated_by).toBe("response_length");
    const obs = o.response_ids.slice(a1.length);
    expect(obs.length).toBeLessThan(20);
    expect(obs.at(-1)).not.toBe(VS);
    expect(obs.includes(VS) || obs.includes(PAD)).toBe(false);
    expect(o.response_ids.slice(0, a1.length)).toEqual(a1);
    // Only the prompt image is recorded; the engine was called once (the budget ended the trajectory).
    expect(o.multi_modal!.images.map((i) => i.source)).toEqual(["prompt"]);
    expect(wire.length - before).toBe(1);
  });

  test("rollout.image_truncation: drop removes a prompt image that left truncation reaches; the tool image still goes to the engine", async () => {
    const full = await new ToolAgentLoop(ctxOf(vl, engine(), config({ response_length: 1024 }), { tools: webhookTools() })).run(SP, row());
    const [s] = full.multi_modal!.images[0]!.span;
    const P = full.prompt_ids.length;
    // One token more than what precedes the image's <|vision_start|>: the cut reaches the image.
    const promptLength = P - s;
    const err = await new ToolAgentLoop(ctxOf(vl, engine(), config({ prompt_length: promptLength, response_length: 1024 }), { tools: webhookTools() })).run(SP, row()).catch((e) => e);
    expect((err as InputError).message).toContain("left truncation would cut image prompt[0].content[0].image");
    const before = wire.length;
    const o = await new ToolAgentLoop(ctxOf(vl, engine(), config({ prompt_length: promptLength, response_length: 1024, image_truncation: "drop" }), { tools: webhookTools() })).run(SP, row());
    // The cut moves past the image's <|vision_end|>: the prompt keeps what follows it.
    expect(o.prompt_ids).toEqual(full.prompt_ids.slice(full.multi_modal!.images[0]!.span[1] + 1));
    expect(o.extra_fields.prompt_truncated).toBe(true);
    expect(o.multi_modal!.dropped_images).toEqual([{ sha256: full.multi_modal!.images[0]!.sha256, field: "prompt[0].content[0].image" }]);
    expect(o.multi_modal!.images.map((i) => i.source)).toEqual(["tool"]);
    const sent = wire.slice(before);
    expect(sent.map((b) => b.image_data ?? null)).toEqual([null, [toolUri]]);
    // Validated at the boundary, naming the key and its values.
    expect(RolloutConfig.safeParse({ image_truncation: "cut" }).error!.issues.map((i) => [i.path, i.message])).toEqual([[["image_truncation"], 'rollout.image_truncation must be "error" or "drop"']]);
  });

  test("a text-only family given a tool image: the trajectory fails naming the tool and the vision family to use", async () => {
    const qwen3 = await builtinTokenizer("qwen3");
    const text = await startSimEngine({ tokenizer: qwen3, script: SCRIPT });
    try {
      const client = new SglangClient({ url: text.urls[0]! });
      const err = await new ToolAgentLoop(ctxOf(qwen3, client, config(), { tools: webhookTools() })).run(SP, row(QUESTION)).catch((e) => e);
      expect(err).toBeInstanceOf(InputError);
      expect((err as InputError).message).toBe("tool 'zoom': replied with an image part (turn 1), and model qwen3 (family qwen3) is text-only; use a vision-language family (--model qwen3_vl)");
    } finally {
      await text.stop();
    }
  });
});

describe("a durable session holding images, killed and resumed", () => {
  /** A storage whose `kill`-th append throws (the process died before it was committed). */
  function dyingAt(inner: SessionStorage, kill: number): SessionStorage {
    let n = 0;
    return {
      get: (k) => inner.get(k),
      delete: (k) => inner.delete(k),
      append: async (k, step, d, o) => {
        if (++n === kill) throw new Error("killed");
        return inner.append(k, step, d, o);
      },
    };
  }
  const deps = (): ExecutorDeps => ({ registry: defaultAgentLoopRegistry(), tokenizer: vl, client: engine(), maxModelLen: 8192, tools: webhookTools() as ToolExecutor, reward: {} });
  const input = (uid: string, question = QUESTION) => {
    const key = `${uid}_0_0`;
    return { key, agent_name: "tool_agent", sampling_params: { ...SP, seed: 7 }, kwargs: { ...row([{ type: "image", image: promptUri }, { type: "text", text: question }]), uid, key }, rollout: RolloutConfig.parse({ response_length: 2048, prompt_length: 1024 }), model_version: "v1" };
  };

  test("three tool images: each commit writes only the images it added (image_data and multi_modal.images are deltas), and a resume at every commit rebuilds them", async () => {
    const mem = new MemorySessionStorage();
    const inp = input("thrice", THRICE);
    const ref = (await TrajectorySession.open(inp.key, { storage: mem, createLoop: sessionLoopFactory(deps()) }, inp))!;
    const rr = await ref.run();
    if (rr.status !== "finished") throw new Error(JSON.stringify(rr));
    const want = rr.outputs[0]!;
    expect(want.multi_modal!.images.map((i) => [i.source, i.field])).toEqual([
      ["prompt", "prompt[0].content[0].image"],
      ["tool", "turn[1].tool[0].content[0].image"],
      ["tool", "turn[2].tool[0].content[0].image"],
      ["tool", "turn[3].tool[0].content[0].image"],
    ]);
    const deltas = (await mem.get(inp.key))!.deltas;
    const toolB64 = toolUri.slice("data:image/png;base64,".length);
    const promptB64 = promptUri.slice("data:image/png;base64,".length);
    const count = (text: string, needle: string) => text.split(needle).length - 1;
    // The run state's commits: a tool image's bytes are written three times, all in the commit that added it — in the
    // tool message, in image_data (the engine's data URI) and in multi_modal.images[].data. Whole lists would write
    // 3, then 6, then 9. The last commit's finished output holds the record's multi_modal once (each image once).
    const loops = deltas.map((t) => JSON.stringify((JSON.parse(t) as { loop?: unknown }).loop ?? null));
    const perCommit = loops.map((t) => count(t, toolB64));
    expect(perCommit.filter((n) => n > 0)).toEqual([3, 3, 3]);
    expect(count(JSON.stringify((JSON.parse(deltas.at(-1)!) as { outputs: unknown }).outputs), toolB64)).toBe(3);
    // The prompt image: in the prompt message, image_data and multi_modal of the commit that built the prompt, never again.
    const promptPerCommit = loops.map((t) => count(t, promptB64));
    expect(promptPerCommit.filter((n) => n > 0)).toEqual([3]);
    // A delta names how many images of the state before it it keeps.
    const withImages = deltas.map((t) => JSON.parse(t) as { loop?: { lists_from?: Record<string, number> } }).filter((d) => d.loop?.lists_from?.image_data !== undefined);
    expect(withImages.at(-1)!.loop!.lists_from!.image_data).toBe(4);
    expect(withImages.at(-1)!.loop!.lists_from!.multi_modal_images).toBe(4);

    for (let kill = 2; kill <= deltas.length; kill++) {
      const inner = new MemorySessionStorage();
      const k = input(`thrice${kill}`, THRICE);
      const s = (await TrajectorySession.open(k.key, { storage: dyingAt(inner, kill), createLoop: sessionLoopFactory(deps()), commitRetries: 0 }, k))!;
      await expect(s.run()).rejects.toThrow("killed");
      const before = wire.length;
      const r = await (await TrajectorySession.open(k.key, { storage: inner, createLoop: sessionLoopFactory(deps()) }))!.run();
      if (r.status !== "finished") throw new Error(`kill ${kill}: ${JSON.stringify(r)}`);
      const got = r.outputs[0]!;
      expect(got.response_ids).toEqual(want.response_ids);
      expect(got.response_mask).toEqual(want.response_mask);
      expect(got.multi_modal).toEqual(want.multi_modal);
      for (const body of wire.slice(before)) {
        const runs = (body.input_ids as number[]).filter((x, i, a) => x === PAD && a[i - 1] === VS).length;
        expect(body.image_data).toEqual([promptUri, toolUri, toolUri, toolUri].slice(0, runs));
      }
    }
  }, 60_000);

  test("resumed at every commit: multi_modal and image_data survive (the record equals the uninterrupted one)", async () => {
    const mem = new MemorySessionStorage();
    const ref = (await TrajectorySession.open(input("ref").key, { storage: mem, createLoop: sessionLoopFactory(deps()) }, input("ref")))!;
    const rr = await ref.run();
    if (rr.status !== "finished") throw new Error(JSON.stringify(rr));
    const want = rr.outputs[0]!;
    expect(want.multi_modal!.images.map((i) => i.source)).toEqual(["prompt", "tool"]);
    const commits = (await mem.get(input("ref").key))!.deltas.length;
    expect(commits).toBeGreaterThanOrEqual(3);
    for (let kill = 2; kill <= commits; kill++) {
      const inner = new MemorySessionStorage();
      const inp = input(`kill${kill}`);
      const s = (await TrajectorySession.open(inp.key, { storage: dyingAt(inner, kill), createLoop: sessionLoopFactory(deps()), commitRetries: 0 }, inp))!;
      await expect(s.run()).rejects.toThrow("killed");
      const before = wire.length;
      const resumed = (await TrajectorySession.open(inp.key, { storage: inner, createLoop: sessionLoopFactory(deps()) }))!;
      const r = await resumed.run();
      if (r.status !== "finished") throw new Error(`kill ${kill}: ${JSON.stringify(r)}`);
      const got = r.outputs[0]!;
      expect(got.prompt_ids).toEqual(want.prompt_ids);
      expect(got.response_ids).toEqual(want.response_ids);
      expect(got.response_mask).toEqual(want.response_mask);
      expect(got.multi_modal).toEqual(want.multi_modal);
      // A call sent after the resume carries every image of its context (the sim refuses a count that differs).
      for (const body of wire.slice(before)) {
        const runs = (body.input_ids as number[]).filter((x, i, a) => x === PAD && a[i - 1] === VS).length;
        expect((body.image_data as string[]).length).toBe(runs);
        expect(body.image_data).toEqual([promptUri, toolUri].slice(0, runs));
      }
    }
  }, 60_000);
});
