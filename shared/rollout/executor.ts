import { checkOutputCount, DEFAULT_SESSION_LIMITS, SessionCallLimiter } from "../agent-loop/session-limits.ts";
import { runAgentLoop, type AgentLoopRegistry } from "../agent-loop/index.ts";
import type { AgentLoop, AgentLoopContext } from "../agent-loop/agent-loop.ts";
import type { GenerateRequest, InferenceClient } from "../inference/types.ts";
import { GatedClient, type EngineGate, type GateAdmission } from "../inference/engine-control.ts";
import type { AgentLoopOutput, RolloutConfig, SamplingParams, TokenOutput, TrajectoryRecord } from "../schema/index.ts";
import type { SessionInput } from "../session/checkpoint.ts";
import type { SessionHost } from "../session/session-host.ts";
import type { TransferQueue } from "../store/types.ts";
import { TrajectoryTracer } from "./trajectory-tracer.ts";
import { outputOfRecord, routedExpertsFields, type BatchPlan, type PlannedTrajectory } from "./batch.ts";
import { waitForAdmission, type Admission } from "./policy-version.ts";
import { TrajectoryCarriedError, type TrajectoryExecutor } from "./batch-run.ts";
import { BatchCancelledError, SurplusCancelledError } from "./batch-types.ts";
import { sandboxKwargsOf, type LeaseReleaseReason, type SandboxLeases } from "../tools/sandbox-leases.ts";
import { SessionSuspendedError } from "../session/trajectory-session.ts";
import { isStaleStep } from "../session/session-storage.ts";
import { scoreWithTeacher, type TeacherClientFactory } from "./teacher-scoring.ts";
import { eitherSignal, isDeadlineAbort, TrajectoryDeadline, trajectoryDeadlineAt, type Timers } from "../agent-loop/trajectory-deadline.ts";

/** What the agent loops of a process share: built once at start-up. */
export interface ExecutorDeps extends Omit<AgentLoopContext, "config" | "client" | "signal"> {
  registry: AgentLoopRegistry;
  client: InferenceClient;
  /** The deployment's pause gate (`POST /v1/engine/pause`): no engine call of a loop starts while it is closed. */
  gate?: EngineGate;
  /** The teacher clients of `rollout.teacher` (on-policy distillation); absent where none can run. */
  teacher?: TeacherClientFactory;
  /** Milliseconds between admission re-checks while a trajectory is held by `rollout.max_staleness` (default 50; memory policies wake at once). */
  admissionPollMs?: number;
  /**
   * Milliseconds a session run by another owner may commit no step before
   * this process resumes it ({@link TrajectoryExecutor.awaitOwner}; default
   * {@link DEFAULT_OWNER_STALL_MS}). Above the longest a live owner spends
   * on one step: an engine call plus a tool call with their timeouts.
   */
  ownerStallMs?: number;
  /**
   * The sandboxes of the tools file's `sandbox` lifecycle (its tools are
   * already a {@link LeasedToolExecutor} over them): each trajectory's lease is
   * released when its run ends (`finished`, `failed`, `cancelled`, `surplus`,
   * `deadline`), and only detached when its session is carried or owned by
   * another process.
   */
  leases?: SandboxLeases;
  /**
   * Timers of the in-process path's trajectory deadlines (`rollout.trajectory_deadline_s`, counted from each run's
   * start, after admission, on {@link wallClockMs}); default the global `setTimeout`.
   * Durable sessions take theirs from `SessionDeps.timers`.
   */
  timers?: Timers;
  /** Epoch milliseconds of the in-process path's trajectory deadlines (default `asyncTools.wallClockMs`, else `Date.now`). */
  wallClockMs?: () => number;
}

/** Default {@link ExecutorDeps.ownerStallMs}: 10 minutes, above the default engine (600 s) and tool timeouts. */
export const DEFAULT_OWNER_STALL_MS = 600_000;

/**
 * Admission of a fresh trajectory under `rollout.max_staleness` (policy
 * `admit`): waits until the bound holds (see {@link waitForAdmission}); null
 * when no bound applies.
 */
