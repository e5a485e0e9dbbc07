import { createWriteStream, type WriteStream } from "node:fs";
import { SingleBar, Presets } from "cli-progress";
import { RolloutRequest } from "../../shared/rollout/batch.ts";
import { inputErrorFromZod } from "../../shared/errors.ts";
import { readRows } from "./files.ts";
import type { ConfigFlags } from "./flags.ts";
import { buildRuntime } from "./runtime.ts";
import { formatSummary } from "./summary.ts";

/** Flags of `edgeloop rollout`. */
export interface RolloutFlags extends ConfigFlags {
  data: string;
  out?: string;
  validate?: boolean;
  globalSteps?: number;
  modelVersion?: string;
  progress?: boolean;
}

/**
 * `edgeloop rollout --data FILE …`: runs every row `n` times through its
 * agent loop, writes each TrajectoryRecord to the store and to `--out`
 * (JSONL, in completion order), shows progress, and ends with a summary.
 * Exits 0 when the batch ran (failed rows are counted, not fatal).
 */
export async function rolloutCommand(flags: RolloutFlags): Promise<void> {
  const rows = await readRows(flags.data);
  const runtime = await buildRuntime(flags);
  const log = (s: string) => process.stderr.write(s + "\n");
  for (const line of runtime.describe) log(line);
  let out: WriteStream | null = null;
  try {
    const req = RolloutRequest.safeParse({
      rows,
      global_steps: flags.globalSteps,
      model_version: flags.modelVersion ?? null,
      validate: flags.validate ?? false,
    });
    if (!req.success) throw inputErrorFromZod("--data", req.error.issues);
    out = flags.out ? createWriteStream(flags.out) : null;
    const t0 = performance.now();
    const { run, keys } = runtime.service.submit(req.data);
    log(`batch      ${run.plan.batch_id}: ${rows.length} rows x n -> ${keys.length} trajectories`);
    const tty = flags.progress !== false && process.stderr.isTTY;
    const bar = tty ? new SingleBar({ format: "rollout |{bar}| {value}/{total} trajectories | {failed} failed | {eta_formatted} left", stream: process.stderr }, Presets.shades_classic) : null;
    bar?.start(keys.length, 0, { failed: 0 });
    let n = 0;
    let lastLine = 0;
    for await (const rec of run.stream()) {
      n++;
      if (out && !out.write(JSON.stringify(rec) + "\n")) await new Promise((r) => out!.once("drain", r));
      const s = run.stats();
      if (bar) bar.update(n, { failed: s.counts.failed });
      else if (n === keys.length || performance.now() - lastLine > 1000) {
        lastLine = performance.now();
        log(`progress   ${n}/${keys.length} trajectories (${s.counts.failed} failed)`);
      }
    }
    bar?.stop();
    await run.run();
    const wall = (performance.now() - t0) / 1000;
    if (out) await new Promise<void>((r, j) => out!.end((e?: Error | null) => (e ? j(e) : r())));
    process.stdout.write(formatSummary(run.stats(), wall) + "\n");
    if (flags.out) log(`wrote ${n} records to ${flags.out}`);
  } finally {
    await runtime.close();
  }
}
