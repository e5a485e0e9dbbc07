import { afterAll, expect, test } from "bun:test";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { spawnCli, spawnServe, until, type CliProc } from "../chaos/store-harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// E7 at start-up: a scale-to-zero worker (or serve) started while Redis is down waits for it with one
// line and comes up with it, instead of exiting (on main: exit 2 after 1.5 s).
let redis: PrivateRedis | undefined;
const procs: CliProc[] = [];
afterAll(async () => {
  for (const p of procs) p.proc.kill();
  await redis?.dispose();
});

test("worker and serve started with the store down wait, say so once, and run once it answers", async () => {
  redis = await privateRedis();
  await redis.stop();
  const store = ["--store", redis.url, "--store-prefix", "atstart:", "--engine", "sim"];
  // No --idle-exit: counted from the moment Redis answers, it raced serve's start-up (a loaded machine took longer than
  // the idle bound to start serve, and the worker left before the batch was posted). The worker is stopped by SIGTERM
  // once the batch is done instead.
  const worker = spawnCli(["worker", ...store, "--consumer", "late"]);
  procs.push(worker);
  const waiting = `edgeloop: cannot reach Redis at ${redis.url} (store.url / --store): connect ECONNREFUSED 127.0.0.1:${redis.port}; waiting for it (bound the wait with --store-timeout SECONDS)`;
  await until(async () => worker.err().includes(waiting), "the worker's waiting line", HANG_MS).catch((e) => {
    throw new Error(`${e.message}; stderr: ${worker.err()}`);
  });
  await Bun.sleep(1_500);
  expect(worker.proc.exitCode).toBeNull();
  expect(worker.err().split(waiting).length - 1).toBe(1);
  await redis.start();
  const serve = await spawnServe(store);
  procs.push(serve);
  const res = await fetch(`${serve.url}/v1/rollouts`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ rows: [{ uid: "late0", prompt: [{ role: "user", content: "What is 2+2?" }], reward_model: { style: "rule", ground_truth: "4" } }], config: { rollout: { n: 2 } } }),
  });
  expect(res.status).toBe(202);
  const { batch_id } = (await res.json()) as { batch_id: string };
  const p = await until(async () => {
    const s = (await (await fetch(`${serve.url}/v1/rollouts/${batch_id}`)).json()) as { done: boolean; counts: { finished: number; ok: number } };
    return s.done ? s : null;
  }, "the batch run by the late worker", 30_000);
  expect([p.counts.finished, p.counts.ok]).toEqual([2, 2]);
  worker.proc.kill("SIGTERM");
  expect(await worker.proc.exited).toBe(0);
  expect(worker.err()).toContain(`edgeloop: store ${redis.url} answers after `);
  expect(JSON.parse(worker.out().trim().split("\n").at(-1)!)).toMatchObject({ consumer: "late", claimed: 2, completed: 2, exit: "stopped" });
}, HANG_MS);
