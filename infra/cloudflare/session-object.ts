import type { Hono } from "hono";
import { flushSpans, workerTelemetry } from "./telemetry.ts";
import { createAgentGatewayApp } from "../../functions/agent-gateway.ts";
import { createSessionsApp } from "../../functions/sessions.ts";
import { AgentGateway } from "../../shared/agent-gateway/agent-gateway.ts";
import type { AgentGatewayLink } from "../../shared/agent-gateway/openai-agent-loop.ts";
import { NotFoundError } from "../../shared/errors.ts";
import { sessionLoopFactory, sessionOutputFinisher, endLoopTrace, versionStampedClient, releaseReasonOf, withSandbox } from "../../shared/rollout/executor.ts";
import type { AgentLoopOutput } from "../../shared/schema/index.ts";
import { LeasedToolExecutor, sandboxKwargsOf, type SandboxLeases } from "../../shared/tools/sandbox-leases.ts";
import { LEASE_ENTRY, REAPER_ENTRY, reaperPass, SANDBOX_REAPER_NAME, waitingAlarmAt, wakeReaper } from "./sandbox-alarm.ts";
import { SessionInput } from "../../shared/session/checkpoint.ts";
import { queueWriter } from "../../shared/rollout/session-records.ts";
import { TrajectorySession, type SessionDeps } from "../../shared/session/trajectory-session.ts";
import type { DurableObjectState, DurableObjectStorage } from "./cf-types.ts";
import { AGENT_ENTRY_PREFIX, DurableObjectSessionStorage, readMany, SQLITE_BACKEND_VALUE_BYTES, writeMany } from "./do-session-storage.ts";
import { toParts } from "../../shared/session/value-parts.ts";
import { isStoreOutage } from "../../shared/store/store-outage.ts";
import { describeModelId, sameModel } from "../../shared/models/model-id.ts";
import { workerRuntime, workerSandboxLeases, type Env } from "./env.ts";

/**
 * A durable trajectory session as a Cloudflare Durable Object (one object per
 * trajectory key, `idFromName(key)`), on SQLite-backed storage:
 * - `POST /start` with a {@link SessionInput}: stores it and sets an alarm
 *   for now; returns `202` at once (the worker does not wait for trajectories).
 * - `alarm()`: runs the session's committed steps (checkpoints in the
 *   object's storage); a session waiting for tool callbacks re-arms the alarm
 *   for its earliest deadline and returns — it holds no CPU and may be
 *   evicted; a finished session writes its record to the transfer queue
 *   (Upstash) and commits `done`; a failed one writes a failed record. Either
 *   way the object then deletes its storage `store.retention.sessions`
 *   seconds later (EDGELOOP_CONFIG; default 7 days), by alarm
 *   ({@link scheduleExpiry}, {@link expireIfDue}).
 * - `POST /v1/sessions/{key}/tool-results`, `GET /v1/sessions/{key}`: the
 *   sessions function, answered by the object that owns the session.
 * - `POST /v1/sessions/{key}/openai/v1/chat/completions`,
 *   `GET /v1/sessions/{key}/openai/v1/models`, `POST /v1/sessions/{key}/finish`:
 *   the agent gateway function (functions/agent-gateway.ts) for the
 *   trajectory's agent session (the agent session key is the trajectory
 *   key). One {@link AgentGateway} per object instance, on the object's own
 *   storage (entries prefixed {@link AGENT_ENTRY_PREFIX}, apart from the
 *   trajectory's); the `openai_agent` loop run by `alarm()` uses the same
 *   instance, so an agent's finish wakes it in-process.
 * - Sandbox leases (a `sandbox` block in `EDGELOOP_TOOLS`): the object holds
 *   its trajectory's lease (created on first use or at start), heartbeats it
 *   while its loop runs and by alarm while it waits, and releases it once
 *   when the trajectory is finished or failed; the object named
 *   {@link SANDBOX_REAPER_NAME} runs the deployment's reaper passes by alarm
 *   (infra/cloudflare/sandbox-alarm.ts; docs/environments.md).
 *
 * An outgoing fetch (engine, tools) does not hold the input gate, so every
 * operation is serialised on an in-memory chain as well: one at a time, as in
 * the in-process host. Agent-gateway calls are not on that chain (the
 * gateway serialises per key itself): an `openai_agent` loop holds the chain
 * for its whole run, waiting (timers, fetch: the input gate is open) for the
 * agent's calls, which must be answered meanwhile.
 * @see https://developers.cloudflare.com/durable-objects/api/ (storage, alarms) and https://developers.cloudflare.com/durable-objects/reference/glossary/ (input gate)
 */
