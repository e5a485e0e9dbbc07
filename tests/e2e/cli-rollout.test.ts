import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { validateTrajectory } from "../../shared/tokens/validate.ts";
import type { TrajectoryRecord as Rec } from "../../shared/schema/index.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { cliWorkdir } from "../helpers/cli-workdir.ts";
import { ROOT } from "../helpers/examples.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The README's first command, run for real: `npx edgeloop rollout --data examples/gsm8k-tool.jsonl --n 4 --out rollouts.jsonl`
// (npx resolves to bin/edgeloop.mjs; we call it with node directly, in a temporary directory).
const cli = cliWorkdir("edgeloop-e2e-", { copyExamples: true });
const { edgeloop, readRecords } = cli;

function summary(stdout: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of stdout.split("\n")) {
    const m = /^\s*([a-z/ ()]+?)\s{2,}(\S+)$/.exec(line);
    if (m) out[m[1]!.trim()] = m[2]!;
  }
  return out;
}

/** A record without what legitimately differs between two runs: random uids and wall-clock timings. */
function comparable(r: Rec) {
  const { key: _k, uid: _u, metrics, ...rest } = r;
  return { ...rest, num_preempted: metrics.num_preempted };
}
const order = (a: Rec, b: Rec) =>
  (a.extra_fields.trajectory_info as { sample_index: number }).sample_index - (b.extra_fields.trajectory_info as { sample_index: number }).sample_index ||
  a.session_id - b.session_id;


