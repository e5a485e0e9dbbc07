import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createRolloutsApp } from "../../functions/rollouts.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { startToolServer, type ToolServer } from "../../infra/tools/server.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import type { InferenceClient } from "../../shared/inference/types.ts";
import { createAgentExecutor } from "../../shared/rollout/executor.ts";
import { MemoryPolicyVersions, RedisPolicyVersions, waitForAdmission } from "../../shared/rollout/policy-version.ts";
import { RolloutService } from "../../shared/service/rollout-service.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { depsFor, ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// rollout.max_staleness as admission control (policy `admit`, AReaL's max_head_offpolicyness):
// a trajectory starts only while model-version seq − consumed-version seq ≤ max_staleness.

let tools: ToolServer;
beforeAll(() => {
  tools = startToolServer({ port: 0 });
});
afterAll(() => tools.stop());

const json = { "content-type": "application/json" };

describe("admission (in-process, memory policy)", () => {
  test("max_staleness 0: trajectories start only while the trainer has consumed the current version; held ones start after POST /v1/consumed-version", async () => {
    const { deps } = await depsFor(tools.url);
    const policy = new MemoryPolicyVersions();
    // When a row first asked for admission and was refused (staleness over the bound): its hold began at or before.
    let firstHeldAsk: number | null = null;
    const admissionState = policy.admissionState.bind(policy);
    policy.admissionState = async () => {
      const s = await admissionState();
      if (firstHeldAsk === null && s.current && s.consumed && s.current.seq - s.consumed.seq > 0) firstHeldAsk = Date.now();
      return s;
    };
    // What the test has published, mirrored synchronously, and the first engine call of each trajectory against it.
    const state = { cur: 0, consumed: 0 };
    const starts: { key: string; cur: number; consumed: number; at: number }[] = [];
    const seen = new Set<string>();
    const slow: InferenceClient = {
      async generate(req) {
        if (!seen.has(req.routing_key!)) {
          seen.add(req.routing_key!);
          starts.push({ key: req.routing_key!, cur: state.cur, consumed: state.consumed, at: Date.now() });
        }
        await Bun.sleep(40); // engine latency: trajectories are in flight while the version moves
        return deps.client.generate(req);
      },
    };
    const config = parseAppConfig({ rollout: { n: 2, max_model_len: 4096, max_staleness: 0 }, concurrency: 4 });
    const service = new RolloutService({ config, store: new MemoryTransferQueue(), policy, executorFor: (r, b) => createAgentExecutor({ ...deps, client: slow, policy }, r, b) });
    const app = createRolloutsApp({ service });
    const post = async (path: string, body: unknown) => {
      const res = await app.request(path, { method: "POST", headers: json, body: JSON.stringify(body) });
      expect(res.status).toBe(200);
      return res.json();
    };

    expect(await (await app.request("/v1/consumed-version")).json()).toEqual({ version: null, seq: 0 });
    expect(await post("/v1/model-version", { version: "v1" })).toEqual({ version: "v1", seq: 1 });
    state.cur = 1;
    // A version never set is refused, naming the field.
    const bad = await app.request("/v1/consumed-version", { method: "POST", headers: json, body: JSON.stringify({ version: "v9" }) });
    expect(bad.status).toBe(400);
    expect((await bad.json()).error.field).toBe("version");
    expect(await post("/v1/consumed-version", { version: "v1" })).toEqual({ version: "v1", seq: 1 });
    state.consumed = 1;

    const rows = ROWS.slice(0, 6).map((r, i) => ({ ...r, uid: `adm${i}` }));
    const submitAt = Date.now();
    const { run } = service.submit({ rows, global_steps: 1, model_version: null, validate: false });
    const done = run.run();
    // Let the first trajectories start (4 at once), then publish v2: staleness 1 > 0, the rest is held.
    while (starts.length < 4) await Bun.sleep(2);
    await post("/v1/model-version", { version: "v2" });
    state.cur = 2;
    const before = starts.length;
    // Wait on the run's own counts, not the clock: once a slot is free a held row asks for admission at once, and
    // once all four first trajectories have finished every slot is free, so a start would follow within a tick.
    while (run.stats().counts.finished < 1) await Bun.sleep(2);
    const freeAt = Date.now();
    while (run.stats().counts.finished < 4) await Bun.sleep(2);
    await Bun.sleep(20);
    // Held: no trajectory started after the bump although every slot has been free.
    expect(starts.length).toBe(before);
    expect(before).toBe(4);
    expect(run.stats().counts.finished).toBe(4);
    // Reporting an older consumed version changes nothing (monotonic), and still holds.
    expect(await post("/v1/consumed-version", { version: "v1" })).toEqual({ version: "v1", seq: 1 });
    await Bun.sleep(100);
    expect(starts.length).toBe(4);

    state.consumed = 2;
    const ackAt = Date.now();
    expect(await post("/v1/consumed-version", { version: "v2" })).toEqual({ version: "v2", seq: 2 });
    await done;

    const recs = run.records();
    expect(recs.length).toBe(12);
    expect(recs.every((r) => r.error === null)).toBe(true);
    expect(starts.length).toBe(12);
    // The bound held at every start (observed from the engine side) …
    expect(Math.max(...starts.map((s) => s.cur - s.consumed))).toBe(0);
    // … and the held ones started after the trainer's signal, under v2.
    const late = starts.slice(before);
    expect(late.length).toBe(8);
    expect(late.every((s) => s.at >= ackAt)).toBe(true);
    // Each record says how it was admitted: the version it started under, staleness 0, held or not.
    const byKey = new Map(recs.map((r) => [r.key, r.extra_fields.admission as { version: string; seq: number; consumed_seq: number; staleness: number; held_ms: number }]));
    for (const s of starts) {
      const a = byKey.get(s.key)!;
      const heldOne = late.includes(s);
      expect({ version: a.version, seq: a.seq, consumed_seq: a.consumed_seq, staleness: a.staleness }).toEqual(heldOne ? { version: "v2", seq: 2, consumed_seq: 2, staleness: 0 } : { version: "v1", seq: 1, consumed_seq: 1, staleness: 0 });
      // Its first turn ran under the version it was admitted with.
      expect((recs.find((r) => r.key === s.key)!.extra_fields.model_versions as string[])[0]).toBe(a.version);
    }
    // The first refused ask (firstHeldAsk, after its row's hold began) came before the trainer's signal (ackAt), and
    // that row was let in only after it: the longest held_ms covers that span. The unheld ones waited less than the
    // time from the submit to the first finished trajectory (they started before it).
    const holds = late.map((s) => byKey.get(s.key)!.held_ms).sort((x, y) => y - x);
    expect(firstHeldAsk).not.toBeNull();
    expect(ackAt - firstHeldAsk!).toBeGreaterThan(0);
    expect(holds[0]!).toBeGreaterThanOrEqual(ackAt - firstHeldAsk!);
    expect(starts.slice(0, before).every((s) => byKey.get(s.key)!.held_ms <= freeAt - submitAt)).toBe(true);
  }, HANG_MS);

  test("waitForAdmission: within the bound at once, beyond it held until aborted; no bound: null", async () => {
    const policy = new MemoryPolicyVersions();
    await policy.set("v1");
    await policy.setConsumed("v1");
    await policy.set("v2");
    await policy.set("v3");
    // waitForAdmission itself: 2 versions ahead of consumption with a bound of 2 is admitted at once; of 1 is held until aborted.
    expect(await waitForAdmission(policy, 2)).toMatchObject({ version: "v3", seq: 3, consumed_seq: 1, staleness: 2 });
    const ac = new AbortController();
    const held = waitForAdmission(policy, 1, { signal: ac.signal });
    setTimeout(() => ac.abort(new Error("cancelled")), 50);
    await expect(held).rejects.toThrow("cancelled");
    expect(await waitForAdmission(policy, null)).toBeNull();
  });
});

