import { beforeAll, describe, expect, test } from "bun:test";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { buildPromptIds } from "../../shared/tokens/prompt.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { TrajectoryBuilder } from "../../shared/tokens/trajectory-builder.ts";
import { InputError, TemplateError } from "../../shared/errors.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Cases from ../shared/fixtures/trajectory-cases.md, with their exact Qwen3 ids.
const IM_START = 151644;
const IM_END = 151645;
const GEN_PROMPT = [IM_START, 77091, 198];

let tok: ChatTokenizer;
beforeAll(async () => {
  tok = await defaultTokenizer();
});

const weatherTool: ToolSchema = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Get the weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};

function builderFor(promptIds: number[], responseLength = 1024, maxModelLen = 40960): TrajectoryBuilder {
  return new TrajectoryBuilder({ promptIds, responseLength, maxModelLen, trackLogProbs: true });
}

describe("C1 sampled tokens survive untouched", () => {
  test("non-canonical BPE split [4272, 285, 151645] is kept, not re-encoded to [59604, 151645]", () => {
    expect(tok.encode("Paris")).toEqual([59604]);
    const { promptIds } = buildPromptIds(tok, [{ role: "user", content: "Capital of France?" }], { promptLength: 512 });
    const b = builderFor(promptIds);
    b.appendAction([4272, 285, IM_END], [-0.5, -0.25, -0.125]);
    expect(b.responseIds()).toEqual([4272, 285, IM_END]);
    expect(b.responseLogprobs()).toEqual([-0.5, -0.25, -0.125]);
    const obs = new ObservationEncoder(tok).encode([{ role: "user", content: "Sure?" }], b.lastTokenId);
    b.appendObservation(obs);
    // The next turn's prompt is previous prompt ‖ sampled ids ‖ observation ids.
    expect(b.contextIds()).toEqual([...promptIds, 4272, 285, IM_END, ...obs]);
    expect(b.responseMask()).toEqual([1, 1, 1, ...obs.map(() => 0 as const)]);
  });

  test("[198, 198] stays two ids although '\\n\\n' encodes to [271]", () => {
    expect(tok.encode("\n\n")).toEqual([271]);
    const b = builderFor([1, 2, 3]);
    b.appendAction([198, 198], [-1, -2]);
    expect(b.responseIds()).toEqual([198, 198]);
    expect(b.responseLogprobs()).toEqual([-1, -2]);
  });
});

describe("C2 the turn separator after <|im_end|>", () => {
  const user: ChatMessage = { role: "user", content: "What is the weather in Paris?" };
  const callText = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';

  test("observation ids and equality with the full render", () => {
    const { promptIds } = buildPromptIds(tok, [user], { tools: [weatherTool], promptLength: 4096 });
    const b = builderFor(promptIds);
    const sampled = [...tok.encode(callText), IM_END];
    b.appendAction(sampled, sampled.map(() => -0.1));
    const enc = new ObservationEncoder(tok, { tools: [weatherTool] });
    const obs = enc.encode([{ role: "tool", content: "sunny" }], b.lastTokenId);
    expect(obs).toEqual([198, IM_START, 872, 198, 151665, 198, 82, 27297, 198, 151666, IM_END, 198, IM_START, 77091, 198]);
    b.appendObservation(obs);
    expect(b.responseMask().slice(sampled.length)).toEqual(obs.map(() => 0));
    expect(b.responseLogprobs()!.slice(sampled.length)).toEqual(obs.map(() => 0));
    const full = tok.renderIds(
      [
        user,
        { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } }] },
        { role: "tool", content: "sunny" },
      ],
      { tools: [weatherTool], addGenerationPrompt: true },
    );
    expect(b.contextIds()).toEqual(full);
  });
});

describe("C3 append-only when the template rewrites history", () => {
  test("think tokens are kept and the user turn is encoded alone", () => {
    const { promptIds } = buildPromptIds(tok, [{ role: "user", content: "Q1" }], { promptLength: 512 });
    expect(promptIds).toEqual([IM_START, 872, 198, 48, 16, IM_END, 198, IM_START, 77091, 198]);
    const sampled = [151667, 198, 81, 16, 198, 151668, 271, 32, 16, IM_END];
    expect(tok.encode("<think>\nr1\n</think>\n\nA1<|im_end|>")).toEqual(sampled);
    const b = builderFor(promptIds);
    b.appendAction(sampled, sampled.map(() => -0.2));
    const obs = new ObservationEncoder(tok).encode([{ role: "user", content: "Q2" }], b.lastTokenId);
    expect(obs).toEqual([198, IM_START, 872, 198, 48, 17, IM_END, 198, IM_START, 77091, 198]);
    b.appendObservation(obs);
    expect(b.responseIds()).toEqual([...sampled, ...obs]);
    // A full re-render would have dropped the think block: slicing it would be wrong.
    const rerender = tok.renderIds(
      [
        { role: "user", content: "Q1" },
        { role: "assistant", content: "<think>\nr1\n</think>\n\nA1" },
        { role: "user", content: "Q2" },
      ],
      { addGenerationPrompt: true },
    );
    expect(rerender).not.toEqual(b.contextIds());
  });
});

