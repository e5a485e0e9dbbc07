import { Hono, type Context } from "hono";
import { AuthError, ConflictError, EdgeloopError, inputErrorFromZod, NotFoundError, NotImplementedError } from "../shared/errors.ts";
import { parseRolloutRequest } from "../shared/rollout/batch.ts";
import { loopLagFamilies } from "../shared/rollout/session-admission.ts";
import { processLoopLag } from "../shared/telemetry/loop-lag.ts";
import type { BatchCancellation, BatchCounts } from "../shared/rollout/batch-run.ts";
import type { RolloutService } from "../shared/service/rollout-service.ts";
import { parseTrajectoryKey, TrajectoryRecord, Uid } from "../shared/schema/index.ts";
import { formatPrometheus, PROMETHEUS_CONTENT_TYPE, type PromFamily } from "../shared/telemetry/prometheus.ts";
import { queueFamilies, RolloutMetricsCollector } from "../shared/service/rollout-metrics.ts";
import { tokenPieces } from "../shared/telemetry/token-pieces.ts";
import { groupDivergence } from "../shared/rollout/group-divergence.ts";
import { pageSummaries } from "../shared/rollout/trajectory-summary.ts";
import { defaultTokenizer, type ChatTokenizer } from "../shared/tokens/tokenizer.ts";
import { decodeRefusal, modelIdOf } from "../shared/models/model-id.ts";
import { bearerAuth, limitBody, readJson, readOptionalJson } from "./http-util.ts";
import { healthResponse, type StoreHealth } from "../shared/store/store-health.ts";
import { STORE_UNREACHABLE, storeOutageOf } from "../shared/store/store-outage.ts";

export type { StoreHealth };
import { mountViewer } from "./viewer/viewer-app.ts";
import { EnginePauseRequest, type EngineControl } from "../shared/inference/engine-control.ts";
import { agentGatewayOpenApiPaths } from "./agent-gateway-openapi.ts";
import { processMetrics } from "../shared/telemetry/process-metrics.ts";
import { openApiDocument } from "./rollouts-openapi.ts";
import { AckRequest, ConsumedVersionRequest, EngineResumeRequest, ModelVersionRequest, queryOf, refuseUnknownQuery } from "./rollouts-schemas.ts";

// The schemas of this API's queries and bodies live in rollouts-schemas.ts, its OpenAPI document in rollouts-openapi.ts.
export { openApiDocument } from "./rollouts-openapi.ts";
export { AckRequest, ConsumedVersionRequest, EngineResumeRequest, GroupRecordsQuery, GroupsQuery, ModelVersionRequest, RolloutsListQuery, SummariesQuery, TrajectoryQuery } from "./rollouts-schemas.ts";

/** Options of {@link createRolloutsApp}. */
export interface RolloutsAppOptions {
  service: RolloutService;
  /**
   * Checks the store for `GET /health`: while it is unreachable the answer is
   * `503 {ok: false, store, error: {code: "store_unreachable", message}}`.
   * Default: no check (always `200 {ok: true}`).
   */
  health?: () => Promise<StoreHealth>;
  /** When set, every `/v1/*` request needs `Authorization: Bearer <token>` (`EDGELOOP_API_TOKEN`). */
  apiToken?: string | null;
  /** `GET /metrics` needs the same bearer token (when `apiToken` is set); default false: public, like `/health`. */
  metricsAuth?: boolean;
  /** Largest accepted request body in bytes (default 32 MiB). */
  maxBodyBytes?: number;
  /**
   * The model's tokenizer, for `GET /v1/trajectories/{key}?decode=1`; default
   * Qwen3 when the config names no model. With `config.model` set and no
   * tokenizer given, decoding answers 501.
   */
  tokenizer?: ChatTokenizer | (() => Promise<ChatTokenizer>);
  /** The engines' pause/resume control (`/v1/engine/*`); absent: those routes answer 501. */
  engine?: EngineControl | null;
  /** More families for `GET /metrics` (the sandbox leases'); a failure leaves them out of the scrape. */
  extraMetrics?: () => Promise<PromFamily[]>;
  /**
   * `GET /v1/sandboxes`: the sandbox leases' figures (store-wide stats and this
   * process's counters); absent (no `sandbox` lifecycle): `{enabled: false}`.
   */
  sandboxes?: () => Promise<Record<string, unknown>>;
}

