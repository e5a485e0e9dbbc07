import { Hono } from "hono";
import { LRUCache } from "lru-cache";
import { z } from "zod";
import { AuthError, ConflictError, EdgeloopError, inputErrorFromZod, NotFoundError } from "../../shared/errors.ts";
import { fnv1a32, hashInt, unitFloat } from "../../shared/inference/hash.ts";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";
import { InteractionRequestBody, type InteractionReply } from "../../shared/tools/interaction-client.ts";
import { ToolCallRequestBody } from "../../shared/tools/webhook-tool-client.ts";
import { limitBody } from "../../functions/http-util.ts";
import { calcToolContent } from "./calc.ts";
import { DEFAULT_FACTS, lookupFact, type FactTable } from "./lookup.ts";

/** The body edgeloop POSTs to a webhook tool ({@link ToolCallRequestBody}), read leniently: `turn` any integer, `create_kwargs` optional. */
export const ToolCallBody = ToolCallRequestBody.extend({
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
  /** Largest request body accepted, bytes (default 1 MiB); larger ones are 413 before they are read. */
  maxBodyBytes?: number;
  /**
   * Probabilistic timeouts (chaos runs): a call times out when
   * {@link toolTimeoutDecision}(seed, call_id, attempt) says so — it is held
   * `holdMs` (default 60 000) or until the client disconnects, then answered
   * 504 without being executed. `attempt` counts the requests seen with that
   * call_id, so a retry draws again.
   */
  faultRate?: { timeouts: number; seed?: number; holdMs?: number };
  /** Called for every injected timeout (the chaos driver logs them by trajectory key). */
  onFault?: (f: ToolInjectedFault) => void;
}

/** A timeout the tool server injected. */
export interface ToolInjectedFault {
  kind: "timeout";
  call_id: string;
  /** The trajectory key the call came from. */
  key: string;
  name: string;
  /** 0-based: requests with this call_id before this one. */
  attempt: number;
}

/** Default body limit of the example tool server, bytes. */
export const DEFAULT_TOOLS_MAX_BODY = 1024 * 1024;

/**
 * The deterministic timeout function of {@link ToolsAppOptions.faultRate}:
 * true when unit(hash(seed, call_id, attempt)) < rate.
 */
export function toolTimeoutDecision(rate: number, seed: number, callId: string, attempt: number): boolean {
  return unitFloat(hashInt(hashInt(hashInt(0x51ed270b, seed), fnv1a32(callId)), attempt)) < rate;
}

/**
 * The example simulated user `gsm8k_user` (the tools file's `interactions`;
 * docs/tool-webhooks.md): reads the final answer after `####` in the last
 * assistant message and compares it with `interaction_kwargs.ground_truth`
 * (as text, trimmed, commas dropped). Right: `{terminate: true, score: 1}`.
 * Wrong or missing: `{terminate: false, score: 0}` with a user turn asking
 * the model to check its work — until `interaction_kwargs.max_turns`
 * assistant turns (default 3), then `{terminate: true, score: 0}`.
 * Stateless (everything it needs is in the request), so a retried request
 * gets the same answer. In the spirit of verl's `Gsm8kInteraction`
 * (`verl/interactions/gsm8k_interaction.py`: score 1.0 and stop when the
 * answer is right, else ask again).
 */
export function gsm8kUserReply(body: InteractionRequestBody): InteractionReply {
  const ik = body.interaction_kwargs;
  const truth = ik.ground_truth;
  if (truth === undefined || truth === null) return { terminate: true, content: "I have no reference answer for this question.", score: null };
  const maxTurns = typeof ik.max_turns === "number" && ik.max_turns >= 1 ? ik.max_turns : 3;
  const last = [...body.messages].reverse().find((m) => m.role === "assistant");
  const text = typeof last?.content === "string" ? last.content : "";
  const m = /####\s*([^\n]+)/.exec(text);
  const norm = (v: string) => v.trim().replace(/,/g, "");
  const answer = m ? norm(m[1]!) : null;
  if (answer !== null && answer === norm(String(truth))) return { terminate: true, content: "That is correct.", score: 1 };
  if (body.turn >= maxTurns) return { terminate: true, content: `That is not right; the answer is ${norm(String(truth))}.`, score: 0 };
  const what = answer === null ? "I cannot find a final answer after ####." : `${answer} is not right.`;
  return { terminate: false, content: `${what} Check your work and give the final number after ####.`, score: 0 };
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
 * - `POST /interactions/gsm8k_user` → the example simulated user
 *   ({@link gsm8kUserReply}), signed like the tools;
 * - `GET /stats` → `{executions, by_tool}` (tool calls actually executed;
 *   once a simulated user was asked, also `interactions: {name: requests}`;
 *   with a fault rate also `faults: {timeouts}`);
 * - `GET /health` → `{ok: true}`.
 *
 * Calls are deduplicated by `call_id`: a repeated id (a retry) gets the same
 * answer and is executed once; the same id with a different name or arguments
 * is 409. Bodies over `maxBodyBytes` are 413. With a secret, a missing, bad or stale signature is 401 before the
 * body is looked at.
 */
export function createToolsApp(opts: ToolsAppOptions = {}): Hono {
  const facts = opts.facts ?? DEFAULT_FACTS;
  const now = opts.nowSeconds ?? (() => Date.now() / 1000);
  const handlers: Record<string, Handler> = {
    calc: (args) => ({ content: calcToolContent(args) }),
    lookup: (args) => {
      const q = stringArg(args, "query");
      if (q === undefined) return { content: "Error: lookup needs a string argument 'query'." };
      return { content: lookupFact(q, facts) };
    },
  };
  const seen = new LRUCache<string, { fingerprint: string; reply: Reply }>({ max: opts.dedupeSize ?? 10_000 });
  const stats: { executions: number; by_tool: Record<string, number>; interactions?: Record<string, number>; faults?: { timeouts: number } } = { executions: 0, by_tool: {} };
  const users: Record<string, (body: InteractionRequestBody) => InteractionReply> = { gsm8k_user: gsm8kUserReply };
  const rate = opts.faultRate;
  if (rate) stats.faults = { timeouts: 0 };
  const attempts = new LRUCache<string, number>({ max: 100_000 });

  const app = new Hono();
  app.onError((err) => {
    if (err instanceof EdgeloopError) return err.toResponse();
    return new EdgeloopError("internal error", { cause: err }).toResponse();
  });
  app.get("/health", (c) => c.json({ ok: true }));
  app.get("/stats", (c) => c.json(stats));
  app.use("/tools/*", limitBody(opts.maxBodyBytes ?? DEFAULT_TOOLS_MAX_BODY));
  app.use("/interactions/*", limitBody(opts.maxBodyBytes ?? DEFAULT_TOOLS_MAX_BODY));
  app.post("/interactions/:name", async (c) => {
    const name = c.req.param("name");
    const raw = await c.req.text();
    if (opts.secret && !(await verifySignature(opts.secret, c.req.header(SIGNATURE_HEADER), raw, now(), opts.windowSeconds))) {
      throw new AuthError("missing, bad or stale x-edgeloop-signature");
    }
    const user = Object.hasOwn(users, name) ? users[name] : undefined;
    if (!user) throw new NotFoundError(`unknown simulated user '${name}'; simulated users: ${Object.keys(users).join(", ")}`);
    let json: unknown;
    try {
      json = JSON.parse(raw);
    } catch {
      throw inputErrorFromZod("body", [{ path: [], message: "not valid JSON" }]);
    }
    const r = InteractionRequestBody.safeParse(json);
    if (!r.success) throw inputErrorFromZod("body", r.error.issues);
    stats.interactions ??= {};
    stats.interactions[name] = (stats.interactions[name] ?? 0) + 1;
    return c.json(user(r.data));
  });
  app.post("/tools/:name", async (c) => {
    const name = c.req.param("name");
    const raw = await c.req.text();
    if (opts.secret && !(await verifySignature(opts.secret, c.req.header(SIGNATURE_HEADER), raw, now(), opts.windowSeconds))) {
      throw new AuthError("missing, bad or stale x-edgeloop-signature");
    }
    const handler = Object.hasOwn(handlers, name) ? handlers[name] : undefined;
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
    if (rate && rate.timeouts > 0) {
      const attempt = attempts.get(call.call_id) ?? 0;
      attempts.set(call.call_id, attempt + 1);
      if (toolTimeoutDecision(rate.timeouts, rate.seed ?? 0, call.call_id, attempt)) {
        stats.faults!.timeouts++;
        opts.onFault?.({ kind: "timeout", call_id: call.call_id, key: call.key, name, attempt });
        await holdUntil(rate.holdMs ?? 60_000, c.req.raw.signal);
        return c.json({ error: { code: "timeout", message: "simulated tool timeout" } }, 504);
      }
    }
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

/** Waits `ms`, or less when `signal` aborts (the client went away). */
function holdUntil(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