function admit(deps: ExecutorDeps, rollout: RolloutConfig, signal?: AbortSignal): Promise<Admission | null> {
  if (!deps.policy || rollout.staleness_policy !== "admit" || rollout.max_staleness == null) return Promise.resolve(null);
  return waitForAdmission(deps.policy, rollout.max_staleness, { ...(signal ? { signal } : {}), pollMs: deps.admissionPollMs ?? 50 });
}

/** Outputs with `extra_fields.admission` (how the trajectory was admitted) when it was. */
function withAdmission(outputs: AgentLoopOutput[], a: Admission | null): AgentLoopOutput[] {
  if (!a) return outputs;
  return outputs.map((o) => ({ ...o, extra_fields: { ...o.extra_fields, admission: a } }));
}

/** Per registry (one per process): the cancellation signal of each session key a {@link createSessionExecutor} runs, read by {@link sessionLoopFactory}. */
const sessionSignals = new WeakMap<object, Map<string, AbortSignal>>();
function signalsOf(deps: ExecutorDeps): Map<string, AbortSignal> {
  let m = sessionSignals.get(deps.registry);
  if (!m) sessionSignals.set(deps.registry, (m = new Map()));
  return m;
}

/**
 * The sampling parameters of a batch: `rollout.{temperature, top_p, top_k}`
 * for training, `rollout.val_kwargs` for validation batches (verl); a
 * validation batch with `val_kwargs.do_sample: false` (the default) is greedy:
 * temperature 0, top_p 1, top_k -1, whatever val_kwargs' own values (verl's
 * vLLM rollout replaces the sampling kwargs so when `meta_info.do_sample` is
 * false, which its trainer sets from `val_kwargs.do_sample`); log-probs
 * per `calculate_log_probs`. With `rollout.seed` set, each trajectory gets its
 * own seed derived from (seed, row, session), so the `n` sessions of a prompt
 * differ while a rerun repeats them. With `partial_rollout: carry` the seed
 * comes from (seed, uid, session) instead of the row's position, so a row
 * carried into the next batch at another position samples as it would have.
 */
export function samplingParamsFor(rollout: RolloutConfig, validate: boolean, t?: Pick<PlannedTrajectory, "row_index" | "session_id"> & { uid?: string }): SamplingParams {
  // verl: a validation batch with `val_kwargs.do_sample: false` decodes greedily whatever val_kwargs' temperature says.
  const greedy = validate && !rollout.val_kwargs.do_sample;
  const src = greedy ? GREEDY : validate ? rollout.val_kwargs : rollout;
  const pos = rollout.partial_rollout === "carry" && t?.uid !== undefined ? fnv1a(t.uid) % 1_000_003 : (t?.row_index ?? 0);
  const seed = rollout.seed === undefined || !t ? undefined : (rollout.seed * 1_000_003 + pos * 9_973 + t.session_id) % 2_147_483_647;
  return {
    temperature: src.temperature,
    top_p: src.top_p,
    top_k: src.top_k,
    logprobs: rollout.calculate_log_probs,
    ...(seed === undefined ? {} : { seed }),
  };
}

/** Greedy decoding as verl sends it for `do_sample: false` (`temperature: 0, top_p: 1.0, top_k: -1`). */
const GREEDY = { temperature: 0, top_p: 1, top_k: -1 } as const;

/** FNV-1a over a string's UTF-16 code units: a stable 32-bit hash. */
function fnv1a(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193) >>> 0;
  return h;
}

/** A signal that fires only when `signal` is aborted to carry the trajectory ({@link TrajectoryCarriedError}). */
function carrySignal(signal: AbortSignal | undefined): AbortSignal | undefined {
  if (!signal) return undefined;
  const c = new AbortController();
  signal.addEventListener("abort", () => signal.reason instanceof TrajectoryCarriedError && c.abort(signal.reason), { once: true });
  return c.signal;
}

/**
 * Stamps every call's output, when the engine does not report a version,
 * with the policy version current when the call was sent (`POST
 * /v1/model-version`, read before the call is sent) or, when none was set, the batch's `model_version`.
 */
class VersionStampingClient implements InferenceClient {
  constructor(
    private readonly inner: InferenceClient,
    private readonly version: () => Promise<string | number | null>,
  ) {}
  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const v = await this.version();
    const out = await this.inner.generate(req);
    if (out.extra_fields?.model_version != null) return out;
    if (v == null) return out;
    return { ...out, extra_fields: { ...out.extra_fields, model_version: v } };
  }
  maxModelLen(): Promise<number | undefined> {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
  servableLength(contextLen: number): number {
    return this.inner.servableLength ? this.inner.servableLength(contextLen) : contextLen;
  }
}

