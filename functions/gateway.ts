import { Hono, type Context } from "hono";
import { z } from "zod";
import { AuthError, ConfigError, EdgeloopError } from "../shared/errors.ts";
import { joinUrl, type FetchLike } from "../shared/inference/engine-http.ts";
import { createRoutingPolicy, normaliseUrl, ReplicaPool, type ReplicaStatus } from "../shared/inference/replica-pool.ts";
import type { RoutingPolicyName } from "../shared/inference/routing-policy.ts";
import { bearerAuth, limitBody } from "./http-util.ts";

/** Response header naming the replica that served a call. */
export const REPLICA_HEADER = "x-edgeloop-replica";

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
  /** Deadline of one attempt at one replica, in ms (default: none; the caller's deadline applies). */
  attemptTimeoutMs?: number;
  /** Web-standard fetch used to reach replicas (default `globalThis.fetch`). */
  fetch?: FetchLike;
  /**
   * When set, `/admin/*` needs `Authorization: Bearer <adminToken>` (compared
   * in constant time; 401 otherwise). Proxied engine calls are not affected.
   */
  adminToken?: string | null;
  /** Largest proxied request body in bytes (default 64 MiB; 413 above it). Admin bodies are capped at 64 KiB. */
  maxBodyBytes?: number;
}

/** A gateway: its Hono app plus the controls the CLI and tests use. */
export interface Gateway {
  app: Hono;
  /** `app.fetch`, bound. */
  fetch: (req: Request) => Promise<Response>;
  pool: ReplicaPool;
  /** Adds a replica at run time (also `POST /admin/replicas {"url": ...}`). */
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
  maxBodyBytes: z.number().int().positive().default(64 * 1024 * 1024),
});

const ReplicaBody = z.object({ url: z.url({ protocol: /^https?$/ }) });

/** Hop-by-hop and encoding headers that must not be forwarded as they are. */
const DROP_REQUEST_HEADERS = ["host", "connection", "content-length", "accept-encoding", "keep-alive", "transfer-encoding"];
const DROP_RESPONSE_HEADERS = ["connection", "content-length", "content-encoding", "keep-alive", "transfer-encoding"];

/**
 * The inference gateway: a runtime-neutral Hono function in front of K engine
 * replicas. Every path other than `/health` and `/admin/*` (`/v1/completions`,
 * `/generate`, `/inference/v1/generate`, `/v1/models`, ...) is proxied with its
 * body unchanged to the replica the policy picks for the call's routing key
 * (`X-Session-ID`, else `X-SMG-Routing-Key`). A call that fails before any
 * token came back (connection error or a 5xx) is retried on another replica;
 * a replica that refuses connections is marked unhealthy until a health check
 * passes. The response carries `x-edgeloop-replica: <replica url>`. With no
 * replica left it answers 503 `{"error":{"code":"no_available_workers",...}}`
 * (SMG's code, vLLM's nested shape, so the engine clients read it as unavailable).
 *
 * Admin API (bearer `adminToken` when one is set; otherwise put it behind the deployment's auth):
 * `GET /admin/replicas`, `POST /admin/replicas {"url"}`, `DELETE /admin/replicas {"url"}`.
 * `GET /health` is 200 while at least one replica is healthy, else 503.
 *
 * @throws ConfigError on invalid options
 * @see vllm-project/router and SGLang Model Gateway (wire-contracts.md §1.10, §2.6)
 */
