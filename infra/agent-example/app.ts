import { Hono } from "hono";
import { LRUCache } from "lru-cache";
import { AgentTask } from "../../shared/agent-gateway/task.ts";
import { AuthError, ConfigError, EdgeloopError, inputErrorFromZod } from "../../shared/errors.ts";
import { SIGNATURE_HEADER, verifySignature } from "../../shared/tools/signature.ts";
import { limitBody } from "../../functions/http-util.ts";
import { runCalculatorAgent, type AgentFetch, type CalculatorAgentResult } from "./agent.ts";

/** Options of {@link createAgentApp}. */
export interface AgentAppOptions {
  /** When set, every task must carry a valid, fresh `x-edgeloop-signature` (else 401); null/absent: none checked. */
  secret?: string | null;
  /** The fetch the agents use for the model and the finish call (default: the global fetch). */
  fetch?: AgentFetch;
  /** {@link runCalculatorAgent}'s `maxSteps` (default 8). */
  maxSteps?: number;
  /** Unix seconds, for signature freshness (default: the wall clock). */
  nowSeconds?: () => number;
  /** Signature window, seconds (default 300). */
  windowSeconds?: number;
  /** How many finished task keys to remember for deduplication (default 10 000; running keys are always kept). */
  dedupeSize?: number;
  /** Largest task body accepted, bytes (default 1 MiB); larger ones are 413. */
  maxBodyBytes?: number;
  /** Called when a run ends: its result, or the error it threw (a failed finish). Default: errors are logged to stderr. */
  onDone?: (key: string, outcome: { result: CalculatorAgentResult } | { error: unknown }) => void;
}

/** The example agent's webhook: the Hono app plus what a server needs to drain it. */
export interface AgentApp {
  app: Hono;
  /** Runs in progress. */
  readonly running: number;
  /** Aborts every run in progress (each still finishes its session with `metadata.error`). */
  abortAll(reason?: string): void;
  /** Resolves when no run is in progress. */
  idle(): Promise<void>;
}

/** Default of {@link AgentAppOptions.maxBodyBytes}. */
export const DEFAULT_AGENT_MAX_BODY = 1024 * 1024;

/**
 * The example agent's webhook as a runtime-neutral Hono app (served by
 * `infra/agent-example/server.ts` on Bun):
 * - `POST /tasks` an {@link AgentTask} → `202 {accepted: true, key}` at once;
 *   {@link runCalculatorAgent} runs in the background (under workerd it is
 *   handed to `executionCtx.waitUntil`). Tasks are deduplicated on `key`
 *   (edgeloop delivers at least once): a key already running or finished is
 *   answered `202 {accepted: true, key, duplicate: true}` and not run again.
 *   With a secret, a missing, bad or stale signature is 401 before the body is
 *   parsed; a body that is not JSON or not a task is 400 naming the field
 *   (`body`, `body.base_url`, …); over `maxBodyBytes` is 413.
 * - `GET /health` → `200 {ok: true, running}`.
 * @throws ConfigError when `maxSteps` is not an integer >= 1.
 */
export function createAgentApp(opts: AgentAppOptions = {}): AgentApp {
  if (opts.maxSteps !== undefined && (!Number.isInteger(opts.maxSteps) || opts.maxSteps < 1)) {
    throw new ConfigError("agent.max_steps", `must be an integer >= 1, got ${opts.maxSteps}`);
  }
  const now = opts.nowSeconds ?? (() => Date.now() / 1000);
  const onDone =
    opts.onDone ??
    ((key, outcome) => {
      if ("error" in outcome) console.error(`agent-example: task '${key}': ${outcome.error instanceof Error ? outcome.error.message : String(outcome.error)}`);
    });
  const running = new Map<string, { controller: AbortController; done: Promise<void> }>();
  const finished = new LRUCache<string, true>({ max: opts.dedupeSize ?? 10_000 });

  const app = new Hono();
  app.onError((err) => {
    if (err instanceof EdgeloopError) return err.toResponse();
    return new EdgeloopError("internal error", { cause: err }).toResponse();
  });
  app.get("/health", (c) => c.json({ ok: true, running: running.size }));
  app.use("/tasks", limitBody(opts.maxBodyBytes ?? DEFAULT_AGENT_MAX_BODY));
  app.post("/tasks", async (c) => {
    const raw = await c.req.text();
    if (opts.secret && !(await verifySignature(opts.secret, c.req.header(SIGNATURE_HEADER), raw, now(), opts.windowSeconds))) {
      throw new AuthError("missing, bad or stale x-edgeloop-signature");
    }
    let json: unknown;
    try {
      json = JSON.parse(raw);
    } catch {
      throw inputErrorFromZod("body", [{ path: [], message: "not valid JSON" }]);
    }
    const r = AgentTask.safeParse(json);
    if (!r.success) throw inputErrorFromZod("body", r.error.issues);
    const task = r.data;
    if (running.has(task.key) || finished.has(task.key)) return c.json({ accepted: true, key: task.key, duplicate: true }, 202);
    const controller = new AbortController();
    const done = runCalculatorAgent(task, { fetch: opts.fetch, maxSteps: opts.maxSteps, signal: controller.signal }).then(
      (result) => settle(task.key, { result }),
      (error: unknown) => settle(task.key, { error }),
    );
    running.set(task.key, { controller, done });
    try {
      c.executionCtx.waitUntil(done);
    } catch {
      // No execution context outside workerd: the server process keeps the run alive.
    }
    return c.json({ accepted: true, key: task.key }, 202);
  });

  function settle(key: string, outcome: { result: CalculatorAgentResult } | { error: unknown }): void {
    running.delete(key);
    finished.set(key, true);
    try {
      onDone(key, outcome);
    } catch (e) {
      console.error(`agent-example: onDone for '${key}' threw: ${e instanceof Error ? e.message : String(e)}`);
    }
  }

  return {
    app,
    get running() {
      return running.size;
    },
    abortAll(reason = "the agent server is stopping") {
      for (const r of running.values()) r.controller.abort(new Error(reason));
    },
    async idle() {
      while (running.size > 0) await Promise.allSettled([...running.values()].map((r) => r.done));
    },
  };
}
