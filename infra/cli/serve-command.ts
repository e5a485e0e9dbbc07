import { Hono } from "hono";
import { InputError } from "../../shared/errors.ts";
import { createRolloutsApp, errorResponse } from "../../functions/rollouts.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { refuseExampleAgent, type ConfigFlags } from "./flags.ts";
import { buildRuntime, unsignedToolsWarning } from "./runtime.ts";
import { loadTokenizer } from "../node/model-dir.ts";
import { untilSignal } from "./engine-commands.ts";
import { listen } from "./listen.ts";

/**
 * `edgeloop serve --port P …`: the HTTP API on one port (rollouts, groups,
 * trajectories, session callbacks, /metrics, /viewer, openapi). Bearer auth
 * on `/v1/*` when `EDGELOOP_API_TOKEN` is set. With a Redis or Upstash store
 * batches are enqueued for `edgeloop worker` processes (`--jobs inline` runs
 * them here instead).
 */
export async function serveCommand(flags: ConfigFlags & { port: number; host: string; jobs?: "inline" | "queue"; maxPending?: number; lostGrace?: number }): Promise<void> {
  refuseExampleAgent(flags, "serve");
  const runtime = await buildRuntime(flags, {
    waitForStore: true,
    jobs: flags.jobs ?? "auto",
    ...(flags.maxPending !== undefined ? { jobQueue: { maxPending: flags.maxPending } } : {}),
    ...(flags.lostGrace !== undefined ? { lostGraceMs: Math.round(flags.lostGrace * 1000) } : {}),
  });
  // Queue-mode settings without a job queue (the memory store, or --jobs inline) would be ignored: refused.
  for (const [flag, set] of [["--max-pending", flags.maxPending !== undefined], ["--lost-grace", flags.lostGrace !== undefined]] as const) {
    if (set && !runtime.jobs) {
      await runtime.close();
      throw new InputError(flag, "applies to queue mode (a Redis or Upstash store, --jobs queue or auto); here batches run inside serve");
    }
  }
  const rollouts = createRolloutsApp({
    service: runtime.service,
    health: runtime.storeHealth,
    apiToken: process.env.EDGELOOP_API_TOKEN || null,
    tokenizer: () => loadTokenizer(runtime.config.model ?? undefined),
    engine: runtime.engine,
  });
  // The agent gateway's routes (session-scoped OpenAI endpoint, finish) come first: they
  // authenticate by the session's own bearer token, not by the API's.
  let app: Hono = new Hono();
  app.route("/", createAgentGatewayApp({ gateway: runtime.agentGateway }));
  if (!runtime.callbacks) app.route("/", rollouts);
  else {
    // Tool callbacks of durable sessions (POST /v1/sessions/{key}/tool-results) are mounted first:
    // they authenticate by webhook signature, not by the API's bearer token. In queue mode they
    // only commit the result and wake the worker running the session.
    app.route("/", createSessionsApp({ backend: runtime.callbacks, secret: runtime.config.tools.secret ?? null, apiToken: process.env.EDGELOOP_API_TOKEN || null }));
    app.route("/", rollouts);
  }
  app.notFound((c) => c.json({ error: { code: "not_found", message: `no route ${c.req.method} ${c.req.path}` } }, 404));
  app.onError((err, c) => errorResponse(err, c));
  const server = listen({ port: flags.port, hostname: flags.host, fetch: app.fetch });
  runtime.setPublicUrl(`http://${flags.host === "0.0.0.0" || flags.host === "::" ? "127.0.0.1" : flags.host}:${server.port}`);
  for (const line of runtime.describe) console.error(line);
  for (const line of runtime.warnings) console.error(line);
  const unsigned = unsignedToolsWarning(runtime.config);
  if (unsigned) console.error(unsigned);
  console.error(`auth       ${process.env.EDGELOOP_API_TOKEN ? "bearer token required" : "none (set EDGELOOP_API_TOKEN to require one)"}`);
  console.log(`edgeloop serving on http://${flags.host}:${server.port} (POST /v1/rollouts, GET /viewer, GET /metrics, GET /openapi.json)`);
  await untilSignal();
  server.stop(true);
  runtime.service.close();
  await runtime.close();
}
