import { Hono, type Context, type Next } from "hono";
import { PolicyVersionValue } from "../shared/rollout/policy-version.ts";
import { z } from "zod";
import { AuthError, ConflictError, EdgeloopError, InputError, inputErrorFromZod, NotFoundError, NotImplementedError } from "../shared/errors.ts";
import { RolloutRequest } from "../shared/rollout/batch.ts";
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
import { ToolResultCallback } from "../shared/session/tool-result-callback.ts";
import { agentGatewayOpenApiPaths } from "./agent-gateway-openapi.ts";
import { processMetrics } from "../shared/telemetry/process-metrics.ts";

/** Query of `GET /v1/groups` (strict: an unknown parameter is a 400 naming it, as on every query below). */
export const GroupsQuery = z.strictObject({
  max: z.coerce.number().int().min(1).max(1000).default(16),
  block_ms: z.coerce.number().int().min(0).max(60_000).default(0),
  consumer: z.string().min(1).max(200).regex(/^[A-Za-z0-9._:-]+$/, "consumer may only hold letters, digits, '.', '_', ':' and '-'").default("trainer"),
  partition: z.enum(["train", "val"]).default("train"),
  /** `1`: also list the partition's complete groups filtered by `rollout.filter_groups` (`filtered`, read-only, never acked). */
  include_filtered: z.enum(["0", "1", "true", "false"]).optional(),
});

/**
 * Query of `GET /v1/rollouts`: `limit` batches per page (1–100, default 20),
 * `cursor` the previous page's `next_cursor` (`{started_at, 15 digits}:{batch_id}`).
 */
export const RolloutsListQuery = z.strictObject({
  limit: z.coerce.number().int().min(1).max(100).default(20),
  cursor: z
    .string()
    .regex(/^\d{15}:[A-Za-z0-9-]{1,100}$/, "must be the next_cursor of an earlier page")
    .optional(),
});

/** A boolean query flag: `1`/`true` or `0`/`false`. */
const QueryFlag = z.enum(["0", "1", "true", "false"]).transform((v) => v === "1" || v === "true");
/** A finite number in a query (`1.5`, `-2`, `1e-3`); empty text is refused, not read as 0. */
const QueryNumber = z
  .string()
  .regex(/^-?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i, "must be a number")
  .transform(Number)
  .refine(Number.isFinite, "must be a finite number");

/**
 * Query of `GET /v1/rollouts/{batch_id}/summaries`: `limit` summaries per page
 * (1–500, default 50), `cursor` the previous page's `next_cursor`, and filters:
 * `status` (`ok`|`failed`), `truncated` (`1`|`0`), `reward_min`/`reward_max`
 * (inclusive; `reward_min` above `reward_max` is a 400 naming `reward_min`), `uid`.
 */
export const SummariesQuery = z.strictObject({
  limit: z.string().regex(/^\d{1,4}$/, "must be an integer from 1 to 500").transform(Number).pipe(z.number().int().min(1).max(500)).default(50).describe("summaries per page, 1–500 (default 50)"),
  cursor: z.string().regex(/^\d{1,9}$/, "must be the next_cursor of an earlier page").optional().describe("the previous page's next_cursor"),
  status: z.enum(["ok", "failed"]).optional(),
  truncated: QueryFlag.optional(),
  reward_min: QueryNumber.optional().describe("inclusive lower bound on reward_score (records without one never match)"),
  reward_max: QueryNumber.optional().describe("inclusive upper bound on reward_score"),
  uid: Uid.optional().describe("only this prompt group's records"),
}).refine((q) => q.reward_min === undefined || q.reward_max === undefined || q.reward_min <= q.reward_max, {
  path: ["reward_min"],
  message: "must be <= reward_max",
});

/**
 * Query of `GET /v1/rollouts/{batch_id}/groups/{uid}`: `decode=1` (or `true`) adds each
 * record's per-token text; `0`/`false` or absent: none; anything else is a 400 naming `decode`.
 */