export function createGatewayApp(options: GatewayOptions): Gateway {
  const parsed = GatewayOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const i = parsed.error.issues[0];
    throw new ConfigError(`gateway.${i?.path.join(".")}`, i?.message ?? "invalid option");
  }
  const opts = parsed.data;
  const fetchFn: FetchLike = options.fetch ?? ((input, init) => fetch(input, init));
  const pool = new ReplicaPool(opts.replicas, createRoutingPolicy(opts.policy, { epsilon: opts.epsilon, maxKeys: opts.maxStickyKeys }));
  let lastHealthCheck = Date.now();
  let healthRun: Promise<void> | undefined;

  const checkHealth = (): Promise<void> => {
    healthRun ??= Promise.all(
      pool.urls().map(async (url) => {
        let ok = false;
        try {
          const res = await fetchFn(joinUrl(url, "/health"), { signal: AbortSignal.timeout(Math.max(1_000, Math.min(opts.healthIntervalMs || 5_000, 10_000))) });
          ok = res.ok;
          await res.body?.cancel();
        } catch {
          ok = false;
        }
        pool.setHealthy(url, ok);
      }),
    ).then(() => {
      lastHealthCheck = Date.now();
      healthRun = undefined;
    });
    return healthRun;
  };

  const app = new Hono();
  app.onError((err) => {
    if (err instanceof EdgeloopError) {
      return err.toResponse(err instanceof AuthError ? { "www-authenticate": 'Bearer realm="edgeloop-gateway"' } : {});
    }
    return Response.json({ error: { code: "internal", message: "internal error" } }, { status: 500 });
  });
  app.use("/admin/*", bearerAuth(options.adminToken ?? null), limitBody(64 * 1024));
  app.use("*", limitBody(opts.maxBodyBytes));

  app.get("/health", (c) => {
    const healthy = pool.status().filter((r) => r.healthy).length;
    return c.json({ status: healthy > 0 ? "ok" : "unavailable", healthy, replicas: pool.urls().length }, healthy > 0 ? 200 : 503);
  });

  app.get("/admin/replicas", (c) => c.json({ policy: pool.policy.name, replicas: pool.status() }));
  app.post("/admin/replicas", async (c) => {
    const body = ReplicaBody.safeParse(await c.req.json().catch(() => undefined));
    if (!body.success) return c.json({ error: { code: "invalid_input", message: "url: expected an http(s) URL", field: "url" } }, 400);
    pool.add(body.data.url);
    return c.json({ replicas: pool.status() }, 201);
  });
  app.delete("/admin/replicas", async (c) => {
    const body = ReplicaBody.safeParse(await c.req.json().catch(() => undefined));
    if (!body.success) return c.json({ error: { code: "invalid_input", message: "url: expected an http(s) URL", field: "url" } }, 400);
    const removed = pool.remove(body.data.url);
    return removed ? c.json({ replicas: pool.status() }) : c.json({ error: { code: "not_found", message: `no replica ${body.data.url}` } }, 404);
  });

  app.all("/admin/*", (c) => c.json({ error: { code: "not_found", message: `no admin route ${c.req.method} ${c.req.path.slice(0, 200)}` } }, 404));

  app.all("*", async (c) => {
    if (opts.healthIntervalMs > 0 && Date.now() - lastHealthCheck >= opts.healthIntervalMs && !healthRun) {
      const run = checkHealth().catch(() => undefined);
      waitUntil(c, run);
    }
    return proxy(c.req.raw);
  });

  async function proxy(req: Request): Promise<Response> {
    const key = req.headers.get("x-session-id") || req.headers.get("x-smg-routing-key") || undefined;
    const inUrl = new URL(req.url);
    const body = req.method === "GET" || req.method === "HEAD" ? undefined : await req.arrayBuffer();
    const headers = new Headers(req.headers);
    for (const h of DROP_REQUEST_HEADERS) headers.delete(h);
    const tried = new Set<string>();
    let lastFailure: Response | undefined;
    let lastError = "no replica configured";
    for (let attempt = 0; attempt < opts.maxAttempts; attempt++) {
      const replica = pool.acquire(key, tried);
      if (replica === undefined) break;
      tried.add(replica);
      const signal = opts.attemptTimeoutMs ? AbortSignal.any([req.signal, AbortSignal.timeout(opts.attemptTimeoutMs)]) : req.signal;
      let res: Response;
      try {
        res = await fetchFn(joinUrl(replica, inUrl.pathname + inUrl.search), { method: req.method, headers, body, signal });
      } catch (e) {
        pool.release(replica, true);
        if (req.signal.aborted) return new Response(null, { status: 499 });
        // Refused or timed out: no token came back, so another replica may serve it.
        pool.setHealthy(replica, false);
        lastError = `${replica}: ${(e as Error)?.message ?? String(e)}`;
        continue;
      }
      if (res.status >= 500) {
        const text = await res.arrayBuffer().catch(() => new ArrayBuffer(0));
        pool.release(replica, true);
        lastFailure = withReplica(new Response(text, { status: res.status, headers: res.headers }), replica);
        lastError = `${replica}: HTTP ${res.status}`;
        continue;
      }
      return relay(res, replica, () => pool.release(replica));
    }
    if (lastFailure) return lastFailure;
    return Response.json(
      { error: { code: "no_available_workers", type: "ServiceUnavailableError", message: `no engine replica could serve the call (${lastError})` } },
      { status: 503 },
    );
  }

  return {
    app,
    fetch: (req) => Promise.resolve(app.fetch(req)),
    pool,
    addReplica: (url) => pool.add(url),
    removeReplica: (url) => pool.remove(normaliseUrl(url)),
    replicas: () => pool.status(),
    checkHealth,
  };
}

/** A replica's response with the replica header, hop-by-hop headers dropped. */
function withReplica(res: Response, replica: string, body: BodyInit | null = res.body): Response {
  const headers = new Headers(res.headers);
  for (const h of DROP_RESPONSE_HEADERS) headers.delete(h);
  headers.set(REPLICA_HEADER, replica);
  return new Response(body, { status: res.status, statusText: res.statusText, headers });
}

/**
 * Passes a replica's answer on and ends its in-flight count when the body is
 * done: at once for a JSON reply (read whole), at the end (or cancel) of an
 * event stream.
 */
async function relay(res: Response, replica: string, release: () => void): Promise<Response> {
  if (!res.body || !(res.headers.get("content-type") ?? "").includes("text/event-stream")) {
    try {
      const buf = res.body ? await res.arrayBuffer() : null;
      return withReplica(res, replica, buf);
    } finally {
      release();
    }
  }
  const reader = res.body.getReader();
  let released = false;
  const once = () => {
    if (!released) {
      released = true;
      release();
    }
  };
  const stream = new ReadableStream<Uint8Array>({
    async pull(ctrl) {
      try {
        const r = await reader.read();
        if (r.done) {
          once();
          ctrl.close();
        } else ctrl.enqueue(r.value);
      } catch (e) {
        once();
        ctrl.error(e);
      }
    },
    cancel(reason) {
      once();
      return reader.cancel(reason);
    },
  });
  return withReplica(res, replica, stream);
}

/** Keeps a background promise alive on workerd (`executionCtx.waitUntil`); elsewhere it just runs. */
function waitUntil(c: Context, p: Promise<unknown>): void {
  try {
    c.executionCtx.waitUntil(p);
  } catch {
    // No execution context outside workerd: the event loop keeps the promise alive.
  }
}
