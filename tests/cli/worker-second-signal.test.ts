import { afterAll, describe, expect, test } from "bun:test";
import { buildRuntime } from "../../infra/cli/runtime.ts";
import { spawnCli, until } from "../chaos/store-harness.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { ROWS } from "../session/fixtures.ts";

// A worker told to stop waits for its running jobs; a second signal (GNU timeout and supervisors signal the
// child, then its group) ends the wait at once, with the exit summary, leaving the jobs to be reclaimed.
const redis = await requireRedis();

describe.skipIf(!redis)("worker: SIGTERM twice", () => {
  const prefix = randomPrefix("sig2");
  let posts = 0;
  // An engine that takes requests and never answers: the claimed job stays running.
  const hung = Bun.serve({
    port: 0,
    hostname: "127.0.0.1",
    fetch: (req) => {
      if (req.method === "GET" && new URL(req.url).pathname === "/v1/models") return Response.json({ object: "list", data: [{ id: "m", object: "model", max_model_len: 4096 }] });
      if (req.method === "GET") return new Response("ok");
      posts++;
      return new Promise<Response>(() => {});
    },
  });
  afterAll(async () => {
    hung.stop(true);
    await deleteByPrefix(prefix);
  });

  test("the first stops claiming and says so; the second exits 0 with the summary (exit signal, running 1)", async () => {
    const engine = `http://127.0.0.1:${hung.port}`;
    const api = await buildRuntime({ store: REDIS_URL, storePrefix: prefix, engine, maxModelLen: 4096 }, { jobs: "queue" });
    try {
      await api.service.accept({ rows: [{ ...ROWS[0], uid: "sig2-0" }], global_steps: 1, model_version: null, validate: false });
      const w = spawnCli(["worker", "--store", REDIS_URL, "--store-prefix", prefix, "--engine", engine, "--max-model-len", "4096", "--consumer", "sig2"]);
      try {
        await until(async () => posts >= 1, "the job's first engine call", HANG_MS, 20);
        w.proc.kill("SIGTERM");
        await until(async () => w.err().includes("stopping"), "the stopping line", HANG_MS, 20);
        expect(w.err()).toContain("worker     sig2: stopping: no new claims; waiting for 1 running jobs (a second signal leaves them to be reclaimed)");
        w.proc.kill("SIGTERM");
        expect(await w.proc.exited).toBe(0);
        expect(JSON.parse(w.out().trim().split("\n").pop()!)).toMatchObject({ consumer: "sig2", claimed: 1, completed: 0, exit: "signal", running: 1 });
        expect(w.err()).toContain("worker     sig2: a second signal with 1 jobs running: they stay pending, to be reclaimed after the lease (30000 ms)");
      } finally {
        w.proc.kill("SIGKILL");
      }
    } finally {
      await api.close();
    }
  }, HANG_MS);
});
