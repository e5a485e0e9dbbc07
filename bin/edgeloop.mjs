#!/usr/bin/env node
// Launcher for `npx edgeloop …`: runs the CLI on the Bun binary that `npm install` put in node_modules
// (the npm package `bun`), so a machine with only Node and npm needs nothing else.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { constants } from "node:os";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(import.meta.url);
let bun = process.versions.bun ? process.execPath : null;
if (!bun) {
  try {
    bun = join(dirname(require.resolve("bun/package.json")), "bin", process.platform === "win32" ? "bun.exe" : "bun.exe");
  } catch {
    bun = "bun";
  }
  if (bun !== "bun" && !existsSync(bun)) bun = "bun";
}
// Bun caps simultaneous outgoing fetches at 256 by default; thousands of concurrent trajectories
// waiting on tools would queue behind that cap and time out while never sent (bench/e2e.ts).
// EDGELOOP_LAUNCHER_PID: the CLI exits when this launcher dies, even by SIGKILL, which cannot be
// forwarded (infra/cli/launcher-watch.ts).
const env = { BUN_CONFIG_MAX_HTTP_REQUESTS: "4096", ...process.env, EDGELOOP_LAUNCHER_PID: String(process.pid) };
const child = spawn(bun, [join(root, "infra", "cli", "main.ts"), ...process.argv.slice(2)], { stdio: "inherit", env });
// Forward signals so that Ctrl-C or a kill of this launcher reaches the CLI (which then flushes and
// prints its partial summary), and exit with the CLI's own status once it is gone.
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"]) process.on(sig, () => child.kill(sig));
// Under `npx`/`npm exec` (npm_command=exec) npm starts this launcher through `sh -c` and forwards a
// signal only to that shell, which dies without passing it on: `npx edgeloop serve & kill $!` left the
// launcher and the CLI running. So follow npm's lifetime: once the process that started this launcher
// is gone (re-parented), stop the CLI as if it had been sent SIGTERM. Run directly, nothing changes.
if (process.env.npm_command === "exec") {
  const parent = process.ppid;
  const watch = setInterval(() => {
    if (process.ppid === parent) return;
    clearInterval(watch);
    child.kill("SIGTERM");
  }, 500);
  watch.unref();
}
child.on("error", (e) => {
  console.error(`edgeloop: cannot start bun (${e.message}); run npm install first`);
  process.exit(127);
});
child.on("exit", (code, signal) => process.exit(code ?? (signal ? 128 + (constants.signals[signal] ?? 1) : 0)));