/** A batch as `GET /v1/rollouts` lists it. */
export interface BatchSummary {
  batch_id: string;
  validate: boolean;
  done: boolean;
  /** Sessions and records counted apart (`BatchCounts`). */
  counts: BatchCounts;
  reward: { count: number; mean: number | null; min: number | null; max: number | null };
  /**
   * Sessions the store lost (queue mode): how many and why, null when none —
   * the same field as `GET /v1/rollouts/{batch_id}`'s `lost`, without its key
   * lists (`keys`, `missing`), which that call gives.
   */
  lost: { count: number; reason: string } | null;
  /**
   * Set once the batch was cancelled (`DELETE /v1/rollouts/{batch_id}`): the
   * detail's `cancelled` `{at (epoch ms), sessions, groups_withdrawn,
   * groups_complete}` as it is; null for a batch never cancelled.
   */
  cancelled: BatchCancellation | null;
  started_at: number;
  finished_at: number | null;
}

/**
 * The rollouts function (Hono, runtime-neutral):
 * - `POST /v1/rollouts` `{rows, config?, global_steps?, model_version?, validate?}` → `202 {batch_id, keys, reused_uids, complete_uids}`
 * - `GET /v1/rollouts?limit=&cursor=` → `{batches: BatchSummary[], next_cursor}` (each with `cancelled`, null unless cancelled), newest first: in queue mode
 *   the batches stored in Redis (listed by any `serve`, also after a restart), inline the ones this process holds
 * - `GET /v1/rollouts/{batch_id}` → progress and metrics (`BatchStats`: verl's `agent_loop/*`, latency percentiles)
 * - `GET /v1/rollouts/{batch_id}/trajectories` → NDJSON of `TrajectoryRecord`s as they finish
 * - `GET /v1/rollouts/{batch_id}/summaries?limit=&cursor=&status=&truncated=&reward_min=&reward_max=&uid=` →
 *   `{summaries: TrajectorySummary[], next_cursor, total, matched, done}`: the batch's records without their
 *   token arrays, in completion order, one page at a time (`SummariesQuery`, `pageSummaries`); to follow a
 *   running batch (`done: false`) past the last page, ask again with `cursor=<total>`
 * - `GET /v1/rollouts/{batch_id}/groups/{uid}?decode=` → `{batch_id, uid, records, divergence}`: the
 *   group's records in the batch (by session_id, output_index; `decode=1` adds `decoded` as
 *   `/v1/trajectories/{key}` does) and where each sample diverges from the others (`groupDivergence`)
 * - `GET /v1/trajectories/{key}` → the stored `TrajectoryRecord`; `?decode=1` (409 `model_mismatch` for a
 *   record whose `model` has another fingerprint than this server's tokenizer: never decoded with another) adds
 *   `decoded: {prompt: string[], response: string[]}`, the text of every token
 * - `GET /metrics` → Prometheus text (no auth, like `/health`, unless `metricsAuth`)
 * - `GET /viewer` → the trajectory viewer page (reads the API above)
 * - `GET /v1/queue` → `{mode, depth, in_flight, stranded?, oldest_age_ms, workers?}`: jobs a worker can claim now (waiting or stranded past the lease), claimed
 *   and the oldest one's age (queue mode), or this process's waiting and running trajectories (inline)
 * - `POST /v1/model-version` `{version}` → `{version, seq}`: the policy version turns are now
 *   recorded with (`extra_fields.model_versions`); `GET` reads it.
 * - `POST /v1/consumed-version` `{version}` → `{version, seq}`: the trainer reports the newest policy
 *   version whose groups it has consumed (monotonic; 400 naming `version` for one never set);
 *   `GET` reads it (`{version: null, seq: 0}` before any report). With `rollout.max_staleness` k
 *   (policy `admit`), a trajectory starts only while `model-version seq − consumed seq ≤ k`; held ones
 *   start once the bound is met again. `staleness_policy: fail`: the old rule (fail trajectories more
 *   than k versions behind their first turn).
 * - `DELETE /v1/rollouts/{batch_id}` → the batch's final `BatchStats` with `cancelled`
 *   `{at, sessions, groups_withdrawn, groups_complete}`: queued trajectories removed, running ones aborted,
 *   nothing more stored, incomplete groups withdrawn (see `RolloutService.cancel`); 409 `batch_done` for a
 *   batch already done, 404 for an unknown one.
 * - `POST /v1/engine/pause` `{mode?: "abort"|"wait"|"keep", clear_cache?: bool}` → `EngineStatus`
 *   `{paused, mode, since_ms, epoch, inflight, replicas}`: pauses every engine replica through its own
 *   API and holds new engine calls (see `EngineControl`); `POST /v1/engine/resume` (no body, or `{}`) → `EngineStatus`;
 *   `GET /v1/engine/status` → `EngineStatus` (with each vLLM replica's `is_paused`). A trainer's step:
 *   pause → update weights → `POST /v1/model-version` → resume. 502 naming the replicas that failed.
 * - `GET /v1/groups?max=K&block_ms=&consumer=&partition=&include_filtered=` → complete groups for a trainer
 *   (`{groups}`); `include_filtered=1` adds `filtered: FilteredGroup[]`, the groups `rollout.filter_groups`
 *   kept from trainers (all rewards equal), read-only
 * - `GET /v1/groups/{uid}` → the group's `GroupStatus` `{uid, partition, expected, finished, records,
 *   failed, complete, fingerprint}`; a uid never registered gives `expected: null` (200, not 404)
 * - `POST /v1/groups/ack` `{delivery_ids, partition?}` → `{acked}`
 * - `GET /openapi.json` (these routes and the agent gateway's, {@link agentGatewayOpenApiPaths}), `GET /health` (503 naming the store while it is unreachable, when `health` is given)
 * Every query is strict: an unknown parameter is a 400 naming it (`field`).
 * Errors are `{error: {code, message, field?}}`; a 400 names the field.
 */
