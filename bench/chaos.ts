/**
 * `npm run chaos` (`bun run bench/chaos.ts`): the chaos run of issue 8 —
 * 3 workers over 1,000 trajectories, the simulated engine injecting 5 %
 * errors and 5 % aborts, the tool server 5 % timeouts, a random worker
 * SIGKILLed every ~3 s and replaced — then the checks and a table of counts
 * (see infra/chaos/chaos-run.ts). Exits 1 when a property is violated.
 * Flags: --trajectories N --workers W --kill-every S --seed K --concurrency C --deadline S (give up after S seconds, default 900),
 * --leases (`npm run chaos:leases`: every trajectory holds a sandbox lease, and a cancelled and an over-sampled batch
 * run beside the main one; see ChaosOptions.sandbox).
 * --restart (`npm run chaos:restart`): issue 31's whole-system restart instead (infra/chaos/restart-run.ts) —
 * serve, the workers, the gateway and a private Redis SIGKILLed together mid-batch, Redis restarted from its
 * append-only file, everything started again; --rows R (default 120, n = 4), --tool-turns K (default 6),
 * --kill-at F (share of records stored at the kill, default 0.5); prints the work kept.
 * Needs Redis (REDIS_URL, default redis://127.0.0.1:6379); --restart needs redis-server (it starts its own).
 */
import { parseArgs } from "node:util";
import { formatChaosReport, runChaos } from "../infra/chaos/chaos-run.ts";
import { formatRestartReport, runWholeRestart } from "../infra/chaos/restart-run.ts";
import { privateRedis } from "../tests/helpers/redis-server.ts";

const { values: v } = parseArgs({
  args: process.argv.slice(2),
  options: {
    trajectories: { type: "string", default: "1000" },
    workers: { type: "string" },
    "kill-every": { type: "string" },
    seed: { type: "string", default: "7" },
    concurrency: { type: "string" },
    leases: { type: "boolean", default: false },
    deadline: { type: "string", default: "900" },
    restart: { type: "boolean", default: false },
    rows: { type: "string", default: "120" },
    "tool-turns": { type: "string", default: "6" },
    "kill-at": { type: "string", default: "0.5" },
  },
});
const t0 = performance.now();
if (v.restart) {
  const redis = await privateRedis({ persist: true });
  try {
    const r = await runWholeRestart({
      redis,
      rows: Number(v.rows),
      toolTurns: Number(v["tool-turns"]),
      workers: Number(v.workers ?? 2),
      concurrency: Number(v.concurrency ?? 8),
      killAt: Number(v["kill-at"]),
      seed: Number(v.seed),
      deadlineMs: Number(v.deadline) * 1000,
      log: (line) => console.error(`[${((performance.now() - t0) / 1000).toFixed(1)} s] ${line}`),
    });
    console.log(formatRestartReport(r));
    process.exitCode = r.violations.length ? 1 : 0;
  } catch (e) {
    // A bad flag, a component that did not start, an interrupt: one line, no stack.
    console.error(`chaos:restart: ${(e as Error)?.message ?? String(e)}`);
    process.exitCode = e instanceof RangeError ? 2 : 1;
  } finally {
    await redis.dispose();
  }
  process.exit();
}
const report = await runChaos({
  trajectories: Number(v.trajectories),
  // --leases: issue 29's shape, a fleet of 20 workers of which one (5 %) is SIGKILLed every ~10 s; else 3 workers, one every ~3 s.
  workers: Number(v.workers ?? (v.leases ? 20 : 3)),
  killEveryMs: Number(v["kill-every"] ?? (v.leases ? 10 : 3)) * 1000,
  seed: Number(v.seed),
  concurrency: Number(v.concurrency ?? (v.leases ? 2 : 8)),
  deadlineMs: Number(v.deadline) * 1000,
  // 20 worker processes on a small machine: a 1 s tool timeout (and a 0.5 s create deadline) time out for real under
  // that load, and a real timeout is not in the fault logs (the record then differs from the fault-free run's).
  ...(v.leases ? { toolTimeoutMs: 3_000 } : {}),
  // --leases (`npm run chaos:leases`): a sandbox per trajectory from the example provider (lease ttl 30 s: well above the
  // job lease of 2 s plus a reclaim on a loaded machine; a lease reaped before its session resumes fails a trajectory
  // that had seen a tool result as sandbox_lost), 10 % of creates hanging past
  // the create deadline; beside the main batch, 100 trajectories cancelled mid-run and 100 over-sampled (target 12 of 25 groups).
  ...(v.leases
    ? { sandbox: { createTimeouts: 0.1, ttlS: 30, maxCreatesPerS: 25, createTimeoutMs: 2_000, stops: { cancelRows: 25, cancelAfterCreated: 12, surplusRows: 25, surplusTarget: 12 } } }
    : {}),
  log: (line) => console.error(`[${((performance.now() - t0) / 1000).toFixed(1)} s] ${line}`),
});
console.log(formatChaosReport(report));
process.exit(report.violations.length ? 1 : 0);
