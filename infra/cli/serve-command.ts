import { createRolloutsApp } from "../../functions/rollouts.ts";
import type { ConfigFlags } from "./flags.ts";
import { buildRuntime } from "./runtime.ts";
import { untilSignal } from "./engine-commands.ts";

/**
 * `edgeloop serve --port P …`: the HTTP API on one port (rollouts, groups,
 * openapi). Bearer auth when `EDGELOOP_API_TOKEN` is set.
 */
export async function serveCommand(flags: ConfigFlags & { port: number; host: string }): Promise<void> {
  const runtime = await buildRuntime(flags);
  const app = createRolloutsApp({ service: runtime.service, apiToken: process.env.EDGELOOP_API_TOKEN || null });
  const server = Bun.serve({ port: flags.port, hostname: flags.host, fetch: app.fetch, idleTimeout: 0 });
  for (const line of runtime.describe) console.error(line);
  console.error(`auth       ${process.env.EDGELOOP_API_TOKEN ? "bearer token required" : "none (set EDGELOOP_API_TOKEN to require one)"}`);
  console.log(`edgeloop serving on http://${flags.host}:${server.port} (POST /v1/rollouts, GET /openapi.json)`);
  await untilSignal();
  server.stop(true);
  await runtime.close();
}