export function createRolloutsApp(opts: RolloutsAppOptions): Hono {
  const app = new Hono();
  const { service } = opts;
  const maxBody = opts.maxBodyBytes ?? 32 * 1024 * 1024;

  app.onError((err, c) => errorResponse(err, c));
  app.notFound((c) => c.json({ error: { code: "not_found", message: `no route ${c.req.method} ${c.req.path}` } }, 404));
  app.use("*", limitBody(maxBody));
  // Every reply is what its content type says (no MIME sniffing of JSON or NDJSON as HTML).
  app.use("*", async (c, next) => {
    await next();
    try {
      c.res.headers.set("x-content-type-options", "nosniff");
    } catch {
      // Immutable headers (a relayed response): left as they are.
    }
  });
  app.get("/health", async (c) => {
    if (!opts.health) return c.json({ ok: true });
    const h = await opts.health();
    return healthResponse(h, { store: h.store });
  });
  app.get("/openapi.json", (c) => c.json(openApiDocument()));
  const collector = new RolloutMetricsCollector(service);
  // The queue's figures too (stranded jobs count as work, N1); a store outage leaves them out rather than failing the scrape.
  app.get("/metrics", bearerAuth(opts.metricsAuth ? (opts.apiToken ?? null) : null), async () => {
    const queue = await service.queueStats().then((q) => (q.mode === "queue" ? queueFamilies(q) : []), () => []);
    // The pause gate (POST /v1/engine/pause): shared by every process of a deployment when it lives in the store.
    const gate: PromFamily[] = opts.engine
      ? await opts.engine.gateStatus().then(
          (g) => [
            { name: "edgeloop_engine_paused", help: "1 while the deployment's engine gate is paused (POST /v1/engine/pause), else 0.", type: "gauge" as const, samples: [{ value: g.paused ? 1 : 0 }] },
            { name: "edgeloop_engine_inflight", help: "Engine calls admitted through the pause gate and not yet returned (every process of the deployment when the gate is in the store).", type: "gauge" as const, samples: [{ value: g.inflight }] },
          ],
          () => [],
        )
      : [];
    const extra = opts.extraMetrics ? await opts.extraMetrics().catch(() => []) : [];
    const lag = processLoopLag.running ? loopLagFamilies(processLoopLag) : [];
    return new Response(formatPrometheus([...collector.families(), ...queue, ...gate, ...extra, ...processMetrics.families(), ...service.admission.families(), ...lag]), { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } });
  });
  mountViewer(app);
  app.use("/v1/*", bearerAuth(opts.apiToken ?? null));
  app.use("/v1/*", refuseUnknownQuery);

  app.get("/v1/rollouts", async (c) => {
    const q = queryOf("/v1/rollouts", c);
    const page = await service.listBatches({ limit: q.limit, cursor: q.cursor ?? null });
    const batches: BatchSummary[] = page.runs.map((run) => {
      const s = run.stats();
      return {
        batch_id: s.batch_id,
        validate: s.validate,
        done: s.done,
        counts: s.counts,
        reward: s.reward,
        lost: s.lost ? { count: s.lost.count, reason: s.lost.reason } : null,
        cancelled: s.cancelled,
        started_at: s.started_at,
        finished_at: s.finished_at,
      };
    });
    return c.json({ batches, next_cursor: page.next_cursor });
  });

  let tokenizer: Promise<ChatTokenizer> | null = null;
  const getTokenizer = (): Promise<ChatTokenizer> => {
    const t = opts.tokenizer;
    tokenizer ??= t === undefined ? (service.config.model == null ? defaultTokenizer() : Promise.reject(noTokenizer())) : typeof t === "function" ? t() : Promise.resolve(t);
    return tokenizer;
  };
  // A record names the model its ids are of: decoded only with that model's tokenizer, never another's (N4).
  const decodingTokenizer = async (records: readonly TrajectoryRecord[]): Promise<ChatTokenizer> => {
    const tok = await getTokenizer();
    const own = await modelIdOf(tok);
    for (const r of records) {
      const why = decodeRefusal(r.model, own);
      if (why) throw new ConflictError(`decode: trajectory ${r.key}: ${why}`, { code: "model_mismatch", field: "decode" });
    }
    return tok;
  };

  app.get("/v1/trajectories/:key", async (c) => {
    const key = c.req.param("key");
    parseTrajectoryKey(key);
    const q = queryOf("/v1/trajectories/:key", c);
    const record = await service.store.get(key);
    if (!record) throw new NotFoundError(`no trajectory '${key}'`, { field: "key" });
    if (!q.decode) return c.json(record);
    const tok = await decodingTokenizer([record]);
    return c.json({ ...record, decoded: { prompt: tokenPieces(tok, record.prompt_ids), response: tokenPieces(tok, record.response_ids) } });
  });

  app.post("/v1/rollouts", async (c) => {
    const body = await readJson(c, maxBody);
    const { batch_id, keys, reused_uids, complete_uids } = await service.accept(parseRolloutRequest(body));
    return c.json({ batch_id, keys, reused_uids, complete_uids }, 202);
  });

  app.get("/v1/rollouts/:batch_id", async (c) => c.json((await service.lookup(c.req.param("batch_id"))).stats()));
  app.delete("/v1/rollouts/:batch_id", async (c) => c.json(await service.cancel(c.req.param("batch_id"))));

  app.get("/v1/queue", async (c) => c.json(await service.queueStats()));
  app.get("/v1/sandboxes", async (c) => c.json(opts.sandboxes ? { enabled: true, ...(await opts.sandboxes()) } : { enabled: false }));

  app.get("/v1/model-version", async (c) => c.json((await service.policy.current()) ?? { version: null, seq: 0 }));
  app.post("/v1/model-version", async (c) => {
    const r = ModelVersionRequest.safeParse(await readJson(c, 64 * 1024));
    if (!r.success) throw inputErrorFromZod("", r.error.issues);
    return c.json(await service.policy.set(r.data.version));
  });

  app.get("/v1/consumed-version", async (c) => c.json((await service.policy.consumed()) ?? { version: null, seq: 0 }));
  app.post("/v1/consumed-version", async (c) => {
    const r = ConsumedVersionRequest.safeParse(await readJson(c, 64 * 1024));
    if (!r.success) throw inputErrorFromZod("", r.error.issues);
    return c.json(await service.policy.setConsumed(r.data.version));
  });

  const engine = (): EngineControl => {
    if (!opts.engine) throw new NotImplementedError("engine pause/resume is not available in this process");
    return opts.engine;
  };
  app.post("/v1/engine/pause", async (c) => {
    const r = EnginePauseRequest.safeParse(await readJson(c, 64 * 1024));
    if (!r.success) throw inputErrorFromZod("", r.error.issues);
    return c.json(await engine().pause(r.data));
  });
  app.post("/v1/engine/resume", async (c) => {
    const body = await readOptionalJson(c, 64 * 1024);
    if (body !== undefined) {
      const r = EngineResumeRequest.safeParse(body);
      if (!r.success) throw inputErrorFromZod("", r.error.issues);
    }
    return c.json(await engine().resume());
  });
  app.get("/v1/engine/status", async (c) => c.json(await engine().status()));

  app.get("/v1/rollouts/:batch_id/trajectories", async (c) => {
    const run = await service.lookup(c.req.param("batch_id"));
    const enc = new TextEncoder();
    const it = run.stream();
    const body = new ReadableStream<Uint8Array>({
      async pull(ctrl) {
        const next = await it.next();
        if (next.done) ctrl.close();
        else ctrl.enqueue(enc.encode(JSON.stringify(next.value) + "\n"));
      },
      async cancel() {
        await it.return(undefined);
      },
    });
    return new Response(body, { headers: { "content-type": "application/x-ndjson", "cache-control": "no-cache" } });
  });

  app.get("/v1/rollouts/:batch_id/summaries", async (c) => {
    const q = queryOf("/v1/rollouts/:batch_id/summaries", c);
    const run = await service.lookup(c.req.param("batch_id"));
    const { limit, cursor, ...filter } = q;
    // `done` read before the page: a batch done then has every record in it.
    const done = run.stats().done;
    return c.json({ ...pageSummaries(run.records(), { limit, cursor: cursor ?? null, filter }), done });
  });

  app.get("/v1/rollouts/:batch_id/groups/:uid", async (c) => {
    const uid = Uid.safeParse(c.req.param("uid"));
    if (!uid.success) throw inputErrorFromZod("uid", uid.error.issues);
    const q = queryOf("/v1/rollouts/:batch_id/groups/:uid", c);
    const batchId = c.req.param("batch_id");
    const run = await service.lookup(batchId);
    const records = run
      .records()
      .filter((r) => r.uid === uid.data)
      .sort((a, b) => a.session_id - b.session_id || a.output_index - b.output_index);
    if (records.length === 0 && !run.plan.trajectories.some((t) => t.uid === uid.data)) {
      throw new NotFoundError(`batch '${batchId.slice(0, 100)}' has no group '${uid.data}'`, { field: "uid" });
    }
    const divergence = groupDivergence(records.map((r) => ({ key: r.key, ids: [...r.prompt_ids, ...r.response_ids] })));
    if (!q.decode) return c.json({ batch_id: batchId, uid: uid.data, records, divergence });
    const tok = await decodingTokenizer(records);
    const decoded = records.map((r) => ({ ...r, decoded: { prompt: tokenPieces(tok, r.prompt_ids), response: tokenPieces(tok, r.response_ids) } }));
    return c.json({ batch_id: batchId, uid: uid.data, records: decoded, divergence });
  });

  app.get("/v1/groups", async (c) => {
    const q = queryOf("/v1/groups", c);
    const { include_filtered, ...read } = q;
    const groups = await service.store.readCompleteGroups(read);
    if (include_filtered !== "1" && include_filtered !== "true") return c.json({ groups });
    const filtered = service.store.filteredGroups ? await service.store.filteredGroups({ partition: read.partition, max: read.max }) : [];
    return c.json({ groups, filtered });
  });

  app.get("/v1/groups/:uid", async (c) => {
    const uid = Uid.safeParse(c.req.param("uid"));
    if (!uid.success) throw inputErrorFromZod("uid", uid.error.issues);
    // Never a 404: a uid no batch registered is `expected: null` (so a trainer can poll before the POST lands).
    return c.json(await service.store.groupStatus(uid.data));
  });

  app.post("/v1/groups/ack", async (c) => {
    const r = AckRequest.safeParse(await readJson(c, 1024 * 1024));
    if (!r.success) throw inputErrorFromZod("", r.error.issues);
    const acked = await service.store.ack(r.data.delivery_ids, r.data.partition);
    return c.json({ acked });
  });

  return app;
}

function noTokenizer(): EdgeloopError {
  return new NotImplementedError("decoding needs the model's tokenizer: pass `tokenizer` to createRolloutsApp");
}

/** Maps any thrown value to the JSON error response; 5xx bodies never carry stack traces. */
export function errorResponse(err: unknown, c: Context): Response {
  // A store outage anywhere in the cause chain is said as such (503 store_unreachable naming the store,
  // as `/health` does), whatever wrapped it on the way up.
  const outage = storeOutageOf(err);
  if (outage) {
    return c.json({ error: { code: STORE_UNREACHABLE, message: outage.message.slice(0, 500) } }, 503, { "retry-after": "1" });
  }
  if (err instanceof EdgeloopError) {
    const headers: Record<string, string> = {};
    if (err.status === 503) headers["retry-after"] = "1";
    if (err instanceof AuthError) headers["www-authenticate"] = 'Bearer realm="edgeloop"';
    return err.toResponse(headers);
  }
  const status = (err as { status?: unknown }).status;
  if (typeof status === "number" && status >= 400 && status < 500) {
    return c.json({ error: { code: "bad_request", message: (err as Error).message } }, status as 400);
  }
  return c.json({ error: { code: "internal", message: "internal error" } }, 500);
}
