import { afterAll, describe, expect, test } from "bun:test";
import { formatRestartReport, runWholeRestart } from "../../infra/chaos/restart-run.ts";
import { privateRedis, type PrivateRedis } from "../helpers/redis-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";

// Issue 31 item 4: SIGKILL serve, every worker, the gateway and Redis mid-batch; Redis comes back from its
// append-only file and the processes start again with the same flags. `npm run chaos:restart` is the bigger run.
describe("whole-system restart", () => {
  let redis: PrivateRedis | undefined;
  afterAll(async () => {
    await redis?.dispose();
  });

  test("every in-flight trajectory resumes token-identical; the trainer's acked groups are not delivered again", async () => {
    redis = await privateRedis({ persist: true });
    const r = await runWholeRestart({ redis, rows: 12, n: 4, toolTurns: 6, workers: 2, concurrency: 6, killAt: 0.4, log: (l) => console.log(`restart: ${l}`) });
    console.log(formatRestartReport(r));
    expect(r.violations).toEqual([]);
    expect([r.records, r.missing, r.miscounted, r.unequal, r.redelivered_after_ack]).toEqual([48, [], [], [], []]);
    expect(r.delivered_groups).toBe(12);
    expect(r.batch).toEqual({ done: true, ok: 48, failed: 0, lost: null });
    // The kill landed mid-batch: some records stored and a group acked before it, engine requests cut by it.
    expect(r.atKill.records).toBeGreaterThanOrEqual(20);
    expect(r.atKill.records).toBeLessThan(48);
    expect(r.atKill.acked_groups).toBeGreaterThan(0);
    expect(r.atKill.engine_inflight).toBeGreaterThan(0);
    expect(r.tool_executions.run).toBe(r.tool_executions.reference);
    // Work kept: what was decoded again is at most what was being decoded at the kill (plus replies not yet checkpointed).
    expect(r.tokens.regenerated).toBeGreaterThanOrEqual(0);
    expect(r.tokens.work_kept).toBeGreaterThan(0.8);
  }, HANG_MS);
});