export class TrajectorySessionObject {
  private chain: Promise<unknown> = Promise.resolve();
  private readonly storage: DurableObjectSessionStorage;
  /** Alarms in a row that met a store outage (resets on success; lost on eviction, which only shortens the next delay). */
  private outageRetries = 0;
  /** The agent gateway of this instance and its HTTP app, built on first use (one per instance: the loop and the agent's calls share it). */
  private agent: Promise<{ link: AgentGatewayLink; app: Hono }> | undefined;
  /** This object's sandbox leases (null: the tools file has no `sandbox` block), built on first use; it holds at most its trajectory's lease. */
  private leases: SandboxLeases | null | undefined;
  /** Work started by the leases' observer (recording a granted lease, waking the reaper), awaited before an alarm ends. */
  private pending: Promise<unknown>[] = [];
  /** The outputs the trajectory finished with in this instance (for the release reason: `deadline` or `finished`). */
  private ended: AgentLoopOutput[] | undefined;

  constructor(
    private readonly ctx: DurableObjectState,
    private readonly env: Env,
  ) {
    this.storage = new DurableObjectSessionStorage(ctx.storage, { maxValueBytes: doValueBytes(env) });
  }

  async fetch(req: Request): Promise<Response> {
    const telemetry = workerTelemetry(this.env);
    try {
      return await this.handle(req);
    } finally {
      await flushSpans(telemetry);
    }
  }

  private async handle(req: Request): Promise<Response> {
    const url = new URL(req.url);
    if (req.method === "POST" && url.pathname === "/sandbox-reaper") {
      const rt = await workerRuntime(this.env);
      if (rt.sandbox) await this.serial(() => wakeReaper(this.ctx.storage, rt.sandbox!.spec, Date.now()));
      return new Response(null, { status: 204 });
    }
    if (req.method === "POST" && url.pathname === "/start") {
      const input = SessionInput.parse(await req.json());
      await this.serial(async () => {
        if (!(await this.ctx.storage.get("start"))) {
          // The input holds the row, which may be larger than one value (a 2 MB prompt): stored in parts.
          const parts = toParts(JSON.stringify(input), doValueBytes(this.env), "utf16").map((p) => p.slice(1));
          const entries: Record<string, unknown> = { start: parts.length };
          parts.forEach((p, j) => (entries[`start:${j}`] = p));
          await writeMany(this.ctx.storage, entries);
          await this.ctx.storage.setAlarm(Date.now());
        }
      });
      return Response.json({ key: input.key }, { status: 202 });
    }
    if (isAgentGatewayPath(url.pathname)) return (await this.agentGateway()).app.fetch(req);
    const rt = await workerRuntime(this.env);
    const app = createSessionsApp({
      secret: rt.secret,
      apiToken: this.env.EDGELOOP_API_TOKEN || null,
      backend: {
        deliver: (key, result) =>
          this.serial(async () => {
            const s = await this.open(key);
            if (!s) throw new NotFoundError(`no session '${key.slice(0, 200)}'`, { field: "key" });
            await s.deliverToolResult(result);
            await this.ctx.storage.setAlarm(Date.now());
          }),
        status: (key) =>
          this.serial(async () => {
            const s = await this.open(key);
            if (!s) return null;
            const cp = s.checkpoint;
            return { phase: cp.phase, step: cp.step, loop_state: cp.loop_state, deadline_ms: cp.deadline_ms, awaited: s.awaitedCalls() };
          }),
      },
    });
    return app.fetch(req);
  }

