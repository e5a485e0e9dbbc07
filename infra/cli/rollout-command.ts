import { ADMISSION_LAG_SAMPLES } from "../../shared/rollout/session-admission.ts";
import { processLoopLag } from "../../shared/telemetry/loop-lag.ts";
import { accessSync, constants, createWriteStream, statSync, type WriteStream } from "node:fs";
import { dirname, resolve } from "node:path";
import { parseRolloutRequest } from "../../shared/rollout/batch.ts";
import { InputError } from "../../shared/errors.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { readDataFile, type BadDataLine } from "./files.ts";
import type { ConfigFlags } from "./flags.ts";
import { buildRuntime, type Runtime } from "./runtime.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { startAgentServer } from "../agent-example/server.ts";
import { formatSummary } from "./summary.ts";
import { RolloutProgress, stallHintFor } from "./progress.ts";
import { sessionWaits } from "../../shared/telemetry/waits.ts";
import { listen } from "./listen.ts";

/** Flags of `edgeloop rollout`. */
export interface RolloutFlags extends ConfigFlags {
  data: string;
  out?: string;
  validate?: boolean;
  globalSteps?: number;
  modelVersion?: string;
  progress?: boolean;
  /** `queue`: enqueue the batch for `edgeloop worker`s (Redis/Upstash store) and wait for them; default `inline` (run here). */
  jobs?: "inline" | "queue";
  /** Seconds without a finished session before a stall warning (default 60; 0: never). */
  stallWarn?: number;
}

/** At most this many warnings about `.jsonl` lines that are not JSON; the rest are counted. */
const MAX_LINE_WARNINGS = 10;

/** The start-up warnings about `.jsonl` lines that are not JSON: one a line (at most 10), then a count. */
export function badLineWarnings(file: string, bad: readonly BadDataLine[]): string[] {
  const lines = bad.slice(0, MAX_LINE_WARNINGS).map((b) => `warning    line ${b.line} of ${file} is not valid JSON: ${b.error}; that row (rows[${b.row}]) fails`);
  if (bad.length > MAX_LINE_WARNINGS) lines.push(`warning    ${bad.length - MAX_LINE_WARNINGS} more lines of ${file} are not valid JSON (${bad.length} in all); their rows fail`);
  return lines;
}

/**
 * `edgeloop rollout --data FILE …`: runs every row `n` times through its
 * agent loop, writes each TrajectoryRecord to the store and to `--out`
 * (JSONL, in completion order), shows progress, and ends with a summary.
 * Sets exit code 0 when at least one trajectory succeeded (failed rows are
 * data, not a crash) and 1 when none did. SIGINT/SIGTERM stop the run: the
 * records finished so far stay written, a partial summary is printed, and
 * the process exits 130.
 */
