import { describe, expect, test } from "bun:test";
import { formatChaosReport, runChaos } from "../../infra/chaos/chaos-run.ts";
import { rawRedis, REDIS_URL, requireRedis } from "../helpers/redis.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// The chaos run of issue 8, scaled down: 3 workers over 120 trajectories, 5 % engine errors,
// 5 % aborts, 5 % tool timeouts, 3 workers SIGKILLed and replaced. The full run is `npm run chaos`.
const redis = await requireRedis();

describe.skipIf(!redis)("chaos run (small)", () => {
  test("every trajectory recorded once; records without injected faults equal the fault-free run's", async () => {
    const r = await runChaos({ trajectories: 120, workers: 3, concurrency: 4, killEveryMs: 1500, maxKills: 3, decodeMsPerToken: 6, seed: 11, redisUrl: REDIS_URL });
    console.log(formatChaosReport(r));
    expect(r.violations).toEqual([]);
    expect(r.trajectories).toBe(120);
    expect(r.missing).toEqual([]);
    expect(r.completed + r.failed).toBe(120);
    expect(Object.values(r.failedByReason).reduce((a, b) => a + b, 0)).toBe(r.failed);
    expect(r.writes.duplicates).toBe(0);
    expect(r.writes.groupDone).toBe(120);
    expect(r.unequal).toEqual([]);
    expect(r.equal).toBe(r.comparable);
    expect(r.comparable + r.faults.trajectories_faulted).toBe(120);
    expect(r.comparable).toBeGreaterThan(0);
    // The faults and kills happened.
    expect(r.faults.engine_errors).toBeGreaterThan(0);
    expect(r.faults.engine_aborts).toBeGreaterThan(0);
    expect(r.faults.tool_timeouts).toBeGreaterThan(0);
    expect(r.kills).toBeGreaterThanOrEqual(2);
    expect(r.workerStarts).toBe(3 + r.kills);
    // No tool call ran twice: as many executions as the fault-free run (tools dedupe re-sent call ids).
    expect(r.toolExecutions.chaos).toBe(r.toolExecutions.reference);
    // The run's Redis keys are gone.
    const c = rawRedis();
    try {
      expect((await c.scan("0", "MATCH", `${r.prefix}*`, "COUNT", 10_000))[1]).toEqual([]);
    } finally {
      await c.quit();
    }
  }, HANG_MS);
});
