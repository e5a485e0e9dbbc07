import { listen } from "../cli/listen.ts";
import { createSandboxProviderApp, type SandboxProviderAppOptions } from "./app.ts";
import type { SandboxProviderStats } from "./sandboxes.ts";

/** A running example sandbox provider. */
export interface SandboxProvider {
  /**
   * Base URL, e.g. `http://127.0.0.1:41234`: the contract at
   * `${url}/sandboxes/create`, `/sandboxes/release`, `/sandboxes/heartbeat`,
   * the sandbox tools at `${url}/tools/sbx_write` and `/tools/sbx_read`.
   */
  url: string;
  port: number;
  /** Exact counts of what the provider did so far (the same object `GET /stats` answers). */
  stats(): SandboxProviderStats;
  /** Stops the lifetime timers, ends held create replies and closes the listener. */
  stop(): Promise<void>;
}

/**
 * Starts the example sandbox provider ({@link createSandboxProviderApp}) with
 * `Bun.serve` on `hostname` (default 127.0.0.1); `port: 0` (the default) picks
 * a free port. `faults` inject delays, hung create replies and failing
 * releases for chaos runs (`SandboxFaults`, infra/sandbox/sandboxes.ts).
 * @throws ConfigError naming a `faults` field that is out of range or unknown.
 */
export function startSandboxProvider(opts: SandboxProviderAppOptions & { port?: number; hostname?: string } = {}): SandboxProvider {
  const hostname = opts.hostname ?? "127.0.0.1";
  const { app, pool } = createSandboxProviderApp(opts);
  const server = listen({ port: opts.port ?? 0, hostname, fetch: app.fetch });
  const port = server.port!;
  return {
    url: `http://${hostname}:${port}`,
    port,
    stats: () => pool.stats(),
    stop: async () => {
      pool.close();
      await server.stop(true);
    },
  };
}