  /**
   * Runs the session until it waits, finishes or fails. A throw makes the
   * runtime retry the alarm (at-least-once, but only 6 times): a store outage
   * is therefore not thrown but waited out by re-arming the alarm with capped
   * backoff ({@link outageAlarmDelayMs}), for as long as the store is
   * unreachable — the committed work (a finished session's outputs included)
   * is kept in the object's storage meanwhile.
   */
  async alarm(): Promise<void> {
    const telemetry = workerTelemetry(this.env);
    try {
      await this.runAlarm();
      this.outageRetries = 0;
    } catch (e) {
      const delay = outageAlarmDelayMs(e, this.outageRetries);
      if (delay === null) throw e;
      this.outageRetries++;
      await this.ctx.storage.setAlarm(Date.now() + delay);
    } finally {
      // The loop's spans (turns, engine and tool calls) leave before the alarm ends.
      await flushSpans(telemetry);
    }
  }

  private async runAlarm(): Promise<void> {
    try {
      await this.serial(() => this.runSessionAlarm());
    } finally {
      const pending = this.pending.splice(0);
      await Promise.all(pending);
    }
  }

  private async runSessionAlarm(): Promise<void> {
    if ((await this.ctx.storage.get(REAPER_ENTRY)) !== undefined) {
      const leases = await this.sandboxLeases();
      if (leases) await reaperPass(this.ctx.storage, leases, Date.now);
      return;
    }
    if ((await expireIfDue(this.ctx.storage, Date.now())) !== "live") return;
    const start = await this.ctx.storage.get<number | string>("start");
    if (start === undefined) return;
    const startJson = typeof start === "string" ? start : (await readMany(this.ctx.storage, Array.from({ length: start }, (_, j) => `start:${j}`), "start")).join("");
    const input = SessionInput.parse(JSON.parse(startJson));
    const s = await this.open(input.key, input);
    if (!s) return;
    let outcome: Awaited<ReturnType<TrajectorySession["run"]>>;
    // Submitted with another model (a Worker of another deployment): refused, not run (N4).
    const own = (await workerRuntime(this.env)).model;
    const mismatch = input.model && !sameModel(input.model, own) ? input.model : null;
    const leases = await this.sandboxLeases();
    let stopHeartbeat: (() => void) | undefined;
    try {
      if (mismatch) {
        outcome = { status: "failed", error: `model mismatch: session ${input.key} was submitted with model ${describeModelId(mismatch)}, this Durable Object runs ${describeModelId(own)}; refused, not run` };
        console.error(outcome.error);
      } else {
        if (leases && (s.checkpoint.phase === "running" || s.checkpoint.phase === "waiting")) {
          const kwargs = sandboxKwargsOf(input.kwargs as { extra_info?: unknown });
          if (await this.ctx.storage.get(LEASE_ENTRY)) {
            // Held before this instance (evicted between alarms): attach the store's live lease and refresh it now.
            // A lease lost meanwhile is not replaced here: the trajectory's next call into the sandbox fails on it.
            await leases.ensure(input.key, kwargs, { fresh: false }).then(() => leases.heartbeatOnce()).catch(() => undefined);
          } else if (leases.spec.create === "start") {
            await leases.ensure(input.key, kwargs, { fresh: s.checkpoint.step < 0 });
          }
          // Heartbeats while the loop runs in this alarm (ttl_s / 3); between alarms the alarm itself is the heartbeat.
          stopHeartbeat = leases.start({ reaper: false, onError: () => undefined });
        }
        outcome = await s.run();
      }
    } catch (e) {
      stopHeartbeat?.();
      // A retryable failure (store or engine briefly down) is the runtime's to retry: the alarm
      // runs again from the last commit. Anything else would fail the same way on every retry —
      // and each retry would redo the uncommitted work — so the trajectory fails now, once.
      if ((e as { retryable?: unknown }).retryable === true) throw e;
      outcome = { status: "failed", error: e instanceof Error ? `${e.name}: ${e.message}` : String(e) };
    }
    stopHeartbeat?.();
    if (outcome.status === "waiting") {
      const rt = await workerRuntime(this.env);
      const at = waitingAlarmAt(outcome.deadline_ms, leases?.leaseOf(input.key) !== undefined, rt.sandbox?.spec ?? null, Date.now());
      if (at !== null) await this.ctx.storage.setAlarm(at);
      return;
    }
    // The trajectory is over (its record is written, or it failed): its sandbox is released, once across every
    // retry of this alarm (the store's claim has one winner); a release the provider keeps refusing is the reaper's.
    if (leases) await leases.release(input.key, outcome.status === "failed" ? "failed" : this.ended ? releaseReasonOf({ outputs: this.ended }) : "finished").catch(() => false);
    if (outcome.status === "failed") {
      const rt = await workerRuntime(this.env);
      const info = (input.kwargs as Record<string, unknown>).trajectory_info;
      await rt.queue.markFailed(input.key, outcome.error, {
        agent_name: input.agent_name,
        data_source: String((input.kwargs as Record<string, unknown>).data_source ?? "unknown"),
        extra_fields: { ...(info ? { trajectory_info: info } : {}), ...(mismatch ? { model_mismatch: { batch: mismatch, worker: own } } : {}) },
        model: mismatch ?? own,
      });
      await s.markDone();
    }
    // Done or failed: the object's storage goes `store.retention.sessions` seconds from now.
    const rt = await workerRuntime(this.env);
    await scheduleExpiry(this.ctx.storage, Date.now(), rt.config.store.retention.sessions);
  }

