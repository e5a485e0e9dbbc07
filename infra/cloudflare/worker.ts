/**
 * The Cloudflare Workers entry (workerd): the rollouts function for a batch
 * of rows, each trajectory handed to its own Durable Object
 * ({@link TrajectorySessionObject}, `idFromName(key)`), the transfer queue
 * over Upstash REST, engine and tools over fetch. Local run: `npx wrangler dev`.
 * - `POST /v1/rollouts` `{rows, config?, global_steps?, model_version?, validate?}` → `202 {batch_id, keys}`
 * - `GET /v1/groups/{uid}` → the group's progress in the queue
 * - `POST /v1/sessions/{key}/tool-results`, `GET /v1/sessions/{key}` → forwarded to the key's object
 * - `POST /v1/sessions/{key}/openai/v1/chat/completions`, `GET …/openai/v1/models`,
 *   `POST /v1/sessions/{key}/anthropic/v1/messages`,
 *   `POST /v1/sessions/{key}/finish` (agent gateway; bearer = the session token) → forwarded to the key's object
 * - `GET /health` (503 naming the Upstash store while it is unreachable)
 *
 * `/v1/rollouts` and `/v1/groups/*` need `Authorization: Bearer <EDGELOOP_API_TOKEN>`;
 * without that secret they are refused (403 `auth_not_configured`) unless
 * `EDGELOOP_ALLOW_ANONYMOUS=1` is set. The auth state is logged on an isolate's first request,
 * and so (once, `console.warn`) are agent tasks sent unsigned (S20).
 */
import { flushSpans, workerTelemetry } from "./telemetry.ts";
import { Hono } from "hono";
import { allowAnonymous, apiAuth, readJson, runtimeAuthLine } from "../../functions/http-util.ts";
import { errorResponse } from "../../functions/rollouts.ts";
import { mergeConfig, parseAppConfig } from "../../shared/config/app-config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { parseRolloutRequest, planBatch } from "../../shared/rollout/batch.ts";
import { checkPlanGroups, withFingerprints } from "../../shared/rollout/group-fingerprint.ts";
import { samplingParamsFor } from "../../shared/rollout/executor.ts";
import type { SessionInputArg } from "../../shared/session/checkpoint.ts";
import type { ExecutionContext } from "./cf-types.ts";
import { refuseRolloutOnWorkers, workerRuntime, workerStartWarnings, type Env } from "./env.ts";
import { healthResponse, storeHealthProbe } from "../../shared/store/store-health.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";

export { TrajectorySessionObject } from "./session-object.ts";
export { registerWorkerAgentLoop } from "./env.ts";

const app = new Hono<{ Bindings: Env }>();
app.onError((err, c) => errorResponse(err, c));
// 503 naming the Upstash store while it is unreachable (one PING, no SDK retries).
app.get("/health", async (c) => {
  const { UPSTASH_REDIS_REST_URL: url, UPSTASH_REDIS_REST_TOKEN: token } = c.env;
  if (!url || !token) return c.json({ ok: true, runtime: "workerd" });
  return healthResponse(await storeHealthProbe(url, new UpstashCommander({ url, token, retries: 0 }))(), { runtime: "workerd" });
});

// Callbacks authenticate by signature inside the object, so they are routed before the bearer check.
app.all("/v1/sessions/:key/*", (c) => c.env.SESSIONS.get(c.env.SESSIONS.idFromName(c.req.param("key"))).fetch(c.req.raw));
app.get("/v1/sessions/:key", (c) => c.env.SESSIONS.get(c.env.SESSIONS.idFromName(c.req.param("key"))).fetch(c.req.raw));
// Fails closed: without EDGELOOP_API_TOKEN the API is refused unless EDGELOOP_ALLOW_ANONYMOUS=1 says otherwise.
app.use("/v1/*", async (c, next) => apiAuth(c.env.EDGELOOP_API_TOKEN || null, allowAnonymous(c.env.EDGELOOP_ALLOW_ANONYMOUS), "Worker")(c, next));