/**
 * The engine client of a batch's loops (and of the agent gateway, with
 * `batchVersion` null): gated by the deployment's pause gate (outermost, so
 * the version is read once the gate let the call through), stamping call
 * versions (the policy's current one, else `batchVersion`; no stamping when
 * neither can exist). The version is read per call, after the call was
 * dispatched and before it is sent: from the gate's admission when the gate
 * reads it ({@link GateAdmission}: no round trip), else from
 * `policy.current()` (uncached) — either way ordered after every
 * `POST /v1/model-version` that returned, at any process, before the dispatch.
 */
export function versionStampedClient(deps: Pick<ExecutorDeps, "client" | "gate" | "policy">, batchVersion: string | number | null): InferenceClient {
  const policy = deps.policy;
  if (!policy && batchVersion == null) return deps.gate ? new GatedClient(deps.client, deps.gate) : deps.client;
  const version = async (admission?: GateAdmission) => {
    if (!policy) return batchVersion;
    const cur = admission?.policy !== undefined ? admission.policy : await policy.current();
    return cur?.version ?? batchVersion;
  };
  // Behind a gate, the gated client stamps (the version read after admission, the call marked sent once it went out).
  return deps.gate ? new GatedClient(deps.client, deps.gate, { version }) : new VersionStampingClient(deps.client, version);
}

/**
 * A {@link TrajectoryExecutor} that routes each row to its agent loop
 * (`agent_name`, absent/null → `default_agent_loop`) and runs it with the
 * row's fields plus `uid`, `session_id`, `global_steps` and the key.
 * Each run's engine client and tools are wrapped by a {@link TrajectoryTracer}
 * (turn, `inference.generate` and `tool.call` spans under the active
 * `agent_loop.run`; tool-call latencies returned as `toolLatenciesMs`).
 */
export function createAgentExecutor(
  deps: ExecutorDeps,
  rollout: RolloutConfig,
  batch: { model_version: string | number | null; validate: boolean },
): TrajectoryExecutor {
  const client = versionStampedClient(deps, batch.model_version);
  const { registry, ...shared } = deps;
  return {
    agentNameFor: (t) => t.row?.agent_name ?? rollout.agent.default_agent_loop,
    async run(t: PlannedTrajectory, plan: BatchPlan, signal?: AbortSignal) {
      const row = t.row!;
      const agentName = registry.resolve(row.agent_name, rollout.agent.default_agent_loop);
      const admission = await admit(deps, rollout, signal);
      const tracer = new TrajectoryTracer(t.key);
      const limits = shared.sessionLimits ?? DEFAULT_SESSION_LIMITS;
      // The deadline counts from here (admitted: the trajectory starts); the loop's calls take the batch's signal and it.
      const wall = deps.wallClockMs ?? deps.asyncTools?.wallClockMs ?? Date.now;
      const deadline = new TrajectoryDeadline({ key: t.key, atMs: trajectoryDeadlineAt(rollout, wall()), wallClockMs: wall, ...(signal ? { parent: signal } : {}), ...(deps.timers ? { timers: deps.timers } : {}) });
      deadline.start();
      const ctx: AgentLoopContext = {
        ...shared,
        client: new SessionCallLimiter(tracer.client(client), t.key, limits),
        ...(shared.tools ? { tools: tracer.tools(shared.tools) } : {}),
        config: rollout,
        ...(deadline.atMs !== null ? { signal: deadline.signal, scoreSignal: signal ?? neverAborts() } : signal ? { signal } : {}),
      };
      const leases = deps.leases;
      let ended: { outputs?: AgentLoopOutput[]; error?: unknown } = {};
      const loopSignal = deadline.atMs !== null ? deadline.signal : signal;
      try {
        if (leases?.spec.create === "start") await leases.ensure(t.key, sandboxKwargsOf(row), { fresh: true, ...(loopSignal ? { signal: loopSignal } : {}) });
        const loopOutputs = await runAgentLoop(registry, ctx, samplingParamsFor(rollout, plan.validate, t), {
          ...row,
          uid: t.uid,
          session_id: t.session_id,
          global_steps: plan.global_steps,
          key: t.key,
        });
        checkOutputCount(t.key, loopOutputs.length, limits);
        const outputs = await scoreWithTeacher(loopOutputs, { teacher: rollout.teacher, ...(deps.teacher ? { clients: deps.teacher } : {}), key: t.key, ...(signal ? { signal } : {}) });
        ended = { outputs };
        return { agentName, outputs: withSandbox(withAdmission(outputs, admission), leases?.leaseOf(t.key)), toolLatenciesMs: tracer.toolLatenciesMs };
      } catch (e) {
        ended = { error: e };
        throw e;
      } finally {
        deadline.dispose();
        tracer.end();
        // The trajectory's run is over whatever happened: its sandbox goes (a failed release is left to the reaper).
        if (leases) await leases.release(t.key, releaseReasonOf(ended, loopSignal)).catch(() => false);
      }
    },
  };
}

