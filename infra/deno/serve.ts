/**
 * The Deno entry: `deno task serve` (deno.json) serves the same HTTP API as
 * `edgeloop serve` — rollouts, groups, and the durable sessions' tool
 * callbacks — with the runtime built by the CLI's `buildRuntime` (npm
 * packages from node_modules). Configuration from the environment:
 * `EDGELOOP_CONFIG` (config file), `EDGELOOP_ENGINE` (engine URL),
 * `EDGELOOP_TOOLS` (tools file), `EDGELOOP_TOOLS_SECRET`, `EDGELOOP_STORE`
 * (`upstash` with `UPSTASH_REDIS_REST_URL`/`_TOKEN`, or `redis://…`; a Redis
 * store runs trajectories as durable sessions), `EDGELOOP_STORE_PREFIX`,
 * `EDGELOOP_API_TOKEN`, `PORT` (default 8787; 0 picks one), `HOST`; the agent
 * gateway's `EDGELOOP_AGENT_URL` (openai_agent tasks; also makes openai_agent the
 * default loop), `EDGELOOP_AGENT_SECRET`, `EDGELOOP_AGENT_TIMEOUT_MS`,
 * `EDGELOOP_PUBLIC_URL` (the URL agents reach this server at; default the
 * address it listens on); `OTEL_EXPORTER_OTLP_ENDPOINT` (or
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), `OTEL_SERVICE_NAME`,
 * `OTEL_SDK_DISABLED`: spans over OTLP/HTTP as the CLI sends them.
 * Prints `edgeloop (deno) serving on http://host:port` once listening.
 */
import { Hono } from "hono";
import { createRolloutsApp, errorResponse } from "../../functions/rollouts.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { buildRuntime } from "../cli/runtime.ts";
import { healthResponse } from "../../shared/store/store-health.ts";
import { setupTelemetryFromEnv } from "../telemetry/setup.ts";
import { bodyTimeoutFromEnv, withBodyDeadline } from "../../functions/body-deadline.ts";

declare const Deno: {
  env: { get(name: string): string | undefined; toObject(): Record<string, string> };
  addSignalListener(signal: "SIGTERM" | "SIGINT", handler: () => void): void;
  exit(code: number): never;
  serve(opts: { port: number; hostname: string; onListen?: (a: { hostname: string; port: number }) => void }, handler: (req: Request) => Response | Promise<Response>): { finished: Promise<void> };
};

const env = (name: string) => Deno.env.get(name) || undefined;
// Spans over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set (as the CLI commands do); flushed on SIGTERM/SIGINT.
const telemetry = setupTelemetryFromEnv(Deno.env.toObject());
if (telemetry) {
  for (const signal of ["SIGTERM", "SIGINT"] as const) {
    Deno.addSignalListener(signal, () => void telemetry.shutdown().finally(() => Deno.exit(signal === "SIGINT" ? 130 : 143)));
  }
}
const runtime = await buildRuntime({
  config: env("EDGELOOP_CONFIG"),
  engine: env("EDGELOOP_ENGINE"),
  tools: env("EDGELOOP_TOOLS"),
  toolsSecret: env("EDGELOOP_TOOLS_SECRET"),
  store: env("EDGELOOP_STORE"),
  storePrefix: env("EDGELOOP_STORE_PREFIX"),
  agent: env("EDGELOOP_AGENT_URL"),
  agentSecret: env("EDGELOOP_AGENT_SECRET"),
  agentTimeoutMs: env("EDGELOOP_AGENT_TIMEOUT_MS") === undefined ? undefined : Number(env("EDGELOOP_AGENT_TIMEOUT_MS")),
  publicUrl: env("EDGELOOP_PUBLIC_URL"),
});
const apiToken = env("EDGELOOP_API_TOKEN") ?? null;
const app = new Hono();
// 503 naming the store while it is unreachable.
app.get("/health", async () => healthResponse(await runtime.storeHealth(), { runtime: "deno" }));
// The agent gateway authenticates by each session's own token: routed before the API's bearer check.
app.route("/", createAgentGatewayApp({ gateway: runtime.agentGateway }));
if (runtime.sessions) app.route("/", createSessionsApp({ backend: runtime.sessions, secret: runtime.config.tools.secret ?? null, apiToken }));
app.route("/", createRolloutsApp({ service: runtime.service, apiToken, engine: runtime.engine }));
app.notFound((c) => c.json({ error: { code: "not_found", message: `no route ${c.req.method} ${c.req.path}` } }, 404));
app.onError((err, c) => errorResponse(err, c));
for (const line of runtime.describe) console.error(line);
// The start-up warnings (unsigned agent tasks among them, S20), as serve prints them.
for (const line of runtime.warnings) console.error(line);
const server = Deno.serve(
  {
    port: Number(env("PORT") ?? 8787),
    hostname: env("HOST") ?? "127.0.0.1",
    onListen: (a) => {
      runtime.setPublicUrl(`http://${a.hostname === "0.0.0.0" ? "127.0.0.1" : a.hostname}:${a.port}`);
      console.log(`edgeloop (deno) serving on http://${a.hostname}:${a.port}`);
    },
  },
  // Deno.serve has no idle or header timeout: request bodies get a deadline here (S9; EDGELOOP_BODY_TIMEOUT_S).
  withBodyDeadline((req) => app.fetch(req), bodyTimeoutFromEnv(env("EDGELOOP_BODY_TIMEOUT_S"))),
);
await server.finished;
