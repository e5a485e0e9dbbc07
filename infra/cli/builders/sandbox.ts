import type { AppConfig } from "../../../shared/config/app-config.ts";
import { ConfigError } from "../../../shared/errors.ts";
import type { SandboxSpec } from "../../../shared/schema/index.ts";
import { SANDBOX_BASE_URL } from "../../../shared/schema/openenv.ts";
import { LeasedToolExecutor, SandboxLeases } from "../../../shared/tools/sandbox-leases.ts";
import type { ToolExecutor } from "../../../shared/tools/webhook-tool-client.ts";
import { buildLeaseStore } from "./store.ts";
import { LeaseMetricsCollector } from "../../../shared/telemetry/lease-metrics.ts";
import type { PromFamily } from "../../../shared/telemetry/prometheus.ts";

/**
 * The sandbox leases of the tools file's `sandbox` lifecycle (null without
 * one), the tools wrapped to run in them, and their `/metrics` families
 * (`storeWide`: with the store's shared figures too). Starts this process's heartbeat
 * and reaper (every process that runs trajectories reaps: the store's claim
 * makes two reapers release a lease once); both stop with `closers`.
 * @throws ConfigError (`tools.file: sandbox.lifetime_s`) when the sandbox lifetime is below the trajectory deadline;
 *   ConfigError (`openenv.base_url`) when it is `"sandbox"` and the tools file has no sandbox block.
 */
export function buildSandboxLeases(
  config: AppConfig,
  spec: SandboxSpec | undefined,
  tools: ToolExecutor,
  closers: (() => Promise<void>)[],
  describe: string[],
  storeTimeoutS?: number,
): { leases: SandboxLeases | null; tools: ToolExecutor; leaseMetrics: ((storeWide: boolean) => Promise<PromFamily[]>) | null } {
  if (!spec) {
    if (config.openenv.base_url === SANDBOX_BASE_URL) {
      throw new ConfigError("openenv.base_url", `"${SANDBOX_BASE_URL}" plays each trajectory's own sandbox, so the tools file needs a sandbox block (its provider's create reply names the environment's base_url)${config.tools.file ? `; ${config.tools.file} has none` : ": set tools.file (--tools)"}`);
    }
    return { leases: null, tools, leaseMetrics: null };
  }
  const observer = new LeaseMetricsCollector();
  const deadline = config.rollout.trajectory_deadline_s;
  let leases: SandboxLeases;
  try {
    leases = new SandboxLeases(spec, buildLeaseStore(config, closers, storeTimeoutS), { ...(config.tools.secret ? { secret: config.tools.secret } : {}), trajectoryDeadlineS: deadline, observer });
  } catch (e) {
    if (e instanceof TypeError) throw new ConfigError(`${config.tools.file ?? "tools file"}: sandbox.lifetime_s`, e.message);
    throw e;
  }
  let failures = 0;
  const stop = leases.start({
    reaper: true,
    onError: (e) => {
      // A store outage is reported by the store watch; one line here for the first failure of a run of them.
      if (failures++ === 0) console.error(`edgeloop: sandbox leases: ${(e as Error)?.message ?? String(e)} (retried at the next heartbeat)`);
    },
  });
  closers.push(async () => {
    stop();
    // Releases the provider kept failing leave sandboxes behind: say so once, at exit, rather than exit quietly.
    const left = leases.unreleased();
    if (left.lease_ids.length === 0) return;
    const n = left.lease_ids.length;
    const who =
      config.store.url === "memory"
        ? `the memory store dies with this process, so no reaper will retry them: the provider's own lifetime_s (${leases.lifetimeS} s) is what destroys them`
        : `they stay 'releasing' in the store; a serve, worker or rollout on the same store and prefix reaps them`;
    console.error(`edgeloop: sandbox: ${n} lease${n === 1 ? "" : "s"} could not be released (${left.last_error}; e.g. ${left.lease_ids[0]}): ${who}`);
  });
  describe.push(leases.describe());
  // Store-wide figures from one process only (serve), so that a sum over a deployment's scrapes counts them once.
  const leaseMetrics = async (storeWide: boolean) => observer.families(storeWide ? await leases.store.stats().catch(() => null) : null);
  return { leases, tools: new LeasedToolExecutor(tools, leases), leaseMetrics };
}