describe("C4 parallel tool results are one user turn", () => {
  test("two results, each once, then the generation prompt", () => {
    const enc = new ObservationEncoder(tok, { tools: [weatherTool] });
    const obs = enc.encode(
      [
        { role: "tool", content: "AAA" },
        { role: "tool", content: "BBB" },
      ],
      IM_END,
    );
    expect(obs).toEqual([
      198,
      ...[IM_START, 872, 198, 151665, 198, 50107, 198, 151666, 198, 151665, 198, 10098, 33, 198, 151666, IM_END, 198],
      ...GEN_PROMPT,
    ]);
  });
});

describe("C5 stripping exactly the template's preamble", () => {
  test("with tools: no system/tools block, no lost leading token", () => {
    const obs = new ObservationEncoder(tok, { tools: [weatherTool] }).encode([{ role: "tool", content: "x" }], IM_END);
    const text = tok.decode(obs);
    expect(text).toBe("\n<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n");
    expect(text).not.toContain("# Tools");
  });

  test("a template that adds nothing has nothing stripped", () => {
    const obsNoTools = new ObservationEncoder(tok).encode([{ role: "tool", content: "x" }], IM_END);
    const obsTools = new ObservationEncoder(tok, { tools: [weatherTool] }).encode([{ role: "tool", content: "x" }], IM_END);
    expect(obsNoTools).toEqual(obsTools);
    expect(obsNoTools[1]).toBe(IM_START);
  });

  test("no separator when the turn did not end with <|im_end|>", () => {
    const obs = new ObservationEncoder(tok).encode([{ role: "user", content: "go on" }], 4272);
    expect(obs[0]).toBe(IM_START);
  });

  test("roles that cannot follow an assistant turn in that order are refused, never encoded wrongly", () => {
    const enc = new ObservationEncoder(tok);
    expect(() =>
      enc.encode(
        [
          { role: "user", content: "b" },
          { role: "tool", content: "a" },
        ],
        IM_END,
      ),
    ).toThrow(TemplateError);
    expect(() => enc.encode([{ role: "assistant", content: "a" }], IM_END)).toThrow(TemplateError);
  });

  test("tool results then a user turn (an agent's request may hold both) are one observation", () => {
    const enc = new ObservationEncoder(tok);
    const ids = enc.encode(
      [
        { role: "tool", content: "a" },
        { role: "user", content: "b" },
      ],
      IM_END,
    );
    expect(tok.decode(ids)).toBe("\n<|im_start|>user\n<tool_response>\na\n</tool_response><|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n");
  });
});

describe("C6 every engine prompt ends with the generation prompt", () => {
  test("after a user turn", () => {
    const msgs: ChatMessage[] = [
      { role: "user", content: "Q1" },
      { role: "assistant", content: "A1" },
      { role: "user", content: "Q2" },
    ];
    const { promptIds } = buildPromptIds(tok, msgs, { promptLength: 512 });
    expect(promptIds.slice(-3)).toEqual(GEN_PROMPT);
  });

  test("with thinking disabled, the empty think block follows (mask 0)", () => {
    const kw = { enable_thinking: false };
    const { promptIds } = buildPromptIds(tok, [{ role: "user", content: "Q1" }], { promptLength: 512, chatTemplateKwargs: kw });
    expect(promptIds.slice(-7)).toEqual([...GEN_PROMPT, 151667, 271, 151668, 271]);
    const b = builderFor(promptIds);
    b.appendAction([32, 16, IM_END], [-1, -1, -1]);
    const obs = new ObservationEncoder(tok, { chatTemplateKwargs: kw }).encode([{ role: "user", content: "Q2" }], IM_END);
    expect(obs.slice(-7)).toEqual([...GEN_PROMPT, 151667, 271, 151668, 271]);
    b.appendObservation(obs);
    expect(b.responseMask().slice(-7)).toEqual([0, 0, 0, 0, 0, 0, 0]);
  });
});

describe("C7 mask only what was sampled", () => {
  test("header in the prompt, sampled ids up to <|im_end|> are 1, the 198 after it is 0", () => {
    const { promptIds } = buildPromptIds(tok, [{ role: "user", content: "Q1" }], { promptLength: 512 });
    expect(promptIds.slice(-3)).toEqual(GEN_PROMPT);
    const b = builderFor(promptIds);
    b.appendAction([32, 16, IM_END], [-1, -1, -1]);
    const obs = new ObservationEncoder(tok).encode([{ role: "tool", content: "r" }], b.lastTokenId);
    b.appendObservation(obs);
    expect(b.responseIds().slice(0, 4)).toEqual([32, 16, IM_END, 198]);
    expect(b.responseMask()).toEqual([1, 1, 1, ...obs.map(() => 0 as const)]);
  });
});

