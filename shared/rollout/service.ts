import { ConfigError, NotFoundError } from "../errors.ts";
import { AppConfig, mergeConfig, parseAppConfig } from "../config/app-config.ts";
import type { RolloutConfig, TrajectoryRecord } from "../schema/index.ts";
import type { TransferQueue } from "../store/types.ts";
import { planBatch, type RolloutRequest } from "./batch.ts";
import { BatchRun, type TrajectoryExecutor } from "./batch-run.ts";

/** Builds the executor for a batch's effective rollout config (per-batch overrides applied). */
export type ExecutorFactory = (rollout: RolloutConfig, batch: { model_version: string | number | null; validate: boolean }) => TrajectoryExecutor;

/** Options of a {@link RolloutService}. */
export interface RolloutServiceOptions {
  config: AppConfig;
  store: TransferQueue;
  executorFor: ExecutorFactory;
  /** Batches kept in memory for progress queries (oldest finished ones are dropped first). */
  maxBatches?: number;
  onRecord?: (r: TrajectoryRecord) => void;
}

/**
 * Accepts batches, runs them in the background and answers progress queries.
 * Only the `rollout` section can be overridden per batch; engine, tools and
 * store are the server's.
 */
export class RolloutService {
  readonly config: AppConfig;
  readonly store: TransferQueue;
  private readonly opts: RolloutServiceOptions;
  private readonly batches = new Map<string, BatchRun>();

  constructor(opts: RolloutServiceOptions) {
    this.opts = opts;
    this.config = opts.config;
    this.store = opts.store;
  }

  /**
   * Plans and starts a batch; resolves once it is accepted (not finished).
   * @throws ConfigError (400) when `config` overrides anything but `rollout`, or an invalid value.
   */
  submit(req: RolloutRequest): { batch_id: string; keys: string[]; run: BatchRun } {
    if (req.config) {
      const extra = Object.keys(req.config).filter((k) => k !== "rollout");
      if (extra.length) throw new ConfigError(extra[0]!, "only the rollout section can be set per batch");
    }
    const cfg = req.config ? parseAppConfig(mergeConfig(this.config, req.config), "request config") : this.config;
    const plan = planBatch(req, cfg.rollout);
    const executor = this.opts.executorFor(cfg.rollout, { model_version: req.model_version, validate: req.validate });
    const run = new BatchRun(plan, {
      executor,
      store: this.store,
      rollout: cfg.rollout,
      concurrency: cfg.concurrency,
      onRecord: this.opts.onRecord,
    });
    this.remember(plan.batch_id, run);
    void run.run().catch(() => {});
    return { batch_id: plan.batch_id, keys: plan.trajectories.map((t) => t.key), run };
  }

  /** @throws NotFoundError (404) for an unknown batch id. */
  batch(id: string): BatchRun {
    const b = this.batches.get(id);
    if (!b) throw new NotFoundError(`no batch '${id.slice(0, 100)}'`, { field: "batch_id" });
    return b;
  }

  /** Ids of the batches kept in memory, oldest first. */
  batchIds(): string[] {
    return [...this.batches.keys()];
  }

  private remember(id: string, run: BatchRun): void {
    this.batches.set(id, run);
    const max = this.opts.maxBatches ?? 1000;
    for (const [k, b] of this.batches) {
      if (this.batches.size <= max) break;
      if (b.stats().done) this.batches.delete(k);
    }
  }
}