describe("admission across processes (Redis policy)", () => {
  let ok = false;
  const prefix = randomPrefix("admission");
  const commanders: IoRedisCommander[] = [];
  beforeAll(async () => {
    ok = await requireRedis();
  });
  afterAll(async () => {
    for (const c of commanders) await c.close();
    if (ok) await deleteByPrefix(prefix);
  });

  test("a trajectory held in one process starts when another process (the API) reports consumption", async () => {
    if (!ok) return;
    const mk = () => {
      const c = new IoRedisCommander(REDIS_URL);
      commanders.push(c);
      return new RedisPolicyVersions(c, { prefix });
    };
    const api = mk();
    const worker = mk();
    expect(await worker.admissionState()).toEqual({ current: null, consumed: null });
    await api.set("v1");
    await api.setConsumed("v1");
    await api.set("v2");
    await api.set("v3");
    await expect(api.setConsumed("nope")).rejects.toMatchObject({ field: "version", status: 400 });
    let admittedAt = 0;
    const t0 = Date.now();
    const held = waitForAdmission(worker, 1, { pollMs: 20 }).then((a) => {
      admittedAt = Date.now();
      return a;
    });
    await Bun.sleep(200);
    expect(admittedAt).toBe(0);
    // Consuming v2 brings the gap to 1: admitted on the next poll, under v3.
    const ackAt = Date.now();
    expect(await api.setConsumed("v2")).toEqual({ version: "v2", seq: 2 });
    const a = (await held)!;
    expect({ version: a.version, seq: a.seq, consumed_seq: a.consumed_seq, staleness: a.staleness }).toEqual({ version: "v3", seq: 3, consumed_seq: 2, staleness: 1 });
    expect(admittedAt).toBeGreaterThanOrEqual(ackAt);
    expect(admittedAt - ackAt).toBeLessThan(500);
    expect(a.held_ms).toBeGreaterThanOrEqual(ackAt - t0);
    // Monotonic in Redis too.
    expect(await api.setConsumed("v1")).toEqual({ version: "v2", seq: 2 });
    expect((await worker.admissionState()).consumed).toEqual({ version: "v2", seq: 2 });
  });
});