describe("C8 truncation cuts every per-token array together", () => {
  test("response_length 4: three sampled ids, observation cut to one id", () => {
    const b = builderFor([1, 2], 4);
    expect(b.appendAction([10, 11, 12], [-0.5, -0.5, -0.5])).toEqual({ appended: 3, truncated: false });
    expect(b.appendObservation([20, 21, 22])).toEqual({ appended: 1, truncated: true });
    expect(b.responseIds()).toEqual([10, 11, 12, 20]);
    expect(b.responseMask()).toEqual([1, 1, 1, 0]);
    expect(b.responseLogprobs()).toEqual([-0.5, -0.5, -0.5, 0]);
    expect(b.truncated).toBe(true);
    expect(b.nextMaxTokens()).toBe(0);
    const out = b.finish({
      numTurns: 3,
      rewardScore: null,
      metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 },
      extraFields: {},
      finishReason: "length",
    });
    expect(out.truncated).toBe(true);
    expect(out.response_ids.length).toBe(4);
  });

  test("an over-long action is cut too", () => {
    const b = builderFor([1], 2);
    expect(b.appendAction([5, 6, 7], [-1, -2, -3])).toEqual({ appended: 2, truncated: true });
    expect(b.responseLogprobs()).toEqual([-1, -2]);
  });
});

describe("C11 the remaining budget on every later request", () => {
  test("max_tokens = min(24576 − g, 40960 − 19202)", () => {
    const prompt = new Array(19202 - 5000).fill(7);
    const b = builderFor(prompt, 24576, 40960);
    b.appendAction(new Array(3000).fill(9), new Array(3000).fill(-1));
    b.appendObservation(new Array(2000).fill(8));
    expect(b.contextLength).toBe(19202);
    expect(b.nextMaxTokens()).toBe(Math.min(24576 - 5000, 40960 - 19202));
    expect(b.nextMaxTokens()).toBe(19576);
  });

  test("when the budget is the limit", () => {
    const b = builderFor(new Array(100).fill(1), 50, 40960);
    b.appendAction(new Array(45).fill(2), new Array(45).fill(-1));
    expect(b.nextMaxTokens()).toBe(5);
    b.appendObservation([3, 3, 3, 3, 3]);
    expect(b.nextMaxTokens()).toBe(0);
  });
});

describe("C12 over-long accumulated prompt: truncate, don't error", () => {
  test("context 256, a tool turn that would make 273 ids: cut at the context, no positive max_tokens", () => {
    const b = builderFor(new Array(200).fill(1), 1024, 256);
    b.appendAction(new Array(40).fill(2), new Array(40).fill(-1));
    // The 33-id observation would make 273 ids; the stream never exceeds the context.
    expect(b.appendObservation(new Array(33).fill(3))).toEqual({ appended: 16, truncated: true });
    expect(b.contextLength).toBe(256);
    expect(b.nextMaxTokens()).toBe(0);
    expect(b.truncated).toBe(true);
  });

  test("text prompts over prompt_length are left-truncated", () => {
    const msgs: ChatMessage[] = [{ role: "user", content: "word ".repeat(300) }];
    const full = tok.renderIds(msgs, { addGenerationPrompt: true });
    const { promptIds, truncated } = buildPromptIds(tok, msgs, { promptLength: 64 });
    expect(truncated).toBe(true);
    expect(promptIds).toEqual(full.slice(full.length - 64));
    expect(promptIds.slice(-3)).toEqual(GEN_PROMPT);
  });

  test("multimodal prompts are rejected", () => {
    const msgs: ChatMessage[] = [
      { role: "user", content: [{ type: "image", image: "x.png" } as never, { type: "text", text: "what is this?" }] },
    ];
    expect(() => buildPromptIds(tok, msgs, { promptLength: 8 })).toThrow(InputError);
    try {
      buildPromptIds(tok, msgs, { promptLength: 8 });
    } catch (e) {
      // Named at the first media part, with the family to use instead.
      expect((e as InputError).field).toBe("prompt[0].content[0]");
      expect((e as InputError).message).toBe(`prompt[0].content[0]: holds image parts, and model ${tok.name} (family ${tok.traits.family}) is text-only; use a vision-language family (--model qwen3_vl)`);
    }
  });
});