export async function rolloutCommand(flags: RolloutFlags): Promise<void> {
  const log = (s: string) => process.stderr.write(s + "\n");
  if (flags.out !== undefined) checkOutPath(flags.out, flags.data);
  const { rows, badLines } = await readDataFile(flags.data);
  // --agent: every row runs through openai_agent; `example` starts the example agent here.
  const agentServer = flags.agent === "example" ? startAgentServer({ port: 0, secret: flags.agentSecret ?? null }) : null;
  if (flags.agent) for (const r of rows) if (r && typeof r === "object" && !Array.isArray(r)) (r as Record<string, unknown>).agent_name = "openai_agent";
  let runtime;
  try {
    runtime = await buildRuntime(agentServer ? { ...flags, agent: `${agentServer.url}/tasks` } : flags, { jobs: flags.jobs ?? "inline" });
  } catch (e) {
    await agentServer?.stop();
    throw e;
  }
  // The agents' OpenAI endpoint, on a loopback port, when tasks can go out.
  const gatewayServer = runtime.config.agent.url ? serveAgentGateway(runtime) : null;
  if (agentServer) log(`agent      example agent (openai SDK) on ${agentServer.url}/tasks`);
  if (gatewayServer) log(`agent      OpenAI endpoint on http://127.0.0.1:${gatewayServer.port}/v1/sessions/{key}/openai/v1`);
  for (const line of runtime.describe) log(line);
  for (const line of [...badLineWarnings(flags.data, badLines), ...runtime.warnings]) log(line);
  let out: WriteStream | null = null;
  let interrupted: string | null = null;
  let onSignal: ((sig: string) => void) | null = null;
  try {
    const req = parseRolloutRequest({ rows, global_steps: flags.globalSteps, model_version: flags.modelVersion ?? null, validate: flags.validate ?? false }, "--data");
    out = flags.out ? createWriteStream(flags.out) : null;
    const t0 = performance.now();
    // accept, not submit: known uids are checked first (another n or prompt is refused before anything is written) and their finished sessions handed back.
    const { run, keys } = await runtime.service.accept(req);
    const n = req.validate ? runtime.config.rollout.val_kwargs.n : runtime.config.rollout.n;
    log(`batch      ${run.plan.batch_id}: ${rows.length} rows x n=${n} -> ${keys.length} trajectories`);
    // verl's validation samples with val_kwargs (n included): say so when --n asked for another n.
    if (req.validate && flags.n !== undefined && flags.n !== n) {
      log(`note       --validate samples rollout.val_kwargs.n = ${n} per row (verl's val_kwargs); --n ${flags.n} is the training n (set rollout.val_kwargs.n in --config to change it)`);
    }

    const stop = new Promise<"interrupted">((resolve) => {
      onSignal = (sig: string) => {
        if (interrupted) {
          // A second signal: stop waiting for the cleanup.
          process.exit(130);
        }
        interrupted = sig;
        resolve("interrupted");
      };
      process.on("SIGINT", onSignal);
      process.on("SIGTERM", onSignal);
    });

    const queued = runtime.service.jobs !== null;
    const progress = new RolloutProgress({
      total: keys.length,
      tty: flags.progress !== false && Boolean(process.stderr.isTTY),
      log,
      stallWarnS: flags.stallWarn ?? 60,
      // What the running sessions wait on at the warning (engine, a tool by name, the agent, the reward): N5.
      stallHint: queued
        ? `its jobs wait in ${runtime.service.jobs!.stream} for workers: is an \`edgeloop worker\` running with the same --store?`
        : () => {
            const a = runtime.service.admission;
            const held = { count: a.held, reason: a.holdReason(), lagMs: processLoopLag.recentMaxMs(ADMISSION_LAG_SAMPLES), maxLagMs: runtime.config.limits.max_event_loop_lag_ms, concurrency: runtime.config.concurrency };
            return stallHintFor(sessionWaits.snapshot(), runtime.config, "no engine, tool, agent or reward call is open: the running sessions are between calls (held by the admission gate or a pause?)", held);
          },
    });
    const ticker = setInterval(() => {
      const s = run.stats();
      // Sessions finishing count even when they stream no record (a loop may emit none).
      if (written >= s.counts.records) progress.update({ finished: s.counts.finished, records: written, failed: s.counts.failed, running: s.counts.running });
      progress.tick();
    }, 1000);
    let written = 0;
    const records = run.stream()[Symbol.asyncIterator]();
    try {
      for (;;) {
        const next: IteratorResult<TrajectoryRecord> | "interrupted" = await Promise.race([records.next(), stop]);
        if (next === "interrupted" || next.done) break;
        written++;
        if (out && !out.write(JSON.stringify(next.value) + "\n")) await new Promise((r) => out!.once("drain", r));
        // A session emits 0…k records: progress counts finished sessions, records apart. The run counts a
        // session before its records reach this stream, so the counts wait until the stream has caught up.
        const s = run.stats();
        if (written >= s.counts.records) progress.update({ finished: s.counts.finished, records: written, failed: s.counts.failed, running: s.counts.running });
      }
    } finally {
      clearInterval(ticker);
      progress.stop();
    }
    if (!interrupted) await run.run();
    else {
      // Interrupted: what still runs is cancelled (its sandbox leases released as `cancelled`, its engine and tool
      // calls aborted) and given a few seconds to settle before the runtime closes under it.
      run.cancel();
      let settleTimer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([run.run().catch(() => undefined), new Promise<void>((r) => (settleTimer = setTimeout(r, 10_000)))]);
      clearTimeout(settleTimer);
    }
    const wall = (performance.now() - t0) / 1000;
    if (out) await new Promise<void>((r, j) => out!.end((e?: Error | null) => (e ? j(e) : r())));
    const stats = run.stats();
    if (interrupted) {
      // Only what was streamed counts (a record stored after the signal is not in --out).
      process.stdout.write(formatSummary(stats, wall) + "\n");
      log(`interrupted: ${written} of ${keys.length} records written to ${flags.out ?? "the store (no --out given)"} (${interrupted})`);
      process.exitCode = 130;
      return;
    }
    process.stdout.write(formatSummary(stats, wall) + "\n");
    if (flags.out) log(`wrote ${written} records to ${flags.out}`);
    if (stats.lost) {
      // The records are in --out, but the trainer's queue will not deliver these groups: not a success.
      log(`edgeloop: the store lost data while the batch ran and ${stats.lost.missing.length} groups could not be completed again (${stats.lost.missing.slice(0, 5).join(", ")}${stats.lost.missing.length > 5 ? ", …" : ""}); their records are in ${flags.out ?? "no file (no --out given)"}`);
      process.exitCode = 3;
    } else if (stats.counts.total > 0 && stats.counts.ok === 0 && stats.counts.failed > 0) {
      log(`edgeloop: no trajectory succeeded (${stats.counts.failed} of ${stats.counts.total} failed); see the errors above`);
      process.exitCode = 1;
    }
  } finally {
    if (onSignal) {
      process.off("SIGINT", onSignal);
      process.off("SIGTERM", onSignal);
    }
    gatewayServer?.stop(true);
    await agentServer?.stop();
    await runtime.close();
  }
}

