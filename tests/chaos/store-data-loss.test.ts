import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { startSimEngine, type RunningSimEngine } from "../../infra/sim-engine/server.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { POLICY } from "../session/fixtures.ts";
import { drainGroups, post, progress, spawnCli, spawnServe, until, type CliProc } from "./store-harness.ts";
import { HANG_MS } from "../helpers/bounds.ts";

/** The flags shared with serve minus --n: a worker runs each job with its batch's rollout section and refuses --n. */
const workerFlags = (flags: string[]): string[] => flags.filter((_, i) => flags[i] !== "--n" && flags[i - 1] !== "--n");

// E2: `serve` and one `worker` on a Redis store; Redis loses its data (FLUSHALL stands in for a
// restart without persistence) between two batches, and again while a batch is in flight.
// On main the worker logged NOGROUP every 5 s forever and GET /v1/groups failed the same way.
// This test flushes Redis, so it runs its own redis-server on a free port.
const ROW = { data_source: "edge", prompt: [{ role: "user", content: "Say hi." }], reward_model: { style: "rule", ground_truth: "1" } };
const GRACE_S = 2;

for (const transport of ["redis", "upstash"] as const) describe(`E2 (${transport === "redis" ? "Redis TCP" : "Upstash REST via the bridge"}): Redis loses its data under serve + worker (queue mode)`, () => {
  let redis: PrivateRedis;
  let bridge: UpstashBridge | undefined;
  let engine: RunningSimEngine;
  let serve: CliProc & { url: string };
  let worker: CliProc;
  const prefix = "e2:";

  beforeAll(async () => {
    redis = await privateRedis();
    const token = `tok-${crypto.randomUUID()}`;
    if (transport === "upstash") bridge = await startUpstashBridge({ port: 0, redisUrl: redis.url, token });
    const env: Record<string, string> = bridge ? { UPSTASH_REDIS_REST_URL: bridge.url, UPSTASH_REDIS_REST_TOKEN: token } : {};
    const store = bridge ? "upstash" : redis.url;
    // A slow engine (about 1 s per trajectory), so a batch is still running when Redis is flushed.
    engine = await startSimEngine({ script: { ...POLICY, seed: 3 }, latency: { prefill_ms_per_token: 0, decode_ms_per_token: 25 } });
    const common = ["--store", store, "--store-prefix", prefix, "--engine", engine.urls[0]!, "--n", "2", "--max-model-len", "4096"];
    serve = await spawnServe([...common, "--lost-grace", String(GRACE_S)], env);
    worker = spawnCli(["worker", ...workerFlags(common), "--concurrency", "2", "--lease", "3", "--consumer", "e2w"], env);
  }, HANG_MS);
  afterAll(async () => {
    worker?.proc.kill("SIGKILL");
    serve?.proc.kill("SIGKILL");
    await engine?.stop();
    await bridge?.stop();
    await redis?.dispose();
  });

  test("pre0 completes; FLUSHALL; post0 runs and its group is delivered by the next GET /v1/groups", async () => {
    const pre = await post(serve.url, [{ ...ROW, uid: "pre0" }]);
    expect(pre.keys).toEqual(["pre0_0_0", "pre0_1_0"]);
    const p0 = await until(async () => ((await progress(serve.url, pre.batch_id)).done ? progress(serve.url, pre.batch_id) : null), "pre0 done");
    expect(p0.counts).toMatchObject({ total: 2, ok: 2, failed: 0 });
    expect((await drainGroups(serve.url, ["pre0"])).get("pre0")).toEqual([["pre0_0_0", "pre0_1_0"]]);

    const raw = redis.client();
    expect(await raw.flushall()).toBe("OK");
    await raw.quit();

    const postB = await post(serve.url, [{ ...ROW, uid: "post0" }]);
    expect(postB.keys).toEqual(["post0_0_0", "post0_1_0"]);
    const p1 = await until(async () => ((await progress(serve.url, postB.batch_id)).done ? progress(serve.url, postB.batch_id) : null), "post0 done", HANG_MS);
    expect(p1.counts).toMatchObject({ total: 2, ok: 2, failed: 0 });
    expect(p1.lost).toBeNull();
    expect((await drainGroups(serve.url, ["post0"])).get("post0")).toEqual([["post0_0_0", "post0_1_0"]]);
    expect(await (await fetch(`${serve.url}/v1/queue`)).json()).toMatchObject({ mode: "queue", depth: 0, in_flight: 0 });
    expect(worker.proc.exitCode).toBeNull();
  }, HANG_MS);

  test("a batch in flight when Redis is flushed finishes: what ran lands, the rest is reported lost with keys named", async () => {
    const rows = Array.from({ length: 6 }, (_, i) => ({ ...ROW, uid: `fly${i}` }));
    const b = await post(serve.url, rows);
    expect(b.keys.length).toBe(12);
    await until(async () => (await progress(serve.url, b.batch_id)).counts.ok >= 2, "two records before the flush", HANG_MS, 20);
    const raw = redis.client();
    await raw.flushall();
    await raw.quit();
    const t0 = Date.now();
    const p = await until(async () => ((await progress(serve.url, b.batch_id)).done ? progress(serve.url, b.batch_id) : null), "the in-flight batch done", HANG_MS);
    const waited = (Date.now() - t0) / 1000;
    console.log(`E2 ${transport} in flight: ${JSON.stringify(p.counts)}, lost ${p.lost?.count} after ${waited.toFixed(1)} s: ${p.lost?.keys.join(",")}; errors ${JSON.stringify(p.errors.slice(0, 3))}`);
    expect(p.counts.failed).toBe(0);
    expect(p.lost).not.toBeNull();
    const lost = p.lost!;
    expect(lost.count).toBeGreaterThan(0);
    expect(lost.keys.length).toBe(lost.count);
    expect(p.counts.ok + lost.count).toBe(12);
    expect(lost.missing).toContain(`${prefix}jobs:batch:${b.batch_id}`);
    const listed = ((await (await fetch(`${serve.url}/v1/rollouts`)).json()) as { batches: { batch_id: string; lost: { count: number; reason: string } | null }[] }).batches.find((x) => x.batch_id === b.batch_id);
    expect(listed?.lost).toEqual({ count: lost.count, reason: lost.reason });
    expect(lost.reason).toStartWith(`no job in ${prefix}jobs and no record for ${GRACE_S} s, no session step committed meanwhile (the batch hash ${prefix}jobs:batch:${b.batch_id} is gone`);
    // Each key either landed (the batch's record stream holds it, exactly once) or is reported lost — never both, never neither.
    const landed = (await (await fetch(`${serve.url}/v1/rollouts/${b.batch_id}/trajectories`)).text()).trim().split("\n").map((l) => (JSON.parse(l) as { key: string }).key);
    expect(new Set(landed).size).toBe(landed.length);
    expect([...landed, ...lost.keys].sort()).toEqual([...b.keys].sort());
    // Every group of the batch vanished with the flush. A group whose sessions all finished is put back (the
    // process that ran or counted them registers it again and rewrites its records) and delivered; every
    // other one is named in `missing`. Never both, never neither.
    const c = redis.client();
    const enqueued = await Promise.all(rows.map(async (r) => (await c.hget(`${prefix}group:${r.uid}`, "enqueued")) === "1"));
    await c.quit();
    const named = lost.missing.filter((m) => m.startsWith(`${prefix}group:`));
    rows.forEach((r, i) => expect([r.uid, enqueued[i] !== named.includes(`${prefix}group:${r.uid}`)]).toEqual([r.uid, true]));
    // A group all of whose sessions landed is delivered; one with a landed and a lost session (the flush fell
    // between them) is named in `missing` above, not delivered.
    const whole = rows.filter((r) => b.keys.filter((k) => k.startsWith(`${r.uid}_`)).every((k) => landed.includes(k)));
    for (const r of whole) expect([r.uid, enqueued[rows.indexOf(r)]]).toEqual([r.uid, true]);
    // Work submitted afterwards still runs.
    const after = await post(serve.url, [{ ...ROW, uid: "after0" }]);
    const pa = await until(async () => ((await progress(serve.url, after.batch_id)).done ? progress(serve.url, after.batch_id) : null), "after0 done", HANG_MS);
    expect(pa.counts).toMatchObject({ ok: 2, failed: 0 });
    expect((await drainGroups(serve.url, ["after0"])).get("after0")).toEqual([["after0_0_0", "after0_1_0"]]);
  }, HANG_MS);
});