export const GroupRecordsQuery = z.strictObject({ decode: QueryFlag.optional().describe("1 or true: add the text of every token") });

/** Query of `GET /v1/trajectories/{key}`: `decode` as {@link GroupRecordsQuery}'s. */
export const TrajectoryQuery = GroupRecordsQuery;

/** Body of `POST /v1/engine/resume`: none, or `{}` (strict: any key is refused, as pause's body refuses unknown ones). */
export const EngineResumeRequest = z.strictObject({});

/**
 * Parses a route's query (`c.req.query()`: the first value of each name) with
 * its strict schema.
 * @throws InputError 400: an unknown parameter named as the field (`stauts: unknown
 *   query parameter; expected one of …`), else the first invalid one (`inputErrorFromZod`).
 */
function parseQuery<S extends z.ZodType>(schema: S, query: Record<string, string>, known: readonly string[]): z.output<S> {
  const r = schema.safeParse(query);
  if (r.success) return r.data;
  const unknown = r.error.issues.find((i) => i.code === "unrecognized_keys");
  if (unknown && unknown.code === "unrecognized_keys") {
    const name = unknown.keys[0]!.slice(0, 100);
    throw new InputError(name, `unknown query parameter; expected one of ${known.join(", ")}`);
  }
  throw inputErrorFromZod("", r.error.issues);
}

/**
 * The routes of this app that take query parameters (Hono paths), each with
 * its strict schema: the route's handler parses with it ({@link queryOf}),
 * the OpenAPI document lists its parameters, and {@link refuseUnknownQuery}
 * refuses a query on every other `/v1/*` route — one table, so a route that
 * gains a query cannot be forgotten by the middleware.
 */
const QUERY_SCHEMAS = {
  "/v1/rollouts": RolloutsListQuery,
  "/v1/trajectories/:key": TrajectoryQuery,
  "/v1/rollouts/:batch_id/summaries": SummariesQuery,
  "/v1/rollouts/:batch_id/groups/:uid": GroupRecordsQuery,
  "/v1/groups": GroupsQuery,
} as const;
type QueryPath = keyof typeof QUERY_SCHEMAS;

/** {@link QUERY_SCHEMAS}' paths as patterns (a `:param` matches one path segment). */
const QUERY_ROUTES: readonly RegExp[] = Object.keys(QUERY_SCHEMAS).map((p) => new RegExp(`^${p.replace(/:[a-z_]+/g, "[^/]+")}$`));

/** The query of a request to `path`, parsed with its schema. @throws InputError naming an unknown or invalid parameter. */
function queryOf<P extends QueryPath>(path: P, c: Context): z.output<(typeof QUERY_SCHEMAS)[P]> {
  const schema = QUERY_SCHEMAS[path];
  return parseQuery(schema, c.req.query(), Object.keys(schema.shape)) as z.output<(typeof QUERY_SCHEMAS)[P]>;
}

/**
 * Middleware: a query parameter on a route that takes none is a 400 naming
 * it (never ignored: `POST /v1/engine/pause?mode=abort` would otherwise pause
 * with the body's mode and drop the query's).
 * @throws InputError naming the first parameter.
 */
async function refuseUnknownQuery(c: Context, next: Next): Promise<void> {
  const path = c.req.path;
  if (!QUERY_ROUTES.some((r) => r.test(path))) {
    const name = new URL(c.req.url).searchParams.keys().next().value;
    if (name !== undefined) throw new InputError(name.slice(0, 100), "unknown query parameter; this route takes none");
  }
  await next();
}

/** Body of `POST /v1/model-version`: the policy version now being served (after a weight update). */
export const ModelVersionRequest = z.strictObject({
  version: PolicyVersionValue,
});

/** Body of `POST /v1/consumed-version`: the newest policy version whose groups the trainer has consumed (a version set with `POST /v1/model-version`). */
export const ConsumedVersionRequest = z.strictObject({
  version: PolicyVersionValue,
});

