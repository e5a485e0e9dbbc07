import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { TrajectoryRecord, type TrajectoryRecord as Rec } from "../../shared/schema/index.ts";
import { validateTrajectory } from "../../shared/tokens/validate.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { simPromptLogProbs } from "../../infra/sim-engine/prompt-logprobs.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// `edgeloop rollout` with rollout.teacher pointing at a simulated teacher over loopback HTTP:
// tool trajectories (observations under mask 0) get the teacher's log-probs of every sampled token.
const ROOT = join(import.meta.dir, "..", "..");
const BIN = join(ROOT, "bin", "edgeloop.mjs");
const ROWS = readFileSync(join(ROOT, "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 3);
let dir: string;
let teacher: RunningSimEngine;
let proxy: ReturnType<typeof Bun.serve>;
let liar: ReturnType<typeof Bun.serve>;
const attempts = new Map<string, number>();

async function edgeloop(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const p = Bun.spawn(["node", BIN, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe", env: { ...process.env, NO_COLOR: "1" } });
  const [stdout, stderr, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  return { code, stdout, stderr };
}

function config(name: string, teacherCfg: Record<string, unknown>, n = 2): string {
  writeFileSync(join(dir, name), JSON.stringify({ rollout: { n, teacher: teacherCfg } }));
  return name;
}

function records(file: string): Rec[] {
  return readFileSync(join(dir, file), "utf8").trim().split("\n").map((l) => TrajectoryRecord.parse(JSON.parse(l)));
}

/** The teacher's log-probs the record must carry: the sim teacher's prompt log-prob of each sampled token (float32), 0.0 under mask 0. */
function expectedTeacher(r: Rec): number[] {
  const lp = simPromptLogProbs(teacher.replicas[0]!.engine, [...r.prompt_ids, ...r.response_ids]);
  return r.response_mask.map((m, i) => (m === 1 ? Math.fround(lp[r.prompt_ids.length + i]!) : 0));
}

const bySample = (r: Rec) => `${(r.extra_fields.trajectory_info as { sample_index: number }).sample_index}/${r.session_id}`;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "edgeloop-teacher-"));
  writeFileSync(join(dir, "rows.jsonl"), ROWS.join("\n") + "\n");
  const uids = ["bad", "good-1", "good-2"];
  writeFileSync(join(dir, "uid-rows.jsonl"), ROWS.map((l, i) => JSON.stringify({ ...JSON.parse(l), uid: uids[i] })).join("\n") + "\n");
  teacher = await startSimEngine({ tokenizer: await defaultTokenizer(), scoreSeed: 11 });
  // A teacher outage for one trajectory: every scoring call routed with key bad_0_0 answers 500.
  proxy = Bun.serve({
    port: 0,
    async fetch(req) {
      const key = req.headers.get("x-session-id") ?? "";
      const path = new URL(req.url).pathname;
      if (path === "/v1/completions" && key === "bad_0_0") {
        attempts.set(key, (attempts.get(key) ?? 0) + 1);
        return Response.json({ error: { message: "teacher outage", type: "InternalServerError", code: 500 } }, { status: 500 });
      }
      return fetch(`${teacher.urls[0]}${path}`, { method: req.method, headers: req.headers, body: await req.text() });
    },
  });
  // A teacher with another tokenizer: /tokenize answers other ids.
  liar = Bun.serve({ port: 0, fetch: () => Response.json({ count: 3, max_model_len: 4096, tokens: [1, 2, 3] }) });
});
afterAll(async () => {
  await teacher.stop();
  proxy.stop(true);
  liar.stop(true);
  rmSync(dir, { recursive: true, force: true });
});

describe("edgeloop rollout with rollout.teacher", () => {
  let vllmRecords: Rec[];

  test("vLLM teacher over HTTP: every record carries teacher_log_probs aligned with response_ids, 0.0 on observations", async () => {
    const r = await edgeloop(["rollout", "--config", config("vllm.json", { url: teacher.urls[0], format: "vllm" }), "--data", "rows.jsonl", "--out", "vllm.jsonl", "--seed", "3"]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain(`teacher    vllm at ${teacher.urls[0]}, on_error fail, same tokenizer`);
    vllmRecords = records("vllm.jsonl");
    expect(vllmRecords).toHaveLength(6);
    let observations = 0;
    for (const rec of vllmRecords) {
      expect(rec.error).toBeNull();
      expect(rec.teacher_log_probs).toEqual(expectedTeacher(rec));
      expect(rec.teacher_log_probs).not.toEqual(rec.rollout_log_probs!);
      validateTrajectory({ ...rec, logprobs: rec.rollout_log_probs }, { responseLength: 512, trackLogProbs: true });
      observations += rec.response_mask.filter((m) => m === 0).length;
    }
    expect(observations).toBeGreaterThan(0);
    // The JSONL keeps the schema's field order: teacher_log_probs right after rollout_log_probs.
    const line = readFileSync(join(dir, "vllm.jsonl"), "utf8").split("\n")[0]!;
    const keys = Object.keys(JSON.parse(line));
    expect(keys.slice(keys.indexOf("rollout_log_probs"), keys.indexOf("rollout_log_probs") + 2)).toEqual(["rollout_log_probs", "teacher_log_probs"]);
    // (and the record names its model, after data_source)
    expect(keys.slice(keys.indexOf("data_source"), keys.indexOf("data_source") + 2)).toEqual(["data_source", "model"]);
  }, HANG_MS);

  test("SGLang teacher (input_token_logprobs, logprob_start_len): the same values as the vLLM form", async () => {
    const r = await edgeloop(["rollout", "--config", config("sglang.json", { url: teacher.urls[0], format: "sglang" }), "--data", "rows.jsonl", "--out", "sglang.jsonl", "--seed", "3"]);
    expect(r.code).toBe(0);
    const recs = records("sglang.jsonl");
    const want = new Map(vllmRecords.map((x) => [bySample(x), x.teacher_log_probs]));
    expect(recs).toHaveLength(6);
    for (const rec of recs) {
      expect(rec.teacher_log_probs).toEqual(expectedTeacher(rec));
      expect(rec.teacher_log_probs).toEqual(want.get(bySample(rec))!);
    }
  }, HANG_MS);

  test("teacher outage, on_error fail: that trajectory fails naming the teacher (after retries), the batch goes on, nothing else lost", async () => {
    attempts.clear();
    const r = await edgeloop(["rollout", "--config", config("fail.json", { url: proxy.url.origin, format: "vllm" }), "--data", "uid-rows.jsonl", "--out", "fail.jsonl", "--seed", "3"]);
    expect(r.code).toBe(0);
    expect(attempts.get("bad_0_0")).toBe(4);
    const recs = records("fail.jsonl");
    expect(recs.map((x) => x.key).sort()).toEqual(["bad_0_0", "bad_1_0", "good-1_0_0", "good-1_1_0", "good-2_0_0", "good-2_1_0"]);
    const bad = recs.find((x) => x.key === "bad_0_0")!;
    expect(bad.error).toBe(`TeacherError: rollout.teacher (vllm at ${proxy.url.origin}) could not score output 0: engine at ${proxy.url.origin}/v1/completions answered HTTP 500: teacher outage`);
    expect(bad.finish_reason).toBe("error");
    expect("teacher_log_probs" in bad).toBe(false);
    for (const rec of recs.filter((x) => x.key !== "bad_0_0")) {
      expect(rec.error).toBeNull();
      expect(rec.teacher_log_probs).toEqual(expectedTeacher(rec));
    }
    expect(r.stdout).toMatch(/^ {2}failed\s+1\s/m);
  }, HANG_MS);

  test("teacher outage, on_error keep: the trajectory is stored without teacher_log_probs and with extra_fields.teacher_error", async () => {
    const r = await edgeloop(["rollout", "--config", config("keep.json", { url: proxy.url.origin, format: "vllm", on_error: "keep" }), "--data", "uid-rows.jsonl", "--out", "keep.jsonl", "--seed", "3"]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain("on_error keep");
    const recs = records("keep.jsonl");
    expect(recs).toHaveLength(6);
    const bad = recs.find((x) => x.key === "bad_0_0")!;
    expect(bad.error).toBeNull();
    expect("teacher_log_probs" in bad).toBe(false);
    expect(bad.extra_fields.teacher_error).toBe(`rollout.teacher (vllm at ${proxy.url.origin}) could not score output 0: engine at ${proxy.url.origin}/v1/completions answered HTTP 500: teacher outage`);
    for (const rec of recs.filter((x) => x.key !== "bad_0_0")) expect(rec.teacher_log_probs).toEqual(expectedTeacher(rec));
  }, HANG_MS);

  test("a teacher with another tokenizer is refused at start (exit 2), naming rollout.teacher; nothing runs", async () => {
    const r = await edgeloop(["rollout", "--config", config("liar.json", { url: liar.url.origin, format: "vllm" }), "--data", "rows.jsonl", "--out", "liar.jsonl"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`config rollout.teacher: the teacher (vllm at ${liar.url.origin}) uses another tokenizer than the policy: its ids of a probe text differ at position 0 (3 ids: [1,2,3]…`);
    expect(r.stderr).not.toContain("wrote");
  }, HANG_MS);

  test("agent gateway (openai_agent, the example agent): its trajectories are scored too", async () => {
    const r = await edgeloop(["rollout", "--agent", "example", "--config", config("agent.json", { url: teacher.urls[0], format: "sglang" }, 1), "--data", "rows.jsonl", "--out", "agent.jsonl", "--seed", "3"]);
    expect(r.code).toBe(0);
    const recs = records("agent.jsonl");
    expect(recs.length).toBeGreaterThanOrEqual(3);
    for (const rec of recs) {
      expect(rec.agent_name).toBe("openai_agent");
      expect(rec.error).toBeNull();
      expect(rec.teacher_log_probs).toEqual(expectedTeacher(rec));
    }
  }, HANG_MS);
});
