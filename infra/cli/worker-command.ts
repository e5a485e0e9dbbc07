import { loopLagFamilies, SessionAdmission } from "../../shared/rollout/session-admission.ts";
import { processLoopLag } from "../../shared/telemetry/loop-lag.ts";
import { hostname } from "node:os";
import { ConfigError, InputError } from "../../shared/errors.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { refuseExampleAgent, type ConfigFlags } from "./flags.ts";
import { formatPrometheus, PROMETHEUS_CONTENT_TYPE } from "../../shared/telemetry/prometheus.ts";
import { processMetrics } from "../../shared/telemetry/process-metrics.ts";
import { workerFamilies } from "../../shared/jobs/worker-metrics.ts";
import { listen } from "./listen.ts";
import { buildRuntime } from "./runtime.ts";
import { unsignedToolsWarning } from "./builders/warnings.ts";

/** Flags of `edgeloop worker`: the config flags plus the worker's own. */
export interface WorkerFlags extends ConfigFlags {
  /** Exit after this many seconds with no job (scale to zero); absent: run until SIGINT/SIGTERM. */
  idleExit?: number;
  /** Seconds a claimed job may go without a heartbeat before another worker reclaims it (default 30). */
  lease?: number;
  /** Consumer name in the `workers` group (default `<host>-<pid>-<random>`). */
  consumer?: string;
  /**
   * Sessions running at once across every worker of the store prefix (the
   * store-wide cap, `StoreRunningCap`); give every worker the same value.
   * Absent: each worker is bounded by its own `--concurrency` only.
   */
  maxRunningTotal?: number;
  /**
   * Seconds the running jobs get to finish after SIGINT/SIGTERM; past it the
   * process exits and leaves them pending, to be reclaimed by another worker
   * after the lease and resumed from their checkpoints. Absent: wait for them
   * however long they take. Kubernetes: keep `terminationGracePeriodSeconds`
   * above it (infra/k8s/worker.yaml), or the kubelet's SIGKILL comes first.
   */
  drainTimeout?: number;
  /**
   * Port of an HTTP listener serving only `GET /metrics` (Prometheus text:
   * this worker's engine and tool calls, `processMetrics`, and its job
   * counts, `workerFamilies`); absent: no listener. 0 picks a free port (printed).
   */
  metricsPort?: number;
  /** Address the metrics listener binds (default 127.0.0.1; a pod scraped from outside needs 0.0.0.0). */
  metricsHost?: string;
}

/**
 * The `rollout` settings a job brings with it: a job runs with the rollout
 * section of the batch `serve` enqueued (serve's config merged with the
 * batch's own `config.rollout`), so these flags would be accepted and
 * ignored on a worker.
 */
export const WORKER_REFUSED_FLAGS: readonly (readonly [keyof WorkerFlags, string, string])[] = [
  ["n", "--n", "rollout.n"],
  ["promptLength", "--prompt-length", "rollout.prompt_length"],
  ["responseLength", "--response-length", "rollout.response_length"],
  ["maxAssistantTurns", "--max-assistant-turns", "rollout.multi_turn.max_assistant_turns"],
  ["trajectoryDeadline", "--trajectory-deadline", "rollout.trajectory_deadline_s"],
  ["defaultAgent", "--default-agent", "rollout.agent.default_agent_loop"],
];

/**
 * Refuses the `rollout` flags a worker cannot honour (see {@link WORKER_REFUSED_FLAGS}).
 * @throws InputError naming the flag and where the setting belongs.
 */
export function refuseBatchFlags(flags: WorkerFlags): void {
  for (const [key, flag, path] of WORKER_REFUSED_FLAGS) {
    if (flags[key] !== undefined) {
      throw new InputError(flag, `a worker runs each job with its batch's ${path} (serve's config, or the batch's config.rollout); set it on edgeloop serve or in the POST, not on the worker`);
    }
  }
}

/**
 * `edgeloop worker [--concurrency C] [--idle-exit S] …`: claims trajectory
 * jobs that `edgeloop serve` (queue mode) enqueued in the store's Redis,
 * runs their durable sessions (resuming from checkpoints), stores the
 * records, acknowledges the jobs, and exits when idle for `--idle-exit`
 * seconds. SIGINT/SIGTERM stop claiming and let running jobs finish. Prints
 * one JSON summary line on exit, always of one shape: `{consumer, claimed,
 * completed, failed, reclaimed, abandoned, cancelled, surplus, refused, capped, exit,
 * running}` (`WorkerSummary` of shared/jobs/job-worker.ts plus the consumer and the jobs still
 * running, 0 unless the drain timed out). With `--drain-timeout S`, a signal
 * gives the running jobs S seconds, then the process exits 0 with `exit:
 * "drain_timeout"` and the counts so far, and the running jobs stay pending
 * for another worker (the same path as a crash: reclaim after the lease,
 * resume from the checkpoint). A second signal does the same at once, with
 * `exit: "signal"`.
 * @throws ConfigError with the memory store (workers need a shared Redis).
 */