/** Body of `POST /v1/groups/ack` (strict: an unknown key is a 400, so a misspelt `partition` does not ack the train partition). */
export const AckRequest = z.strictObject({
  delivery_ids: z.array(z.string().regex(/^\d{1,20}-\d{1,20}$/, "a delivery id is a stream id such as 1796002889517-0")).min(1).max(1000),
  partition: z.enum(["train", "val"]).default("train"),
});

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
    return new Response(formatPrometheus([...collector.families(), ...queue, ...gate, ...processMetrics.families()]), { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } });
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
    const r = RolloutRequest.safeParse(body);
    if (!r.success) throw inputErrorFromZod("", r.error.issues);
    const { batch_id, keys, reused_uids, complete_uids } = await service.accept(r.data);
    return c.json({ batch_id, keys, reused_uids, complete_uids }, 202);
  });

  app.get("/v1/rollouts/:batch_id", async (c) => c.json((await service.lookup(c.req.param("batch_id"))).stats()));
  app.delete("/v1/rollouts/:batch_id", async (c) => c.json(await service.cancel(c.req.param("batch_id"))));

  app.get("/v1/queue", async (c) => c.json(await service.queueStats()));

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

/** OpenAPI query parameters of a query schema (an object of string fields), each with its JSON schema. */
function queryParameters(q: z.ZodObject): Record<string, unknown>[] {
  const doc = z.toJSONSchema(q, { io: "input", unrepresentable: "any" }) as { properties?: Record<string, unknown> };
  return Object.entries(doc.properties ?? {}).map(([name, schema]) => ({ name, in: "query", required: false, schema }));
}

