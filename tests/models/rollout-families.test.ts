import { describe, expect, test } from "bun:test";
import { builtinTokenizer } from "../../shared/models/index.ts";
import type { TrajectoryRecord as Rec } from "../../shared/schema/index.ts";
import { toolCallParserNames } from "../../shared/tools/parser-registry.ts";
import { cliWorkdir } from "../helpers/cli-workdir.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// `npx edgeloop rollout --model llama3_1 --data examples/gsm8k-tool.jsonl`, run
// for real: the example policy (written once, in Qwen3's format) is sampled in
// Llama 3.1's JSON tool format by the sim engine and parsed by llama3_json.
const { edgeloop, readRecords } = cliWorkdir("edgeloop-families-", { copyExamples: true });

/** Mask runs of a record, each decoded: [[mask, text], …]. */
function maskRuns(tok: Awaited<ReturnType<typeof builtinTokenizer>>, r: Rec): Array<[number, string]> {
  const runs: Array<[number, string]> = [];
  let cur: number[] = [];
  r.response_ids.forEach((id, i) => {
    if (i > 0 && r.response_mask[i] !== r.response_mask[i - 1]) {
      runs.push([r.response_mask[i - 1]!, tok.decode(cur)]);
      cur = [];
    }
    cur.push(id);
  });
  runs.push([r.response_mask.at(-1)!, tok.decode(cur)]);
  return runs;
}

// deepseek_v3, gemma3 and gpt_oss use the `deepseek_v3`, `pythonic` and `harmony` parsers.
const FAMILY_RUNS: Array<[string, string, Array<[number, string]>]> = [
  [
    "deepseek_v3",
    "deepseek_v3",
    [
      [1, '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{"expression":"12*3-5"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'],
      [0, "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>31<｜tool▁output▁end｜><｜tool▁outputs▁end｜>"],
      [1, "The answer is 31.\n#### 31<｜end▁of▁sentence｜>"],
    ],
  ],
  [
    "gemma3",
    "pythonic",
    [
      [1, '[calc(expression="12*3-5")]<end_of_turn>'],
      [0, "\n<start_of_turn>user\n```tool_output\n31\n```<end_of_turn>\n<start_of_turn>model\n"],
      [1, "The answer is 31.\n#### 31<end_of_turn>"],
    ],
  ],
  [
    "gpt_oss",
    "harmony",
    [
      [1, '<|channel|>analysis<|message|>Let me compute 12*3-5.<|end|><|start|>assistant<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expression":"12*3-5"}<|call|>'],
      [0, "<|start|>functions.calc to=assistant<|channel|>commentary<|message|>31<|end|><|start|>assistant"],
      [1, "<|channel|>analysis<|message|>The tool says 31.<|end|><|start|>assistant<|channel|>final<|message|>The answer is 31.\n#### 31<|return|>"],
    ],
  ],
];
for (const [family, parser, expected] of FAMILY_RUNS) {
  describe(`edgeloop rollout --model ${family}`, () => {
    test.skipIf(!toolCallParserNames().includes(parser))(`runs the example end to end in ${family}'s tool format`, async () => {
      const run = edgeloop(["rollout", "--model", family, "--data", "examples/gsm8k-tool.jsonl", "--out", `${family}.jsonl`, "--seed", "7", "--no-progress"]);
      expect(run.code).toBe(0);
      const records: Rec[] = readRecords(`${family}.jsonl`).records;
      expect(records.length).toBe(60);
      expect(records.filter((r) => r.error !== null)).toEqual([]);
      const tok = await builtinTokenizer(family);
      const ana = records.find((r) => tok.decode(r.prompt_ids).includes("Ana bakes 12 loaves"))!;
      expect(maskRuns(tok, ana)).toEqual(expected);
      expect(ana.reward_score).toBe(1);
    }, HANG_MS);
  });
}

