import { beforeAll, describe, expect, test } from "bun:test";
import { sharedObservationEncoder } from "../../shared/agent-loop/encoder-cache.ts";
import { builtinTokenizer } from "../../shared/models/index.ts";
import type { ChatMessage, ToolSchema } from "../../shared/schema/index.ts";
import { ObservationEncoder } from "../../shared/tokens/observation.ts";
import { defaultTokenizer, type ChatTokenizer } from "../../shared/tokens/tokenizer.ts";
import { HANG_MS } from "../helpers/bounds.ts";

const calc: ToolSchema = { type: "function", function: { name: "calc", description: "calculator", parameters: { type: "object", properties: { expression: { type: "string" } } } } };
const TOOL: ChatMessage[] = [{ role: "tool", name: "calc", content: "4" }];
const USER: ChatMessage[] = [{ role: "user", content: "Check your answer." }];
const IM_END = 151645;

let qwen: ChatTokenizer;
beforeAll(async () => {
  qwen = await defaultTokenizer();
}, HANG_MS);

describe("sharedObservationEncoder", () => {
  test("one encoder per (tokenizer, tools JSON, template kwargs); separate ones otherwise", () => {
    const a = sharedObservationEncoder(qwen, [calc], undefined);
    expect(sharedObservationEncoder(qwen, [calc], undefined)).toBe(a); // another list object with the same JSON
    expect(sharedObservationEncoder(qwen, [{ ...calc, function: { ...calc.function, name: "calc2" } }], undefined)).not.toBe(a);
    expect(sharedObservationEncoder(qwen, [calc], { enable_thinking: false })).not.toBe(a);
    expect(sharedObservationEncoder(qwen, [], undefined)).toBe(sharedObservationEncoder(qwen, undefined, undefined));
  });

  test("Qwen3: a reused encoder gives exactly the ids of a fresh one, in any order of use", () => {
    const shared = sharedObservationEncoder(qwen, [calc], undefined);
    const fresh = () => new ObservationEncoder(qwen, { tools: [calc] });
    // After <|im_end|>: "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n".
    const toolIds = [198, 151644, 872, 198, 151665, 198, 19, 198, 151666, 151645, 198, 151644, 77091, 198];
    expect(shared.encode(TOOL, IM_END)).toEqual(toolIds);
    expect(fresh().encode(TOOL, IM_END)).toEqual(toolIds);
    expect(shared.encode(USER, IM_END)).toEqual(fresh().encode(USER, IM_END));
    expect(shared.encode(TOOL, IM_END)).toEqual(toolIds);
    // After another stop id (<|endoftext|>): <|im_end|> \n first.
    expect(shared.encode(TOOL, 151643)).toEqual([151645, ...toolIds]);
  });

  test("every built-in family: shared and fresh encoders agree on tool and user observations", async () => {
    for (const family of ["llama3_1", "deepseek_v3", "gpt_oss", "gemma3"]) {
      const tok = await builtinTokenizer(family);
      const shared = sharedObservationEncoder(tok, [calc], undefined);
      const last = tok.eosTokenId;
      for (const msgs of [TOOL, USER, TOOL]) {
        expect({ family, ids: shared.encode(msgs, last) }).toEqual({ family, ids: new ObservationEncoder(tok, { tools: [calc] }).encode(msgs, last) });
      }
    }
  }, HANG_MS);
});