  private async open(key: string, input?: SessionInput): Promise<TrajectorySession | null> {
    const rt = await workerRuntime(this.env);
    const { link } = await this.agentGateway();
    const leases = await this.sandboxLeases();
    const tools = leases && rt.deps.tools ? new LeasedToolExecutor(rt.deps.tools, leases) : rt.deps.tools;
    const finish = sessionOutputFinisher(rt.deps);
    const finishOutputs = async (i: SessionInput, outputs: AgentLoopOutput[]) => {
      const scored = await finish(i, outputs);
      this.ended = scored;
      // As on Bun: a record whose tool calls ran in a sandbox carries extra_fields.sandbox {lease_id, sandbox_id}.
      return withSandbox(scored, leases?.leaseOf(i.key));
    };
    const deps: SessionDeps = { storage: this.storage, createLoop: sessionLoopFactory({ ...rt.deps, ...(tools ? { tools } : {}), agentGateway: link }), finishOutputs, onPause: endLoopTrace, writeOutputs: queueWriter(rt.queue, rt.model) };
    return TrajectorySession.open(key, deps, input);
  }

  /**
   * This object's {@link SandboxLeases} (null without a `sandbox` block in
   * `EDGELOOP_TOOLS`), over the runtime's shared lease store. When a create
   * of its trajectory succeeds, the object records {@link LEASE_ENTRY} (so an
   * evicted instance's next alarm re-attaches and heartbeats the lease) and
   * wakes the deployment's reaper object ({@link SANDBOX_REAPER_NAME}).
   */
  private async sandboxLeases(): Promise<SandboxLeases | null> {
    if (this.leases !== undefined) return this.leases;
    const rt = await workerRuntime(this.env);
    if (!rt.sandbox) return (this.leases = null);
    const leases = workerSandboxLeases(rt.sandbox, {
      created: () => void this.pending.push(this.leaseGranted()),
      createFailed: () => undefined,
      released: () => undefined,
    });
    return (this.leases ??= leases);
  }

  private async leaseGranted(): Promise<void> {
    await this.ctx.storage.put(LEASE_ENTRY, true);
    await this.env.SESSIONS.get(this.env.SESSIONS.idFromName(SANDBOX_REAPER_NAME))
      .fetch("https://session/sandbox-reaper", { method: "POST" })
      .then((r) => r.body?.cancel())
      .catch((e: unknown) => console.error(`edgeloop: sandbox reaper not woken: ${(e as Error)?.message ?? String(e)}`));
  }

