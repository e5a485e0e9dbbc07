import type { Context, Hono } from "hono";
import { z } from "zod";
import { ConflictError, EdgeloopError, inputErrorFromZod } from "../shared/errors.ts";
import { normaliseUrl, type ReplicaPool } from "../shared/inference/replica-pool.ts";
import { readJson } from "./http-util.ts";

// The inference gateway's admin API (`/admin/replicas`): its bodies and routes. gateway.ts mounts the
// bearer check and body limit in front of them.

/** Largest `/admin/*` request body in bytes. */
export const ADMIN_MAX_BODY = 64 * 1024;

/** Body of `POST` and `DELETE /admin/replicas`: `{url}` and nothing else (strict). */
const ReplicaBody = z.strictObject({ url: z.url({ protocol: /^https?$/, error: "expected an http(s) URL" }) });

/**
 * Reads an admin body as {@link ReplicaBody}.
 * @throws InputError: 415 (field `content-type`) unless sent as `application/json`; 400 (field
 *   `body`) for a missing or malformed body or an unknown key; 400 (field `url`) for a bad url.
 */
async function readReplicaBody(c: Context): Promise<{ url: string }> {
  const r = ReplicaBody.safeParse(await readJson(c, ADMIN_MAX_BODY));
  if (!r.success) throw inputErrorFromZod("", r.error.issues);
  return r.data;
}

/** The 403 of `/admin/*` on a gateway started without an admin token. */
export function adminDisabled(): EdgeloopError {
  return new EdgeloopError("the gateway's admin API is off: start it with EDGELOOP_ADMIN_TOKEN set to enable /admin/* behind that bearer token", {
    status: 403,
    code: "admin_disabled",
  });
}

/** What the admin routes read of a gateway. */
export interface GatewayAdminContext {
  pool: ReplicaPool;
  /** The shared routing state as `GET /admin/replicas` shows it (`shared_state`), or null without one. */
  sharedState: () => Promise<Record<string, unknown> | null>;
  /** The per-attempt deadline in milliseconds, or null. */
  attemptTimeoutMs: number | null;
}

/**
 * Mounts `GET /admin/replicas` (policy, shared state, breaker, re-pins,
 * every replica's status), `POST /admin/replicas {"url"}` → 201 (409
 * `conflict`, field `url`, when present) and `DELETE /admin/replicas
 * {"url"}` → 200 (404 when unknown) on `app`.
 */
export function adminRoutes(app: Hono, ctx: GatewayAdminContext): void {
  app.get("/admin/replicas", async (c) => {
    return c.json({
      policy: ctx.pool.policy.name,
      shared_state: await ctx.sharedState(),
      breaker: { eject_after: ctx.pool.ejectAfter, cooldown_ms: ctx.pool.cooldownMs, attempt_timeout_ms: ctx.attemptTimeoutMs },
      repins: ctx.pool.repins,
      replicas: ctx.pool.status(),
    });
  });
  app.post("/admin/replicas", async (c) => {
    const { url } = await readReplicaBody(c);
    // Symmetric with DELETE's 404: adding is not a way to reset a replica's breaker (that stays the breaker's job).
    if (ctx.pool.stateOf(url) !== undefined) throw new ConflictError(`replica ${normaliseUrl(url)} is already present`, { field: "url" });
    ctx.pool.add(url);
    return c.json({ replicas: ctx.pool.status() }, 201);
  });
  app.delete("/admin/replicas", async (c) => {
    const { url } = await readReplicaBody(c);
    const removed = ctx.pool.remove(url);
    return removed ? c.json({ replicas: ctx.pool.status() }) : c.json({ error: { code: "not_found", message: `no replica ${url}` } }, 404);
  });
}
