import { afterAll, describe, expect, test } from "bun:test";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { spawnCli, spawnServe, until, type CliProc } from "../chaos/store-harness.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { POLICY, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 25 item 5 across real processes: the trainer posts versions to `edgeloop serve --jobs queue`
// while one `edgeloop worker` (another process, Redis store) runs batches against a simulated vLLM
// replica. Each round posts a version, then at once a batch; the next round starts while that batch
// still runs (its first requests reached the engine), so the worker's calls never stop and a
// per-process cache of the version would stay warm across every POST. Every turn of a batch was
// dispatched after its round's POST returned: its version is that round's or a later one, never an
// earlier one; and the last batch (no POST after it) is all the last version.

const redisUp = await requireRedis();
const prefix = randomPrefix("version-order-procs");
const procs: CliProc[] = [];
let sim: RunningSimEngine | undefined;
const json = { "content-type": "application/json" };
const ROUNDS = 8;
const N = 2;

afterAll(async () => {
  for (const p of procs) if (p.proc.exitCode === null) p.proc.kill();
  await Promise.all(procs.map((p) => p.proc.exited));
  await sim?.stop();
  if (redisUp) await deleteByPrefix(prefix);
});

describe.skipIf(!redisUp)("versions across processes: POST /v1/model-version to serve, calls on a worker", () => {
  test(`${ROUNDS} rounds of POST version → POST batch: no turn of a batch carries a version older than the one posted before it`, async () => {
    sim = await startSimEngine({ script: { ...POLICY, seed: 7 }, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 2 } });
    const engine = sim.replicas[0]!.engine;
    const common = ["--store", REDIS_URL, "--store-prefix", prefix, "--engine", sim.urls[0]!, "--seed", "7", "--max-model-len", "4096"];
    const serve = await spawnServe([...common, "--n", String(N), "--jobs", "queue"]);
    procs.push(serve);
    const worker = spawnCli(["worker", ...common, "--concurrency", "32", "--idle-exit", "30", "--consumer", "vo-w1"]);
    procs.push(worker);
    const api = async (path: string, body: unknown) => {
      const res = await fetch(`${serve.url}${path}`, { method: "POST", headers: json, body: JSON.stringify(body) });
      expect(res.status).toBeLessThan(300);
      return res.json() as Promise<Record<string, unknown>>;
    };

    const batches: { round: number; batch_id: string; keys: string[] }[] = [];
    for (let k = 0; k < ROUNDS; k++) {
      await api("/v1/model-version", { version: `p${k}` });
      const rows = [0, 1].map((i) => ({ ...ROWS[(2 * k + i) % ROWS.length]!, uid: `vo${k}r${i}` }));
      const { batch_id, keys } = (await api("/v1/rollouts", { rows, model_version: "batch-fallback" })) as { batch_id: string; keys: string[] };
      batches.push({ round: k, batch_id, keys });
      // The next POST goes while this batch runs on the worker: wait for its first requests at the engine.
      await until(async () => engine.requests.filter((l) => keys.includes(l.routing_key ?? "")).length >= 2, `round ${k}'s first engine requests`, HANG_MS, 2);
    }
    for (const b of batches) {
      const done = await until(async () => {
        const r = (await (await fetch(`${serve.url}/v1/rollouts/${b.batch_id}`)).json()) as { done: boolean; counts: { ok: number } };
        return r.done ? r : null;
      }, `batch ${b.round} done`, 120_000, 50);
      expect(done.counts.ok).toBe(2 * N);
    }

    const violations: string[] = [];
    let turns = 0;
    for (const b of batches) {
      for (const key of b.keys) {
        const r = (await (await fetch(`${serve.url}/v1/trajectories/${key}`)).json()) as TrajectoryRecord;
        expect(r.error).toBeNull();
        const versions = r.extra_fields.model_versions as string[];
        expect(versions.length).toBeGreaterThan(0);
        turns += versions.length;
        const rounds = versions.map((v) => (/^p\d+$/.test(v) ? Number(v.slice(1)) : -1));
        // Posted at or after this batch's round, and never going back within a trajectory.
        if (rounds.some((x, i) => x < b.round || (i > 0 && x < rounds[i - 1]!))) violations.push(`${key} (round ${b.round}): ${JSON.stringify(versions)}`);
        const segs = r.extra_fields.token_versions as [number, string][];
        if (segs.some(([, v]) => !versions.includes(v))) violations.push(`${key}: token_versions ${JSON.stringify(segs)} vs turns ${JSON.stringify(versions)}`);
        if (b.round === ROUNDS - 1 && versions.some((v) => v !== `p${ROUNDS - 1}`)) violations.push(`${key} (last round): ${JSON.stringify(versions)}`);
      }
    }
    expect(violations).toEqual([]);
    expect(turns).toBeGreaterThanOrEqual(ROUNDS * 2 * N);
    expect(worker.proc.exitCode).toBeNull();
  }, HANG_MS);
});