describe("edgeloop rollout --model gpt_oss", () => {
  test("the example policy in harmony: same calls, errors and rewards as every family; the start line names the harmony parser", async () => {
    const run = edgeloop(["rollout", "--model", "gpt_oss", "--data", "examples/gsm8k-tool.jsonl", "--out", "gptoss.jsonl", "--seed", "7", "--no-progress"]);
    expect(run.code).toBe(0);
    expect(run.stderr).toContain("model      gpt_oss (end of turn <|return|> 200002; stop ids 200002, 199999, 200012; parser harmony; history rewrites-history)\n");
    const records: Rec[] = readRecords("gptoss.jsonl").records;
    expect(records.reduce((n, r) => n + (r.extra_fields.tool_calls as number), 0)).toBe(84);
    expect(records.reduce((n, r) => n + (r.extra_fields.tool_errors as number), 0)).toBe(4);
    expect(records.reduce((n, r) => n + (r.reward_score ?? 0), 0) / 60).toBeCloseTo(0.85, 10);
    const tok = await builtinTokenizer("gpt_oss");
    // A malformed call: the error observation names the tool and holds no harmony special token, and the model retries.
    const retried = records.find((r) => tok.decode(r.prompt_ids).includes("leaks 13 litres per hour in test 4"))!;
    const runs = maskRuns(tok, retried);
    expect(runs[1]).toEqual([
      0,
      "<|start|>functions.calc to=assistant<|channel|>commentary<|message|>Invalid JSON in the arguments of 'calc'; call a function with a message on the commentary channel addressed to functions.NAME whose content is a JSON object of its arguments.<|end|><|start|>assistant",
    ]);
    expect(runs[2]![1]).toBe('<|channel|>analysis<|message|>Let me compute 175-4*13.<|end|><|start|>assistant<|channel|>commentary to=functions.calc <|constrain|>json<|message|>{"expression":"175-4*13"}<|call|>');
    expect(retried.reward_score).toBe(1);
  }, HANG_MS);
});

describe("edgeloop rollout --model llama3_1", () => {
  test("runs the example end to end in Llama 3.1's tool format, token-exact", async () => {
    const run = edgeloop(["rollout", "--model", "llama3_1", "--data", "examples/gsm8k-tool.jsonl", "--out", "llama.jsonl", "--seed", "7", "--no-progress"]);
    expect(run.code).toBe(0);
    expect(run.stderr).toContain("model      llama3_1 (end of turn <|eot_id|> 128009; stop ids 128009, 128001, 128008; parser llama3_json; history append-only)\n");
    expect(run.stderr).toContain("wrote 60 records to llama.jsonl");
    const records: Rec[] = readRecords("llama.jsonl").records;
    expect(records.length).toBe(60);
    expect(records.filter((r) => r.error !== null)).toEqual([]);
    // The same policy as Qwen3's run: 84 calls, 4 of them malformed on purpose, mean reward 0.85.
    expect(records.reduce((n, r) => n + (r.extra_fields.tool_calls as number), 0)).toBe(84);
    expect(records.reduce((n, r) => n + (r.extra_fields.tool_errors as number), 0)).toBe(4);
    expect(records.reduce((n, r) => n + (r.reward_score ?? 0), 0) / 60).toBeCloseTo(0.85, 10);

    const tok = await builtinTokenizer("llama3_1");
    const ana = records.find((r) => tok.decode(r.prompt_ids).includes("Ana bakes 12 loaves"))!;
    const prompt = tok.decode(ana.prompt_ids);
    expect(prompt.startsWith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are a careful math assistant.")).toBe(true);
    expect(prompt).toContain("<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a function call");
    expect(prompt.endsWith("How many loaves are left?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")).toBe(true);
    const runs: Array<[number, string]> = [];
    let cur: number[] = [];
    ana.response_ids.forEach((id, i) => {
      const m = ana.response_mask[i]!;
      if (i > 0 && m !== ana.response_mask[i - 1]) {
        runs.push([ana.response_mask[i - 1]!, tok.decode(cur)]);
        cur = [];
      }
      cur.push(id);
    });
    runs.push([ana.response_mask.at(-1)!, tok.decode(cur)]);
    expect(runs).toEqual([
      [1, '{"name": "calc", "parameters": {"expression": "12*3-5"}}<|eot_id|>'],
      [0, "<|start_header_id|>ipython<|end_header_id|>\n\n31<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"],
      [1, "The answer is 31.\n#### 31<|eot_id|>"],
    ]);
    expect(ana.reward_score).toBe(1);
  }, HANG_MS);
});
