import { Hono } from "hono";
import { LRUCache } from "lru-cache";
import { z } from "zod";
import { AuthError, ConflictError, EdgeloopError, inputErrorFromZod, NotFoundError } from "../../shared/errors.ts";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";
import { evaluateExpression } from "./calc.ts";
import { DEFAULT_FACTS, lookupFact, type FactTable } from "./lookup.ts";

/** The body edgeloop POSTs to a webhook tool. */
export const ToolCallBody = z.object({
  call_id: z.string().min(1),
  name: z.string().min(1),
  arguments: z.record(z.string(), z.unknown()),
  key: z.string(),
  turn: z.number().int(),
  create_kwargs: z.record(z.string(), z.unknown()).default({}),
});
export type ToolCallBody = z.infer<typeof ToolCallBody>;

/** Options of {@link createToolsApp}. */
export interface ToolsAppOptions {
  /** When set, every call must carry a valid, fresh `x-edgeloop-signature` (else 401). */
  secret?: string;
  /** The `lookup` fact table (default: `infra/tools/facts.json`). */
  facts?: FactTable;
  /** Unix seconds, for signature freshness (default: the wall clock). */
  nowSeconds?: () => number;
  /** Signature window, seconds (default 300). */
  windowSeconds?: number;
  /** How many call ids to remember for deduplication (default 10 000). */
  dedupeSize?: number;
  /**
   * Milliseconds every tool call is held before it is answered (default 0),
   * to model slow tools (sandboxes, search APIs) in benchmarks. Applied after
   * the signature and body checks, to fresh calls and repeated call ids alike.
   */
  delayMs?: number;
}

type Reply = { content: string };
type Handler = (args: Record<string, unknown>) => Reply;

function stringArg(args: Record<string, unknown>, name: string): string | undefined {
  const v = args[name];
  return typeof v === "string" ? v : typeof v === "number" ? String(v) : undefined;
}

/**
 * The example tool server as a runtime-neutral Hono app:
 * - `POST /tools/calc` `{arguments: {expression}}` → the value as text
 *   (mathjs, restricted; errors come back as `Error: …` content);
 * - `POST /tools/lookup` `{arguments: {query}}` → a fact from the table;
 * - `GET /stats` → `{executions, by_tool}` (calls actually executed);
 * - `GET /health` → `{ok: true}`.
 *
 * Calls are deduplicated by `call_id`: a repeated id (a retry) gets the same
 * answer and is executed once; the same id with a different name or arguments
 * is 409. With a secret, a missing, bad or stale signature is 401 before the
 * body is looked at.
 */
export function createToolsApp(opts: ToolsAppOptions = {}): Hono {
  const facts = opts.facts ?? DEFAULT_FACTS;
  const now = opts.nowSeconds ?? (() => Date.now() / 1000);
  const handlers: Record<string, Handler> = {
    calc: (args) => {
      const expr = stringArg(args, "expression");
      if (expr === undefined) return { content: "Error: calc needs a string argument 'expression'." };
      try {
        return { content: evaluateExpression(expr) };
      } catch (e) {
        return { content: `Error: ${(e as Error).message}` };
      }
    },
    lookup: (args) => {
      const q = stringArg(args, "query");
      if (q === undefined) return { content: "Error: lookup needs a string argument 'query'." };
      return { content: lookupFact(q, facts) };
    },
  };
  const seen = new LRUCache<string, { fingerprint: string; reply: Reply }>({ max: opts.dedupeSize ?? 10_000 });
  const stats = { executions: 0, by_tool: {} as Record<string, number> };

  const app = new Hono();
  app.onError((err) => {
    if (err instanceof EdgeloopError) return err.toResponse();
    return new EdgeloopError("internal error", { cause: err }).toResponse();
  });
  app.get("/health", (c) => c.json({ ok: true }));
  app.get("/stats", (c) => c.json(stats));
  app.post("/tools/:name", async (c) => {
    const name = c.req.param("name");
    const raw = await c.req.text();
    if (opts.secret && !(await verifySignature(opts.secret, c.req.header(SIGNATURE_HEADER), raw, now(), opts.windowSeconds))) {
      throw new AuthError("missing, bad or stale x-edgeloop-signature");
    }
    const handler = handlers[name];
    if (!handler) throw new NotFoundError(`unknown tool '${name}'; tools: ${Object.keys(handlers).join(", ")}`);
    let json: unknown;
    try {
      json = JSON.parse(raw);
    } catch {
      throw inputErrorFromZod("body", [{ path: [], message: "not valid JSON" }]);
    }
    const r = ToolCallBody.safeParse(json);
    if (!r.success) throw inputErrorFromZod("body", r.error.issues);
    const call = r.data;
    if (call.name !== name) throw inputErrorFromZod("body", [{ path: ["name"], message: `'${call.name}' does not match the URL's tool '${name}'` }]);
    if (opts.delayMs && opts.delayMs > 0) await new Promise((resolve) => setTimeout(resolve, opts.delayMs));
    const fingerprint = JSON.stringify([call.name, call.arguments]);
    const prior = seen.get(call.call_id);
    if (prior) {
      if (prior.fingerprint !== fingerprint) throw new ConflictError(`call_id '${call.call_id}' was already used for a different call`);
      return c.json(prior.reply);
    }
    const reply = handler(call.arguments);
    seen.set(call.call_id, { fingerprint, reply });
    stats.executions++;
    stats.by_tool[name] = (stats.by_tool[name] ?? 0) + 1;
    return c.json(reply);
  });
  return app;
}
