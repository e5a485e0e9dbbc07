import { Hono, type Context } from "hono";
import { z } from "zod";
import { AuthError, ConfigError, EdgeloopError } from "../shared/errors.ts";
import { DEFAULT_ENGINE_MAX_REPLY_BYTES, redactUrl } from "../shared/http/outbound.ts";
import { DEADLINE_HEADER, joinUrl, PREFIX_KEY_HEADER, type FetchLike } from "../shared/inference/engine-http.ts";
import { gatewayMetricsText } from "../shared/inference/gateway-metrics.ts";
import { createRoutingPolicy, normaliseUrl, ReplicaPool, type FailureKind, type ReplicaStatus } from "../shared/inference/replica-pool.ts";
import { DEFAULT_EPSILON, rendezvousOrder } from "../shared/inference/bounded-load-hash.ts";
import { cacheUsage, cacheUsageOf, recordCacheUsage } from "../shared/inference/cache-usage.ts";
import type { RoutingState } from "../shared/inference/routing-state.ts";
import { judgeReply } from "../shared/inference/reply-check.ts";
import { PROMETHEUS_CONTENT_TYPE } from "../shared/telemetry/prometheus.ts";
import type { RoutingPolicyName } from "../shared/inference/routing-policy.ts";
import { bearerAuth, limitBody, tooLarge } from "./http-util.ts";
import { ADMIN_MAX_BODY, adminDisabled, adminRoutes } from "./gateway-admin.ts";
import { DROP_REQUEST_HEADERS, isEventStream, readLimited, readReplyLimited, relayStream, REPLICA_HEADER, waitUntil, withReplica } from "./gateway-relay.ts";

export { REPLICA_HEADER };
/**
 * Header on the replies the gateway makes itself (`/health`, and the 404 of a
 * route it does not forward), never on a relayed replica reply: how a client
 * such as `edgeloop doctor` tells the gateway from an engine.
 */
export const GATEWAY_HEADER = "x-edgeloop-gateway";

/**
 * Request header carrying the prompt's prefix key (the engine clients send
 * `GenerateRequest.prefix_key`): with a shared routing state, a routing key
 * with no pin yet goes to the replica this key's rendezvous order prefers
 * (bounded-load), where its prefix is most likely cached.
 */
export { PREFIX_KEY_HEADER };

/** Options of {@link createGatewayApp}. */
export interface GatewayOptions {
  /** Base URLs of the engine replicas (may be empty and filled at run time). */
  replicas: string[];
  /** Routing policy (default `least_inflight_sticky`). */
  policy?: RoutingPolicyName;
  /** ε of `bounded_load_hash` (default 0.25). */
  epsilon?: number;
  /** Sticky keys kept by `least_inflight_sticky` (default 10,000). */
  maxStickyKeys?: number;
  /** Health-check period in ms (default 5,000; 0 = only on demand). Checks run lazily, on traffic. */
  healthIntervalMs?: number;
  /** Replicas tried per call, at most (default 3, never more than the replica count). */
  maxAttempts?: number;
  /**
   * Deadline of one attempt at one replica, in ms (default: none; the
   * caller's deadline applies). Past it the attempt counts as a `timeout`
   * failure and the call moves to another replica. Set it below the
   * clients' `engine.timeout_ms` so a hung replica costs one attempt, not the call.
   */
  attemptTimeoutMs?: number;
  /** Consecutive failures that eject a replica (default 3). */
  ejectAfter?: number;
  /** Cool-down of an ejected replica before one half-open probe call, in ms (default 10,000). */
  cooldownMs?: number;
  /**
   * True while the deployment's engines are paused on purpose (the pause
   * gate is closed): a failed health probe then marks nothing unhealthy. A
   * paused SGLang replica whose `/health` runs a generation
   * (`SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`) cannot answer until resumed,
   * and that is not the replica's fault. Default: never paused.
   * @see docs/engines.md §3.6
   */
  enginesPaused?: () => boolean | Promise<boolean>;
  /** Wall clock in epoch ms (tests). */
  now?: () => number;
  /** Web-standard fetch used to reach replicas (default `globalThis.fetch`). */
  fetch?: FetchLike;
  /**
   * When set, `/admin/*` needs `Authorization: Bearer <adminToken>` (compared
   * in constant time; 401 otherwise). When absent (null or empty) the admin
   * API is off: every `/admin/*` request is a 403 `admin_disabled`. Proxied
   * engine calls are not affected.
   */
  adminToken?: string | null;
  /** Largest proxied request body in bytes (default 64 MiB; 413 above it). Admin bodies are capped at 64 KiB. */
  maxBodyBytes?: number;
  /**
   * Largest replica reply in bytes, counted as the bytes stream (default
   * `DEFAULT_ENGINE_MAX_REPLY_BYTES`, 64 MiB; `engine.max_reply_bytes` in
   * `edgeloop gateway`). A JSON reply over it is a failed attempt (the next
   * replica is tried); an event stream that passes it is cut: the caller gets
   * the events relayed so far, then one `data: {"error":{"code":"reply_too_large",…}}`
   * event naming the cap, and the stream closes without `data: [DONE]`.
   */
  maxReplyBytes?: number;
  /**
   * Routing state shared with the deployment's other gateway instances
   * (`RedisRoutingState` over the store's Redis): pins, in-flight leases and
   * ejections live there, and `policy` is replaced by its rule (sticky pins
   * under a bounded-load cap of ε, first turns placed by the prompt's prefix
   * key). Absent: this instance's own {@link ReplicaPool} routes (the default).
   * If the state fails (store unreachable), the call is routed in-process.
   */
  routingState?: RoutingState | null;
  /**
   * Shared state: ε of the cap past which a pinned session moves to another
   * replica (default {@link DEFAULT_STICKY_EPSILON}; never below
   * {@link DEFAULT_STICKY_MIN_LOAD} calls); `epsilon` (default
   * {@link DEFAULT_SHARED_EPSILON} with a shared state) places new sessions.
   */
  stickyEpsilon?: number;
}

