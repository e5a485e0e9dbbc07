import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { buildRuntime, type Runtime } from "../../infra/cli/runtime.ts";
import { startUpstashBridge, type UpstashBridge } from "../../infra/upstash-bridge/upstash-bridge.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { deleteByPrefix, randomPrefix, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { comparableRecord } from "../session/crash.ts";
import { ROWS } from "../session/fixtures.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// N3 (issue 27): two inline serves on one store prefix, the same batch POSTed to both at once (a client retry
// through a load balancer). Both run every session; the durable session's step fence lets one owner commit
// each step. The loser must wait for the winner's outcome and hand its records back — never store the
// fence's ConflictError as the trajectory's failed record (on main all 40 records were such failures).
const redis = await requireRedis();
const N = 4;

for (const transport of ["redis", "upstash"] as const) describe.skipIf(!redis)(`N3: two inline owners of one batch (${transport === "redis" ? "Redis TCP" : "Upstash REST via the bridge"})`, () => {
  const prefix = randomPrefix("two-owners");
  let bridge: UpstashBridge | undefined;
  let a: Runtime;
  let b: Runtime;
  beforeAll(async () => {
    if (transport === "upstash") {
      const token = crypto.randomUUID();
      bridge = await startUpstashBridge({ port: 0, redisUrl: REDIS_URL, token });
      process.env.UPSTASH_REDIS_REST_URL = bridge.url;
      process.env.UPSTASH_REDIS_REST_TOKEN = token;
    }
    const flags = { store: transport === "upstash" ? "upstash" : REDIS_URL, storePrefix: prefix, n: N, seed: 7, maxModelLen: 4096 };
    a = await buildRuntime(flags, { jobs: "inline" });
    b = await buildRuntime(flags, { jobs: "inline" });
  }, HANG_MS);
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await bridge?.stop();
    delete process.env.UPSTASH_REDIS_REST_URL;
    delete process.env.UPSTASH_REDIS_REST_TOKEN;
    await deleteByPrefix(prefix);
  });

  test("the same 10 rows × 4 posted to both at once: 40 good records stored once, every group delivered with failed 0", async () => {
    const rows = Array.from({ length: 10 }, (_, i) => ({ ...ROWS[i % ROWS.length], uid: `two-${i}` }));
    const req = { rows, global_steps: 1, model_version: "v1", validate: false };
    const [ra, rb] = await Promise.all([a.service.accept(req), b.service.accept(req)]);
    expect(ra.keys).toEqual(rb.keys);
    expect(ra.keys.length).toBe(40);
    await Promise.all([ra.run.run(), rb.run.run()]);
    const sa = ra.run.stats();
    const sb = rb.run.stats();
    console.log(`owner a: ${JSON.stringify(sa.counts)}; owner b: ${JSON.stringify(sb.counts)}; errors ${JSON.stringify([...sa.errors, ...sb.errors].slice(0, 3))}`);
    // Each owner ends with every session finished and none failed; a session is written by one of them (counted
    // there) and handed back to the other (reused there: streamed, not counted again).
    for (const s of [sa, sb]) expect(s.counts).toMatchObject({ total: 40, pending: 0, running: 0, finished: 40, failed: 0, records: s.counts.ok });
    expect([sa.counts.ok + sb.counts.ok, sa.counts.reused + sb.counts.reused]).toEqual([40, 40]);
    // What each owner streamed is what the store holds, and what the store holds is a trajectory the policy sampled.
    const stored = new Map<string, TrajectoryRecord>();
    for (const k of ra.keys) stored.set(k, (await a.store.get(k))!);
    for (const r of stored.values()) expect([r.key, r.error, r.response_ids.length > 0, r.response_mask.length]).toEqual([r.key, null, true, r.response_ids.length]);
    for (const run of [ra.run, rb.run]) for (const r of run.records()) expect(comparableRecord(r)).toEqual(comparableRecord(stored.get(r.key)!));
    for (let i = 0; i < 10; i++) expect(await a.store.groupStatus(`two-${i}`)).toMatchObject({ expected: N, finished: N, records: N, failed: 0, complete: true });
    const groups = await a.store.readCompleteGroups({ consumer: "t", max: 20 });
    expect(groups.map((g) => [g.uid, g.failed, g.records.length]).sort()).toEqual(rows.map((r) => [r.uid, 0, N]).sort());
  }, HANG_MS);
});
