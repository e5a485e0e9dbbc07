import { afterAll, describe, expect, test } from "bun:test";
import { builtinTokenizer, modelIdOf } from "../../shared/models/index.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { post, progress, spawnCli, spawnServe, summaryOf, until, type CliProc } from "../chaos/store-harness.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 27 item 4 (N4) across real processes: `serve --jobs queue --model qwen3` records its model in the
// batch; a `worker --model llama3_1` on the same prefix refuses the batch's jobs (stored failed, naming both
// models; the batch ends), a qwen3 worker's records carry `model`, and `?decode=1` / `edgeloop inspect`
// decode a record only with the record's own model.

const redisUp = await requireRedis();
const prefix = randomPrefix("model-mismatch");
const procs: CliProc[] = [];

afterAll(async () => {
  for (const p of procs) if (p.proc.exitCode === null) p.proc.kill();
  await Promise.all(procs.map((p) => p.proc.exited));
  if (redisUp) await deleteByPrefix(prefix);
});

const count = (text: string, needle: string) => text.split(needle).length - 1;

describe.skipIf(!redisUp)("N4: records name their model; workers refuse another model's batch", () => {
  test("a llama3_1 worker fails a qwen3 batch's jobs naming both models; a qwen3 worker's records carry model; readers decode only with the record's model", async () => {
    const qwen = await modelIdOf(await builtinTokenizer("qwen3"));
    const llama = await modelIdOf(await builtinTokenizer("llama3_1"));
    expect(qwen.fingerprint).not.toBe(llama.fingerprint);
    const common = ["--store", REDIS_URL, "--store-prefix", prefix, "--seed", "7"];
    const serve = await spawnServe([...common, "--model", "qwen3", "--n", "2", "--jobs", "queue", "--response-length", "64"]);
    procs.push(serve);

    // 1. The mismatched worker: every job of the batch is refused, the batch ends, nothing holds Llama ids.
    const wrong = spawnCli(["worker", ...common, "--model", "llama3_1", "--concurrency", "4", "--consumer", "mm-llama"]);
    procs.push(wrong);
    const rows = [0, 1].map((i) => ({ ...ROWS[i]!, uid: `mm-a${i}` }));
    const a = await post(serve.url, rows);
    const done = await until(async () => {
      const p = await progress(serve.url, a.batch_id);
      return p.done ? p : null;
    }, "the refused batch to end", 60_000, 50);
    expect(done.counts).toMatchObject({ total: 4, finished: 4, records: 4, ok: 0, failed: 4 });
    const want = `model mismatch: batch ${a.batch_id} was submitted with model qwen3 (fingerprint ${qwen.fingerprint}), this worker (mm-llama) runs llama3_1 (fingerprint ${llama.fingerprint}); refused, not run: start workers with the serve's model (--model qwen3)`;
    expect(done.errors.map((e) => e.key).sort()).toEqual([...a.keys].sort());
    for (const e of done.errors) expect(e.error).toBe(want);
    for (const key of a.keys) {
      const r = (await (await fetch(`${serve.url}/v1/trajectories/${key}`)).json()) as TrajectoryRecord;
      expect(r).toMatchObject({ error: want, finish_reason: "error", prompt_ids: [], response_ids: [], model: qwen, extra_fields: { model_mismatch: { batch: qwen, worker: llama } } });
    }
    // Said once for the batch, however many of its jobs were refused.
    await until(async () => count(wrong.err(), "model mismatch: batch") >= 1, "the refusal log line", HANG_MS, 20);
    expect(count(wrong.err(), `model mismatch: batch ${a.batch_id}`)).toBe(1);
    wrong.proc.kill("SIGTERM");
    await wrong.proc.exited;
    expect(summaryOf(wrong)).toMatchObject({ claimed: 4, completed: 4, failed: 4, refused: 4, exit: "stopped" });

    // 2. A matching worker: ok records, each naming the model; ?decode=1 decodes them.
    const right = spawnCli(["worker", ...common, "--model", "qwen3", "--concurrency", "4", "--consumer", "mm-qwen"]);
    procs.push(right);
    const b = await post(serve.url, [{ ...ROWS[2]!, uid: "mm-b0" }]);
    const doneB = await until(async () => {
      const p = await progress(serve.url, b.batch_id);
      return p.done ? p : null;
    }, "the matching batch to end", 60_000, 50);
    expect(doneB.counts).toMatchObject({ total: 2, ok: 2, failed: 0 });
    for (const key of b.keys) {
      const res = await fetch(`${serve.url}/v1/trajectories/${key}?decode=1`);
      expect(res.status).toBe(200);
      const r = (await res.json()) as TrajectoryRecord & { decoded: { prompt: string[] } };
      expect(r.model).toEqual(qwen);
      expect(r.prompt_ids[0]).toBe(151644); // <|im_start|>
      expect(r.decoded.prompt[0]).toBe("<|im_start|>");
    }
    right.proc.kill("SIGTERM");
    await right.proc.exited;

    // 3. A record of another model in the store: the API refuses to decode it, inspect decodes it with its own model.
    const llamaTok = await builtinTokenizer("llama3_1");
    const ids = llamaTok.renderIds([{ role: "user", content: "What is 6 times 7?" }], { addGenerationPrompt: true });
    const answer = llamaTok.encode("42<|eot_id|>");
    const key = "mm-c0_0_0";
    const q = createRedisTransferQueue({ url: REDIS_URL, prefix });
    try {
      await q.expectGroup("mm-c0", 1, "train");
      await q.put({
        key, uid: "mm-c0", session_id: 0, output_index: 0, agent_name: "single_turn_agent", data_source: "test", model: llama,
        prompt_ids: ids, response_ids: answer, response_mask: answer.map(() => 1 as const), rollout_log_probs: null,
        reward_score: 1, num_turns: 2, truncated: false, finish_reason: "stop", error: null, metrics: { generate_sequences: 0, tool_calls: 0, compute_score: 0, num_preempted: -1 }, extra_fields: {},
      });
    } finally {
      await q.close();
    }
    const plain = await fetch(`${serve.url}/v1/trajectories/${key}`);
    expect(((await plain.json()) as TrajectoryRecord).model).toEqual(llama);
    const refused = await fetch(`${serve.url}/v1/trajectories/${key}?decode=1`);
    expect(refused.status).toBe(409);
    const body = (await refused.json()) as { error: { code: string; message: string; field: string } };
    expect(body.error.code).toBe("model_mismatch");
    expect(body.error.message).toBe(
      `decode: trajectory ${key}: the record's tokens are of model llama3_1 (fingerprint ${llama.fingerprint}), this process has qwen3 (fingerprint ${qwen.fingerprint}): not decoded (decoding with another tokenizer gives garbage); decode where that model is loaded (e.g. --model llama3_1)`,
    );

    const inspect = spawnCli(["inspect", key, "--store", REDIS_URL, "--store-prefix", prefix, "--no-color"]);
    expect(await inspect.proc.exited).toBe(0);
    expect(inspect.out()).toContain("What is 6 times 7?");
    expect(inspect.out()).toContain("<|begin_of_text|>");
    const wrongInspect = spawnCli(["inspect", key, "--store", REDIS_URL, "--store-prefix", prefix, "--model", "qwen3"]);
    expect(await wrongInspect.proc.exited).toBe(2);
    expect(wrongInspect.out()).toBe("");
    expect(wrongInspect.err()).toContain(`the record's tokens are of model llama3_1 (fingerprint ${llama.fingerprint}), this process has qwen3 (fingerprint ${qwen.fingerprint}): not decoded`);
  }, HANG_MS);
});
