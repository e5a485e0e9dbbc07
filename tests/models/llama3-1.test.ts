import { beforeAll, describe, expect, test } from "bun:test";
import { builtinTokenizer } from "../../shared/models/index.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Load the tokenizers once, with room for a loaded machine (bun's per-test default is 5 s).
beforeAll(async () => {
  await Promise.all(["llama3_1"].map((n) => builtinTokenizer(n)));
}, HANG_MS);

// Llama 3.1 JSON tool calling with the ipython role: our template against the
// documented prompt format, token for token.
const BOT = 128000, EOT_TEXT = 128001, SH = 128006, EH = 128007, EOM = 128008, EOT = 128009;

const weather: ToolSchema = {
  type: "function",
  function: {
    name: "get_current_conditions",
    description: "Get the current weather conditions for a specific location",
    parameters: { type: "object", properties: { location: { type: "string", description: "The city and state, e.g., San Francisco, CA" } }, required: ["location"] },
  },
};

const DOC_PROMPT =
  "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" +
  "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" +
  "You are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n" +
  "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" +
  'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\n\n' +
  JSON.stringify(weather, null, 4) +
  "\n\nWhat is the weather like in San Francisco?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

const convo: ChatMessage[] = [
  { role: "system", content: "You are a helpful assistant" },
  { role: "user", content: "What is the weather like in San Francisco?" },
];

describe("llama3_1 template (ours)", () => {
  test("the documented JSON tool-calling prompt: system with dates, tools in the first user message", async () => {
    const tok = await builtinTokenizer("llama3_1");
    expect(tok.renderText(convo, { tools: [weather], addGenerationPrompt: true })).toBe(DOC_PROMPT);
    const ids = tok.renderIds(convo, { tools: [weather], addGenerationPrompt: true });
    expect(ids.slice(0, 5)).toEqual([BOT, SH, 9125, EH, 271]);
    expect(ids.slice(-4)).toEqual([SH, 78191, EH, 271]);
  });

  test("without tools: the plain Llama 3.1 system block", async () => {
    const tok = await builtinTokenizer("llama3_1");
    expect(tok.renderText([{ role: "user", content: "Hi" }], { addGenerationPrompt: true })).toBe(
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    );
  });

  test("one tool round and a final answer: call JSON, ipython result, exact ids", async () => {
    const tok = await builtinTokenizer("llama3_1");
    const call = '{"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA"}}';
    const msgs: ChatMessage[] = [
      ...convo,
      { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "get_current_conditions", arguments: { location: "San Francisco, CA" } } }] },
      { role: "tool", content: '{"output": "Clouds giving way to sun Hi: 76° Tonight: Mainly clear early"}' },
      { role: "assistant", content: "It is 76° and sunny." },
    ];
    const text = tok.renderText(msgs, { tools: [weather] });
    expect(text).toBe(
      DOC_PROMPT +
        call +
        "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n" +
        '{"output": "Clouds giving way to sun Hi: 76° Tonight: Mainly clear early"}' +
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nIt is 76° and sunny.<|eot_id|>",
    );
    // Observation after the sampled call: exactly the ipython turn and the next generation prompt.
    const enc = new ObservationEncoder(tok, { tools: [weather] });
    const obs = enc.encode([msgs[3]!], EOT);
    expect(obs).toEqual([SH, 23799, 4690, EH, 271, ...tok.encode('{"output": "Clouds giving way to sun Hi: 76° Tonight: Mainly clear early"}'), EOT, SH, 78191, EH, 271]);
    const prompt = tok.renderIds(convo, { tools: [weather], addGenerationPrompt: true });
    const sampled = [...tok.encode(call), EOT];
    expect([...prompt, ...sampled, ...obs]).toEqual(tok.renderIds(msgs.slice(0, 4), { tools: [weather], addGenerationPrompt: true }));
  });

  test("two parallel calls are joined with '; ' and two ipython turns follow", async () => {
    const tok = await builtinTokenizer("llama3_1");
    const msgs: ChatMessage[] = [
      { role: "user", content: "Weather in SF and NYC?" },
      {
        role: "assistant",
        content: "",
        tool_calls: [
          { type: "function", function: { name: "get_current_conditions", arguments: { location: "SF" } } },
          { type: "function", function: { name: "get_current_conditions", arguments: { location: "NYC" } } },
        ],
      },
      { role: "tool", content: "76" },
      { role: "tool", content: "60" },
    ];
    const text = tok.renderText(msgs, { tools: [weather], addGenerationPrompt: true });
    expect(text.endsWith(
      '{"name": "get_current_conditions", "parameters": {"location": "SF"}}; {"name": "get_current_conditions", "parameters": {"location": "NYC"}}<|eot_id|>' +
        "<|start_header_id|>ipython<|end_header_id|>\n\n76<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n60<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    )).toBe(true);
  });

  test("E4 for Llama 3.1: <|end_of_text|> (128001) is closed with <|eot_id|>; <|eom_id|> (128008) ends the turn as is", async () => {
    const tok = await builtinTokenizer("llama3_1");
    const enc = new ObservationEncoder(tok, { tools: [weather] });
    const result: ChatMessage = { role: "tool", content: "76" };
    const body = [SH, 23799, 4690, EH, 271, ...tok.encode("76"), EOT, SH, 78191, EH, 271];
    expect(enc.encode([result], EOT)).toEqual(body);
    expect(enc.encode([result], EOM)).toEqual(body);
    expect(enc.encode([result], EOT_TEXT)).toEqual([EOT, ...body]);
    expect(enc.encode([result], 12345)).toEqual(body);
    expect(tok.decode([SH, 23799, 4690, EH])).toBe("<|start_header_id|>ipython<|end_header_id|>");
  });

  test("a tools conversation needs a user message to carry the tools: TemplateError, not a wrong render", async () => {
    const tok = await builtinTokenizer("llama3_1");
    expect(() => tok.renderText([{ role: "system", content: "s" }], { tools: [weather] })).toThrow("puts the tools into the first user message");
  });
});
