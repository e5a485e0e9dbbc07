import type { AgentLoop, AgentLoopKwargs } from "../agent-loop/agent-loop.ts";
import { ToolAgentLoop, type ToolAgentData, type ToolAgentState as LoopState } from "../agent-loop/tool-agent.ts";
import { loopOutputs } from "../agent-loop/registry.ts";
import { ConflictError } from "../errors.ts";
import type { AgentLoopOutput } from "../schema/index.ts";
import { CHECKPOINT_VERSION, packOutput, parseSessionInput, SessionInput, type CheckpointDelta, type SessionCheckpoint, type SessionInputArg, type SessionPhase } from "./checkpoint.ts";
import { DeltaTracker, foldCheckpoint, restoreFoldedLoop, type FoldedLoop } from "./checkpoint-delta.ts";
import { isStaleStep, type AppendOptions, type SessionStorage } from "./session-storage.ts";
import { isStoreOutage } from "../store/store-outage.ts";
import { TrajectoryDeadline, trajectoryDeadlineAt, type Timers } from "../agent-loop/trajectory-deadline.ts";

/** What a session needs from its host. */
export interface SessionDeps {
  storage: SessionStorage;
  /**
   * Builds the agent loop for a session's input (the registry's loop for
   * `input.agent_name`, with a context built from `input.rollout` and
   * `input.model_version`, and `asyncTools` set so 202 tools are awaited).
   * `deadlineSignal` aborts (reason `TrajectoryDeadlineError`) once the
   * trajectory passes its deadline while a step runs: the loop's engine and
   * tool calls must take it (with the batch's own signal), its reward need not.
   */
  createLoop(input: SessionInput, deadlineSignal?: AbortSignal): AgentLoop;
  /**
   * Writes the finished outputs (the transfer-queue records; must be
   * idempotent per key). When given, the session writes them itself and
   * commits `done`; when absent it stops at `finished` and its owner writes
   * them, then calls {@link TrajectorySession.markDone}.
   */
  writeOutputs?(input: SessionInput, outputs: AgentLoopOutput[]): Promise<void>;
  /**
   * Post-processes a finished trajectory's outputs before they are committed
   * as `finished` (the teacher's scores: `sessionOutputFinisher`). Runs on
   * every resume that reaches the end of the loop again, never after the
   * `finished` commit (its result is checkpointed with the outputs). A throw
   * fails the session with the error's text.
   */
  finishOutputs?(input: SessionInput, outputs: AgentLoopOutput[]): Promise<AgentLoopOutput[]>;
  /** In-place retries of a commit that failed with a retryable storage error (default 3; backoff 50 ms × 4ⁱ). */
  commitRetries?: number;
  /** Epoch milliseconds (deadlines, `updated_ms`); default `Date.now()`. */
  wallClockMs?(): number;
  /** Timers (the trajectory deadline's while a step runs; a host's for waiting sessions); default the global `setTimeout`. */
  timers?: Timers;
  /** TTL of terminal (`done`/`failed`) entries, seconds (default 604 800 = 7 days). */
  terminalTtlSeconds?: number;
  /** Called after every commit with the head and the size of the delta written, in characters of JSON (benchmarks, metrics). */
  onCommit?(cp: SessionCheckpoint, bytes: number): void;
  /** Called each time {@link TrajectorySession.run} returns (waiting, finished, done, failed or thrown), to close per-run resources such as the loop's trace spans. */
  onPause?(loop: AgentLoop): void;
  /**
   * Suspends the session (`rollout.partial_rollout: carry`): once aborted, no
   * further step is committed — the commit throws {@link SessionSuspendedError}
   * and the session stays at its last committed step, to be resumed from
   * there by a later run of the same key.
   */
  suspend?: AbortSignal;
}

/** Thrown by a commit of a session whose {@link SessionDeps.suspend} signal fired: nothing was written. */
export class SessionSuspendedError extends Error {
  override name = "SessionSuspendedError";
}