/**
 * Builds the loop of a durable session from its stored input alone (the
 * batch's rollout config and policy version travel in the input), with
 * asynchronous tools enabled: what {@link SessionHost} needs as `createLoop`.
 * The loop's calls are aborted by the batch's signal (the executor's run)
 * and by the session's `deadlineSignal` (its trajectory deadline); its reward
 * only by the batch's.
 */
export function sessionLoopFactory(deps: ExecutorDeps): (input: SessionInput, deadlineSignal?: AbortSignal) => AgentLoop {
  const { registry, ...shared } = deps;
  const stamped = new Map<string | number | null, InferenceClient>();
  return (input, deadlineSignal) => {
    const client = stamped.get(input.model_version) ?? versionStampedClient(deps, input.model_version);
    stamped.set(input.model_version, client);
    const name = registry.resolve(input.agent_name, input.rollout.agent.default_agent_loop);
    // Turns, engine calls and tool calls of a session are traced like the in-process path's;
    // the session ends the open turn span when a run pauses (SessionDeps.onPause = endLoopTrace).
    const tracer = new TrajectoryTracer(input.key);
    const batchSignal = signalsOf(deps).get(input.key);
    // The loop's calls stop on the batch's cancel/surplus or the session's deadline; its reward only on the former.
    const signal = eitherSignal(batchSignal, deadlineSignal);
    const loop = registry.create(name, {
      ...shared,
      ...(signal ? { signal } : {}),
      ...(batchSignal || deadlineSignal ? { scoreSignal: batchSignal ?? neverAborts() } : {}),
      client: new SessionCallLimiter(tracer.client(client), input.key, shared.sessionLimits ?? DEFAULT_SESSION_LIMITS),
      ...(shared.tools ? { tools: tracer.tools(shared.tools) } : {}),
      config: input.rollout,
      asyncTools: shared.asyncTools ?? {},
    });
    loopTracers.set(loop, tracer);
    return loop;
  };
}

const loopTracers = new WeakMap<AgentLoop, TrajectoryTracer>();

/**
 * A signal that never aborts: the reward signal of a loop whose only signal is its deadline. Made on first use:
 * workerd refuses an AbortController built in global scope.
 */
let never: AbortSignal | undefined;
function neverAborts(): AbortSignal {
  return (never ??= new AbortController().signal);
}

/**
 * What a durable session does with its finished outputs before it commits
 * them (`SessionDeps.finishOutputs`): the teacher's scores
 * ({@link scoreWithTeacher}, per the session input's `rollout.teacher`).
 * Pass it with {@link sessionLoopFactory} wherever sessions are hosted.
 */
export function sessionOutputFinisher(deps: ExecutorDeps): (input: SessionInput, outputs: AgentLoopOutput[]) => Promise<AgentLoopOutput[]> {
  return (input, outputs) => {
    checkOutputCount(input.key, outputs.length, deps.sessionLimits ?? DEFAULT_SESSION_LIMITS);
    const signal = signalsOf(deps).get(input.key);
    return scoreWithTeacher(outputs, { teacher: input.rollout.teacher ?? null, ...(deps.teacher ? { clients: deps.teacher } : {}), key: input.key, ...(signal ? { signal } : {}) });
  };
}

