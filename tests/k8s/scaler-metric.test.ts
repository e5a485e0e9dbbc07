import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type IORedis from "ioredis";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { deleteByPrefix, randomPrefix, rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { spawnWorker, triggerFor, workerArgs, writeConfig } from "./harness.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { kedaMetric, type KedaMode, type RedisStreamsTrigger } from "./manifests.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The ScaledObject's metric (KEDA's redis-streams scaler in the mode the manifest selects, computed
// with the same command) against real Redis, in every state the job stream goes through: jobs nobody
// claimed, a job held by a SIGKILLed worker, jobs removed by a cancel, jobs left by a worker that
// drained out, and nothing left. Beside it, the two other modes KEDA offers, showing where each would
// leave work with no worker.
const redis = await requireRedis();

describe.skipIf(!redis)("KEDA metric of the worker ScaledObject, against real Redis", () => {
  const prefix = randomPrefix("k8s-metric");
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-k8s-metric-"));
  let hung: ReturnType<typeof Bun.serve>;
  let engine: RunningSimEngine;
  let api: Runtime;
  let app: ReturnType<typeof createRolloutsApp>;
  let r: IORedis;
  let configPath: string;
  let tools: ToolServer;
  const procs: ReturnType<typeof Bun.spawn>[] = [];

  beforeAll(async () => {
    // An engine that takes requests and never answers: a claimed job stays running.
    hung = Bun.serve({
      port: 0,
      fetch: (req) => {
        const path = new URL(req.url).pathname;
        if (req.method === "GET" && path === "/v1/models") return Response.json({ object: "list", data: [{ id: "m", object: "model", max_model_len: 4096 }] });
        if (req.method === "GET") return new Response("ok");
        return new Promise<Response>(() => {});
      },
    });
    engine = await startSimEngine({ script: { ...POLICY, seed: 7 } });
    // The tools the ConfigMap's tools.json names: the example tool server, as examples/example-tools.yaml runs it.
    tools = startToolServer();
    configPath = writeConfig(dir, tools.url);
    api = await buildRuntime({ config: configPath, store: REDIS_URL, storePrefix: prefix, engine: engine.urls[0]!, maxModelLen: 4096 }, { jobs: "queue" });
    app = createRolloutsApp({ service: api.service });
    r = rawRedis();
  });
  afterAll(async () => {
    for (const p of procs) p.kill("SIGKILL");
    await api?.close();
    hung?.stop(true);
    await engine?.stop();
    await tools?.stop();
    await r?.quit();
    await deleteByPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  });

  const submit = async (row: number, n: number) => {
    const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows: [{ ...ROWS[row], uid: `m${row}` }], config: { rollout: { n } } }) });
    expect(res.status).toBe(202);
    return ((await res.json()) as { batch_id: string }).batch_id;
  };
  const cancel = async (batch: string) => expect((await app.request(`/v1/rollouts/${batch}`, { method: "DELETE" })).status).toBe(200);
  const pending = async (stream: string) => Number(((await r.call("XPENDING", stream, "workers")) as [number])[0]);

  test("XLEN reports work in every state with work left and 0 only when nothing is left; XPENDING and lag each get states wrong", async () => {
    const trigger = triggerFor(prefix);
    expect(trigger).toEqual({ stream: `${prefix}jobs`, streamLength: "64" });
    const pendingMode: RedisStreamsTrigger = { stream: trigger.stream!, consumerGroup: "workers", pendingEntriesCount: "64" };
    const lagMode: RedisStreamsTrigger = { stream: trigger.stream!, consumerGroup: "workers", lagCount: "64", activationLagCount: "0" };
    const metrics = async () => ({
      streamLength: await kedaMetric(r, trigger),
      pendingEntriesCount: await kedaMetric(r, pendingMode),
      lagCount: await kedaMetric(r, lagMode),
    });
    const m = (value: number, mode: KedaMode) => ({ mode, value, active: value > 0 });

    // 1. Jobs queued, no worker has ever run: nobody claimed them, so the PEL is empty.
    await r.call("XGROUP", "CREATE", trigger.stream!, "workers", "0", "MKSTREAM");
    const a = await submit(0, 1);
    expect(await metrics()).toEqual({ streamLength: m(1, "streamLength"), pendingEntriesCount: m(0, "pendingEntriesCount"), lagCount: m(1, "lagCount") });

    // 2. A worker (the Deployment's own args) claims the job, then dies by SIGKILL holding it: delivered, so out of the lag.
    const w1 = spawnWorker("victim", workerArgs(configPath, ["--store-prefix", prefix, "--engine", `http://127.0.0.1:${hung.port}`, "--max-model-len", "4096"]));
    procs.push(w1.proc);
    const deadline = Date.now() + 30_000;
    while ((await pending(trigger.stream!)) < 1 && Date.now() < deadline) await Bun.sleep(25);
    w1.proc.kill("SIGKILL");
    expect((await w1.done).code).toBe(137);
    expect(await metrics()).toEqual({ streamLength: m(1, "streamLength"), pendingEntriesCount: m(1, "pendingEntriesCount"), lagCount: m(0, "lagCount") });

    // 3. Two more batches queued behind it.
    const b = await submit(1, 3);
    const c = await submit(2, 2);
    expect(await metrics()).toEqual({ streamLength: m(6, "streamLength"), pendingEntriesCount: m(1, "pendingEntriesCount"), lagCount: m(5, "lagCount") });

    // 4. Cancel batch b (XACK + XDEL of its 3 queued jobs): deleted entries after the last delivered one make Redis's lag NULL.
    await cancel(b);
    const group = ((await r.call("XINFO", "GROUPS", trigger.stream!)) as unknown[][])[0]!;
    expect(group.slice(8)).toEqual(["entries-read", 1, "lag", null]);
    expect(await metrics()).toEqual({ streamLength: m(3, "streamLength"), pendingEntriesCount: m(1, "pendingEntriesCount"), lagCount: m(-1, "lagCount") });

    // 5. Cancel batch a too (the dead worker's job): 2 jobs of c wait. XPENDING says 0; the lag says 5, not 2:
    // every tombstone now lies before the stream's first entry, so Redis takes the lag as entries-added (6)
    // minus the group's entries-read (1), counting the 3 cancelled jobs as waiting. Only XLEN is exact.
    await cancel(a);
    expect(await metrics()).toEqual({ streamLength: m(2, "streamLength"), pendingEntriesCount: m(0, "pendingEntriesCount"), lagCount: m(5, "lagCount") });

    // 6. A worker claims c's jobs, is told to stop (SIGTERM, as on a scale-down) and drains out after --drain-timeout, leaving them pending.
    const w2 = spawnWorker("drainer", workerArgs(configPath, ["--store-prefix", prefix, "--engine", `http://127.0.0.1:${hung.port}`, "--max-model-len", "4096"], { "--drain-timeout": "1" }));
    procs.push(w2.proc);
    while ((await pending(trigger.stream!)) < 2 && Date.now() < deadline) await Bun.sleep(25);
    const t0 = Date.now();
    w2.proc.kill("SIGTERM");
    const drained = await w2.done;
    expect(drained.code).toBe(0);
    expect(Date.now() - t0).toBeLessThan(10_000);
    expect(JSON.parse(drained.stdout.trim().split("\n").pop()!)).toEqual({ consumer: "drainer", claimed: 2, completed: 0, failed: 0, reclaimed: 0, abandoned: 0, cancelled: 0, surplus: 0, refused: 0, capped: 0, exit: "drain_timeout", running: 2 });
    expect(drained.stderr).toContain("drain timeout (1 s) with 2 jobs running: they stay pending");
    expect((await metrics()).streamLength).toEqual(m(2, "streamLength"));
    expect((await metrics()).pendingEntriesCount).toEqual(m(2, "pendingEntriesCount"));

    // 7. A worker on a working engine reclaims them after its lease and finishes them: nothing left. XLEN and
    // XPENDING are 0; the lag stays 3 (entries-added 6 minus entries-read 3: the cancelled jobs never read),
    // so a lag trigger would keep one worker up for good.
    const w3 = spawnWorker("finisher", workerArgs(configPath, ["--store-prefix", prefix, "--engine", engine.urls[0]!, "--max-model-len", "4096", "--lease", "0.5", "--idle-exit", "1"]));
    procs.push(w3.proc);
    const finished = await w3.done;
    expect(finished.code, finished.stderr).toBe(0);
    expect(JSON.parse(finished.stdout.trim().split("\n").pop()!)).toEqual({ consumer: "finisher", claimed: 2, completed: 2, failed: 0, reclaimed: 2, abandoned: 0, cancelled: 0, surplus: 0, refused: 0, capped: 0, exit: "idle", running: 0 });
    expect(await metrics()).toEqual({ streamLength: m(0, "streamLength"), pendingEntriesCount: m(0, "pendingEntriesCount"), lagCount: m(3, "lagCount") });
    expect(await r.xlen(trigger.stream!)).toBe(0);
    // Batch c's two trajectories are stored; the cancelled ones are not.
    expect(await api.store.groupStatus("m2")).toMatchObject({ expected: 2, finished: 2, records: 2, complete: true });
    expect(await api.store.get("m1_0_0")).toBeNull();
  }, HANG_MS);
});