/** Where a {@link TrajectorySession.run} stopped. */
export type SessionOutcome =
  /** `deadline_ms`: when to run the session again (epoch ms): the earliest awaited call's deadline or the trajectory's, whichever is first. */
  | { status: "waiting"; deadline_ms: number | null }
  | {
      status: "finished";
      outputs: AgentLoopOutput[];
      /** The session was already `finished` when opened: an earlier owner may have written the records before it died. */
      resumed: boolean;
    }
  | { status: "done" }
  | { status: "failed"; error: string };

/** A tool result delivered by callback (`POST /v1/sessions/{key}/tool-results`). */
export interface ToolResultDelivery {
  call_id: string;
  content: string;
  reward?: number | null;
  /** false: the tool reports a failure; `content` is its error text (counted in `extra_fields.tool_errors`). Default true. */
  ok?: boolean;
  /** The tool's metrics for this call (`extra_fields.tool_metrics`). */
  metrics?: Record<string, unknown> | null;
}

const DEFAULT_TERMINAL_TTL = 7 * 24 * 3600;

/**
 * One trajectory's agent loop as a sequence of committed steps (DESIGN §4.4).
 *
 * After every state transition — the prompt built, a generation returned and
 * appended, the tool calls of a turn issued (their `call_id`s are
 * `{key}:{turn}:{index}`, fixed by the committed turn counter), a callback
 * received, an observation appended — the run state's delta (new token
 * chunks, new messages, counters, pending calls, metrics, model versions) is
 * appended to {@link SessionStorage} before anything else happens: a commit
 * costs O(turn), and a session is the fold of its deltas. A session
 * opened on a key with a checkpoint resumes from its last committed step: a
 * generation that was in flight is re-issued with the same prompt ids, issued
 * tool calls are re-sent with the same `call_id`s (tools dedupe on them),
 * calls awaiting a callback keep waiting (their deadlines are stored), and a
 * step is never appended twice because the appended state and the next state
 * are one commit. Loops other than `tool_agent` (and its subclasses) cannot
 * stop mid-way: they run whole, and a resumed one runs again from the start.
 *
 * Not safe for concurrent use: a host keeps one instance per key and
 * serialises calls (the storage's step fence refuses a second owner's commit).
 */
export class TrajectorySession {
  readonly key: string;
  readonly input: SessionInput;
  private cp: SessionCheckpoint;
  private readonly deps: SessionDeps;
  private readonly loop: AgentLoop;
  private data: ToolAgentData | undefined;
  private readonly inputJson: string | undefined;
  private readonly openedFinished: boolean;
  private readonly tracker = new DeltaTracker();
  private readonly deadline: TrajectoryDeadline;

  private constructor(deps: SessionDeps, input: SessionInput, cp: SessionCheckpoint, inputJson: string | undefined) {
    this.deps = deps;
    this.key = input.key;
    this.input = input;
    // The deadline is fixed at the first start and travels in every commit; a checkpoint written before it existed
    // gets one from now (its first resume).
    if (cp.trajectory_deadline_ms === undefined) cp.trajectory_deadline_ms = trajectoryDeadlineAt(input.rollout, (deps.wallClockMs ?? Date.now)());
    this.cp = cp;
    this.inputJson = inputJson;
    this.openedFinished = cp.phase === "finished";
    this.deadline = new TrajectoryDeadline({ key: input.key, atMs: cp.trajectory_deadline_ms, ...(deps.wallClockMs ? { wallClockMs: () => deps.wallClockMs!() } : {}), ...(deps.timers ? { timers: deps.timers } : {}) });
    this.loop = deps.createLoop(input, this.deadline.signal);
  }