export async function workerCommand(flags: WorkerFlags): Promise<void> {
  refuseBatchFlags(flags);
  refuseExampleAgent(flags, "worker");
  if (!flags.store && !flags.config) throw new ConfigError("store.url", "edgeloop worker needs a shared store: pass --store redis://host:port (or upstash), the same as edgeloop serve");
  const runtime = await buildRuntime(flags, { waitForStore: true, ...(flags.lease !== undefined ? { jobQueue: { leaseMs: Math.round(flags.lease * 1000) } } : {}) });
  let closeMetrics: () => void = () => {};
  try {
    if (!runtime.jobs) throw new ConfigError("store.url", "edgeloop worker needs a Redis or Upstash store (--store redis://host:port), the same as edgeloop serve");
    const consumer = flags.consumer ?? `${hostname()}-${process.pid}-${crypto.randomUUID().slice(0, 6)}`;
    const admission = new SessionAdmission({ maxInFlight: runtime.config.concurrency, maxLagMs: runtime.config.limits.max_event_loop_lag_ms, lag: processLoopLag });
    const worker = new JobWorker({
      jobs: runtime.jobs,
      store: runtime.batchStore,
      executorFor: runtime.executorFor,
      consumer,
      concurrency: runtime.config.concurrency,
      admission,
      ...(flags.maxRunningTotal !== undefined ? { runningCap: runtime.jobs.runningCap(flags.maxRunningTotal) } : {}),
      idleExitMs: flags.idleExit === undefined ? null : Math.round(flags.idleExit * 1000),
      log: (line) => console.error(line),
      model: runtime.model,
      ...(runtime.sessions ? { onWake: (key: string) => void runtime.sessions!.wake(key) } : {}),
    });
    const concurrency = runtime.config.concurrency;
    // /metrics only: what this worker does is scrapeable where serve cannot see it (engine and tool latency, job counts).
    const metrics =
      flags.metricsPort === undefined
        ? null
        : listen({
            port: flags.metricsPort,
            hostname: flags.metricsHost ?? "127.0.0.1",
            fetch: async (req) => {
              const path = new URL(req.url).pathname;
              if (req.method !== "GET" || path !== "/metrics") return Response.json({ error: { code: "not_found", message: "this listener serves only GET /metrics" } }, { status: 404 });
              // A worker reports its own lease figures only: serve reports the store-wide ones once.
              const leases = runtime.leaseMetrics ? await runtime.leaseMetrics(false).catch(() => []) : [];
              const text = formatPrometheus([...workerFamilies(worker.progress, worker.running, concurrency), ...leases, ...processMetrics.families(), ...admission.families(), ...loopLagFamilies(processLoopLag)]);
              return new Response(text, { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } });
            },
          });
    closeMetrics = () => metrics?.stop(true);
    if (metrics) console.error(`worker     metrics on http://${flags.metricsHost ?? "127.0.0.1"}:${metrics.port}/metrics`);
    for (const line of runtime.describe) console.error(line);
    for (const line of runtime.warnings) console.error(line);
    const unsigned = unsignedToolsWarning(runtime.config, runtime.signedToolCalls);
    if (unsigned) console.error(unsigned);
    console.error(
      `worker     ${consumer}: ${runtime.config.concurrency} jobs at once from ${runtime.jobs.stream}, lease ${runtime.jobs.leaseMs} ms` +
        (flags.idleExit === undefined ? "" : `, exits after ${flags.idleExit} s idle`) +
        (flags.maxRunningTotal === undefined ? "" : `, at most ${flags.maxRunningTotal} running across all workers (store-wide cap)`),
    );
    let drainTimer: ReturnType<typeof setTimeout> | undefined;
    let signals = 0;
    const leaveRunning = (why: string, exit: string) => {
      const running = worker.running;
      console.error(`worker     ${consumer}: ${why} with ${running} jobs running: they stay pending, to be reclaimed after the lease (${runtime.jobs!.leaseMs} ms) and resumed from their checkpoints`);
      console.log(JSON.stringify({ consumer, ...worker.progress, exit, running }));
      process.exit(0);
    };
    // The first signal stops claiming and waits for the running jobs (at most --drain-timeout); a second one
    // (GNU timeout and supervisors send SIGTERM to the child and then to its group) ends the wait, with the summary.
    const onSignal = () => {
      if (++signals > 1) return leaveRunning("a second signal", "signal");
      worker.stop();
      console.error(`worker     ${consumer}: stopping: no new claims; waiting for ${worker.running} running jobs${flags.drainTimeout === undefined ? "" : ` (at most ${flags.drainTimeout} s)`} (a second signal leaves them to be reclaimed)`);
      if (flags.drainTimeout === undefined || drainTimer) return;
      drainTimer = setTimeout(() => leaveRunning(`drain timeout (${flags.drainTimeout} s)`, "drain_timeout"), Math.round(flags.drainTimeout * 1000));
    };
    process.on("SIGINT", onSignal);
    process.on("SIGTERM", onSignal);
    const summary = await worker.run();
    clearTimeout(drainTimer);
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    await runtime.jobs.forgetConsumer(consumer).catch(() => {});
    console.log(JSON.stringify({ consumer, ...summary, running: 0 }));
  } finally {
    closeMetrics();
    await runtime.close();
  }
}
