import { describe, expect, test } from "bun:test";
import { formatChaosReport, runChaos } from "../../infra/chaos/chaos-run.ts";
import { rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The lease chaos run of issue 29, scaled down: the chaos run (3 workers, engine errors and aborts, tool
// timeouts, workers SIGKILLed and replaced) with a sandbox lease per trajectory from the example provider,
// 10 % of whose creates make their sandbox and then hang past the create deadline, and two more batches: one
// cancelled mid-run, one over-sampled whose surplus is stopped while running. The full run is
// `npm run chaos:leases`.
const redis = await requireRedis();

describe.skipIf(!redis)("lease chaos run (small)", () => {
  test("no sandbox left live, none leaked to its lifetime, no lease left in the store, creates within the limit; the chaos run's own checks hold", async () => {
    const r = await runChaos({
      trajectories: 120,
      workers: 3,
      concurrency: 4,
      killEveryMs: 1500,
      maxKills: 3,
      decodeMsPerToken: 6,
      seed: 13,
      redisUrl: REDIS_URL,
      sandbox: { createTimeouts: 0.1, ttlS: 8, maxCreatesPerS: 25, createTimeoutMs: 500, stops: { cancelRows: 10, cancelAfterCreated: 6, surplusRows: 6, surplusTarget: 3 } },
    });
    console.log(formatChaosReport(r));
    expect(r.violations).toEqual([]);
    expect(r.missing).toEqual([]);
    expect(r.writes.duplicates).toBe(0);
    expect(r.kills).toBeGreaterThanOrEqual(2);
    const sb = r.sandbox!;
    expect(sb.provider.live).toBe(0);
    expect(sb.provider.destroyed_expired).toBe(0);
    expect(sb.provider.create_timeouts).toBeGreaterThan(0);
    expect(sb.provider.created).toBe(sb.provider.destroyed_released);
    expect(sb.provider.created).toBeGreaterThanOrEqual(120);
    expect(sb.provider.peak_creates_1s).toBeLessThanOrEqual(25);
    // The cancelled batch's running trajectories released theirs as cancelled, the over-sampled batch's surplus as surplus.
    expect(sb.provider.releases_by_reason.cancelled).toBeGreaterThan(0);
    expect(sb.provider.releases_by_reason.surplus).toBeGreaterThan(0);
    expect(sb.provider.releases_by_reason.finished).toBeGreaterThanOrEqual(120);
    expect(sb.stops).toMatchObject({ cancelled: { trajectories: 40 }, surplus: { trajectories: 24, target_groups: 3 } });
    expect(sb.stops!.surplus.complete_groups).toBeGreaterThanOrEqual(3);
    expect(sb.store.live + sb.store.creating + sb.store.releasing).toBe(0);
    // Every timed-out create was released by its lease id.
    expect(sb.store.counters.create_failed ?? 0).toBeGreaterThanOrEqual(sb.provider.create_timeouts);
    const c = rawRedis();
    try {
      expect((await c.scan("0", "MATCH", `${r.prefix}*`, "COUNT", 10_000))[1]).toEqual([]);
    } finally {
      await c.quit();
    }
  }, HANG_MS);
});
