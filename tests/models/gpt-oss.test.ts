import { describe, expect, test } from "bun:test";
import { Template } from "@huggingface/jinja";
import { GPT_OSS_CHAT_TEMPLATE, GPT_OSS_STOP_IDS, gptOssTurnClose, HARMONY_TOKENS } from "../../shared/models/gpt-oss.ts";
import { HarmonyToolCallParser } from "../../shared/tools/harmony-parser.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import type { ChatMessage } from "../../shared/schema/index.ts";
import { DOC_AFTER_TOOL, DOC_CALL_OUTPUT, DOC_DEVELOPER, DOC_INPUT, DOC_KWARGS, DOC_SYSTEM, DOC_TOOLS } from "./harmony-doc-fixtures.ts";
import { gptOssTokenizer } from "./gpt-oss-tokenizer.ts";

const tpl = new Template(GPT_OSS_CHAT_TEMPLATE);
const render = (messages: unknown[], opts: { tools?: unknown; gen?: boolean; kwargs?: Record<string, unknown> } = {}) =>
  tpl.render({ messages, tools: opts.tools, add_generation_prompt: opts.gen ?? true, ...(opts.kwargs ?? {}) });

/** The guide's StreamableParser example: the ids of a sampled analysis + final answer, ending with <|return|>. */
const DOC_SAMPLED_IDS = [
  200005, 35644, 200008, 1844, 31064, 25, 392, 4827, 382, 220, 17, 659, 220, 17, 16842, 12295, 81645, 13, 51441, 6052, 13, 200007, 200006, 173781, 200005, 17196, 200008, 17, 659, 220, 17, 314, 220, 19, 13, 200002,
];
const DOC_SAMPLED_TEXT = '<|channel|>analysis<|message|>User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|return|>';
const DEFAULT_SYSTEM =
  "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>";