  /**
   * Opens the session of `key`: resumes its stored checkpoint, or — when none
   * is stored and `input` is given — creates it (nothing is stored until the
   * first commit). Returns null for an unknown key without `input`.
   * @throws StoreError when the stored checkpoint or input is malformed or of another version.
   */
  static async open(key: string, deps: SessionDeps, input?: SessionInputArg): Promise<TrajectorySession | null> {
    const stored = await deps.storage.get(key);
    if (stored?.deltas.length && stored.input) {
      const inp = parseSessionInput(JSON.parse(stored.input), key);
      const folded = foldCheckpoint(stored.deltas, key);
      const s = new TrajectorySession(deps, inp, folded.cp, undefined);
      s.restore(folded.loop);
      return s;
    }
    if (!input) return null;
    const inp = SessionInput.parse(input);
    if (inp.key !== key) throw new ConflictError(`session input key '${inp.key}' does not match '${key}'`);
    const cp: SessionCheckpoint = {
      v: CHECKPOINT_VERSION,
      key,
      step: stored?.step ?? -1,
      phase: "running",
      agent_name: inp.agent_name,
      loop_state: "pending",
      loop: null,
      outputs: null,
      error: null,
      deadline_ms: null,
      updated_ms: 0,
    };
    const s = new TrajectorySession(deps, inp, cp, JSON.stringify(inp));
    if (!(s.loop instanceof ToolAgentLoop)) s.cp.loop_state = "whole";
    else {
      try {
        s.data = s.loop.initData(inp.sampling_params, inp.kwargs as AgentLoopKwargs);
      } catch (e) {
        s.cp.phase = "failed";
        s.cp.error = errorText(e);
      }
    }
    return s;
  }

  /** The last committed (or, before the first commit, initial) checkpoint. */
  get checkpoint(): Readonly<SessionCheckpoint> {
    return this.cp;
  }

  get phase(): SessionPhase {
    return this.cp.phase;
  }

  /** Call ids awaiting a callback, with their deadlines (epoch ms). */
  awaitedCalls(): { call_id: string; name: string; deadline_ms: number }[] {
    const out: { call_id: string; name: string; deadline_ms: number }[] = [];
    for (const r of this.data?.toolResults ?? []) if (r && "awaiting" in r) out.push({ call_id: r.call_id, name: r.name, deadline_ms: r.deadline_ms });
    return out;
  }

  /**
   * Advances the session until it waits for callbacks, finishes or fails,
   * committing after every transition. In `waiting`, calls past their
   * deadline are first turned into error results. With `writeOutputs`, a
   * finished session writes its records and commits `done`.
   * @throws ConflictError when another owner committed a newer step; StoreError when storage fails.
   */
  async run(): Promise<SessionOutcome> {
    this.deadline.start();
    try {
      return await this.advance();
    } finally {
      this.deadline.stop();
      this.deps.onPause?.(this.loop);
    }
  }

  /** The trajectory's deadline (epoch ms of the session's wall clock), fixed at its first start; null: none. */
  get trajectoryDeadlineMs(): number | null {
    return this.cp.trajectory_deadline_ms ?? null;
  }

  /**
   * Past the trajectory's deadline, ends a `tool_agent` run at once with what
   * the checkpoint holds (no handler runs: no engine or tool call) and
   * commits it; false when the deadline has not passed or the loop cannot
   * end here (loops that run whole end through their signal; a run whose
   * prompt was never built goes on to its first step, which ends it).
   */
  private async endIfPastDeadline(): Promise<boolean> {
    const d = this.data;
    if (!this.deadline.passed || !d?.builder || !(this.loop instanceof ToolAgentLoop) || this.cp.loop_state === "terminated") return false;
    this.loop.endByDeadline(d, this.trajectoryDeadlineMs ?? undefined);
    await this.commit("running", "terminated");
    return true;
  }

