/** Environment variable through which `bin/edgeloop.mjs` tells the CLI its own pid. */
export const LAUNCHER_PID_ENV = "EDGELOOP_LAUNCHER_PID";

/** Options of {@link watchLauncher}. */
export interface LauncherWatchOptions {
  /** Check period in ms (default 1000). */
  everyMs?: number;
  /** Grace after the stop signal before a forced exit, in ms (default 3000). */
  graceMs?: number;
  /** Prints the one line saying why the process stops (default: stderr). */
  log?: (line: string) => void;
}

/**
 * Makes the CLI leave when the launcher that started it dies: `bin/edgeloop.mjs`
 * (node) runs the CLI as a bun child and passes its pid in
 * `EDGELOOP_LAUNCHER_PID`; a `kill -9` of the launcher cannot forward a
 * signal, and the orphan (re-parented, `process.ppid` changes) would go on
 * claiming jobs. Checked every `everyMs` on an unref'd timer; once the parent
 * is no longer the launcher, one line is printed, the process sends itself
 * SIGTERM (so `worker` stops claiming, `serve` closes, `rollout` writes its
 * partial summary) and exits 1 after `graceMs` if it is still there.
 * No-op when the variable is unset (the CLI run directly).
 * @returns a function that stops watching
 */
export function watchLauncher(opts: LauncherWatchOptions = {}): () => void {
  const launcher = Number(process.env[LAUNCHER_PID_ENV]);
  // Processes this CLI starts are not the launcher's children: they must not inherit the watch.
  delete process.env[LAUNCHER_PID_ENV];
  if (!Number.isInteger(launcher) || launcher <= 1) return () => {};
  const log = opts.log ?? ((line) => process.stderr.write(`${line}\n`));
  const timer = setInterval(() => {
    if (process.ppid === launcher) return;
    clearInterval(timer);
    log(`edgeloop: the launcher (pid ${launcher}) is gone; stopping`);
    setTimeout(() => process.exit(1), opts.graceMs ?? 3_000);
    process.kill(process.pid, "SIGTERM");
  }, opts.everyMs ?? 1_000);
  timer.unref?.();
  return () => clearInterval(timer);
}