describe("edgeloop rollout (the README's first command)", () => {
  let first: { code: number; stdout: string; stderr: string };

  test("runs the example batch, every record passes the validator, the summary matches the records", () => {
    first = edgeloop(["rollout", "--data", "examples/gsm8k-tool.jsonl", "--n", "4", "--out", "rollouts.jsonl", "--seed", "7"]);
    expect(first.stderr).toContain("wrote 240 records to rollouts.jsonl");
    expect(first.code).toBe(0);
    const { records } = readRecords("rollouts.jsonl");
    expect(records.length).toBe(240);
    for (const r of records) {
      expect(r.error).toBeNull();
      validateTrajectory({ ...r, logprobs: r.rollout_log_probs }, { responseLength: 512, promptLength: 512, trackLogProbs: true });
    }
    // 60 groups of 4 sessions each.
    const groups = new Map<string, number[]>();
    for (const r of records) groups.set(r.uid, [...(groups.get(r.uid) ?? []), r.session_id]);
    expect(groups.size).toBe(60);
    for (const s of groups.values()) expect(s.sort()).toEqual([0, 1, 2, 3]);

    const s = summary(first.stdout);
    // The README shows the summary as the CLI prints it: the same lines in the same order, label and value only.
    const readme = readFileSync(join(ROOT, "README.md"), "utf8");
    const block = /then this summary \(on stdout\)[\s\S]*?```\n([\s\S]*?)```/.exec(readme)![1]!.trimEnd().split("\n");
    const printed = first.stdout.trimEnd().split("\n");
    expect(block.map((l) => l.split(/\s{2,}/).filter(Boolean).length)).toEqual(block.map(() => 2));
    expect(block.map((l) => l.slice(0, 25))).toEqual(printed.map((l) => l.slice(0, 25)));
    const sampled = records.reduce((n, r) => n + r.response_mask.filter((m) => m === 1).length, 0);
    const response = records.reduce((n, r) => n + r.response_ids.length, 0);
    expect([s["sessions (trajectories)"], s["finished"], s["records"]]).toEqual(["240", "240", "240"]);
    expect(s["ok"]).toBe(String(records.filter((r) => !r.error).length));
    expect(s["failed"]).toBe("0");
    expect(s["truncated"]).toBe(String(records.filter((r) => r.truncated).length));
    expect(s["turns"]).toBe(String(records.reduce((n, r) => n + r.num_turns, 0)));
    expect(s["tokens prompt"]).toBe(String(records.reduce((n, r) => n + r.prompt_ids.length, 0)));
    expect(s["tokens sampled"]).toBe(String(sampled));
    expect(s["tokens observation"]).toBe(String(response - sampled));
    expect(s["tool calls"]).toBe(String(records.reduce((n, r) => n + (r.extra_fields.tool_calls as number), 0)));
    expect(s["tool errors"]).toBe(String(records.reduce((n, r) => n + (r.extra_fields.tool_errors as number), 0)));
    const mean = records.reduce((n, r) => n + r.reward_score!, 0) / records.length;
    expect(s["mean reward"]).toBe(mean.toFixed(4));
    // The scripted policy answers some rows wrongly and sends a few malformed calls.
    expect(mean).toBeGreaterThan(0.5);
    expect(mean).toBeLessThan(1);
    expect(Number(s["tool errors"])).toBeGreaterThan(0);
  }, HANG_MS);

  test("a second run with the same seed produces identical records", () => {
    const second = edgeloop(["rollout", "--data", "examples/gsm8k-tool.jsonl", "--n", "4", "--out", "again.jsonl", "--seed", "7", "--no-progress"]);
    expect(second.code).toBe(0);
    const a = readRecords("rollouts.jsonl").records.sort(order).map(comparable);
    const b = readRecords("again.jsonl").records.sort(order).map(comparable);
    expect(b).toEqual(a);
    // A different seed gives different log-probs (the simulated engine's are seeded).
    const third = edgeloop(["rollout", "--data", "examples/gsm8k-tool.jsonl", "--n", "1", "--out", "seed8.jsonl", "--seed", "8"]);
    expect(third.code).toBe(0);
    const c = readRecords("seed8.jsonl").records.sort(order);
    const a0 = readRecords("rollouts.jsonl").records.sort(order).filter((r) => r.session_id === 0);
    expect(c[0]!.response_ids).toEqual(a0[0]!.response_ids);
    expect(c[0]!.rollout_log_probs).not.toEqual(a0[0]!.rollout_log_probs);
  }, HANG_MS);

  test("with --store redis://, records in Redis are byte-identical to the JSONL", async () => {
    if (!(await requireRedis())) return;
    const prefix = randomPrefix("e2e-cli");
    try {
      const run = edgeloop(["rollout", "--data", "examples/gsm8k-tool.jsonl", "--n", "2", "--out", "redis.jsonl", "--store", REDIS_URL, "--store-prefix", prefix]);
      expect(run.code).toBe(0);
      const { lines, records } = readRecords("redis.jsonl");
      expect(records.length).toBe(120);
      const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
      try {
        for (const [i, r] of records.entries()) {
          const stored = await q.get(r.key);
          expect(JSON.stringify(stored)).toBe(lines[i]!);
        }
        const st = await q.groupStatus(records[0]!.uid);
        expect(st).toMatchObject({ expected: 2, finished: 2, records: 2, failed: 0, complete: true });
      } finally {
        await q.close();
      }
    } finally {
      await deleteByPrefix(prefix);
    }
  }, HANG_MS);

  test("with --store redis://, a uid already holding another prompt is refused before anything is written (exit 2); the same prompt is handed back", async () => {
    if (!(await requireRedis())) return;
    const prefix = randomPrefix("e2e-cli-uid");
    const row = { uid: "cliuid", data_source: "edge", prompt: [{ role: "user", content: "What is 2+2?" }], reward_model: { style: "rule", ground_truth: "4" } };
    Bun.write(join(cli.dir, "uid-a.jsonl"), JSON.stringify(row) + "\n");
    Bun.write(join(cli.dir, "uid-b.jsonl"), JSON.stringify({ ...row, uid: "clinew" }) + "\n" + JSON.stringify({ ...row, prompt: [{ role: "user", content: "What is 3+3?" }] }) + "\n");
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
    try {
      const first = edgeloop(["rollout", "--data", "uid-a.jsonl", "--n", "2", "--out", "uid-a.out.jsonl", "--store", REDIS_URL, "--store-prefix", prefix]);
      expect(first.code).toBe(0);
      const status = await q.groupStatus("cliuid");
      expect(status).toMatchObject({ expected: 2, finished: 2, records: 2, complete: true });
      const refused = edgeloop(["rollout", "--data", "uid-b.jsonl", "--n", "2", "--store", REDIS_URL, "--store-prefix", prefix]);
      expect(refused.code).toBe(2);
      expect(refused.stderr).toContain("edgeloop: rows[1].uid: group cliuid was registered with another prompt: a uid names one prompt group; use a new uid for new samples");
      expect(await q.groupStatus("cliuid")).toEqual(status);
      expect((await q.groupStatus("clinew")).expected).toBeNull();
      // The same prompt again: its finished sessions are handed back from the store, not run again.
      const again = edgeloop(["rollout", "--data", "uid-a.jsonl", "--n", "2", "--out", "uid-a2.out.jsonl", "--store", REDIS_URL, "--store-prefix", prefix]);
      expect(again.code).toBe(0);
      expect(readRecords("uid-a2.out.jsonl").lines.sort()).toEqual(readRecords("uid-a.out.jsonl").lines.sort());
      expect(await q.groupStatus("cliuid")).toEqual(status);
    } finally {
      await q.close();
      await deleteByPrefix(prefix);
    }
  }, HANG_MS);

  test("bad rows fail alone; a bad flag fails at start naming it", () => {
    const rows = readFileSync(join(cli.dir, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 3);
    rows.splice(1, 0, "{not json", JSON.stringify({ prompt: [] }), JSON.stringify({ ...JSON.parse(rows[0]!), agent_name: "no_such_agent" }));
    Bun.write(join(cli.dir, "mixed.jsonl"), rows.join("\n") + "\n");
    const run = edgeloop(["rollout", "--data", "mixed.jsonl", "--n", "2", "--out", "mixed-out.jsonl"]);
    expect(run.code).toBe(0);
    const { records } = readRecords("mixed-out.jsonl");
    expect(records.length).toBe(12);
    const failed = records.filter((r) => r.error);
    expect(failed.length).toBe(6);
    const errors = failed.map((r) => r.error).sort();
    expect(errors).toEqual([
      "rows[1]: Invalid input: expected object, received string",
      "rows[1]: Invalid input: expected object, received string",
      "rows[2].prompt: prompt must hold at least one message",
      "rows[2].prompt: prompt must hold at least one message",
      "rows[3].agent_name: unknown agent loop 'no_such_agent'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent",
      "rows[3].agent_name: unknown agent loop 'no_such_agent'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent",
    ]);
    // The good rows' trajectories all succeeded.
    expect(records.filter((r) => !r.error).length).toBe(6);
    const unknown = failed.find((r) => r.error!.includes("no_such_agent"))!;
    expect(unknown.error).toBe("rows[3].agent_name: unknown agent loop 'no_such_agent'; registered agent loops: openai_agent, openenv_agent, single_turn_agent, tool_agent");
    expect(unknown.prompt_ids).toEqual([]);
    expect(summary(run.stdout)["failed"]).toBe("6");

    const bad = edgeloop(["rollout", "--data", "mixed.jsonl", "--n", "0"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toBe("edgeloop: --n must be an integer >= 1, got '0' (see edgeloop rollout --help)\n");
  }, HANG_MS);
});