describe("gpt-oss harmony template: the guide's documented examples", () => {
  test("complete input with the developer message's functions namespace (exact text)", () => {
    expect(render([{ role: "system", content: "Use a friendly tone." }, { role: "user", content: "What is the weather like in SF?" }], { tools: DOC_TOOLS, kwargs: DOC_KWARGS })).toBe(DOC_INPUT);
  });

  test("input after the tool call: analysis kept, the call, the tool message, generation prompt (exact text)", () => {
    const messages = [
      { role: "system", content: "Use a friendly tone." },
      { role: "user", content: "What is the weather like in SF?" },
      { role: "assistant", content: "", reasoning_content: "Need to use function get_weather.", tool_calls: [{ type: "function", function: { name: "get_weather", arguments: '{"location":"San Francisco"}' } }] },
      { role: "tool", content: '{"sunny": true, "temperature": 20}' },
    ];
    expect(render(messages, { tools: DOC_TOOLS, kwargs: DOC_KWARGS })).toBe(DOC_AFTER_TOOL);
    // The tool's name in the message wins over the positional lookup.
    expect(render([...messages.slice(0, 3), { role: "tool", name: "get_weather", content: "x" }], { tools: DOC_TOOLS, kwargs: DOC_KWARGS })).toContain("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>x<|end|>");
  });

  test("system message without tools; the basic chat input", () => {
    expect(render([{ role: "user", content: "What is 2 + 2?" }])).toBe(`${DEFAULT_SYSTEM}<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant`);
    expect(render([], { tools: DOC_TOOLS, kwargs: DOC_KWARGS, gen: false })).toBe(DOC_SYSTEM + DOC_DEVELOPER.replace("# Instructions\n\nUse a friendly tone.\n\n", ""));
  });

  test("history: earlier analysis dropped once a user message follows, the final answer closed with <|end|>; a training render ends with <|return|>", () => {
    const convo = [
      { role: "user", content: "What is 2 + 2?" },
      { role: "assistant", content: "2 + 2 = 4.", reasoning_content: 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.' },
    ];
    expect(render([...convo, { role: "user", content: "What about 9 / 2?" }])).toBe(
      `${DEFAULT_SYSTEM}<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|end|><|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant`,
    );
    expect(render(convo, { gen: false })).toBe(`${DEFAULT_SYSTEM}<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant${DOC_SAMPLED_TEXT}`);
  });

  test("JSON-schema → TypeScript: nested objects, unions, arrays of enums, numbers, booleans, defaults, no-description fields", () => {
    const tools = [
      {
        type: "function",
        function: {
          name: "f",
          description: "Line one.\nLine two.",
          parameters: {
            type: "object",
            properties: {
              n: { type: "integer", default: 3 },
              ok: { type: "boolean", default: false },
              tags: { type: "array", items: { type: "string", enum: ["a", "b"] } },
              any: { type: ["string", "null"] },
              opt: { type: "object", properties: { x: { type: "number", description: "ex" } }, required: ["x"] },
              free: { type: "object" },
              u: { anyOf: [{ type: "string" }, { type: "number" }] },
            },
            required: ["n"],
          },
        },
      },
    ];
    const dev = render([], { tools, gen: false });
    expect(dev.slice(dev.indexOf("namespace functions"))).toBe(
      'namespace functions {\n\n// Line one.\n// Line two.\ntype f = (_: {\nn: number, // default: 3\nok?: boolean, // default: false\ntags?: ("a" | "b")[],\nany?: string | null,\nopt?: {\n// ex\nx: number,\n},\nfree?: object,\nu?: string | number,\n}) => any;\n\n} // namespace functions<|end|>',
    );
  });
});

describe("gpt-oss tokens (gptoss tokenizer + our template)", () => {
  test("special-token ids and the stop list", async () => {
    const tok = await gptOssTokenizer();
    for (const [text, id] of Object.entries(HARMONY_TOKENS)) expect([text, tok.tokenId(text)]).toEqual([text, id]);
    expect(tok.eosTokenId).toBe(200002);
    expect(tok.stopTokenIds).toEqual([...GPT_OSS_STOP_IDS]);
    expect(tok.isStopToken(200007)).toBe(false);
  });

  test("the guide's sampled ids decode to the documented output and parse as a final answer", async () => {
    const tok = await gptOssTokenizer();
    expect(tok.encode(DOC_SAMPLED_TEXT)).toEqual(DOC_SAMPLED_IDS);
    expect(tok.decode(DOC_SAMPLED_IDS)).toBe(DOC_SAMPLED_TEXT);
    expect(new HarmonyToolCallParser().extract(tok.decode(DOC_SAMPLED_IDS))).toEqual({ content: "2 + 2 = 4.", calls: [], errors: [] });
  });

  test("the documented input's ids: each harmony marker is one special token", async () => {
    const tok = await gptOssTokenizer();
    const ids = tok.renderIds([{ role: "system", content: "Use a friendly tone." }, { role: "user", content: "What is the weather like in SF?" }], {
      tools: DOC_TOOLS,
      addGenerationPrompt: true,
      chatTemplateKwargs: DOC_KWARGS,
    });
    expect(ids).toEqual(tok.encode(DOC_INPUT));
    expect(ids.slice(0, 3)).toEqual([200006, 17360, 200008]);
    expect(ids.slice(-2)).toEqual([200006, 173781]);
    expect(ids.filter((i) => i === 200006).length).toBe(4);
    expect(ids.filter((i) => i === 200007).length).toBe(3);
  });

  test("turn close: nothing after <|return|>, <|call|> or <|end|>; <|end|> after <|endoftext|>; nothing after a length stop", () => {
    expect(gptOssTurnClose(200002)).toEqual([]);
    expect(gptOssTurnClose(200012)).toEqual([]);
    expect(gptOssTurnClose(200007)).toEqual([]);
    expect(gptOssTurnClose(199999)).toEqual([200007]);
    expect(gptOssTurnClose(13)).toEqual([]);
    expect(gptOssTurnClose(undefined)).toEqual([]);
  });

  test("one tool round: prompt ‖ sampled call ‖ observation equals the guide's after-tool input, token for token", async () => {
    const tok = await gptOssTokenizer();
    const enc = new ObservationEncoder(tok, { tools: DOC_TOOLS, chatTemplateKwargs: DOC_KWARGS });
    const prompt = tok.renderIds([{ role: "system", content: "Use a friendly tone." }, { role: "user", content: "What is the weather like in SF?" }], {
      tools: DOC_TOOLS,
      addGenerationPrompt: true,
      chatTemplateKwargs: DOC_KWARGS,
    });
    const sampled = tok.encode(DOC_CALL_OUTPUT);
    expect(sampled.at(-1)).toBe(200012);
    const call = new HarmonyToolCallParser().extract(tok.decode(sampled));
    expect(call.calls.map((c) => [c.name, c.arguments])).toEqual([["get_weather", { location: "San Francisco" }]]);
    const toolMsg: ChatMessage = { role: "tool", name: "get_weather", content: '{"sunny": true, "temperature": 20}' };
    const obs = [...gptOssTurnClose(sampled.at(-1)), ...enc.encode([toolMsg], undefined)];
    expect(tok.decode(obs)).toBe('<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"sunny": true, "temperature": 20}<|end|><|start|>assistant');
    expect([...prompt, ...sampled, ...obs]).toEqual(tok.encode(DOC_AFTER_TOOL));
  });

  test("a user turn after the sampled <|return|>: the observation starts after it and the <|return|> stays (no re-render to <|end|>)", async () => {
    const tok = await gptOssTokenizer();
    const enc = new ObservationEncoder(tok);
    const prompt = tok.renderIds([{ role: "user", content: "What is 2 + 2?" }], { addGenerationPrompt: true });
    const obs = [...gptOssTurnClose(200002), ...enc.encode([{ role: "user", content: "What about 9 / 2?" }], undefined)];
    expect(tok.decode(obs)).toBe("<|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant");
    const trajectory = tok.decode([...prompt, ...DOC_SAMPLED_IDS, ...obs]);
    // What the trainer sees: the turn as sampled (analysis and <|return|> kept) …
    expect(trajectory).toBe(`${DEFAULT_SYSTEM}<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant${DOC_SAMPLED_TEXT}<|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant`);
    // … where a fresh render of the same conversation drops the analysis and writes <|end|>.
    const fresh = tok.renderText(
      [
        { role: "user", content: "What is 2 + 2?" },
        { role: "assistant", content: "2 + 2 = 4.", reasoning_content: 'User asks: "What is 2 + 2?" Simple arithmetic. Provide answer.' },
        { role: "user", content: "What about 9 / 2?" },
      ],
      { addGenerationPrompt: true },
    );
    expect(fresh).toBe(`${DEFAULT_SYSTEM}<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.<|end|><|start|>user<|message|>What about 9 / 2?<|end|><|start|>assistant`);
  });

  test("two parallel calls, their results, then the final answer: exact ids of the whole trajectory", async () => {
    const tok = await gptOssTokenizer();
    const enc = new ObservationEncoder(tok);
    const prompt = tok.renderIds([{ role: "user", content: "Weather in Paris and Oslo?" }], { addGenerationPrompt: true });
    const turn1 =
      '<|channel|>analysis<|message|>Two cities.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Oslo"}<|call|>';
    const parsed = new HarmonyToolCallParser().extract(turn1);
    expect(parsed.calls.map((c) => [c.index, c.name, c.arguments])).toEqual([
      [0, "get_weather", { city: "Paris" }],
      [1, "get_weather", { city: "Oslo" }],
    ]);
    const sampled1 = tok.encode(turn1);
    const obs = [
      ...gptOssTurnClose(sampled1.at(-1)),
      ...enc.encode(
        [
          { role: "tool", name: "get_weather", content: "18C" },
          { role: "tool", name: "get_weather", content: "9C" },
        ],
        undefined,
      ),
    ];
    expect(tok.decode(obs)).toBe(
      "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>18C<|end|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>9C<|end|><|start|>assistant",
    );
    const sampled2 = tok.encode("<|channel|>final<|message|>Paris 18C, Oslo 9C.<|return|>");
    const ids = [...prompt, ...sampled1, ...obs, ...sampled2];
    const full = tok.renderIds([
      { role: "user", content: "Weather in Paris and Oslo?" },
      { role: "assistant", content: "", reasoning_content: "Two cities.", tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } }, { type: "function", function: { name: "get_weather", arguments: { city: "Oslo" } } }] },
      { role: "tool", content: "18C" },
      { role: "tool", content: "9C" },
      { role: "assistant", content: "Paris 18C, Oslo 9C." },
    ]);
    // Arguments reach the template as the compact JSON string (GPT_OSS_TRAITS.argumentsAsString), so the re-render is byte-exact.
    expect(full).toEqual(ids);
    expect(ids.slice(prompt.length - 2, prompt.length)).toEqual([200006, 173781]);
    expect(ids.at(-1)).toBe(200002);
    expect(ids.filter((i) => i === 200012).length).toBe(2);
  });

  test("E4 for gpt-oss: the observation encoder writes gptOssTurnClose — nothing after <|return|>/<|call|>/<|end|>, <|end|> after <|endoftext|>", async () => {
    const tok = await gptOssTokenizer();
    const enc = new ObservationEncoder(tok);
    const user: ChatMessage = { role: "user", content: "Go on." };
    const body = tok.encode("<|start|>user<|message|>Go on.<|end|><|start|>assistant");
    for (const last of [200002, 200012, 200007, 199999, 13]) expect([last, enc.encode([user], last)]).toEqual([last, [...gptOssTurnClose(last), ...body]]);
    expect(enc.encode([user], 199999)[0]).toBe(200007);
  });
});