  /**
   * This instance's agent gateway (built once: a second instance would not
   * see the first one's finish in-process), on the object's storage under
   * {@link AGENT_ENTRY_PREFIX}, with the isolate's tokenizer and engine
   * client, and the link `openai_agent` runs with (public URL and webhook
   * from `EDGELOOP_PUBLIC_URL`, `EDGELOOP_AGENT_*`).
   */
  private agentGateway(): Promise<{ link: AgentGatewayLink; app: Hono }> {
    if (!this.agent) {
      const built = workerRuntime(this.env).then((rt) => {
        const gateway = new AgentGateway({
          storage: new DurableObjectSessionStorage(this.ctx.storage, { maxValueBytes: doValueBytes(this.env), prefix: AGENT_ENTRY_PREFIX }),
          tokenizer: rt.deps.tokenizer,
          client: versionStampedClient(rt.deps, null),
          ...(rt.deps.maxModelLen ? { maxModelLen: rt.deps.maxModelLen } : {}),
          modelName: rt.config.engine.model ?? rt.deps.tokenizer.name,
          ...(rt.deps.sessionLimits ? { limits: rt.deps.sessionLimits } : {}),
        });
        const link: AgentGatewayLink = { gateway, publicUrl: () => rt.publicUrl, agent: rt.agent };
        return { link, app: createAgentGatewayApp({ gateway }) };
      });
      built.catch(() => {
        if (this.agent === built) this.agent = undefined;
      });
      this.agent = built;
    }
    return this.agent;
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.chain.then(fn, fn);
    this.chain = next.catch(() => {});
    return next;
  }
}

/**
 * Milliseconds until the next alarm when one failed with `e` after `retries`
 * outage re-arms in a row, or null when `e` is not a store outage (then the
 * runtime's own alarm retries apply). 1 s doubling, capped at 30 s, without
 * a limit on the count: an outage of any length is waited out.
 */
export function outageAlarmDelayMs(e: unknown, retries: number): number | null {
  if (!isStoreOutage(e)) return null;
  return Math.min(1_000 * 2 ** Math.min(retries, 10), 30_000);
}

/** Storage entry of a finished session's object: epoch ms at which its storage is deleted ({@link expireIfDue}). */
export const EXPIRE_AT_ENTRY = "expire_at";

/**
 * Marks a finished (done or failed) session's object for deletion
 * `retentionSeconds` after `nowMs` and arms its alarm for then (the alarm of
 * a finished session has nothing else to do). Idempotent: a later call moves
 * the time.
 * @see https://developers.cloudflare.com/durable-objects/api/alarms/ (one alarm per object; setAlarm replaces it)
 */
export async function scheduleExpiry(storage: DurableObjectStorage, nowMs: number, retentionSeconds: number): Promise<number> {
  const at = nowMs + retentionSeconds * 1000;
  await storage.put(EXPIRE_AT_ENTRY, at);
  await storage.setAlarm(at);
  return at;
}

/**
 * The first thing an alarm does: `live` for a session not marked by
 * {@link scheduleExpiry}; `expired` when its time has come — then every
 * entry of the object (trajectory and agent session) is deleted
 * (`deleteAll`) and the alarm cleared; `waiting` when an alarm came early
 * (re-armed for the expiry time).
 * @see https://developers.cloudflare.com/durable-objects/api/storage-api/ (deleteAll)
 */
export async function expireIfDue(storage: DurableObjectStorage, nowMs: number): Promise<"live" | "expired" | "waiting"> {
  const at = await storage.get<number>(EXPIRE_AT_ENTRY);
  if (at === undefined) return "live";
  if (nowMs < at) {
    await storage.setAlarm(at);
    return "waiting";
  }
  await storage.deleteAll();
  await storage.deleteAlarm();
  return "expired";
}

/** Whether `path` is one of the agent gateway's routes (`/v1/sessions/{key}/openai/…`, `…/anthropic/…`, `/v1/sessions/{key}/finish`). */
export function isAgentGatewayPath(path: string): boolean {
  return /^\/v1\/sessions\/[^/]+\/(openai\/|anthropic\/|finish$)/.test(path);
}

/** `EDGELOOP_DO_MAX_VALUE_BYTES`, or the SQLite backend's bound. */
function doValueBytes(env: Env): number {
  const n = Number(env.EDGELOOP_DO_MAX_VALUE_BYTES || 0);
  return n >= 1024 ? n : SQLITE_BACKEND_VALUE_BYTES;
}
