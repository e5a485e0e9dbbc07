import { Hono, type Context } from "hono";
import { z } from "zod";
import { AuthError, EdgeloopError, inputErrorFromZod, NotFoundError } from "../../shared/errors.ts";
import { SandboxCreateBody, SandboxHeartbeatBody, SandboxReleaseBody } from "../../shared/schema/sandbox.ts";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";
import { ToolCallRequestBody } from "../../shared/tools/webhook-tool-client.ts";
import { limitBody } from "../../functions/http-util.ts";
import { SandboxPool, type SandboxPoolOptions } from "./sandboxes.ts";
import { exampleEnvHttp } from "../openenv/example-env.ts";

/** Options of {@link createSandboxProviderApp}. */
export interface SandboxProviderAppOptions extends SandboxPoolOptions {
  /** When set, every POST must carry a valid, fresh `x-edgeloop-signature` (else 401, before the body is looked at). */
  secret?: string;
  /** Unix seconds, for signature freshness (default: the wall clock). */
  nowSeconds?: () => number;
  /** Signature window, seconds (default 300). */
  windowSeconds?: number;
  /** Largest request body accepted, bytes (default 1 MiB); larger ones are 413 before they are read. */
  maxBodyBytes?: number;
}

/** Default body limit of the example sandbox provider, bytes. */
export const DEFAULT_SANDBOX_MAX_BODY = 1024 * 1024;

/** The tools each sandbox serves (`POST /tools/<name>`). */
export const SANDBOX_TOOLS = ["sbx_write", "sbx_read"] as const;

/** The tool webhook body, read as {@link ToolCallRequestBody} but with `turn` any integer and `create_kwargs` optional (as the example tool server reads it). */
const ToolCallBody = ToolCallRequestBody.extend({
  turn: z.number().int(),
  create_kwargs: z.record(z.string(), z.unknown()).default({}),
});

/**
 * The example sandbox provider as a runtime-neutral Hono app over a
 * {@link SandboxPool} (the provider contract of shared/schema/sandbox.ts):
 * - `POST /sandboxes/create` {@link SandboxCreateBody} → `200 {sandbox_id}` (with `openenv`:
 *   `{sandbox_id, base_url}`, `base_url` = `{origin of the request}/envs/{sandbox_id}`); 409 for a released or expired lease id;
 * - `POST /sandboxes/release` {@link SandboxReleaseBody} → `200 {ok: true, sandbox_id}` (null when its create was still in progress); 404 already gone;
 * - `POST /sandboxes/heartbeat` {@link SandboxHeartbeatBody} → `200 {ok: true}`; 404 gone;
 * - `POST /tools/sbx_write` `{arguments: {path, content}}` and `POST /tools/sbx_read`
 *   `{arguments: {path}}`: tool webhooks ({@link ToolCallRequestBody}) against the
 *   state of the body's `sandbox_id` → `200 {content}`; 400 without `sandbox_id`,
 *   404 for an unknown or destroyed one;
 * - with `openenv`, `/envs/{sandbox_id}/reset`, `/step`, `/state`, `/health`, `/schema`,
 *   `/metadata`: that sandbox's own OpenEnv environment (OpenEnv's HTTP routes,
 *   infra/openenv/example-env.ts), so two sandboxes never share an episode;
 *   404 (field `sandbox_id`) once the sandbox is destroyed;
 * - `GET /stats` → {@link SandboxPool.stats}; `GET /health` → `{ok: true}`;
 *   any other route is a JSON 404.
 * A body that is not JSON or breaks its schema is 400 naming the field
 * (`body.lease_id`); with a secret, a missing, bad or stale signature is 401
 * first; bodies over `maxBodyBytes` are 413.
 */
export function createSandboxProviderApp(opts: SandboxProviderAppOptions = {}): { app: Hono; pool: SandboxPool } {
  const pool = new SandboxPool(opts);
  const now = opts.nowSeconds ?? (() => Date.now() / 1000);

  /** The request's raw body, its signature checked when a secret is set. */
  async function signed(c: Context): Promise<string> {
    const raw = await c.req.text();
    if (opts.secret && !(await verifySignature(opts.secret, c.req.header(SIGNATURE_HEADER), raw, now(), opts.windowSeconds))) {
      throw new AuthError("missing, bad or stale x-edgeloop-signature");
    }
    return raw;
  }

  /** `raw` parsed as JSON under `schema`; 400 naming the field. */
  function parse<T extends z.ZodType>(raw: string, schema: T): z.output<T> {
    let json: unknown;
    try {
      json = JSON.parse(raw);
    } catch {
      throw inputErrorFromZod("body", [{ path: [], message: "not valid JSON" }]);
    }
    const r = schema.safeParse(json);
    if (!r.success) throw inputErrorFromZod("body", r.error.issues);
    return r.data;
  }

  const app = new Hono();
  app.onError((err) => {
    if (err instanceof EdgeloopError) return err.toResponse();
    return new EdgeloopError("internal error", { cause: err }).toResponse();
  });
  app.notFound((c) => new NotFoundError(`no route ${c.req.method} ${new URL(c.req.url).pathname.slice(0, 200)}`).toResponse());
  app.get("/health", (c) => c.json({ ok: true }));
  app.get("/stats", (c) => c.json(pool.stats()));
  app.use("/sandboxes/*", limitBody(opts.maxBodyBytes ?? DEFAULT_SANDBOX_MAX_BODY));
  app.use("/tools/*", limitBody(opts.maxBodyBytes ?? DEFAULT_SANDBOX_MAX_BODY));
  app.post("/sandboxes/create", async (c) => {
    const made = await pool.create(parse(await signed(c), SandboxCreateBody), c.req.raw.signal);
    return c.json(pool.openenv ? { ...made, base_url: `${new URL(c.req.url).origin}/envs/${encodeURIComponent(made.sandbox_id)}` } : made);
  });
  // The environment's own calls are not signed: an OpenEnv client (openenv_agent) talks to it as to any OpenEnv server.
  app.use("/envs/*", limitBody(opts.maxBodyBytes ?? DEFAULT_SANDBOX_MAX_BODY));
  app.on(["GET", "POST"], "/envs/:id/:route", (c) => {
    const route = c.req.param("route");
    return exampleEnvHttp(pool.envOf(c.req.param("id"), route), c.req.raw, `/${route}`);
  });
  app.post("/sandboxes/release", async (c) => c.json({ ok: true, ...pool.release(parse(await signed(c), SandboxReleaseBody)) }));
  app.post("/sandboxes/heartbeat", async (c) => {
    pool.heartbeat(parse(await signed(c), SandboxHeartbeatBody));
    return c.json({ ok: true });
  });
  app.post("/tools/:name", async (c) => {
    const name = c.req.param("name");
    const raw = await signed(c);
    const tool = SANDBOX_TOOLS.find((t) => t === name);
    if (!tool) throw new NotFoundError(`unknown tool '${name}'; tools: ${SANDBOX_TOOLS.join(", ")}`);
    const call = parse(raw, ToolCallBody);
    if (call.name !== name) throw inputErrorFromZod("body", [{ path: ["name"], message: `'${call.name}' does not match the URL's tool '${name}'` }]);
    return c.json(pool.tool(tool, call));
  });
  return { app, pool };
}
