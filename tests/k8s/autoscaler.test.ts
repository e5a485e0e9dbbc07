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
import { spawnWorker, triggerFor, workerArgs, writeConfig, type WorkerProc } from "./harness.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { kedaMetric } from "./manifests.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// This test plays KEDA + the HPA for the worker ScaledObject: every 200 ms it reads the metric KEDA
// reads (the manifest's trigger: XLEN of the job stream), sets replicas = min(max, ceil(metric /
// streamLength)), starts real `edgeloop worker` processes with the Deployment's args to scale up,
// SIGTERMs them to scale down (after a stabilization window; to zero only after the cooldown), and
// lets each drain. Over a 500-trajectory batch enqueued by the service in queue mode: 0 -> 3 -> 0
// workers, 500 records, none twice.
const redis = await requireRedis();
const ROWS_N = 50;
const N = 10;
const MAX_REPLICAS = 3;
const TICK_MS = 200;
const STABILIZE_MS = 1_000;
const COOLDOWN_MS = 1_000;

describe.skipIf(!redis)("autoscaling workers on the ScaledObject's signal", () => {
  const prefix = randomPrefix("k8s-autoscale");
  const dir = mkdtempSync(join(tmpdir(), "edgeloop-k8s-autoscale-"));
  let engine: RunningSimEngine;
  let api: Runtime;
  let r: IORedis;
  let configPath: string;
  let tools: ToolServer;
  const workers: WorkerProc[] = [];

  beforeAll(async () => {
    engine = await startSimEngine({ script: { ...POLICY, seed: 11 } });
    // The tools the ConfigMap's tools.json names: the example tool server, as examples/example-tools.yaml runs it.
    tools = startToolServer();
    configPath = writeConfig(dir, tools.url);
    api = await buildRuntime({ config: configPath, store: REDIS_URL, storePrefix: prefix, engine: engine.urls[0]!, maxModelLen: 4096 }, { jobs: "queue" });
    r = rawRedis();
  });
  afterAll(async () => {
    for (const w of workers) w.proc.kill("SIGKILL");
    await api?.close();
    await engine?.stop();
    await tools?.stop();
    await r?.quit();
    await deleteByPrefix(prefix);
    rmSync(dir, { recursive: true, force: true });
  });

  test(`${ROWS_N * N} trajectories: 0 -> ${MAX_REPLICAS} -> 0 workers on ceil(XLEN / target), nothing lost, nothing twice`, async () => {
    const trigger = triggerFor(prefix);
    const target = Number(trigger.streamLength);
    expect(target).toBe(64);
    const app = createRolloutsApp({ service: api.service });
    const rows = Array.from({ length: ROWS_N }, (_, i) => ({ ...ROWS[i % ROWS.length], uid: `as${i}` }));
    const t0 = Date.now();
    const res = await app.request("/v1/rollouts", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ rows, config: { rollout: { n: N } } }) });
    expect(res.status).toBe(202);
    const { batch_id, keys } = (await res.json()) as { batch_id: string; keys: string[] };
    expect(keys.length).toBe(ROWS_N * N);
    expect((await kedaMetric(r, trigger)).value).toBe(ROWS_N * N);

    const running: WorkerProc[] = [];
    const history: { t: number; metric: number; replicas: number }[] = [{ t: 0, metric: ROWS_N * N, replicas: 0 }];
    let lowerSince: number | null = null;
    let zeroSince: number | null = null;
    const deadline = Date.now() + 80_000;
    for (;;) {
      const { value } = await kedaMetric(r, trigger);
      const desired = Math.min(MAX_REPLICAS, Math.ceil(value / target));
      const now = Date.now();
      if (desired > running.length) {
        lowerSince = zeroSince = null;
        while (running.length < desired) {
          const w = spawnWorker(`as-${workers.length}`, workerArgs(configPath, ["--store-prefix", prefix, "--engine", engine.urls[0]!, "--max-model-len", "4096"]));
          workers.push(w);
          running.push(w);
        }
      } else if (desired < running.length) {
        lowerSince ??= now;
        if (desired === 0) zeroSince ??= now;
        const wait = desired === 0 ? COOLDOWN_MS : STABILIZE_MS;
        if (now - (desired === 0 ? zeroSince! : lowerSince) >= wait) {
          // Scale down: SIGTERM, as the kubelet does; the worker stops claiming and drains its running jobs.
          while (running.length > desired) running.pop()!.proc.kill("SIGTERM");
          lowerSince = zeroSince = null;
        }
      } else lowerSince = zeroSince = null;
      if (history.at(-1)?.replicas !== running.length || history.at(-1)?.metric !== value) history.push({ t: now - t0, metric: value, replicas: running.length });
      if (running.length === 0 && value === 0) break;
      if (now > deadline) throw new Error(`autoscaler did not reach 0: ${JSON.stringify(history.slice(-5))}`);
      await Bun.sleep(TICK_MS);
    }
    const summaries = await Promise.all(
      workers.map(async (w) => {
        const d = await w.done;
        if (d.code !== 0) throw new Error(`${w.name} exited ${d.code}: ${d.stderr.slice(-2000)}`);
        return JSON.parse(d.stdout.trim().split("\n").pop()!) as { consumer: string; claimed: number; completed: number; reclaimed: number; failed: number; exit: string };
      }),
    );
    const replicas = history.map((h) => h.replicas);
    console.log(`autoscaler: ${workers.length} workers started, replicas ${replicas.filter((x, i) => x !== replicas[i - 1]).join(" -> ")}, ${((Date.now() - t0) / 1000).toFixed(1)} s; per worker ${JSON.stringify(summaries.map((s) => [s.consumer, s.completed]))}`);

    // 0 -> 3 -> 0.
    expect(replicas[0]).toBe(0);
    expect(replicas[1]).toBe(MAX_REPLICAS);
    expect(Math.max(...replicas)).toBe(MAX_REPLICAS);
    expect(replicas.at(-1)).toBe(0);
    for (const s of summaries) expect(s.exit).toBe("stopped");
    // Nothing duplicated: each job claimed and completed once (no redelivery), each record stored once.
    expect(summaries.reduce((n, s) => n + s.claimed, 0)).toBe(ROWS_N * N);
    expect(summaries.reduce((n, s) => n + s.completed, 0)).toBe(ROWS_N * N);
    expect(summaries.reduce((n, s) => n + s.reclaimed, 0)).toBe(0);
    // Nothing lost: 500 records, every group complete and delivered once.
    const progress = (await (await app.request(`/v1/rollouts/${batch_id}`)).json()) as { done: boolean; counts: Record<string, number> };
    expect(progress.counts).toMatchObject({ total: ROWS_N * N, finished: ROWS_N * N, records: ROWS_N * N, ok: ROWS_N * N, failed: 0 });
    for (let i = 0; i < ROWS_N; i++) expect(await api.store.groupStatus(`as${i}`)).toMatchObject({ expected: N, finished: N, records: N, failed: 0, complete: true });
    for (const k of keys) expect((await api.store.get(k))?.key).toBe(k);
    expect(await r.xlen(`${prefix}groups:train`)).toBe(ROWS_N);
    expect(await r.xlen(trigger.stream!)).toBe(0);
  }, HANG_MS);
});
