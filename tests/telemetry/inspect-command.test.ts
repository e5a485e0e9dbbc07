import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";

// `edgeloop inspect` run for real (node bin/edgeloop.mjs) on a known record: from a JSONL file and from Redis.
const BIN = join(import.meta.dir, "..", "..", "bin", "edgeloop.mjs");
const PREFIX = randomPrefix("inspect");
let dir: string;
let rec: TrajectoryRecord;

const TEXT = {
  prompt: "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
  turn1: '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call><|im_end|>',
  obs: "\n<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
  turn2: "#### 4",
};

function edgeloop(args: string[], env: Record<string, string> = {}) {
  const p = Bun.spawnSync(["node", BIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, ...env } });
  return { code: p.exitCode, stdout: p.stdout.toString(), stderr: p.stderr.toString() };
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-inspect-"));
  const tok = await defaultTokenizer();
  const [p, a, o, b] = [TEXT.prompt, TEXT.turn1, TEXT.obs, TEXT.turn2].map((t) => tok.encode(t));
  rec = {
    key: "q-7_1_0",
    uid: "q-7",
    session_id: 1,
    output_index: 0,
    agent_name: "tool_agent",
    data_source: "fixture",
    prompt_ids: p!,
    response_ids: [...a!, ...o!, ...b!],
    response_mask: [...a!.map(() => 1 as const), ...o!.map(() => 0 as const), ...b!.map(() => 1 as const)],
    rollout_log_probs: [...a!.map(() => -0.5), ...o!.map(() => 0), ...b!.map(() => -0.25)],
    reward_score: 1,
    num_turns: 4,
    truncated: true,
    finish_reason: "length",
    error: null,
    metrics: { generate_sequences: 0.5, tool_calls: 0.25, compute_score: 0, num_preempted: -1 },
    extra_fields: { terminated_by: "response_length" },
  };
  const other = { ...rec, key: "q-8_0_0", uid: "q-8", session_id: 0 };
  writeFileSync(join(dir, "rollouts.jsonl"), [other, rec].map((r) => JSON.stringify(r)).join("\n") + "\n");
});

afterAll(async () => {
  rmSync(dir, { recursive: true, force: true });
  await deleteByPrefix(PREFIX);
});

test("coloured by mask, a header per run, the truncation point and a one-line summary", () => {
  const r = edgeloop(["inspect", "q-7_1_0", "--file", "rollouts.jsonl", "--color"]);
  expect(r.stderr).toBe("");
  expect(r.code).toBe(0);
  const [a, o, b] = [rec.response_mask.indexOf(0), rec.response_mask.lastIndexOf(0) + 1, rec.response_mask.length];
  expect(r.stdout).toBe(
    `\x1b[1;90m── prompt (${rec.prompt_ids.length} tokens) ──\x1b[0m\n` +
      `\x1b[2m${TEXT.prompt}\x1b[0m` +
      `\x1b[1;90m── assistant turn 1 (${a} tokens, mask 1) ──\x1b[0m\n` +
      `\x1b[32m${TEXT.turn1}\x1b[0m\n` +
      `\x1b[1;90m── observation 1 (${o - a} tokens, mask 0) ──\x1b[0m\n` +
      `\x1b[36m${TEXT.obs}\x1b[0m` +
      `\x1b[1;90m── assistant turn 2 (${b - o} tokens, mask 1) ──\x1b[0m\n` +
      `\x1b[32m${TEXT.turn2}\x1b[0m\n` +
      `\x1b[1;31m✂ truncated after ${b} response tokens (length, response_length)\x1b[0m\n` +
      `q-7_1_0  agent=tool_agent  reward=1  turns=4  finish=length(response_length)  truncated=yes  tokens prompt=${rec.prompt_ids.length} sampled=${b - (o - a)} observation=${o - a}\n`,
  );
});

test("--no-color and --no-prompt: plain text, the mask still readable from the headers", () => {
  const r = edgeloop(["inspect", "q-7_1_0", "--file", "rollouts.jsonl", "--no-prompt"], { NO_COLOR: "1" });
  expect(r.code).toBe(0);
  expect(r.stdout).not.toContain("\x1b[");
  expect(r.stdout.split("\n").slice(0, 6)).toEqual([
    `── assistant turn 1 (${rec.response_mask.indexOf(0)} tokens, mask 1) ──`,
    "<tool_call>",
    '{"name": "calc", "arguments": {"expression": "2+2"}}',
    "</tool_call><|im_end|>",
    `── observation 1 (${rec.response_mask.filter((m) => m === 0).length} tokens, mask 0) ──`,
    "",
  ]);
});

test("--json prints the record; an unknown key exits 2 naming it", () => {
  const r = edgeloop(["inspect", "q-7_1_0", "--file", "rollouts.jsonl", "--json"]);
  expect(r.code).toBe(0);
  expect(JSON.parse(r.stdout)).toEqual(rec);
  const missing = edgeloop(["inspect", "q-9_0_0", "--file", "rollouts.jsonl"]);
  expect(missing.code).toBe(2);
  expect(missing.stderr).toBe("edgeloop: no trajectory 'q-9_0_0' in rollouts.jsonl\n");
  const memory = edgeloop(["inspect", "q-7_1_0"]);
  expect(memory.code).toBe(2);
  expect(memory.stderr).toContain("the memory store lives inside one process");
  expect(edgeloop(["inspect", "not a key", "--file", "rollouts.jsonl"]).code).toBe(2);
});

test("reads the record from Redis with --store and --store-prefix", async () => {
  if (!(await requireRedis())) return;
  const q = createRedisTransferQueue({ url: REDIS_URL, prefix: PREFIX });
  await q.expectGroup("q-7", 2);
  await q.put(rec);
  await q.close();
  const r = edgeloop(["inspect", "q-7_1_0", "--store", REDIS_URL, "--store-prefix", PREFIX, "--json"]);
  expect(r.stderr).toBe("");
  expect(JSON.parse(r.stdout)).toEqual(rec);
  const text = edgeloop(["inspect", "q-7_1_0", "--store", REDIS_URL, "--store-prefix", PREFIX, "--no-color"]);
  expect(text.stdout.trimEnd().split("\n").at(-1)).toStartWith("q-7_1_0  agent=tool_agent  reward=1");
});