  private async advance(): Promise<SessionOutcome> {
    for (;;) {
      switch (this.cp.phase) {
        case "done":
          return { status: "done" };
        case "failed":
          // A row that failed before its first step (bad prompt) is committed once, so a rerun sees it.
          if (this.cp.step < 0) await this.commit("failed", this.cp.loop_state);
          return { status: "failed", error: this.cp.error ?? "failed" };
        case "finished": {
          const outputs = this.cp.outputs ?? [];
          if (!this.deps.writeOutputs) return { status: "finished", outputs, resumed: this.openedFinished };
          await this.deps.writeOutputs(this.input, outputs);
          await this.markDone();
          return { status: "done" };
        }
        case "waiting": {
          const d = this.data!;
          const loop = this.loop as ToolAgentLoop;
          if (await this.endIfPastDeadline()) continue;
          if (loop.expireToolCalls(d, this.wall()) > 0) {
            await this.commit("running", "awaiting_tools");
            continue;
          }
          const next = loop.nextToolDeadline(d);
          if (next !== null && !loop.hasAwaitedTasks(d)) return { status: "waiting", deadline_ms: Math.min(next, this.trajectoryDeadlineMs ?? next) };
          this.cp.phase = "running";
          continue;
        }
        case "running":
          if (await this.endIfPastDeadline()) continue;
          await this.step();
      }
    }
  }

  /**
   * Records a callback's result for an awaited call and commits it (the
   * caller then calls {@link run}).
   * @throws ConflictError (409) when the session waits for no tools, no call of its
   *   current round has `call_id`, that call was already answered (or timed out),
   *   or it runs as an MCP task (polled, never delivered).
   */
  async deliverToolResult(r: ToolResultDelivery): Promise<void> {
    if (!(this.loop instanceof ToolAgentLoop) || !this.data || this.cp.loop_state !== "awaiting_tools") {
      throw new ConflictError(`session '${this.key}' is not waiting for tool results (state ${this.cp.phase}/${this.cp.loop_state})`, { field: "call_id" });
    }
    const res = this.loop.deliverToolResult(this.data, r.call_id, { content: r.content, reward: r.reward, ...(r.ok !== undefined ? { ok: r.ok } : {}), metrics: r.metrics ?? null }, this.wall());
    if (res === "unknown") throw new ConflictError(`session '${this.key}' has no tool call '${r.call_id}'`, { field: "call_id" });
    if (res === "answered") throw new ConflictError(`tool call '${r.call_id}' was already answered`, { field: "call_id" });
    if (res === "task") throw new ConflictError(`tool call '${r.call_id}' runs as an MCP task: its result is read from the MCP server, not delivered`, { field: "call_id" });
    await this.commit("running", "awaiting_tools");
  }

  /** Commits `done` once the finished outputs' records are written (owner-written mode); a no-op when already done. */
  async markDone(): Promise<void> {
    if (this.cp.phase === "done") return;
    this.data = undefined;
    await this.commit("done", this.cp.loop_state, { outputs: null });
  }

  private async step(): Promise<void> {
    const loop = this.loop;
    if (!(loop instanceof ToolAgentLoop)) {
      let outputs: AgentLoopOutput[];
      try {
        outputs = loopOutputs(this.input.agent_name, await loop.run(this.input.sampling_params, this.input.kwargs as AgentLoopKwargs));
        if (this.deps.finishOutputs) outputs = await this.deps.finishOutputs(this.input, outputs);
      } catch (e) {
        await this.commit("failed", "whole", { error: errorText(e) });
        return;
      }
      await this.commit("finished", "whole", { outputs });
      return;
    }
    const d = this.data!;
    const state = this.cp.loop_state as LoopState;
    let next: LoopState;
    let output: AgentLoopOutput | undefined;
    try {
      if (state === "terminated") {
        output = await loop.finishData(d);
        if (this.deps.finishOutputs) output = (await this.deps.finishOutputs(this.input, [output]))[0];
      } else next = await loop.advance(state, d);
    } catch (e) {
      await this.commit("failed", state, { error: errorText(e) });
      return;
    }
    if (output) {
      await this.commit("finished", "terminated", { outputs: [output] });
      return;
    }
    // Awaited MCP tasks are polled by the next step, so the session runs on instead of waiting for a callback.
    const waiting = next! === "awaiting_tools" && loop.nextToolDeadline(d) !== null && !loop.hasAwaitedTasks(d);
    await this.commit(waiting ? "waiting" : "running", next!);
  }