describe("chat template rendering", () => {
  test("tool-call arguments as a JSON string or an object render identically", () => {
    const asString = tok.renderText([
      { role: "user", content: "q" },
      { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "f", arguments: '{"x":1,"y":"a"}' } }] },
    ]);
    const asObject = tok.renderText([
      { role: "user", content: "q" },
      { role: "assistant", content: "", tool_calls: [{ type: "function", function: { name: "f", arguments: { x: 1, y: "a" } } }] },
    ]);
    expect(asString).toBe(asObject);
    expect(asObject).toContain('{"name": "f", "arguments": {"x": 1, "y": "a"}}');
  });

  test("the tokenizer is cached per model", async () => {
    expect(await defaultTokenizer()).toBe(tok);
  });
});

describe("tokenizer edges", () => {
  test("decode of no ids is the empty string", () => {
    expect(tok.decode([])).toBe("");
    expect(tok.decode(new Int32Array(0))).toBe("");
  });
});

describe("observation encoder on a template without boundary tokens", () => {
  test("falls back to the token diff of full renders and still strips the preamble", async () => {
    const { loadDefaultModelFiles, ChatTokenizer } = await import("../../shared/tokens/tokenizer.ts");
    const files = await loadDefaultModelFiles();
    const toy = new ChatTokenizer({
      ...files,
      name: "toy",
      tokenizerConfig: {
        ...files.tokenizerConfig,
        chat_template:
          "{% if tools %}TOOLS {{ tools | length }}\n{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}",
      },
    });
    const enc = new ObservationEncoder(toy, { tools: [weatherTool] });
    const obs = enc.encode([{ role: "tool", content: "42" }], 4272);
    expect(toy.decode(obs)).toBe("tool: 42\nassistant:");
    expect(obs).toEqual([...toy.encode("tool: 42\n"), ...toy.encode("assistant:")]);
    // The full render of the conversation equals prompt ‖ sampled ‖ observation here too.
    const prompt = toy.renderIds([{ role: "user", content: "q" }], { tools: [weatherTool], addGenerationPrompt: true });
    const sampled = toy.encode(" call\n");
    const full = toy.renderIds(
      [
        { role: "user", content: "q" },
        { role: "assistant", content: "call" },
        { role: "tool", content: "42" },
      ],
      { tools: [weatherTool], addGenerationPrompt: true },
    );
    expect([...prompt, ...sampled, ...obs]).toEqual(full);
  });
});

describe("the context bounds every append", () => {
  test("an observation past max_model_len is cut there and the trajectory is truncated", () => {
    // prompt 90 + action 5 = 95 of a 100-token context: only 5 observation ids fit, though the response budget has room.
    const b = new TrajectoryBuilder({ promptIds: new Array(90).fill(1), responseLength: 50, maxModelLen: 100, trackLogProbs: true });
    b.appendAction([2, 3, 4, 5, IM_END], [-1, -1, -1, -1, -1]);
    expect(b.appendObservation(new Array(20).fill(7))).toEqual({ appended: 5, truncated: true });
    expect(b.contextLength).toBe(100);
    expect(b.responseMask()).toEqual([1, 1, 1, 1, 1, 0, 0, 0, 0, 0]);
    expect(b.nextMaxTokens()).toBe(0);
    const out = b.finish({ numTurns: 3, rewardScore: null, metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extraFields: {}, finishReason: "length" });
    expect(out.prompt_ids.length + out.response_ids.length).toBe(100);
  });
});

describe("prompt_length too short to hold a question", () => {
  test("truncation that would keep only the generation prompt is refused", () => {
    const msgs: ChatMessage[] = [{ role: "user", content: "What is 2+2?" }];
    expect(() => buildPromptIds(tok, msgs, { promptLength: 3 })).toThrow(
      "rollout.prompt_length: 3 tokens cannot hold this prompt's generation prompt (3 tokens) and any of the conversation (15 tokens in all)",
    );
    expect(buildPromptIds(tok, msgs, { promptLength: 6 }).promptIds).toEqual([30, IM_END, 198, ...GEN_PROMPT]);
  });
});

describe("huge prompts", () => {
  test("only the tail is tokenized, and the kept ids equal the whole encoding's last ids", () => {
    const words = ["alpha", " beta", "  gamma", "\n", "数学", "x+1=2", "emoji 🎉", "----", "tab\tsep", "  "];
    let s = "";
    for (let i = 0; s.length < 1_500_000; i++) s += words[(i * 7919) % words.length] + (i % 13 === 0 ? " " : "");
    const msgs: ChatMessage[] = [{ role: "user", content: s }];
    const full = tok.renderIds(msgs, { addGenerationPrompt: true });
    for (const promptLength of [64, 500]) {
      const { promptIds, truncated } = buildPromptIds(tok, msgs, { promptLength });
      expect(truncated).toBe(true);
      expect(promptIds).toEqual(full.slice(full.length - promptLength));
    }
    expect(tok.maxTokenChars()).toBeGreaterThan(10);
  }, HANG_MS);
});
