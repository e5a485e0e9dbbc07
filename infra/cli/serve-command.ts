import { Hono } from "hono";
import { InputError } from "../../shared/errors.ts";
import { createRolloutsApp, errorResponse } from "../../functions/rollouts.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { refuseExampleAgent, type ConfigFlags } from "./flags.ts";
import { buildRuntime } from "./runtime.ts";
import { unsignedToolsWarning } from "./builders/warnings.ts";
import { loadTokenizer } from "../node/model-dir.ts";
import { untilSignal } from "./engine-commands.ts";
import { listen } from "./listen.ts";
import { secretFromEnv } from "./secrets.ts";
import { isLoopbackName, loopbackGuard } from "../../functions/http-util.ts";

/** The host name of `agent.public_url`, which agents and tool servers send as `Host` (none when unset). */
function publicHosts(publicUrl: string | null | undefined): string[] {
  if (!publicUrl) return [];
  try {
    return [new URL(publicUrl).hostname.replace(/^\[|\]$/g, "")];
  } catch {
    return [];
  }
}

/**
 * How a token-less `serve` announces itself (stderr), one line per case:
 * loopback-only (the default) or exposed on purpose (`--insecure-no-auth`).
 */
export function authLine(token: string | null, host: string, insecure: boolean): string {
  if (token) return "auth       bearer token required on /v1/* (EDGELOOP_API_TOKEN)";
  if (insecure) return `auth       NONE on ${host} (--insecure-no-auth): anyone who reaches this address can submit batches, read trajectories and pause engines`;
  return "auth       NONE: no EDGELOOP_API_TOKEN, so this server is for this machine only: bound to loopback, Host and Origin must be 127.0.0.1, localhost or [::1] (set EDGELOOP_API_TOKEN to serve others)";
}

/**
 * Said at start by a `serve` on the memory store (S23): it never frees what
 * it holds, so a long-running server grows with every batch.
 */
export const MEMORY_STORE_WARNING =
  "warning    memory store: every batch, record and group stays in this process's memory until it exits (nothing is freed); for a long-running serve use --store redis://… and `edgeloop gc`";

/**
 * Whether a `--host` value binds loopback only (`127.0.0.0/8`, `::1`, `localhost`).
 * `0.0.0.0`, `::` and every other address do not.
 */
export function isLoopbackBind(host: string): boolean {
  return isLoopbackName(host);
}

/**
 * `edgeloop serve --port P …`: the HTTP API on one port (rollouts, groups,
 * trajectories, session callbacks, /metrics, /viewer, openapi). Bearer auth
 * on `/v1/*` when `EDGELOOP_API_TOKEN` (or `EDGELOOP_API_TOKEN_FILE`) is set.
 * Without a token the server is for loopback clients only: `--host` must be a
 * loopback address (else refused, unless `--insecure-no-auth`), and every
 * request's `Host`/`Origin` must be a loopback name (or the host of
 * `agent.public_url`): 403 `forbidden_host` otherwise, which stops DNS
 * rebinding. With a Redis or Upstash store
 * batches are enqueued for `edgeloop worker` processes (`--jobs inline` runs
 * them here instead). `--reuse-port` binds with SO_REUSEPORT so several
 * `serve`s on one Redis/Upstash store share the port (one killed or
 * restarted, the others answer, within the SDKs' retry budget).
 * On SIGINT/SIGTERM the listener closes and the work still running here
 * (inline batches, agent sessions waiting for their finish) gets
 * `--drain-timeout` seconds (default {@link DEFAULT_SERVE_DRAIN_S}) to end;
 * after that, or at a second signal, serve exits 1 naming what it left.
 * @throws InputError (field `--reuse-port`) with `--port 0` or the memory store
 * @throws InputError (field `--host`) for a non-loopback `--host` without a token or `--insecure-no-auth`
 */