/** Ends the open turn span of a session loop made by {@link sessionLoopFactory}: pass it as `SessionDeps.onPause`. */
export function endLoopTrace(loop: AgentLoop): void {
  loopTracers.get(loop)?.end();
}

/**
 * A {@link TrajectoryExecutor} that runs each trajectory as a durable session
 * on `host` (DESIGN §4.4): its checkpoints survive the process, so rerunning
 * the same batch (same row `uid`s, hence keys) after a crash resumes every
 * unfinished trajectory where it stopped. A trajectory whose records were
 * already written (session `done`, or `finished` by an owner that died right
 * after writing) is not run again: every record of its session is read back
 * from `store` (`sessionRecords`) and handed to the batch, whose writes are
 * then skipped by {@link sessionCompletingQueue}.
 */
export function createSessionExecutor(
  deps: ExecutorDeps,
  host: SessionHost,
  store: TransferQueue,
  rollout: RolloutConfig,
  batch: { model_version: string | number | null; validate: boolean },
): TrajectoryExecutor {
  const { registry } = deps;
  return {
    agentNameFor: (t) => t.row?.agent_name ?? rollout.agent.default_agent_loop,
    discard: (t) => host.drop(t.key),
    async awaitOwner(t: PlannedTrajectory, signal?: AbortSignal) {
      const stallMs = deps.ownerStallMs ?? DEFAULT_OWNER_STALL_MS;
      let step: number | null | undefined;
      let movedAt = Date.now();
      for (let waitMs = 50; ; waitMs = Math.min(waitMs * 2, 2_000)) {
        if (signal?.aborted) throw signal.reason ?? new Error("aborted");
        // A failed read (a store outage) concludes nothing: no records, the step unread; the stall clock runs on.
        const seen = await Promise.all([store.sessionRecords(t.uid, t.session_id), host.stepOf(t.key)]).catch(() => null);
        if (seen?.[0]) return seen[0];
        if (seen && seen[1] !== step) (step = seen[1]), (movedAt = Date.now());
        if (Date.now() - movedAt >= stallMs) return null;
        await new Promise((r) => setTimeout(r, Math.min(waitMs, stallMs)));
      }
    },
    run(t: PlannedTrajectory, plan: BatchPlan, signal?: AbortSignal) {
      return runSession(t, plan, signal, false);
    },
  };

  async function runSession(t: PlannedTrajectory, plan: BatchPlan, signal: AbortSignal | undefined, rerun: boolean): Promise<{ agentName: string; outputs: AgentLoopOutput[] }> {
    const row = t.row!;
    const agentName = registry.resolve(row.agent_name, rollout.agent.default_agent_loop);
    // Admission holds only a trajectory not started yet: a stored session (a resume) goes on.
    const fresh = deps.policy && rollout.staleness_policy === "admit" && rollout.max_staleness != null ? (await host.status(t.key)) === null : false;
    const admission = fresh ? await admit(deps, rollout, signal) : null;
    const signals = signalsOf(deps);
    if (signal) signals.set(t.key, signal);
    const leases = deps.leases;
    if (leases?.spec.create === "start") {
      const stored = await host.status(t.key);
      if (stored === null) {
        // A session with nothing stored yet gets its sandbox now.
        await leases.ensure(t.key, sandboxKwargsOf(row), { fresh: true, ...(signal ? { signal } : {}) }).catch(async (e: unknown) => {
          await leases.release(t.key, releaseReasonOf({ error: e }, signal)).catch(() => false);
          throw e;
        });
      } else if (stored.phase === "running" || stored.phase === "waiting") {
        // A resumed one adopts its lease (refreshed from here on); a lease lost meanwhile is the next tool call's to
        // judge (it knows whether the trajectory saw a result from that sandbox). A finished, done or failed session
        // runs no tool again: its records are read back, and its sandbox (released by the owner that finished it) is
        // not asked for — asking failed finished trajectories whose owner died after the release as sandbox_lost.
        await leases.ensure(t.key, sandboxKwargsOf(row), { fresh: false, ...(signal ? { signal } : {}) }).catch(() => undefined);
      }
    }
    const r = await host
      .run(
        {
      key: t.key,
      agent_name: agentName,
      sampling_params: samplingParamsFor(rollout, plan.validate, t),
      kwargs: { ...row, uid: t.uid, session_id: t.session_id, global_steps: plan.global_steps, key: t.key },
        rollout,
        model_version: batch.model_version,
        },
        // Carried at the end of an over-sampled batch: stop at the last committed step, resumed by the next batch.
        rollout.partial_rollout === "carry" ? { suspend: carrySignal(signal) } : {},
      )
      .catch(async (e: unknown) => {
        if (leases) {
          // Carried, or run by another owner now: the lease stays with the session; anything else ends the trajectory here.
          if (e instanceof SessionSuspendedError || isStaleStep(e) || signal?.reason instanceof TrajectoryCarriedError) leases.detach(t.key);
          else await leases.release(t.key, releaseReasonOf({ error: e }, signal)).catch(() => false);
        }
        throw e;
      })
      .finally(() => {
        if (signals.get(t.key) === signal) signals.delete(t.key);
      });
    // The sandbox it ran in: held here, or (a session resumed after its owner died, no tool call since) the store's record.
    const lease = leases ? await leases.sandboxOf(t.key).catch(() => undefined) : undefined;
    if (leases) await leases.release(t.key, releaseReasonOf(r.status === "failed" ? { error: r.error } : { outputs: r.status === "finished" ? r.outputs : [] }, signal)).catch(() => false);
    if (r.status === "finished" && !r.resumed) return { agentName, outputs: withSandbox(withAdmission(r.outputs, admission), lease) };
    if (r.status === "failed") throw new Error(r.error);
    // Done, or finished by an owner that died around its writes: the records (0…k) may already be stored.
    const recs = await store.sessionRecords(t.uid, t.session_id);
    if (!recs && r.status === "finished") return { agentName, outputs: withSandbox(r.outputs, lease) };
    if (recs && r.status === "finished") await host.markDone(t.key);
    if (!recs) {
      // Done, yet its records are gone: the store lost them (a restart without persistence, an eviction) after the
      // session was marked done — a done checkpoint keeps no outputs. Nothing of it survives to hand back, so the
      // trajectory is sampled again from the start (once), rather than stored failed or waited for forever.
      if (rerun) throw new Error(`session '${t.key}' is done but its records are not in the transfer queue (twice: the store keeps losing them)`);
      await host.drop(t.key);
      return runSession(t, plan, signal, true);
    }
    const failed = recs.find((x) => x.error !== null);
    if (failed) throw new Error(failed.error!);
    return { agentName: recs[0]?.agent_name ?? agentName, outputs: recs.map(outputOfRecord) };
  }
}


