import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { RolloutRequest } from "../../shared/rollout/batch.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { SIM_TEACHER_SCORE_SEED } from "../../infra/cli/teacher.ts";
import { simPromptLogProbs } from "../../infra/sim-engine/prompt-logprobs.ts";
import { SimEngine } from "../../infra/sim-engine/sim-engine.ts";
import { defaultTokenizer } from "../../shared/tokens/tokenizer.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Queue mode: `serve` enqueues, a worker runs the jobs as durable sessions in Redis; the worker's
// sessions call the teacher (rollout.teacher: sim) before their records are written.
const hasRedis = await requireRedis();
const prefix = randomPrefix("teacher-jobs");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-teacher-jobs-"));
const runtimes: Runtime[] = [];
afterAll(async () => {
  for (const r of runtimes) await r.close();
  await deleteByPrefix(prefix);
  rmSync(dir, { recursive: true, force: true });
});

test.skipIf(!hasRedis)("a worker's trajectories carry the teacher's log-probs (0.0 on observations), read back from Redis", async () => {
  writeFileSync(join(dir, "cfg.json"), JSON.stringify({ rollout: { n: 2, seed: 5, teacher: { url: "sim", format: "sglang" } } }));
  const flags = { config: join(dir, "cfg.json"), store: REDIS_URL, storePrefix: prefix };
  const api = await buildRuntime(flags, { jobs: "queue" });
  runtimes.push(api);
  const worker = await buildRuntime(flags);
  runtimes.push(worker);
  const rows = readFileSync(join(import.meta.dir, "..", "..", "examples", "gsm8k-tool.jsonl"), "utf8").trim().split("\n").slice(0, 2).map((l) => JSON.parse(l));
  const { keys, run } = await api.service.accept(RolloutRequest.parse({ rows }));
  expect(keys).toHaveLength(4);
  const summary = await new JobWorker({ model: null, jobs: worker.jobs!, store: worker.batchStore, executorFor: worker.executorFor, consumer: "tw", concurrency: 4, idleExitMs: 500, blockMs: 100 }).run();
  expect(summary).toMatchObject({ claimed: 4, completed: 4, failed: 0 });
  await run.run();
  const teacher = new SimEngine({ tokenizer: await defaultTokenizer(), scoreSeed: SIM_TEACHER_SCORE_SEED });
  for (const key of keys) {
    const rec = (await api.store.get(key))!;
    expect(rec.error).toBeNull();
    const lp = simPromptLogProbs(teacher, [...rec.prompt_ids, ...rec.response_ids]);
    expect(rec.teacher_log_probs).toEqual(rec.response_mask.map((m, i) => (m === 1 ? Math.fround(lp[rec.prompt_ids.length + i]!) : 0)));
    expect(rec.response_mask).toContain(0);
  }
}, HANG_MS);