/** Default ε past which a pinned session leaves its replica (shared state): 1, i.e. more than twice the mean in-flight load. */
export const DEFAULT_STICKY_EPSILON = 1;
/**
 * Shared state: a pinned session never leaves its replica for load while the
 * replica holds fewer than 16 calls (engines batch far more sequences than
 * that: vLLM's `max_num_seqs` defaults to 256 and above).
 */
export const DEFAULT_STICKY_MIN_LOAD = 16;
/**
 * Shared state: default ε for placing new sessions. 0.2 rather than the
 * stateless hash's 0.25: first turns all follow their prefix key's order, so
 * the first replica of a popular prefix runs at the cap, and the whole run's
 * max/mean requests lands a little above 1 + ε (bench/shared-routing.ts).
 */
export const DEFAULT_SHARED_EPSILON = 0.2;

/** A gateway: its Hono app plus the controls the CLI and tests use. */
export interface Gateway {
  app: Hono;
  /** `app.fetch`, bound. */
  fetch: (req: Request) => Promise<Response>;
  pool: ReplicaPool;
  /**
   * Adds a replica at run time; one already present is restored (its breaker
   * reset). `POST /admin/replicas {"url": ...}` adds too, but answers 409 for
   * a present replica and leaves it as it is.
   */
  addReplica(url: string): void;
  /** Removes a replica at run time (also `DELETE /admin/replicas {"url": ...}`); its keys move. */
  removeReplica(url: string): boolean;
  /** Every replica's status (also `GET /admin/replicas`). */
  replicas(): ReplicaStatus[];
  /** Probes `GET /health` on every replica now and updates health. */
  checkHealth(): Promise<void>;
}

const GatewayOptionsSchema = z.object({
  replicas: z.array(z.url({ protocol: /^https?$/ })),
  policy: z.enum(["least_inflight_sticky", "bounded_load_hash", "round_robin"]).default("least_inflight_sticky"),
  epsilon: z.number().positive().optional(),
  maxStickyKeys: z.number().int().positive().optional(),
  healthIntervalMs: z.number().int().min(0).default(5_000),
  maxAttempts: z.number().int().min(1).default(3),
  attemptTimeoutMs: z.number().int().positive().optional(),
  ejectAfter: z.number().int().min(1).default(3),
  cooldownMs: z.number().int().min(0).default(10_000),
  maxBodyBytes: z.number().int().positive().default(64 * 1024 * 1024),
  maxReplyBytes: z.number().int().positive().default(DEFAULT_ENGINE_MAX_REPLY_BYTES),
  stickyEpsilon: z.number().positive().optional(),
});