app.post("/v1/rollouts", async (c) => {
  const rt = await workerRuntime(c.env);
  const req = parseRolloutRequest(await readJson(c, 32 * 1024 * 1024));
  if (req.config && Object.keys(req.config).some((k) => k !== "rollout")) throw new ConfigError("config", "only the rollout section can be set per batch");
  const cfg = req.config ? parseAppConfig(mergeConfig(rt.config, req.config), "request config") : rt.config;
  refuseRolloutOnWorkers(cfg.rollout, "request config");
  if (req.target_groups !== undefined) throw new ConfigError("target_groups", "over-sampling runs in edgeloop serve and its workers, not on the Worker");
  const plan = await withFingerprints(planBatch(req, cfg.rollout, cfg.max_batch_trajectories, cfg.limits.max_prompt_chars));
  const mode = plan.validate ? "val" : "train";
  // Every group is checked before any is registered: a 409 (another n, partition or prompt under a known uid) writes nothing.
  await checkPlanGroups(rt.queue, plan);
  for (const [uid, n] of plan.groups) await rt.queue.expectGroup(uid, n, mode, plan.fingerprints?.get(uid));
  const start = async (i: number) => {
    const t = plan.trajectories[i]!;
    if (t.row_error || !t.row) {
      await rt.queue.markFailed(t.key, t.row_error ?? "invalid row", { data_source: "unknown", extra_fields: { trajectory_info: t.trajectory_info }, model: rt.model });
      return;
    }
    let agentName: string;
    try {
      agentName = rt.deps.registry.resolve(t.row.agent_name, cfg.rollout.agent.default_agent_loop);
    } catch (e) {
      await rt.queue.markFailed(t.key, `${(e as Error).name}: ${(e as Error).message}`, { data_source: t.row.data_source, extra_fields: { trajectory_info: t.trajectory_info }, model: rt.model });
      return;
    }
    const input: SessionInputArg = {
      key: t.key,
      agent_name: agentName,
      sampling_params: samplingParamsFor(cfg.rollout, plan.validate, t),
      kwargs: { ...t.row, uid: t.uid, session_id: t.session_id, global_steps: plan.global_steps, key: t.key, trajectory_info: t.trajectory_info },
      rollout: cfg.rollout,
      model_version: plan.model_version,
      model: rt.model,
    };
    let failure: string | null = null;
    try {
      const res = await c.env.SESSIONS.get(c.env.SESSIONS.idFromName(t.key)).fetch("https://session/start", { method: "POST", body: JSON.stringify(input) });
      if (res.status !== 202) failure = `session did not start: HTTP ${res.status} ${(await res.text()).slice(0, 300)}`;
    } catch (e) {
      failure = `session did not start: ${(e as Error).message ?? String(e)}`;
    }
    // Its group is registered: a session that cannot start fails its trajectory, so the group still completes.
    if (failure) await rt.queue.markFailed(t.key, failure, { agent_name: agentName, data_source: t.row.data_source, extra_fields: { trajectory_info: t.trajectory_info }, model: rt.model });
  };
  // At most 6 simultaneous subrequests per invocation.
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(6, plan.trajectories.length) }, async () => {
      for (let i = next++; i < plan.trajectories.length; i = next++) await start(i);
    }),
  );
  return c.json({ batch_id: plan.batch_id, keys: plan.trajectories.map((t) => t.key) }, 202);
});

app.get("/v1/groups/:uid", async (c) => {
  const rt = await workerRuntime(c.env);
  return c.json(await rt.queue.groupStatus(c.req.param("uid")));
});

/** The routes this entry serves (named in its 404s: `edgeloop serve` serves more, see the README). */
export const WORKER_ROUTES = [
  "GET /health",
  "POST /v1/rollouts",
  "GET /v1/groups/{uid}",
  "GET /v1/sessions/{key}",
  "POST /v1/sessions/{key}/tool-results",
  "POST /v1/sessions/{key}/openai/v1/chat/completions",
  "GET /v1/sessions/{key}/openai/v1/models",
  "POST /v1/sessions/{key}/anthropic/v1/messages",
  "POST /v1/sessions/{key}/finish",
] as const;

// workerd answers an unmatched route with Hono's plain-text "404 Not Found": the API's JSON envelope instead.
app.notFound((c) =>
  c.json(
    {
      error: {
        code: "not_found",
        message: `no route ${c.req.method} ${c.req.path.slice(0, 200)} on the Workers entry; it serves ${WORKER_ROUTES.join(", ")} (batch progress, trajectories, groups to consume, /metrics and the viewer are served by edgeloop serve)`,
      },
    },
    404,
  ),
);

/** The auth state last logged by this isolate (a Worker has no start: it is said on the first request, and again if it changes). */
let loggedAuth: string | null = null;
/**
 * The bindings whose start warnings ({@link workerStartWarnings}) this isolate
 * printed, and those warnings: printed on its first request (workerd passes
 * the same `env` to every request of an isolate), again only if they change.
 */
let warnedFor: { env: Env; warnings: string } | null = null;

export default {
  async fetch(req: Request, env: Env, ctx: ExecutionContext): Promise<Response> {
    const line = runtimeAuthLine(env.EDGELOOP_API_TOKEN || null, allowAnonymous(env.EDGELOOP_ALLOW_ANONYMOUS));
    if (line !== loggedAuth) {
      loggedAuth = line;
      console.log(`edgeloop (workerd) ${line}`);
    }
    if (warnedFor?.env !== env) {
      const warnings = workerStartWarnings(env).join("\n");
      if (warnings !== "" && warnings !== warnedFor?.warnings) for (const w of warnings.split("\n")) console.warn(`edgeloop (workerd) ${w}`);
      warnedFor = { env, warnings };
    }
    const telemetry = workerTelemetry(env);
    const res = await app.fetch(req, env, ctx as never);
    // Spans of this request (and of work it left to waitUntil by then) leave after the response.
    if (telemetry) ctx.waitUntil(flushSpans(telemetry));
    return res;
  },
};