/** Outputs with `extra_fields.sandbox: {lease_id, sandbox_id}` (the sandbox their tool calls ran in) when the trajectory held a lease. */
export function withSandbox(outputs: AgentLoopOutput[], lease: { lease_id: string; sandbox_id: string } | undefined): AgentLoopOutput[] {
  if (!lease) return outputs;
  return outputs.map((o) => ({ ...o, extra_fields: { ...o.extra_fields, sandbox: { lease_id: lease.lease_id, sandbox_id: lease.sandbox_id } } }));
}


/**
 * The lease release reason of a trajectory whose run ended with `ended` (its
 * outputs, or what it threw) under `signal`. The batch's stop wins over what
 * the run returned (a loop aborted mid-turn returns its partial output):
 * `surplus` for a surplus stop or a carry, `cancelled` for a batch cancel;
 * then `deadline` when an output ended by the deadline or the signal was
 * aborted by it ({@link isDeadlineAbort}), `finished` for outputs,
 * `cancelled` for any other abort, `failed` for an error.
 */
export function releaseReasonOf(ended: { outputs?: readonly { extra_fields?: Record<string, unknown> }[]; error?: unknown }, signal?: AbortSignal): LeaseReleaseReason {
  const r: unknown = signal?.aborted ? signal.reason : undefined;
  if (r instanceof SurplusCancelledError || r instanceof TrajectoryCarriedError) return "surplus";
  if (r instanceof BatchCancelledError) return "cancelled";
  if (ended.outputs) return ended.outputs.some((o) => o.extra_fields?.terminated_by === "deadline") ? "deadline" : "finished";
  if (isDeadlineAbort(signal)) return "deadline";
  if (signal?.aborted) return "cancelled";
  return "failed";
}