const decoder = new TextDecoder();

/**
 * The engine routes the gateway forwards, as `METHOD path` (exact, no
 * decoding): the generation and tokenize routes edgeloop's engine clients and
 * teacher call, and `GET /v1/models` (context size). Everything else — engine
 * control such as vLLM `/pause`, `/resume`, `/is_paused`, SGLang
 * `/pause_generation`, `/flush_cache`, `/update_weight_version`,
 * `/update_weights_from_*` — is refused with 404: engine control goes through
 * edgeloop's authenticated `/v1/engine/*` (to `engine.admin_urls`), never
 * through the gateway.
 * @see docs/engines.md §2.1, §3.9 (the routes the clients use)
 */
export const PROXIED_ROUTES: readonly string[] = [
  "POST /v1/completions",
  "POST /inference/v1/generate",
  "POST /generate",
  "POST /tokenize",
  "POST /v1/tokenize",
  "GET /v1/models",
];
const PROXIED = new Set(PROXIED_ROUTES);
/** POST routes `Gateway.fetch` sends straight to the proxy (the hot path). */
const PROXIED_POST = new Set(PROXIED_ROUTES.filter((r) => r.startsWith("POST ")).map((r) => r.slice(5)));

/**
 * The inference gateway: a runtime-neutral Hono function in front of K engine
 * replicas. The engine routes in {@link PROXIED_ROUTES} (`POST /v1/completions`,
 * `/inference/v1/generate`, `/generate`, `/tokenize`, `/v1/tokenize`,
 * `GET /v1/models`) are proxied with their
 * body unchanged to the replica the policy picks for the call's routing key
 * (`X-Session-ID`, else `X-SMG-Routing-Key`). A call that fails at a replica
 * before any token came back is retried on another one (up to `maxAttempts`
 * replicas). Failures, counted per replica and kind: a connection error
 * (`connect`; the replica is also marked unhealthy until a health check
 * passes), a 5xx (`http_5xx`), the per-attempt deadline (`timeout`), a 2xx
 * whose body is not JSON, not the engine's wire schema, or lacks what the
 * request asked for — token ids with `return_token_ids`, log-probs with
 * `logprobs` — judged by the engine clients' own parsers (`bad_reply`, see
 * `replyProblem`; a well-formed reply carrying ids and log-probs is settled
 * by a structural check without them, `surelyUsableReply`, and the request
 * body is neither decoded nor parsed unless the verdict depends on it), and a
 * caller that gives up at its own deadline while the replica is still silent
 * (`client_abort`: the engine clients declare their per-attempt deadline in
 * `x-edgeloop-timeout-ms`; an abort at ≥ 90 % of it, or
 * of `attemptTimeoutMs`, is the replica's failure, an earlier one is the
 * caller's choice and counts for nothing). `ejectAfter` failures in a row
 * eject the replica: the keys pinned to it are re-pinned on their next call
 * (counted); after `cooldownMs` one call is let through as a half-open probe,
 * and its success restores the replica (see {@link ReplicaPool}).
 * The response carries `x-edgeloop-replica: <replica url>`. With no replica
 * left it answers 503 `{"error":{"code":"no_available_workers",...}}` (SMG's
 * code, vLLM's nested shape, so the engine clients read it as unavailable);
 * when every attempt got a garbled 2xx, 502 `{"error":{"code":"bad_reply",...}}`.
 *
 * Any other path (engine control included) is a 404 `not_found` naming the forwarded routes.
 *
 * Admin API (bearer `adminToken`; without one the admin API is off: 403 `admin_disabled`):
 * `GET /admin/replicas` (with a shared state also `shared_state.inflight`: live
 * leases per replica over every instance), `POST /admin/replicas {"url"}` → 201 (409 `conflict`,
 * field `url`, when the replica is already present: nothing changes), `DELETE /admin/replicas {"url"}`
 * → 200 (404 when unknown). Bodies are `application/json` (415 otherwise) holding `url` only
 * (400 field `body` for malformed JSON or another key; 400 field `url` for a non-http(s) URL).
 * `GET /health` is 200 while at least one replica is healthy, else 503; when
 * the last probes are older than `healthIntervalMs` it probes the replicas
 * first (probes otherwise run lazily, on traffic).
 * `GET /metrics`: Prometheus text (`gatewayMetricsText`: health, state,
 * failures by kind, ejections, probes, re-pins per replica).
 *
 * @throws ConfigError on invalid options (a replica listed twice included)
 * @see vllm-project/router and SGLang Model Gateway (docs/engines.md §4)
 */