/**
 * Checks `--out` before any work starts: its folder must exist and be
 * writable, and the path must not be a folder itself (an existing file is
 * replaced) nor the `--data` file (`data`). Without this a batch ran to the end and then failed on a bare
 * ENOENT.
 * @throws InputError naming `--out`.
 */
export function checkOutPath(out: string, data?: string): void {
  const path = resolve(out);
  const dir = dirname(path);
  let st: ReturnType<typeof statSync> | undefined;
  try {
    st = statSync(dir);
  } catch {
    throw new InputError("--out", `the folder ${dir} does not exist (create it first, or write elsewhere)`);
  }
  if (!st.isDirectory()) throw new InputError("--out", `${dir} is not a folder`);
  try {
    accessSync(dir, constants.W_OK);
  } catch {
    throw new InputError("--out", `the folder ${dir} is not writable`);
  }
  let target: ReturnType<typeof statSync> | undefined;
  try {
    target = statSync(path);
  } catch {
    return;
  }
  if (target.isDirectory()) throw new InputError("--out", `${path} is a folder; name a file (e.g. ${path}/rollouts.jsonl)`);
  // The same file as --data (by device and inode, so links and relative spellings count): writing would destroy the dataset.
  if (data !== undefined) {
    let src: ReturnType<typeof statSync> | undefined;
    try {
      src = statSync(resolve(data));
    } catch {
      src = undefined;
    }
    if (src && src.dev === target.dev && src.ino === target.ino) throw new InputError("--out", `${path} is the --data file; the records would overwrite the dataset (write elsewhere)`);
  }
  try {
    accessSync(path, constants.W_OK);
  } catch {
    throw new InputError("--out", `${path} exists and is not writable`);
  }
}

/** The agent gateway's function on a free loopback port; the runtime's public URL becomes its address. */
function serveAgentGateway(runtime: Runtime): { port: number; stop(force?: boolean): void } {
  const app = createAgentGatewayApp({ gateway: runtime.agentGateway });
  const server = listen({ port: 0, hostname: "127.0.0.1", fetch: app.fetch });
  runtime.setPublicUrl(`http://127.0.0.1:${server.port}`);
  return { port: server.port!, stop: (f) => void server.stop(f) };
}