export async function serveCommand(flags: ConfigFlags & { port: number; host: string; jobs?: "inline" | "queue"; maxPending?: number; lostGrace?: number; insecureNoAuth?: boolean; metricsAuth?: boolean; reusePort?: boolean; drainTimeout?: number }): Promise<void> {
  refuseExampleAgent(flags, "serve");
  if (flags.reusePort && flags.port === 0) throw new InputError("--reuse-port", "needs a fixed --port (with --port 0 each process gets a port of its own, so none shares one)");
  const apiToken = secretFromEnv("EDGELOOP_API_TOKEN");
  const insecure = flags.insecureNoAuth === true;
  if (!apiToken && !insecure && !isLoopbackBind(flags.host)) {
    throw new InputError(
      "--host",
      `${flags.host} is not a loopback address and no EDGELOOP_API_TOKEN is set: anyone reaching it could submit batches, read trajectories and pause engines. Set EDGELOOP_API_TOKEN (or EDGELOOP_API_TOKEN_FILE), or pass --insecure-no-auth to serve without auth anyway`,
    );
  }
  if (flags.metricsAuth && !apiToken) throw new InputError("--metrics-auth", "puts /metrics behind EDGELOOP_API_TOKEN, which is not set");
  if (apiToken && insecure) throw new InputError("--insecure-no-auth", "EDGELOOP_API_TOKEN is set: the API requires it, so --insecure-no-auth would not apply");
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
    apiToken,
    metricsAuth: flags.metricsAuth === true,
    tokenizer: () => loadTokenizer(runtime.config.model ?? undefined),
    engine: runtime.engine,
    ...(runtime.leaseMetrics ? { extraMetrics: () => runtime.leaseMetrics!(true) } : {}),
    ...(runtime.leases ? { sandboxes: () => runtime.leases!.snapshot() } : {}),
  });
  // The agent gateway's routes (session-scoped OpenAI endpoint, finish) come first: they
  // authenticate by the session's own bearer token, not by the API's.
  let app: Hono = new Hono();
  // Token-less and loopback-bound: refuse every request addressed to another name (DNS rebinding).
  // The DNS-rebinding guard stays on for every token-less loopback bind, --insecure-no-auth or not: the flag
  // opens a non-loopback address on purpose, and there clients name that address in Host.
  if (!apiToken && (!insecure || isLoopbackBind(flags.host))) app.use("*", loopbackGuard(publicHosts(runtime.config.agent.public_url)));
  app.route("/", createAgentGatewayApp({ gateway: runtime.agentGateway }));
  if (!runtime.callbacks) app.route("/", rollouts);
  else {
    // Tool callbacks of durable sessions (POST /v1/sessions/{key}/tool-results) are mounted first:
    // they authenticate by webhook signature, not by the API's bearer token. In queue mode they
    // only commit the result and wake the worker running the session.
    app.route("/", createSessionsApp({ backend: runtime.callbacks, secret: runtime.config.tools.secret ?? null, apiToken }));
    app.route("/", rollouts);
  }
  app.notFound((c) => c.json({ error: { code: "not_found", message: `no route ${c.req.method} ${c.req.path}` } }, 404));
  app.onError((err, c) => errorResponse(err, c));
  // Processes sharing a port must share their state: the memory store lives in one process.
  if (flags.reusePort && runtime.config.store.url === "memory") {
    await runtime.close();
    throw new InputError("--reuse-port", "the memory store lives in this process, so a second serve on the port would answer from another state: use --store redis://… (or an Upstash URL) in queue mode");
  }
  const server = listen({ port: flags.port, hostname: flags.host, fetch: app.fetch, reusePort: flags.reusePort === true });
  runtime.setPublicUrl(`http://${flags.host === "0.0.0.0" || flags.host === "::" ? "127.0.0.1" : flags.host}:${server.port}`);
  for (const line of runtime.describe) console.error(line);
  for (const line of runtime.warnings) console.error(line);
  const unsigned = unsignedToolsWarning(runtime.config, runtime.signedToolCalls);
  if (unsigned) console.error(unsigned);
  console.error(authLine(apiToken, flags.host, insecure));
  if (runtime.config.store.url === "memory") console.error(MEMORY_STORE_WARNING);
  console.log(`edgeloop serving on http://${flags.host}:${server.port} (POST /v1/rollouts, GET /viewer, GET /metrics, GET /openapi.json)`);
  await untilSignal();
  // The listener stops at once; the trajectories running here (inline batches, agents' sessions waiting for their
  // finish) get --drain-timeout to end, and a second signal ends the wait: a stopped serve never hangs on work
  // that cannot finish.
  server.stop(true);
  const drainS = flags.drainTimeout ?? DEFAULT_SERVE_DRAIN_S;
  const running = () => runtime.service.batchIds().reduce((n, id) => {
    const st = runtime.service.batch(id).stats();
    return st.done ? n : n + Math.max(0, st.counts.total - st.counts.finished);
  }, 0);
  let stop = false;
  const timer = setTimeout(() => (stop = true), Math.round(drainS * 1000));
  void untilSignal().then(() => (stop = true));
  while (!stop && running() > 0) await new Promise((r) => setTimeout(r, 100));
  clearTimeout(timer);
  const left = running();
  runtime.service.close();
  await runtime.close();
  if (left > 0) {
    console.error(
      `serve      stopped with ${left} trajectories still running (--drain-timeout ${drainS} s, or a second signal): they are not recorded (inline batches live in this process; in queue mode workers run them and resume them from their checkpoints)`,
    );
    process.exit(1);
  }
}

/** Seconds a stopped `serve` waits for its running work before it exits anyway (`--drain-timeout`). */
export const DEFAULT_SERVE_DRAIN_S = 30;