export function createGatewayApp(options: GatewayOptions): Gateway {
  const parsed = GatewayOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const i = parsed.error.issues[0];
    throw new ConfigError(`gateway.${i?.path.join(".")}`, i?.message ?? "invalid option");
  }
  const opts = parsed.data;
  const seen = new Set<string>();
  for (const url of opts.replicas.map(normaliseUrl)) {
    // Two entries for one replica would silently collapse into one (and skew what the operator thinks runs).
    if (seen.has(url)) throw new ConfigError("gateway.replicas", `${url} is listed twice`);
    seen.add(url);
  }
  const fetchFn: FetchLike = options.fetch ?? ((input, init) => fetch(input, init));
  const state = options.routingState ?? null;
  const epsilon = opts.epsilon ?? (state ? DEFAULT_SHARED_EPSILON : DEFAULT_EPSILON);
  const stickyEpsilon = opts.stickyEpsilon ?? DEFAULT_STICKY_EPSILON;
  let stateErrors = 0;
  const pool = new ReplicaPool(opts.replicas, createRoutingPolicy(opts.policy, { epsilon: opts.epsilon, maxKeys: opts.maxStickyKeys }), {
    ejectAfter: opts.ejectAfter,
    cooldownMs: opts.cooldownMs,
    maxKeys: opts.maxStickyKeys,
    now: options.now,
  });
  let lastHealthCheck = Date.now();
  let healthRun: Promise<void> | undefined;

  const enginesPaused = async (): Promise<boolean> => {
    try {
      return (await options.enginesPaused?.()) === true;
    } catch {
      return false;
    }
  };
  const checkHealth = (): Promise<void> => {
    healthRun ??= Promise.all(
      pool.urls().map(async (url) => {
        let ok = false;
        try {
          const res = await fetchFn(joinUrl(url, "/health"), { signal: AbortSignal.timeout(Math.max(1_000, Math.min(opts.healthIntervalMs || 5_000, 10_000))), redirect: "manual" });
          ok = res.ok;
          await res.body?.cancel();
        } catch {
          ok = false;
        }
        // A probe that failed while the engines are paused on purpose says nothing about the replica.
        if (!ok && (await enginesPaused())) return;
        pool.setHealthy(url, ok);
      }),
    ).then(() => {
      lastHealthCheck = Date.now();
      healthRun = undefined;
    });
    return healthRun;
  };

  const app = new Hono();
  const onError = (err: unknown): Response => {
    if (err instanceof EdgeloopError) {
      return err.toResponse(err instanceof AuthError ? { "www-authenticate": 'Bearer realm="edgeloop-gateway"' } : {});
    }
    return Response.json({ error: { code: "internal", message: "internal error" } }, { status: 500 });
  };
  app.onError(onError);
  const adminToken = options.adminToken || null;
  app.use("/admin/*", async (_c, next) => {
    if (!adminToken) throw adminDisabled();
    await next();
  });
  app.use("/admin/*", bearerAuth(adminToken), limitBody(ADMIN_MAX_BODY));
  app.use("*", limitBody(opts.maxBodyBytes));

  app.get("/health", async (c) => {
    // Probes run lazily, on traffic; a readiness check on an idle gateway must not read health that is
    // older than the period: it runs the probes first (at most once per period, shared with traffic).
    if (opts.healthIntervalMs > 0 && (Date.now() - lastHealthCheck >= opts.healthIntervalMs || healthRun)) await checkHealth().catch(() => undefined);
    const healthy = pool.status().filter((r) => r.healthy).length;
    return c.json({ status: healthy > 0 ? "ok" : "unavailable", healthy, replicas: pool.urls().length }, healthy > 0 ? 200 : 503, { [GATEWAY_HEADER]: "1" });
  });

  app.get("/metrics", () => new Response(gatewayMetricsText(pool.status()), { headers: { "content-type": PROMETHEUS_CONTENT_TYPE } }));

  adminRoutes(app, {
    pool,
    sharedState: async () => {
      if (!state) return null;
      // Calls in flight at each replica across every instance (live leases); null when the store does not answer.
      const inflight = await state.inflight(pool.urls()).catch(() => null);
      return { rule: "sticky_bounded_load", epsilon, sticky_epsilon: stickyEpsilon, sticky_min_load: DEFAULT_STICKY_MIN_LOAD, errors: stateErrors, inflight };
    },
    attemptTimeoutMs: opts.attemptTimeoutMs ?? null,
  });
  app.all("/admin/*", (c) => c.json({ error: { code: "not_found", message: `no admin route ${c.req.method} ${c.req.path.slice(0, 200)}` } }, 404));

  app.all("*", (c) => {
    const path = new URL(c.req.url).pathname;
    // HEAD of a forwarded GET is a GET without a body (as Hono routes it).
    const method = c.req.method === "HEAD" ? "GET" : c.req.method;
    if (!PROXIED.has(`${method} ${path}`)) {
      return Promise.resolve(
        Response.json(
          { error: { code: "not_found", type: "NotFoundError", message: `the gateway does not forward ${c.req.method} ${path.slice(0, 200)}: it forwards only ${PROXIED_ROUTES.join(", ")} (engine control goes through edgeloop's /v1/engine/*)` } },
          { status: 404, headers: { [GATEWAY_HEADER]: "1" } },
        ),
      );
    }
    return serveProxy(c.req.raw, c);
  });

  /** The catch-all route: a lazy health check when one is due, then the proxied call. */
  function serveProxy(req: Request, c?: Context, body?: ArrayBuffer): Promise<Response> {
    if (opts.healthIntervalMs > 0 && Date.now() - lastHealthCheck >= opts.healthIntervalMs && !healthRun) {
      const run = checkHealth().catch(() => undefined);
      if (c) waitUntil(c, run);
    }
    return proxy(req, body);
  }

  /**
   * `Gateway.fetch`: an engine call (a POST to a path the app's own routes
   * cannot match) goes straight to the catch-all route with the body-size
   * check Hono's middleware would make (by the declared length, else while
   * the body is read); every other request goes through the Hono app. Same
   * responses either way: it saves the router and middleware chain on the
   * hot path.
   */
  async function fetchGateway(req: Request): Promise<Response> {
    if (req.method !== "POST") return app.fetch(req);
    const url = req.url;
    const start = url.indexOf("/", url.indexOf(":") + 4);
    let end = url.indexOf("?", start);
    if (end < 0) end = url.length;
    // Only an allow-listed generation route takes the fast path; anything else (the app's own
    // routes, a refused path, an encoded or odd one) goes through the Hono app, which answers it.
    if (start < 0 || !PROXIED_POST.has(url.slice(start, end))) return app.fetch(req);
    try {
      const declared = req.headers.get("content-length");
      let body: ArrayBuffer | undefined;
      if (declared === null || req.headers.has("transfer-encoding")) {
        // No declared length (a streamed body, or an in-process Request): read it under the limit.
        const read = await readLimited(req, opts.maxBodyBytes);
        if (read === null) return onError(tooLarge(opts.maxBodyBytes));
        body = read;
      } else if (parseInt(declared, 10) > opts.maxBodyBytes && req.body) return onError(tooLarge(opts.maxBodyBytes));
      return await serveProxy(req, undefined, body);
    } catch (e) {
      return onError(e);
    }
  }

  /** One proxied call; `read` is the request body when the caller already read it. */
  async function proxy(req: Request, read?: ArrayBuffer): Promise<Response> {
    const key = req.headers.get("x-session-id") || req.headers.get("x-smg-routing-key") || undefined;
    const prefixKey = req.headers.get(PREFIX_KEY_HEADER) || undefined;
    const inUrl = new URL(req.url);
    // Forwarded as the bytes that came in: never decoded unless a reply's verdict depends on what
    // was asked (token ids, log-probs), which only a doubtful reply does (see judgeReply).
    const body = req.method === "GET" || req.method === "HEAD" ? undefined : (read ?? (await req.arrayBuffer()));
    let requestText: string | undefined;
    const readRequest = () => (requestText ??= body && body.byteLength > 0 ? decoder.decode(body) : undefined);
    const headers = new Headers(req.headers);
    for (const h of DROP_REQUEST_HEADERS) headers.delete(h);
    // The deadline a caller's abort is judged against: its declared per-attempt deadline, or ours.
    const declared = Number(req.headers.get(DEADLINE_HEADER));
    const deadlines = [opts.attemptTimeoutMs, Number.isFinite(declared) && declared > 0 ? declared : undefined].filter((v): v is number => v !== undefined);
    const abortDeadline = deadlines.length ? Math.min(...deadlines) : undefined;
    const tried = new Set<string>();
    let lastFailure: Response | undefined;
    let lastError = "no replica configured";
    for (let attempt = 0; attempt < opts.maxAttempts; attempt++) {
      // Without a shared state the pick is synchronous: no promise, no extra turn of the event loop.
      const call = state ? await acquire(key, prefixKey, tried) : acquireLocal(key, tried);
      if (call === undefined) break;
      const replica = call.url;
      tried.add(replica);
      // The attempt deadline covers the reply up to its last byte for JSON, up to the headers for an
      // event stream (whose chunks may legitimately flow for longer).
      const deadline = opts.attemptTimeoutMs ? new AbortController() : undefined;
      let timedOut = false;
      const timer = deadline
        ? setTimeout(() => {
            timedOut = true;
            deadline.abort(new DOMException(`no reply within ${opts.attemptTimeoutMs} ms`, "TimeoutError"));
          }, opts.attemptTimeoutMs)
        : undefined;
      const signal = deadline ? AbortSignal.any([req.signal, deadline.signal]) : req.signal;
      const t0 = Date.now();
      let res: Response;
      let buf: ArrayBuffer | undefined;
      try {
        // Redirects are relayed, never followed (the caller's client fails on a 3xx).
        res = await fetchFn(joinUrl(replica, inUrl.pathname + inUrl.search), { method: req.method, headers, body, signal, redirect: "manual" });
        // A JSON reply is read whole under the attempt's deadline and the reply cap: a replica that
        // sends headers and then stalls, or sends garbage or too much, fails here, before anything reached the caller.
        if (!isEventStream(res)) buf = await readReplyLimited(res, opts.maxReplyBytes);
      } catch (e) {
        if (req.signal.aborted) {
          // The caller gave up. At (about) its deadline, with the replica still silent, that is the
          // replica's failure; earlier, it is the caller's choice.
          if (abortDeadline !== undefined && Date.now() - t0 >= 0.9 * abortDeadline) call.fail("client_abort");
          else call.release();
          return new Response(null, { status: 499 });
        }
        const kind: FailureKind = timedOut ? "timeout" : "connect";
        call.fail(kind);
        lastError = `${redactUrl(replica)}: ${kind === "timeout" ? `no reply within ${opts.attemptTimeoutMs} ms` : ((e as Error)?.message ?? String(e))}`;
        continue;
      } finally {
        clearTimeout(timer);
      }
      if (res.status >= 500) {
        call.fail("http_5xx");
        lastFailure = withReplica(new Response(buf ?? null, { status: res.status, headers: res.headers }), replica);
        lastError = `${redactUrl(replica)}: HTTP ${res.status}`;
        if (buf === undefined) await res.body?.cancel().catch(() => undefined);
        continue;
      }
      if (buf === undefined) return relayStream(res, replica, opts.maxReplyBytes, (ok) => (ok ? call.succeed(res.status < 300) : call.release()));
      const verdict = res.status < 300 ? judgeReply(inUrl.pathname, res.headers.get("content-type"), decoder.decode(buf), readRequest) : undefined;
      const problem = verdict?.problem ?? null;
      if (problem) {
        call.fail("bad_reply");
        lastError = `${redactUrl(replica)}: ${problem}`;
        lastFailure = withReplica(
          Response.json({ error: { code: "bad_reply", type: "BadGatewayError", message: `engine replica sent an unusable reply: ${lastError}` } }, { status: 502 }),
          replica,
        );
        continue;
      }
      call.succeed(res.status < 300);
      if (res.status < 300) {
        const usage = verdict?.parsed ? cacheUsageOf(inUrl.pathname, verdict.json) : cacheUsage(inUrl.pathname, buf);
        if (usage) {
          pool.noteCache(replica, usage.prompt_tokens, usage.cached_tokens);
          recordCacheUsage(replica, usage.prompt_tokens, usage.cached_tokens ?? 0);
        }
      }
      return withReplica(res, replica, buf);
    }
    if (lastFailure) return lastFailure;
    return Response.json(
      { error: { code: "no_available_workers", type: "ServiceUnavailableError", message: `no engine replica could serve the call (${lastError})` } },
      { status: 503 },
    );
  }

  /**
   * One attempt's replica and the calls that end it. With a shared state:
   * candidates are the replicas not tried yet, minus those refusing
   * connections here (all of them when that leaves none), in the rendezvous
   * order of the prefix key (else the routing key); the state picks, and the
   * outcome goes to both this pool (counters, local breaker) and the state
   * (lease released; an ejection or a recovery published).
   */
  async function acquire(key: string | undefined, prefixKey: string | undefined, tried: ReadonlySet<string>): Promise<Attempt | undefined> {
    if (state) {
      const all = pool.urls().filter((u) => !tried.has(u));
      if (all.length === 0) return undefined;
      const up = all.filter((u) => pool.stateOf(u) !== "unhealthy");
      const candidates = up.length > 0 ? up : all;
      const orderKey = prefixKey ?? key;
      const order = orderKey === undefined ? candidates : rendezvousOrder(orderKey, candidates.map((url) => ({ url }))).map((c) => c.url);
      let r: Awaited<ReturnType<RoutingState["route"]>> | undefined;
      try {
        r = await state.route({ key, order, epsilon, stickyEpsilon, stickyMinLoad: DEFAULT_STICKY_MIN_LOAD, ordered: orderKey !== undefined });
      } catch {
        stateErrors++;
      }
      // A replica removed here while the script ran: give its lease back and route in-process.
      if (r && pool.stateOf(r.url) === undefined) void state.release(r.url, r.lease).catch(() => stateErrors++);
      else if (r) {
        const routed = r;
        for (const u of order) pool.mirror(u, routed.ejected[u] ?? null);
        pool.begin(routed.url, routed.probe);
        if (routed.previous !== null && routed.previous !== routed.url) pool.countRepin(routed.previous, tried, routed.ejected[routed.previous] !== undefined);
        const recovered = routed.probe || routed.ejected[routed.url] !== undefined;
        const bg = (p: Promise<void>) => void p.catch(() => stateErrors++);
        return {
          url: routed.url,
          succeed: (served) => {
            pool.succeed(routed.url, served);
            bg(state.release(routed.url, routed.lease));
            if (recovered) bg(state.restore(routed.url));
          },
          fail: (kind) => {
            const ejected = pool.fail(routed.url, kind);
            bg(state.release(routed.url, routed.lease));
            if (ejected) bg(state.eject(routed.url, pool.status().find((s) => s.url === routed.url)?.ejected_until_ms ?? Date.now() + opts.cooldownMs));
          },
          release: () => {
            pool.release(routed.url);
            bg(state.release(routed.url, routed.lease));
            if (routed.probe) bg(state.endProbe(routed.url));
          },
        };
      }
    }
    return acquireLocal(key, tried);
  }

  /** One attempt's replica picked by this instance's own {@link ReplicaPool}. */
  function acquireLocal(key: string | undefined, tried: ReadonlySet<string>): Attempt | undefined {
    const url = pool.acquire(key, tried);
    if (url === undefined) return undefined;
    return { url, succeed: (served) => pool.succeed(url, served), fail: (kind) => void pool.fail(url, kind), release: () => pool.release(url) };
  }

  return {
    app,
    fetch: fetchGateway,
    pool,
    addReplica: (url) => pool.add(url),
    removeReplica: (url) => pool.remove(normaliseUrl(url)),
    replicas: () => pool.status(),
    checkHealth,
  };
}

/** One attempt at one replica: its URL and exactly one of the three endings. */
interface Attempt {
  url: string;
  succeed(served: boolean): void;
  fail(kind: FailureKind): void;
  release(): void;
}