/** The OpenAPI 3.1 document, generated from the zod schemas of the boundary. */
export function openApiDocument(): Record<string, unknown> {
  const schema = (s: z.ZodType) => z.toJSONSchema(s, { io: "input", unrepresentable: "any" });
  const json = (s: z.ZodType) => ({ content: { "application/json": { schema: schema(s) } } });
  const err = { description: "error", content: { "application/json": { schema: { $ref: "#/components/schemas/Error" } } } };
  return {
    openapi: "3.1.0",
    info: { title: "edgeloop", version: "0.1.0", description: "Agent-loop rollouts for agentic RL: POST a batch, read token trajectories." },
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" }, session_bearer: { type: "http", scheme: "bearer", description: "an agent session's own token (the task's api_key)" } },
      schemas: {
        TrajectoryRecord: schema(TrajectoryRecord),
        Error: {
          type: "object",
          properties: { error: { type: "object", properties: { code: { type: "string" }, message: { type: "string" }, field: { type: "string" } } } },
        },
      },
    },
    security: [{ bearer: [] }],
    paths: {
      "/v1/rollouts": {
        get: {
          summary: "Batches newest first, paged (queue mode: every batch stored in Redis; inline: this process's)",
          parameters: ["limit", "cursor"].map((name) => ({ name, in: "query", required: false, schema: { type: "string" } })),
          responses: { "200": { description: "{batches: BatchSummary[], next_cursor: string | null}" }, "400": err },
        },
        post: { summary: "Submit a batch of dataset rows", requestBody: json(RolloutRequest), responses: {
            "202": { description: "accepted: {batch_id, keys, reused_uids, complete_uids} (uids whose group already existed resume it; complete ones are returned as they are)" },
            "400": err,
            "401": err,
            "409": err,
            "413": { ...err, description: "request_too_large: the body is over 32 MiB, or a row cannot fit in one store request (names rows[i]); nothing was written" },
            "415": err,
            "503": { ...err, description: "queue_full (more jobs than --max-pending would wait) or the store refuses writes; Retry-After says when to try again", headers: { "Retry-After": { schema: { type: "integer" } } } },
          },
        },
      },
      "/v1/queue": {
        get: { summary: "Job-queue depth, in-flight jobs and the oldest job's age (the autoscaler's signal)", responses: { "200": { description: "{mode, depth, in_flight, stranded?, oldest_age_ms, workers?}: depth = jobs a worker can claim now (waiting, plus stranded: held past the lease by a worker that stopped heart-beating)" } } },
      },
      "/v1/model-version": {
        get: { summary: "The current policy version", responses: { "200": { description: "{version, seq}" } } },
        post: { summary: "Set the policy version (after a weight update)", requestBody: json(ModelVersionRequest), responses: { "200": { description: "{version, seq}" }, "400": err } },
      },
      "/v1/consumed-version": {
        get: { summary: "The newest policy version whose groups the trainer reported consuming", responses: { "200": { description: "{version, seq} ({version: null, seq: 0} before any report)" } } },
        post: { summary: "Report consumption (admission control: rollout.max_staleness holds new trajectories while model-version seq − consumed seq exceeds it)", requestBody: json(ConsumedVersionRequest), responses: { "200": { description: "{version, seq}" }, "400": err } },
      },
      "/v1/engine/pause": {
        post: { summary: "Pause every engine replica (abort: in-flight requests end and are resumed after; wait: drain first; keep: frozen) and hold new engine calls", requestBody: json(EnginePauseRequest), responses: { "200": { description: "{paused, mode, since_ms, epoch, inflight, replicas}" }, "400": err, "401": err, "502": err } },
      },
      "/v1/engine/resume": { post: { summary: "Resume every engine replica and let engine calls go (no body, or {})", requestBody: { required: false, ...json(EngineResumeRequest) }, responses: { "200": { description: "{paused, mode, since_ms, epoch, inflight, replicas}" }, "400": err, "401": err, "415": err, "502": err } } },
      "/v1/engine/status": { get: { summary: "Pause state, engine calls in flight, each replica's is_paused", responses: { "200": { description: "{paused, mode, since_ms, epoch, inflight, replicas}" }, "401": err } } },
      "/v1/rollouts/{batch_id}": {
        get: { summary: "Batch progress and metrics", responses: { "200": { description: "BatchStats" }, "404": err } },
        delete: { summary: "Cancel the batch: queued trajectories removed, running ones aborted, nothing more stored, incomplete groups withdrawn", responses: { "200": { description: "BatchStats with cancelled {at, sessions, groups_withdrawn, groups_complete}" }, "404": err, "409": err, "501": err } },
      },
      "/v1/trajectories/{key}": {
        get: {
          summary: "One stored trajectory; decode=1 adds the text of every token",
          parameters: [{ name: "key", in: "path", required: true, schema: { type: "string" } }, ...queryParameters(TrajectoryQuery)],
          responses: { "200": { description: "TrajectoryRecord (plus decoded: {prompt, response} per-token strings)" }, "400": { ...err, description: "a bad key, an unknown query parameter or a decode other than 0/1/true/false (field names it)" }, "404": err, "409": { ...err, description: "decode=1 on a record of another model (its model.fingerprint differs from this server's tokenizer), code model_mismatch" } },
        },
      },
      "/v1/rollouts/{batch_id}/trajectories": {
        get: { summary: "NDJSON stream of TrajectoryRecords as they finish", responses: { "200": { description: "application/x-ndjson" }, "404": err } },
      },
      "/v1/rollouts/{batch_id}/summaries": {
        get: {
          summary: "One page of the batch's trajectories as summaries (no token arrays), in completion order, filtered",
          parameters: [
            { name: "batch_id", in: "path", required: true, schema: { type: "string" } },
            ...queryParameters(SummariesQuery),
          ],
          responses: {
            "200": { description: "{summaries: [{key, uid, session_id, output_index, status, reward_score, num_turns, truncated, finish_reason, prompt_length, response_length, sampled, error}], next_cursor: string | null, total, matched, done} (a running batch: after the last page, cursor=<total> reads what finished since)" },
            "400": { ...err, description: "a query parameter is invalid (field names it)" },
            "401": err,
            "404": err,
          },
        },
      },
      "/v1/rollouts/{batch_id}/groups/{uid}": {
        get: {
          summary: "The records of one prompt group in the batch and where its samples diverge (on prompt ‖ response token ids)",
          parameters: [
            { name: "batch_id", in: "path", required: true, schema: { type: "string" } },
            { name: "uid", in: "path", required: true, schema: { type: "string" } },
            ...queryParameters(GroupRecordsQuery),
          ],
          responses: {
            "200": { description: "{batch_id, uid, records: TrajectoryRecord[] (by session_id; decode=1 adds decoded), divergence: {common_prefix, samples: [{key, at, kind: token|ended|identical, nearest, length}]}}" },
            "400": err,
            "401": err,
            "404": { ...err, description: "unknown batch, or no trajectory of this uid in it" },
          },
        },
      },
      "/v1/groups": {
        get: {
          summary: "Complete groups for a trainer (at-least-once; ack them)",
          parameters: ["max", "block_ms", "consumer", "partition", "include_filtered"].map((name) => ({ name, in: "query", required: false, schema: { type: "string" } })),
          responses: { "200": { description: "{groups: CompleteGroup[]}" }, "400": err },
        },
      },
      "/v1/groups/{uid}": {
        get: {
          summary: "One prompt group's progress (expected null for a uid never registered)",
          parameters: [{ name: "uid", in: "path", required: true, schema: { type: "string" } }],
          responses: { "200": { description: "{uid, partition, expected, finished, records, failed, complete, fingerprint}" }, "400": err },
        },
      },
      "/v1/groups/ack": { post: { summary: "Acknowledge delivered groups", requestBody: json(AckRequest), responses: { "200": { description: "{acked}" }, "400": err } } },
      "/v1/sessions/{key}/tool-results": {
        post: {
          summary: "An asynchronous tool's result (the tool answered its call 202 Accepted): signed like tool calls, not by the bearer token",
          security: [],
          parameters: [
            { name: "key", in: "path", required: true, schema: { type: "string" } },
            { name: "x-edgeloop-signature", in: "header", required: true, description: "t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\"> with tools.secret; refused outside a 5-minute window", schema: { type: "string" } },
          ],
          requestBody: json(ToolResultCallback),
          responses: {
            "200": { description: "{ok: true, key, call_id}" },
            "400": err,
            "401": { ...err, description: "missing, bad or stale x-edgeloop-signature" },
            "403": { ...err, description: "no tools.secret configured: callbacks are never accepted unsigned" },
            "415": { ...err, description: "the body is not sent as application/json (judged after the signature)" },
            "404": { ...err, description: "no session with this key" },
            "409": { ...err, description: "the session waits for no call with this call_id, or it was already answered" },
            "413": { ...err, description: "body over 4 MiB" },
          },
        },
      },
      "/v1/sessions/{key}": {
        get: {
          summary: "A durable session's phase, step and the tool calls it awaits",
          parameters: [{ name: "key", in: "path", required: true, schema: { type: "string" } }],
          responses: { "200": { description: "{phase, step, loop_state, deadline_ms, awaited: [{call_id, name, deadline_ms}]} (phase running | waiting | finished | done | failed)" }, "401": err, "404": err },
        },
      },
      "/metrics": {
        get: {
          summary: "Prometheus text exposition: edgeloop_sessions_total, edgeloop_trajectories_total{outcome}, the agent_loop histograms, this process's tool and engine calls (docs/metrics.md)",
          security: [],
          responses: { "200": { description: "Prometheus text format 0.0.4", content: { "text/plain": { schema: { type: "string" } } } } },
        },
      },
      "/health": {
        get: {
          summary: "Liveness and the store's reachability",
          security: [],
          responses: { "200": { description: "{ok: true, …}" }, "503": { ...err, description: "{ok: false, store, error: {code: store_unreachable, …}} while the store does not answer" } },
        },
      },
      ...agentGatewayOpenApiPaths(err),
    },
  };
}

