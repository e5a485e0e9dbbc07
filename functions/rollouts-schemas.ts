import type { Context, Next } from "hono";
import { z } from "zod";
import { InputError, inputErrorFromZod } from "../shared/errors.ts";
import { PolicyVersionValue } from "../shared/rollout/policy-version.ts";
import { AgentRoleName, Uid } from "../shared/schema/index.ts";

// The boundary of the rollouts API (rollouts.ts): the strict query schemas of its routes (one table the
// handlers, the OpenAPI document and the unknown-query middleware read) and its request bodies.

/** Query of `GET /v1/groups` (strict: an unknown parameter is a 400 naming it, as on every query below). */
export const GroupsQuery = z.strictObject({
  max: z.coerce.number().int().min(1).max(1000).default(16),
  block_ms: z.coerce.number().int().min(0).max(60_000).default(0),
  consumer: z.string().min(1).max(200).regex(/^[A-Za-z0-9._:-]+$/, "consumer may only hold letters, digits, '.', '_', ':' and '-'").default("trainer"),
  partition: z.enum(["train", "val"]).default("train"),
  /** Only this agent role's records in each group (groups are still delivered whole: ack them as usual). */
  agent_role: AgentRoleName.optional(),
  /** `tree`: a branch record whose parent is in the same group holds only its tokens from `branch_at` on (`tree_prompt_length` set); `leaves` (default): every record whole. */
  deliver: z.enum(["leaves", "tree"]).optional(),
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
 *   ({@link queryOf} first refuses a parameter given twice.)
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
export function queryOf<P extends QueryPath>(path: P, c: Context): z.output<(typeof QUERY_SCHEMAS)[P]> {
  const schema = QUERY_SCHEMAS[path];
  // A parameter given twice (`deliver=tree&deliver=leaves`) is refused, not read as its first value.
  const seen = new Set<string>();
  for (const name of new URL(c.req.url).searchParams.keys()) {
    if (seen.has(name)) throw new InputError(name.slice(0, 100), "given more than once; give each query parameter once");
    seen.add(name);
  }
  return parseQuery(schema, c.req.query(), Object.keys(schema.shape)) as z.output<(typeof QUERY_SCHEMAS)[P]>;
}

/**
 * Middleware: a query parameter on a route that takes none is a 400 naming
 * it (never ignored: `POST /v1/engine/pause?mode=abort` would otherwise pause
 * with the body's mode and drop the query's).
 * @throws InputError naming the first parameter.
 */
export async function refuseUnknownQuery(c: Context, next: Next): Promise<void> {
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
  delivery_ids: z.array(z.string().regex(/^\d{1,20}-\d{1,20}(@\d{1,4})?$/, "a delivery id is a stream id such as 1796002889517-0 (a sharded store's: 1796002889517-0@2)")).min(1).max(1000),
  partition: z.enum(["train", "val"]).default("train"),
});