  private async commit(phase: SessionPhase, loopState: string, extra: Partial<Pick<SessionCheckpoint, "outputs" | "error">> = {}): Promise<void> {
    if (this.deps.suspend?.aborted) throw new SessionSuspendedError(`session '${this.key}' was suspended at step ${this.cp.step}`);
    const terminal = phase === "done" || phase === "failed";
    const d = this.data;
    const keep = !(terminal || phase === "finished" || !d);
    // Only what changed is written: the loop's delta while it runs; null once its state is dropped.
    const loop = keep ? this.tracker.delta(d!) : this.cp.loop === null && this.cp.step >= 0 ? undefined : null;
    const delta: CheckpointDelta = {
      v: CHECKPOINT_VERSION,
      key: this.key,
      step: this.cp.step + 1,
      phase,
      agent_name: this.cp.agent_name,
      loop_state: loopState,
      ...(loop !== undefined ? { loop } : {}),
      ...(extra.outputs !== undefined ? { outputs: extra.outputs === null ? null : extra.outputs.map(packOutput) } : {}),
      error: extra.error !== undefined ? extra.error : this.cp.error,
      deadline_ms: d && this.loop instanceof ToolAgentLoop ? this.loop.nextToolDeadline(d) : null,
      trajectory_deadline_ms: this.cp.trajectory_deadline_ms ?? null,
      updated_ms: this.wall(),
    };
    const next: SessionCheckpoint = {
      ...this.cp,
      ...delta,
      loop: loop ?? null,
      outputs: extra.outputs !== undefined ? extra.outputs : this.cp.outputs,
    };
    const json = JSON.stringify(delta);
    await this.append(next.step, json, {
      // The input is stored with the first commit only; storage keeps the first one it got.
      ...(this.inputJson !== undefined && this.cp.step < 0 ? { input: this.inputJson } : {}),
      ...(terminal ? { ttlSeconds: this.deps.terminalTtlSeconds ?? DEFAULT_TERMINAL_TTL } : {}),
    });
    this.cp = next;
    this.tracker.accept(keep ? d : undefined);
    if (terminal || phase === "finished") this.data = undefined;
    this.deps.onCommit?.(next, json.length);
  }

  /**
   * Appends a delta, retrying a retryable storage failure in place (the
   * work behind the delta — a generation, a tool call — is in memory; a
   * retry of the whole step would redo it): `commitRetries` times for a
   * retryable error, and for as long as the store is unreachable (backoff
   * capped at 5 s). A retry after a failure whose write did land is
   * recognised by reading the stored delta back.
   */
  private async append(step: number, json: string, opts: AppendOptions): Promise<void> {
    const retries = this.deps.commitRetries ?? 3;
    for (let attempt = 0; ; attempt++) {
      try {
        await this.deps.storage.append(this.key, step, json, opts);
        return;
      } catch (e) {
        if (attempt > 0 && isStaleStep(e)) {
          const stored = await this.deps.storage.get(this.key);
          if (stored?.step === step && stored.deltas[stored.deltas.length - 1] === json) return;
        }
        // A store outage is waited out here, with the step's work in memory, for as long as it lasts.
        if ((e as { retryable?: unknown }).retryable !== true || (attempt >= retries && !isStoreOutage(e))) throw e;
        await new Promise((r) => setTimeout(r, Math.min(50 * 4 ** attempt, 5_000)));
      }
    }
  }

  private restore(folded: FoldedLoop | null): void {
    const loop = this.loop;
    if (this.cp.phase === "done" || this.cp.phase === "failed" || this.cp.phase === "finished") return;
    if (!(loop instanceof ToolAgentLoop)) {
      this.cp.loop_state = "whole";
      return;
    }
    this.data = folded ? restoreFoldedLoop(loop, folded, this.input) : loop.initData(this.input.sampling_params, this.input.kwargs as AgentLoopKwargs);
    if (folded) this.tracker.accept(this.data);
  }

  private wall(): number {
    return (this.deps.wallClockMs ?? Date.now)();
  }
}

function errorText(e: unknown): string {
  if (e instanceof Error) return e.name && e.name !== "Error" ? `${e.name}: ${e.message}` : e.message;
  return String(e);
}
