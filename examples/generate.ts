/**
 * Writes the example data set and its scripted policy (deterministic; rerun
 * after editing): `bun examples/generate.ts`.
 *
 * - `gsm8k-tool.jsonl` / `gsm8k-tool.parquet`: 60 arithmetic word problems in
 *   verl's tool-agent row format, with ground truths.
 * - `policy.json`: the simulated engine's scripted policy for them: one or two
 *   tool calls per problem, then a final answer after `####`; some rows answer
 *   wrongly and a few emit a malformed call, so rewards and error paths show.
 */
import { writeFileSync } from "node:fs";
import { parquetWriteBuffer } from "hyparquet-writer";

interface Problem {
  question: string;
  expression: string;
  answer: number;
  lookup?: { query: string; value: number };
}

const names = ["Ana", "Ben", "Chloé", "Dev", "Emi", "Farah", "Gus", "Hana", "Ivo", "Jun"];
const templates: ((i: number) => Problem)[] = [
  (i) => {
    const [a, b, c] = [12 + i, 3 + (i % 4), 5 + i];
    return { question: `${names[i]} bakes ${a} loaves a day for ${b} days and gives away ${c}. How many loaves are left?`, expression: `${a}*${b}-${c}`, answer: a * b - c };
  },
  (i) => {
    const [a, b] = [48 + 6 * i, 3 + (i % 3)];
    const answer = a / b;
    return { question: `A bus carries ${a} pupils split evenly over ${b} classes on trip ${i + 1}. How many pupils are in each class?`, expression: `${a}/${b}`, answer };
  },
  (i) => {
    const [a, b, c] = [7 + i, 15 + 2 * i, 4 + (i % 5)];
    return { question: `${names[(i + 3) % 10]} buys ${a} notebooks at ${b} cents and ${c} pens at 90 cents. How many cents in total?`, expression: `${a}*${b}+${c}*90`, answer: a * b + c * 90 };
  },
  (i) => {
    const h = 2 + i;
    return {
      question: `A film festival runs for ${h} hours on day ${i + 1}. How many minutes is that?`,
      expression: `${h}*60`,
      answer: h * 60,
      lookup: { query: "minutes per hour", value: 60 },
    };
  },
  (i) => {
    const [a, b] = [100 + 25 * i, 10 + i];
    return { question: `A tank holds ${a} litres and leaks ${b} litres per hour in test ${i + 1}. How much is left after 4 hours?`, expression: `${a}-4*${b}`, answer: a - 4 * b };
  },
  (i) => {
    const w = 2 + i;
    return {
      question: `${names[(i + 6) % 10]} trains for ${w} weeks, every day of every week, in season ${i + 1}. How many training days is that?`,
      expression: `${w}*7`,
      answer: w * 7,
      lookup: { query: "days per week", value: 7 },
    };
  },
];

const problems: Problem[] = [];
for (let i = 0; i < 10; i++) for (const t of templates) problems.push(t(i));

const SYSTEM =
  "You are a careful math assistant. Use the calc tool for arithmetic and the lookup tool for facts you are unsure of. End your reply with the final answer after '####'.";

const rows = problems.map((p, index) => ({
  data_source: "edgeloop/arith",
  agent_name: "tool_agent",
  prompt: [
    { role: "system", content: SYSTEM },
    { role: "user", content: p.question },
  ],
  ability: "math",
  reward_model: { style: "rule", ground_truth: String(p.answer) },
  extra_info: { index, split: "train", tools_kwargs: { calc: { create_kwargs: {} }, lookup: { create_kwargs: {} } } },
}));

const call = (name: string, args: Record<string, unknown>) =>
  `<tool_call>\n${JSON.stringify({ name, arguments: args }).replace(/","/g, '", "').replace(/":/g, '": ')}\n</tool_call>`;

const rules = problems.map((p, i) => {
  const turns: string[] = [];
  if (p.lookup) turns.push(`<think>\nI need a fact first.\n</think>\n\n${call("lookup", { query: p.lookup.query })}`);
  if (i % 17 === 5) {
    // A malformed call: invalid JSON arguments (trailing comma); the loop answers with an error observation.
    turns.push(`<think>\nLet me compute.\n</think>\n\n<tool_call>\n{"name": "calc", "arguments": {"expression": "${p.expression}",}}\n</tool_call>`);
  }
  turns.push(`<think>\nLet me compute ${p.expression}.\n</think>\n\n${call("calc", { expression: p.expression })}`);
  const wrong = i % 7 === 3;
  const final = wrong ? p.answer + 1 : p.answer;
  turns.push(`<think>\nThe tool says ${p.answer}.\n</think>\n\nThe answer is ${final}.\n#### ${final}`);
  return { when: p.question, turns };
});

const here = new URL(".", import.meta.url).pathname;
writeFileSync(`${here}gsm8k-tool.jsonl`, rows.map((r) => JSON.stringify(r)).join("\n") + "\n");
writeFileSync(
  `${here}policy.json`,
  JSON.stringify({ seed: 1, rules, default: ["I cannot help with that."] }, null, 1) + "\n",
);
const buf = parquetWriteBuffer({
  columnData: [
    { name: "data_source", data: rows.map((r) => r.data_source), type: "STRING" },
    { name: "agent_name", data: rows.map((r) => r.agent_name), type: "STRING" },
    { name: "prompt", data: rows.map((r) => r.prompt), type: "JSON" },
    { name: "ability", data: rows.map((r) => r.ability), type: "STRING" },
    { name: "reward_model", data: rows.map((r) => r.reward_model), type: "JSON" },
    { name: "extra_info", data: rows.map((r) => r.extra_info), type: "JSON" },
  ],
});
writeFileSync(`${here}gsm8k-tool.parquet`, new Uint8Array(buf));
console.log(`wrote ${rows.length} rows, ${rules.length} policy rules`);
