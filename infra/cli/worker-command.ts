import { hostname } from "node:os";
import { ConfigError, InputError } from "../../shared/errors.ts";
import { JobWorker } from "../../shared/jobs/job-worker.ts";
import { refuseExampleAgent, type ConfigFlags } from "./flags.ts";
import { buildRuntime, unsignedToolsWarning } from "./runtime.ts";

/** Flags of `edgeloop worker`: the config flags plus the worker's own. */
export interface WorkerFlags extends ConfigFlags {
  /** Exit after this many seconds with no job (scale to zero); absent: run until SIGINT/SIGTERM. */
  idleExit?: number;
  /** Seconds a claimed job may go without a heartbeat before another worker reclaims it (default 30). */
  lease?: number;
  /** Consumer name in the `workers` group (default `<host>-<pid>-<random>`). */
  consumer?: string;
  /**
   * Seconds the running jobs get to finish after SIGINT/SIGTERM; past it the
   * process exits and leaves them pending, to be reclaimed by another worker
   * after the lease and resumed from their checkpoints. Absent: wait for them
   * however long they take. Kubernetes: keep `terminationGracePeriodSeconds`
   * above it (infra/k8s/worker.yaml), or the kubelet's SIGKILL comes first.
   */
  drainTimeout?: number;
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
 * completed, failed, reclaimed, abandoned, cancelled, surplus, refused, exit,
 * running}` (`WorkerSummary` of shared/jobs/job-worker.ts plus the consumer and the jobs still
 * running, 0 unless the drain timed out). With `--drain-timeout S`, a signal
 * gives the running jobs S seconds, then the process exits 0 with `exit:
 * "drain_timeout"` and the counts so far, and the running jobs stay pending
 * for another worker (the same path as a crash: reclaim after the lease,
 * resume from the checkpoint).
 * @throws ConfigError with the memory store (workers need a shared Redis).
 */
export async function workerCommand(flags: WorkerFlags): Promise<void> {
  refuseBatchFlags(flags);
  refuseExampleAgent(flags, "worker");
  if (!flags.store && !flags.config) throw new ConfigError("store.url", "edgeloop worker needs a shared store: pass --store redis://host:port (or upstash), the same as edgeloop serve");
  const runtime = await buildRuntime(flags, { waitForStore: true, ...(flags.lease !== undefined ? { jobQueue: { leaseMs: Math.round(flags.lease * 1000) } } : {}) });
  try {
    if (!runtime.jobs) throw new ConfigError("store.url", "edgeloop worker needs a Redis or Upstash store (--store redis://host:port), the same as edgeloop serve");
    const consumer = flags.consumer ?? `${hostname()}-${process.pid}-${crypto.randomUUID().slice(0, 6)}`;
    const worker = new JobWorker({
      jobs: runtime.jobs,
      store: runtime.batchStore,
      executorFor: runtime.executorFor,
      consumer,
      concurrency: runtime.config.concurrency,
      idleExitMs: flags.idleExit === undefined ? null : Math.round(flags.idleExit * 1000),
      log: (line) => console.error(line),
      model: runtime.model,
      ...(runtime.sessions ? { onWake: (key: string) => void runtime.sessions!.wake(key) } : {}),
    });
    for (const line of runtime.describe) console.error(line);
    for (const line of runtime.warnings) console.error(line);
    const unsigned = unsignedToolsWarning(runtime.config);
    if (unsigned) console.error(unsigned);
    console.error(
      `worker     ${consumer}: ${runtime.config.concurrency} jobs at once from ${runtime.jobs.stream}, lease ${runtime.jobs.leaseMs} ms` +
        (flags.idleExit === undefined ? "" : `, exits after ${flags.idleExit} s idle`),
    );
    let drainTimer: ReturnType<typeof setTimeout> | undefined;
    const onSignal = () => {
      worker.stop();
      if (flags.drainTimeout === undefined || drainTimer) return;
      const leaseMs = runtime.jobs!.leaseMs;
      drainTimer = setTimeout(() => {
        const running = worker.running;
        console.error(`worker     ${consumer}: drain timeout (${flags.drainTimeout} s) with ${running} jobs running: they stay pending, to be reclaimed after the lease (${leaseMs} ms) and resumed from their checkpoints`);
        console.log(JSON.stringify({ consumer, ...worker.counts, exit: "drain_timeout", running }));
        process.exit(0);
      }, Math.round(flags.drainTimeout * 1000));
    };
    process.once("SIGINT", onSignal);
    process.once("SIGTERM", onSignal);
    const summary = await worker.run();
    clearTimeout(drainTimer);
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    await runtime.jobs.forgetConsumer(consumer).catch(() => {});
    console.log(JSON.stringify({ consumer, ...summary, running: 0 }));
  } finally {
    await runtime.close();
  }
}
