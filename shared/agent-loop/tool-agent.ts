import { InputError, ToolError } from "../errors.ts";
import { sandboxKwargsOf } from "../tools/sandbox-leases.ts";
import { hasMultimodalContent, type AgentLoopMetrics, type AgentLoopOutput, type ChatMessage, type FinishReason, type MultiModal, type SamplingParams, type TokenOutput, type ToolSchema } from "../schema/index.ts";
import type { ObservationEncoder } from "../tokens/observation.ts";
import { buildPromptIds } from "../tokens/prompt.ts";
import { TrajectoryBuilder } from "../tokens/trajectory-builder.ts";
import type { InteractionClient } from "../tools/interaction-client.ts";
import { createToolCallParser } from "../tools/parser-registry.ts";
import type { ParsedCall, ParseError, ToolCallParser } from "../tools/tool-call-parser.ts";
import { truncateToolResponse } from "../tools/truncate.ts";
import { pyList, type ToolExecutor, type ToolResult } from "../tools/webhook-tool-client.ts";
import { appendImageObservation, encodeImageObservation, imageObservationEncoder, multiModalField, resolveImages } from "../vision/multimodal-tokens.ts";
import { sharedObservationEncoder } from "./encoder-cache.ts";
import { imageDataUri, visionPrompt } from "./vision-prompt.ts";
import { isDeadlineAbort, TrajectoryDeadlineError } from "./trajectory-deadline.ts";
import { addPreempted, AgentLoop, emptyMetrics, finalTokenVersions, modelVersionOf, recordTurnVersions, type AgentLoopContext, type AgentLoopKwargs, type TokenVersions } from "./agent-loop.ts";

/**
 * The states of {@link ToolAgentLoop}. `awaiting_tools` is reached only when
 * the context accepts asynchronous tool results (`asyncTools`, set by a
 * durable session host): some call answered `202` and its result comes later.
 */
export type ToolAgentState = "pending" | "generating" | "processing_tools" | "awaiting_tools" | "interacting" | "terminated";

/**
 * A tool call whose webhook answered `202 Accepted`: its result is delivered
 * later (`POST /v1/sessions/{key}/tool-results`) or, past `deadline_ms`
 * (wall-clock epoch milliseconds = accepted + the tool's `timeout_ms`),
 * becomes an error observation.
 */
export interface AwaitedToolCall {
  awaiting: true;
  call_id: string;
  name: string;
  accepted_ms: number;
  deadline_ms: number;
  timeout_ms: number;
  /**
   * The call runs as this MCP task: its result is not delivered but polled
   * for ({@link ToolExecutor.awaitTask}, state `awaiting_tools`), by the
   * session that resumes it too; the call is never sent again.
   */
  task_id?: string;
}

/** What one call of the current tool round has produced so far: a result, or a call awaiting its callback. */
export type ToolCallOutcome = ToolResult | AwaitedToolCall;

/**
 * Why a tool-agent trajectory ended (`extra_fields.terminated_by`):
 * `model` (a turn without calls and no simulated user), `interaction` (the
 * simulated user said terminate), `max_assistant_turns`, `max_user_turns`,
 * `response_length` (the response budget is used up or an observation
 * overflowed it), `max_model_len` (no room left in the context), `length_stop`
 * (the engine stopped a turn on its length limit), `multi_turn_disabled`
 * (`rollout.multi_turn.enable: false`: the first assistant turn is final; its
 * calls are not run and no simulated user answers), `deadline` (the
 * trajectory passed `rollout.trajectory_deadline_s`: it ends with the turns
 * sampled so far, `finish_reason: "abort"`, truncated), `abort`, `error`.
 */
export type TerminatedBy =
  | "model"
  | "interaction"
  | "max_assistant_turns"
  | "max_user_turns"
  | "response_length"
  | "max_model_len"
  | "length_stop"
  | "multi_turn_disabled"
  | "deadline"
  | "abort"
  | "error";

/**
 * One tool reply's `metrics` object as recorded in `extra_fields.tool_metrics`:
 * the assistant turn whose call it answered (1-based), the tool's name and
 * the object as the tool sent it (synchronous reply or callback).
 */
export interface ToolMetricsEntry {
  turn: number;
  name: string;
  metrics: Record<string, unknown>;
}

/** Mutable state of one tool-agent run (what a durable session would checkpoint). */
export interface ToolAgentData {
  key: string;
  kwargs: AgentLoopKwargs;
  samplingParams: SamplingParams;
  messages: ChatMessage[];
  builder?: TrajectoryBuilder;
  encoder?: ObservationEncoder;
  tools?: ToolExecutor;
  interaction?: InteractionClient;
  interactionKwargs?: Record<string, unknown>;
  assistantTurns: number;
  userTurns: number;
  /** Calls and parse errors of the last assistant turn still to process, in the model's order. */
  pending: Array<ParsedCall | ParseError>;
  /**
   * Per entry of `pending`, what its call produced so far (null: not answered
   * yet). Kept across checkpoints so that a resumed session re-sends only
   * unanswered calls (with the same `call_id`) and waits for awaited ones.
   */
  toolResults?: Array<ToolCallOutcome | null>;
  /** Decoded text (special tokens skipped) of the last assistant turn, for the reward (in data from `initData`, decoded when first read). */
  lastAssistantText: string;
  metrics: AgentLoopMetrics;
  toolRewards: number[];
  /** `metrics` of tool replies that carried one, in call order (`extra_fields.tool_metrics`). */
  toolMetrics?: ToolMetricsEntry[];
  turnScores: number[];
  modelVersions: unknown[];
  /** Policy versions of the response tokens so far, run-length (`extra_fields.token_versions`). */
  tokenVersions: TokenVersions;
  droppedToolCalls: number;
  /** Tool calls processed (executed or answered with an error observation). */
  toolCalls: number;
  toolErrors: number;
  finishReason: FinishReason;
  terminatedBy: TerminatedBy;
  error?: string;
  /**
   * Vision-language families, once the trajectory holds an image (prompt or
   * tool reply): the record's `multi_modal` (every image with its span in
   * `prompt_ids ‖ response_ids`, in order) and the same images as data URIs,
   * sent with every engine call as `image_data`. Absent otherwise (records
   * of text trajectories unchanged). Checkpointed with the run state.
   */
  vision?: { multiModal: MultiModal; imageData: string[] };
}

/** Run data made by {@link ToolAgentLoop.initData}, whose `lastAssistantText` decodes on first read. */
const lazyText = new WeakSet<ToolAgentData>();
/** The last assistant turn's ids, not decoded yet (see `initData`). */
const undecoded = new WeakMap<ToolAgentData, readonly number[]>();

/**
 * `tool_agent`: multi-turn generation with webhook tools and, optionally, a
 * simulated user — an explicit state machine:
 *
 * ```
 * pending ─► generating ─┬─► processing_tools ─► generating …
 *                        ├─► interacting ───────► generating …
 *                        └─► terminated
 * ```
 *
 * - pending: render the prompt with the active tools' schemas (tools file
 *   order; `extra_info.tool_selection` narrows them) → generating.
 * - generating: `max_tokens = builder.nextMaxTokens()`; 0 → terminated
 *   truncated, nothing sent. One engine call (fresh request id, trajectory
 *   key as routing key); sampled ids appended exactly (mask 1). A
 *   `finish_reason: "length"` turn executes no call and ends truncated (C13)
 *   unless `multi_turn.execute_calls_on_length`. Then, in verl's order: the
 *   response budget used up, `max_assistant_turns`, `max_user_turns` →
 *   terminated. Otherwise parse the turn (calls inside `<think>` do not count);
 *   calls or parse errors → processing_tools; none → interacting when the row
 *   has `extra_info.interaction_kwargs`, else terminated.
 * - processing_tools: the first `max_parallel_calls` attempts run concurrently
 *   (extra ones are not executed and are counted in
 *   `extra_fields.dropped_tool_calls`); parse errors, unknown tools and failed
 *   webhooks become error observations (C10), counted in
 *   `extra_fields.tool_errors`. Each text is cut to `max_tool_response_length`
 *   characters (`tool_response_truncate_side`). The tool messages are encoded
 *   incrementally as one observation (mask 0, C4); an observation that
 *   overflows the budget is cut by the builder and ends the trajectory
 *   truncated → generating or terminated.
 * - interacting: the simulated user's reply; `terminate` → terminated, else
 *   its content is encoded as a `user` observation (C3) → generating.
 * - terminated: reward, then `builder.finish` (validated).
 *
 * `num_turns = user turns + assistant turns + 1`. Metrics: seconds
 * accumulated over turns (`generate_sequences`; `tool_calls` includes
 * interaction calls; `compute_score`), `num_preempted` summed (−1 when no call
 * reported one). `extra_fields`: `turn_scores`, `tool_rewards`,
 * `tool_metrics` (`[{turn, name, metrics}]`, the `metrics` objects tool
 * replies carried; absent when none did), `model_versions` (per assistant turn, when the engine reports
 * `extra_fields.model_version`), `token_versions` (run-length segments
 * `[[start, version], …]` over `response_ids`: each sampled token's policy
 * version — the engine's reported one, else the version current when its
 * call was sent; a turn resumed across a weight update has two; observation
 * tokens belong to the segment of the action before them; absent when no
 * version is known), `dropped_tool_calls`, `tool_errors`,
 * `terminated_by`, and `error`/`reward_error` when something failed.
 * @see verl `ToolAgentLoop` (`verl/experimental/agent_loop/tool_agent_loop.py`) and §5 of the verl spec
 */
export class ToolAgentLoop extends AgentLoop {
  /** The states visited by the last `run`, in order (for tests and traces). */
  readonly trace: ToolAgentState[] = [];
  private readonly parser: ToolCallParser;

  /** @throws ConfigError when `multi_turn.format` (or, unset, the model family's default parser) names no registered parser. */
  constructor(ctx: AgentLoopContext) {
    super(ctx);
    this.parser = ctx.parser ?? createToolCallParser(ctx.config.multi_turn.format ?? ctx.tokenizer.traits.defaultParser, { tools: ctx.tools?.schemas });
  }

  async run(samplingParams: SamplingParams, kwargs: AgentLoopKwargs): Promise<AgentLoopOutput> {
    const d = this.initData(samplingParams, kwargs);
    let state: ToolAgentState = "pending";
    this.trace.length = 0;
    while (state !== "terminated") {
      this.trace.push(state);
      state = await this.advance(state, d);
    }
    this.trace.push("terminated");
    return this.onTerminated(d);
  }

  /**
   * The fresh state of a run (state `pending`). With {@link advance} and
   * {@link finishData} it lets a durable session drive the loop one committed
   * transition at a time; `run` is exactly these three.
   * @throws InputError when the row's prompt is invalid.
   */
  initData(samplingParams: SamplingParams, kwargs: AgentLoopKwargs): ToolAgentData {
    const tok = this.ctx.tokenizer;
    let text = "";
    const d: ToolAgentData = {
      key: this.key(kwargs),
      kwargs,
      samplingParams,
      messages: this.messages(kwargs),
      assistantTurns: 0,
      userTurns: 0,
      pending: [],
      // Decoded when first read (the reward, a checkpoint): most turns are not the last one.
      get lastAssistantText(): string {
        const ids = undecoded.get(d);
        if (ids) {
          text = tok.decode(ids, { skipSpecialTokens: true });
          undecoded.delete(d);
        }
        return text;
      },
      set lastAssistantText(v: string) {
        text = v;
        undecoded.delete(d);
      },
      metrics: emptyMetrics(),
      toolRewards: [],
      turnScores: [],
      modelVersions: [],
      tokenVersions: [],
      droppedToolCalls: 0,
      toolCalls: 0,
      toolErrors: 0,
      finishReason: "stop",
      terminatedBy: "model",
    };
    lazyText.add(d);
    return d;
  }

  /**
   * Runs the handler of `state` once and returns the next state. In
   * `awaiting_tools` it returns `awaiting_tools` until every awaited call has
   * a result (see {@link deliverToolResult}, {@link expireToolCalls}).
   * Once the context's signal is aborted by the trajectory's deadline
   * ({@link isDeadlineAbort}) — before the handler or while it ran — it returns
   * `terminated` by {@link endByDeadline} instead (a handler that ended the
   * run for another reason than the abort keeps it).
   * @throws TrajectoryDeadlineError past the deadline when the prompt was never built (an environment's reset aborted).
   */
  async advance(state: ToolAgentState, d: ToolAgentData): Promise<ToolAgentState> {
    if (state === "terminated") return "terminated";
    // Past the deadline no handler starts (but the prompt is still built: it is what the record holds).
    if (state !== "pending" && this.deadlinePassed()) return this.endByDeadline(d);
    let next: ToolAgentState;
    try {
      next = await this.handle(state, d);
    } catch (e) {
      // A call the deadline aborted (an environment step, a reset) threw: the trajectory ends with what it has.
      if (this.deadlinePassed()) return this.endByDeadline(d);
      throw e;
    }
    // The deadline fired during the handler: its engine call ended as an abort (tokens kept as the abort path keeps
    // them), or it finished its work; either way the trajectory ends here. A natural end is kept.
    if (this.deadlinePassed() && (next !== "terminated" || d.terminatedBy === "abort")) return this.endByDeadline(d);
    return next;
  }

  /**
   * Ends the run because the trajectory passed its deadline: `terminated_by:
   * "deadline"`, `finish_reason: "abort"`, truncated; tool calls still pending
   * or awaited are dropped (their results never enter the response). Returns
   * `terminated`; {@link finishData} then scores and validates what was
   * sampled. A durable session calls it when it resumes (or wakes) past the
   * deadline, without running a handler (`deadlineMs`: the deadline, epoch ms, named in the error).
   * @throws TrajectoryDeadlineError when there is nothing to record yet (the prompt was never built).
   */
  endByDeadline(d: ToolAgentData, deadlineMs?: number): ToolAgentState {
    if (!d.builder) {
      const r: unknown = this.ctx.signal?.reason;
      throw r instanceof TrajectoryDeadlineError ? r : new TrajectoryDeadlineError(d.key, deadlineMs ?? Date.now());
    }
    d.pending = [];
    d.toolResults = undefined;
    return this.end(d, "abort", "deadline", true);
  }

  /** Whether this trajectory's signal was aborted by its deadline. */
  protected deadlinePassed(): boolean {
    return isDeadlineAbort(this.ctx.signal);
  }

  private async handle(state: ToolAgentState, d: ToolAgentData): Promise<ToolAgentState> {
    switch (state) {
      case "pending":
        return this.onPending(d);
      case "generating":
        return this.onGenerating(d);
      case "processing_tools":
        return this.onProcessingTools(d);
      case "awaiting_tools":
        if (this.hasAwaitedTasks(d)) await this.awaitTasks(d);
        return (d.toolResults ?? []).some((r) => r === null || "awaiting" in r) ? "awaiting_tools" : this.onProcessingTools(d);
      case "interacting":
        return this.onInteracting(d);
      case "terminated":
        return "terminated";
    }
  }

  /** Scores the finished run and returns its validated output (the `terminated` state's work). */
  finishData(d: ToolAgentData): Promise<AgentLoopOutput> {
    return this.onTerminated(d);
  }

  /**
   * Re-creates what a checkpoint does not hold (active tools, simulated user,
   * observation encoder) for data restored after `pending` ran; the builder
   * must already be restored.
   */
  reattach(d: ToolAgentData): void {
    const extra = (d.kwargs.extra_info ?? {}) as Record<string, unknown>;
    d.tools = this.activeTools(extra.tool_selection);
    d.interaction = this.pickInteraction(extra.interaction_kwargs, d);
    // Shared across trajectories: an encoder derives its template facts once (see sharedObservationEncoder).
    d.encoder = sharedObservationEncoder(this.ctx.tokenizer, d.tools?.schemas, this.ctx.config.chat_template_kwargs);
  }

  /**
   * Records the asynchronous result of an awaited call.
   * @returns `unknown` when no call of the current round has this id, `answered` when it already has a result,
   *   `task` when it runs as an MCP task (its result is polled from the server, never delivered).
   */
  deliverToolResult(d: ToolAgentData, callId: string, result: { content: string; reward?: number | null; ok?: boolean; metrics?: Record<string, unknown> | null }, nowMs: number): "ok" | "unknown" | "answered" | "task" {
    const rs = d.toolResults ?? [];
    const i = rs.findIndex((r) => r !== null && r.call_id === callId);
    if (i < 0) return "unknown";
    const r = rs[i]!;
    if (!("awaiting" in r)) return "answered";
    if (r.task_id !== undefined) return "task";
    d.metrics.tool_calls += Math.max(0, (nowMs - r.accepted_ms) / 1000);
    rs[i] = { ok: result.ok ?? true, call_id: callId, attempts: 1, content: result.content, ...(result.reward != null ? { reward: result.reward } : {}), ...(result.metrics != null ? { metrics: result.metrics } : {}) };
    return "ok";
  }

  /** Turns awaited calls past their deadline into error results; returns how many expired. */
  expireToolCalls(d: ToolAgentData, nowMs: number): number {
    const rs = d.toolResults ?? [];
    let n = 0;
    rs.forEach((r, i) => {
      if (r === null || !("awaiting" in r) || r.deadline_ms > nowMs) return;
      d.metrics.tool_calls += Math.max(0, (nowMs - r.accepted_ms) / 1000);
      rs[i] = { ok: false, call_id: r.call_id, attempts: 1, content: `Error executing tool '${r.name}': no asynchronous result within ${r.timeout_ms} ms` };
      n++;
    });
    return n;
  }

  /** Whether a call of the current round runs as an MCP task still awaited (its result is polled for, not delivered). */
  hasAwaitedTasks(d: ToolAgentData): boolean {
    return (d.toolResults ?? []).some((r) => r !== null && "awaiting" in r && r.task_id !== undefined);
  }

  /**
   * Waits for every awaited MCP task of the round (in parallel, each by its
   * task id, within what is left of its `deadline_ms`) and records the
   * results; the round's other calls are left as they are.
   */
  private async awaitTasks(d: ToolAgentData): Promise<void> {
    const rs = d.toolResults ?? [];
    const wall = this.ctx.asyncTools?.wallClockMs ?? (() => Date.now());
    await Promise.all(
      rs.map(async (r, i): Promise<void> => {
        if (r === null || !("awaiting" in r) || r.task_id === undefined) return;
        const wait = { name: r.name, call_id: r.call_id, task_id: r.task_id, within_ms: r.deadline_ms - wall(), timeout_ms: r.timeout_ms, ...(this.ctx.signal ? { signal: this.ctx.signal } : {}) };
        const got: ToolResult = d.tools?.awaitTask
          ? await d.tools.awaitTask(wait)
          : { ok: false, call_id: r.call_id, attempts: 0, content: `Error executing tool '${r.name}': no MCP server offers it to wait for task '${r.task_id}'` };
        d.metrics.tool_calls += Math.max(0, (wall() - r.accepted_ms) / 1000);
        rs[i] = got;
      }),
    );
  }

  /** The earliest deadline (epoch ms) of the calls still awaited, or null. */
  nextToolDeadline(d: ToolAgentData): number | null {
    let min: number | null = null;
    for (const r of d.toolResults ?? []) if (r !== null && "awaiting" in r && (min === null || r.deadline_ms < min)) min = r.deadline_ms;
    return min;
  }

  /**
   * Renders `d.messages` with `tools` (verl's prompt truncation to `prompt_length`) and starts `d.builder` on it, with
   * the rollout's response budget, the context size and log-prob tracking. Shared by the loops built on this one.
   */
  protected async openBuilder(d: ToolAgentData, tools: readonly ToolSchema[] | undefined): Promise<void> {
    const { config, tokenizer } = this.ctx;
    // A vision-language family renders prompt images (shared/vision); any other refuses them in buildPromptIds.
    const vision =
      tokenizer.traits.vision && hasMultimodalContent(d.messages)
        ? await visionPrompt(tokenizer, d.messages, { ...(tools ? { tools } : {}), promptLength: config.prompt_length, chatTemplateKwargs: config.chat_template_kwargs, imageTruncation: config.image_truncation })
        : undefined;
    if (vision) d.vision = { multiModal: vision.multiModal, imageData: vision.imageData };
    const { promptIds, truncated } = vision ?? buildPromptIds(tokenizer, d.messages, {
      ...(tools ? { tools } : {}),
      promptLength: config.prompt_length,
      chatTemplateKwargs: config.chat_template_kwargs,
    });
    d.builder = new TrajectoryBuilder({
      promptIds,
      responseLength: config.response_length,
      maxModelLen: await this.maxModelLen(),
      trackLogProbs: d.samplingParams.logprobs,
      promptLength: config.prompt_length,
      promptTruncated: truncated,
    });
  }

  /**
   * Appends one sampled assistant turn `out` to `d.builder` (mask 1, its log-probs when tracked, its routed experts)
   * and books it: preemptions, the turn's policy version and token versions, the assistant-turn count. Returns the
   * builder's append result (`truncated` when the response budget cut it). Shared by the loops built on this one.
   */
  protected appendTurn(d: ToolAgentData, out: TokenOutput): ReturnType<TrajectoryBuilder["appendAction"]> {
    const b = d.builder!;
    addPreempted(d.metrics, out.num_preempted);
    d.modelVersions.push(modelVersionOf(out));
    d.assistantTurns++;
    recordTurnVersions(d.tokenVersions, b.responseLength, out);
    const appended = b.appendAction(out.token_ids, d.samplingParams.logprobs ? out.log_probs : null);
    b.applyRoutedExperts(out.routed_experts);
    return appended;
  }

  /** Renders the prompt with the active tools and picks the simulated user; fails the row before any request on bad input. */
  protected async onPending(d: ToolAgentData): Promise<ToolAgentState> {
    const { config, tokenizer } = this.ctx;
    this.reattach(d);
    // The executor's own list (not a copy): buildPromptIds keys its cache by the list object's JSON, computed once per list.
    const schemas: readonly ToolSchema[] | undefined = d.tools && d.tools.schemas.length > 0 ? d.tools.schemas : undefined;
    await this.openBuilder(d, schemas);
    return "generating";
  }

  protected async onGenerating(d: ToolAgentData): Promise<ToolAgentState> {
    const b = d.builder!;
    const mt = this.ctx.config.multi_turn;
    await this.checkStaleness(d.modelVersions);
    const out = await this.generate(b, d.samplingParams, d.key, d.metrics, undefined, undefined, undefined, d.vision?.imageData);
    if (out === undefined || out === "overflow") {
      return this.end(d, "length", b.remainingBudget <= 0 ? "response_length" : "max_model_len", true);
    }
    if (out === "aborted") return this.end(d, "abort", "abort");
    const appended = this.appendTurn(d, out);
    const tok = this.ctx.tokenizer;
    if (lazyText.has(d)) undecoded.set(d, out.token_ids);
    else d.lastAssistantText = tok.decode(out.token_ids, { skipSpecialTokens: true });
    if (out.finish_reason === "abort") return this.end(d, "abort", "abort");
    const lengthStop = out.finish_reason === "length";
    if (appended.truncated) return this.end(d, "length", "response_length", true);
    if (lengthStop && !mt.execute_calls_on_length) return this.end(d, "length", "length_stop", true);

    const ids = out.token_ids;
    // The stop id that ended the turn (any of the model's list) is not part of the message.
    const body = ids.length > 0 && tok.isStopToken(ids[ids.length - 1]) ? ids.slice(0, -1) : ids;
    const parsed = this.parser.extract(tok.decode(body));
    const attempts: Array<ParsedCall | ParseError> = lengthStop
      ? parsed.calls
      : [...parsed.calls, ...parsed.errors].sort((x, y) => x.index - y.index);
    const executed = attempts.slice(0, mt.max_parallel_calls);
    d.messages.push({
      role: "assistant",
      content: parsed.content,
      ...(executed.some((a) => "arguments" in a)
        ? { tool_calls: executed.filter((a): a is ParsedCall => "arguments" in a).map((c) => ({ type: "function" as const, function: { name: c.name, arguments: c.arguments } })) }
        : {}),
    });

    const wantsMore = attempts.length > 0 || d.interaction !== undefined;
    if (b.remainingBudget <= 0) return wantsMore ? this.end(d, "length", "response_length", true) : this.end(d, "stop", "model");
    if (mt.max_assistant_turns != null && d.assistantTurns >= mt.max_assistant_turns) return this.end(d, "stop", "max_assistant_turns");
    if (mt.max_user_turns != null && d.userTurns >= mt.max_user_turns) return this.end(d, "stop", "max_user_turns");
    if (!mt.enable && wantsMore) return this.end(d, "stop", "multi_turn_disabled");
    if (lengthStop && attempts.length === 0) return this.end(d, "length", "length_stop", true);

    if (attempts.length > 0) {
      d.droppedToolCalls += attempts.length - executed.length;
      d.pending = executed;
      return "processing_tools";
    }
    if (d.interaction) return "interacting";
    return this.end(d, "stop", "model");
  }

  protected async onProcessingTools(d: ToolAgentData): Promise<ToolAgentState> {
    const mt = this.ctx.config.multi_turn;
    const toolsKwargs = (((d.kwargs.extra_info ?? {}) as Record<string, unknown>).tools_kwargs ?? d.kwargs.tools_kwargs ?? {}) as Record<
      string,
      { create_kwargs?: Record<string, unknown> } | undefined
    >;
    const sandboxKwargs = sandboxKwargsOf(d.kwargs as { extra_info?: unknown });
    const outcomes = (d.toolResults ??= d.pending.map(() => null));
    const t0 = this.now();
    const wall = this.ctx.asyncTools?.wallClockMs ?? (() => Date.now());
    await Promise.all(
      d.pending.map(async (a, i): Promise<void> => {
        if (outcomes[i] != null) return;
        let r: ToolResult;
        if (!("arguments" in a)) r = { ok: false, content: a.message, call_id: "", attempts: 0 };
        else if (!d.tools) r = { ok: false, content: `Unknown function '${a.name}'. Available tools: []`, call_id: "", attempts: 0 };
        else {
          r = await d.tools.call({
            name: a.name,
            arguments: a.arguments,
            key: d.key,
            turn: d.assistantTurns,
            index: i,
            create_kwargs: toolsKwargs[a.name]?.create_kwargs ?? {},
            sandbox_kwargs: sandboxKwargs,
            sandbox_fresh: d.toolCalls === 0,
            ...(this.ctx.asyncTools ? { deferTasks: true } : {}),
            signal: this.ctx.signal,
          });
        }
        if (r.pending && this.ctx.asyncTools) {
          const now = wall();
          const timeout = r.timeout_ms ?? 30_000;
          outcomes[i] = { awaiting: true, call_id: r.call_id, name: "arguments" in a ? a.name : "", accepted_ms: now, deadline_ms: now + timeout, timeout_ms: timeout, ...(r.task_id !== undefined ? { task_id: r.task_id } : {}) };
        } else outcomes[i] = r;
      }),
    );
    d.metrics.tool_calls += Math.max(0, (this.now() - t0) / 1000);
    // The deadline aborted the round: its results (aborted calls among them) are not observed.
    if (this.deadlinePassed()) return this.endByDeadline(d);
    if (outcomes.some((r) => r === null || "awaiting" in r)) return "awaiting_tools";
    const results = outcomes as ToolResult[];
    // Templates that name the tool in its result's header (harmony:
    // `<|start|>functions.NAME to=assistant…`) read it from the message.
    const names = d.pending.map((a) => a.name);
    d.pending = [];
    d.toolResults = undefined;
    d.toolCalls += results.length;
    const tok = this.ctx.tokenizer;
    const toolMessages: ChatMessage[] = results.map((r, i) => {
      if (!r.ok) d.toolErrors++;
      if (r.reward != null) d.toolRewards.push(r.reward);
      if (r.metrics != null && names[i]) (d.toolMetrics ??= []).push({ turn: d.assistantTurns, name: names[i]!, metrics: r.metrics });
      const cut = (text: string) => truncateToolResponse(text, mt.max_tool_response_length, mt.tool_response_truncate_side);
      const name = names[i];
      if (r.parts && !tok.traits.vision) {
        throw new InputError(
          `tool '${name ?? ""}'`,
          `replied with an image part (turn ${d.assistantTurns}), and model ${tok.name} (family ${tok.traits.family}) is text-only; use a vision-language family (--model qwen3_vl)`,
        );
      }
      // Images are whole; each text part is cut to max_tool_response_length as a text reply is.
      const content: ChatMessage["content"] = r.parts ? r.parts.map((p) => (p.type === "text" ? { type: "text" as const, text: cut(p.text) } : p)) : cut(r.content);
      return name ? { role: "tool", name, content } : { role: "tool", content };
    });
    return this.appendObservation(d, toolMessages);
  }

  protected async onInteracting(d: ToolAgentData): Promise<ToolAgentState> {
    const t0 = this.now();
    let reply;
    try {
      reply = await d.interaction!.respond({ key: d.key, turn: d.assistantTurns, messages: d.messages, interaction_kwargs: d.interactionKwargs, signal: this.ctx.signal });
    } catch (e) {
      if (this.deadlinePassed()) return this.endByDeadline(d);
      d.error = e instanceof ToolError ? e.message : String(e);
      return this.end(d, "error", "error");
    } finally {
      d.metrics.tool_calls += Math.max(0, (this.now() - t0) / 1000);
    }
    if (reply.score != null) d.turnScores.push(reply.score);
    if (reply.terminate) {
      // Counted like verl (its user turn is in the conversation) but not appended: no trailing mask-0 tokens.
      d.userTurns++;
      d.messages.push({ role: "user", content: reply.content });
      return this.end(d, "stop", "interaction");
    }
    return this.appendObservation(d, [{ role: "user", content: reply.content }]);
  }

  protected async onTerminated(d: ToolAgentData): Promise<AgentLoopOutput> {
    // The last turn's text is decoded only when a reward reads it (see AgentLoop.reward).
    const scored = this.ctx.reward !== false && !!d.kwargs.reward_model;
    const reward = await this.reward(d.kwargs, d.key, scored ? d.lastAssistantText : "");
    d.metrics.compute_score += reward.seconds;
    const extra: Record<string, unknown> = {
      turn_scores: d.turnScores,
      tool_rewards: d.toolRewards,
      dropped_tool_calls: d.droppedToolCalls,
      tool_calls: d.toolCalls,
      tool_errors: d.toolErrors,
      terminated_by: d.terminatedBy,
    };
    // Absent when no tool sent metrics, so records without them are unchanged byte for byte.
    if (d.toolMetrics?.length) extra.tool_metrics = d.toolMetrics;
    if (d.modelVersions.some((v) => v !== null)) extra.model_versions = d.modelVersions;
    const tv = finalTokenVersions(d.tokenVersions, d.builder!.responseLength);
    if (tv) extra.token_versions = tv;
    if (d.error) extra.error = d.error;
    if (reward.error) extra.reward_error = reward.error;
    const output = d.builder!.finish({
      numTurns: d.userTurns + d.assistantTurns + 1,
      rewardScore: reward.score,
      metrics: d.metrics,
      extraFields: extra,
      finishReason: d.finishReason,
    });
    if (d.vision) output.multi_modal = d.vision.multiModal;
    return output;
  }

  /**
   * Encodes and appends an observation (a run of tool messages or one user message); an overflow ends the trajectory
   * truncated. An observation holding images (a vision family) is encoded with its placeholders expanded
   * (`encodeImageObservation`, mask 0) and cut, when over the budget, before the `<|vision_start|>` of the first image
   * that does not fit (`appendImageObservation`); the images kept join `multi_modal` and the calls' `image_data`.
   * @throws InputError naming the image (`turn[N].tool[i].content[j].image`) that cannot be read or sized.
   */
  private async appendObservation(d: ToolAgentData, newMessages: ChatMessage[]): Promise<ToolAgentState> {
    const b = d.builder!;
    if (hasMultimodalContent(newMessages)) return this.appendImageObservation(d, newMessages);
    const ids = d.encoder!.encode(newMessages, b.lastTokenId);
    d.messages.push(...newMessages);
    d.userTurns++;
    const r = b.appendObservation(ids);
    if (r.truncated) return this.end(d, "length", "response_length", true);
    return "generating";
  }

  private async appendImageObservation(d: ToolAgentData, newMessages: ChatMessage[]): Promise<ToolAgentState> {
    const b = d.builder!;
    const tok = this.ctx.tokenizer;
    const field = `turn[${d.assistantTurns}].tool`;
    const images = await resolveImages(tok, newMessages, { prefix: field });
    const encoder = imageObservationEncoder(tok, { ...(d.tools && d.tools.schemas.length > 0 ? { tools: d.tools.schemas } : {}), chatTemplateKwargs: this.ctx.config.chat_template_kwargs });
    const obs = encodeImageObservation(encoder, tok, newMessages, images, b.lastTokenId, b.contextLength, field);
    d.messages.push(...newMessages);
    d.userTurns++;
    const r = appendImageObservation(b, obs);
    const vision = (d.vision ??= { multiModal: multiModalField(tok, []), imageData: [] });
    vision.multiModal.images.push(...r.images);
    for (const kept of r.images) vision.imageData.push(imageDataUri(images[obs.images.indexOf(kept)]!));
    if (r.truncated) return this.end(d, "length", "response_length", true);
    return "generating";
  }

  private end(d: ToolAgentData, finishReason: FinishReason, by: TerminatedBy, truncated = false): ToolAgentState {
    if (truncated) d.builder!.markTruncated();
    d.finishReason = finishReason;
    d.terminatedBy = by;
    return "terminated";
  }

  private activeTools(selection: unknown): ToolExecutor | undefined {
    const tools = this.ctx.tools;
    if (!tools || !Array.isArray(selection) || selection.length === 0) return tools;
    const names = selection.filter((s): s is string => typeof s === "string");
    if (tools.select) return tools.select(names);
    return tools;
  }

  /**
   * The simulated user for this row: the one `extra_info.interaction_kwargs.name`
   * names, or — name absent — the first configured (the tools file's first
   * `interactions` entry; verl requires the name, edgeloop defaults it).
   * No `interaction_kwargs`: none (the row runs without a simulated user).
   * @throws InputError naming `extra_info.interaction_kwargs.name` for an unknown name, or a
   *   row asking for a simulated user when none is configured.
   */
  private pickInteraction(ik: unknown, d: ToolAgentData): InteractionClient | undefined {
    if (!ik || typeof ik !== "object") return undefined;
    d.interactionKwargs = ik as Record<string, unknown>;
    const all = this.ctx.interactions ?? {};
    const names = Object.keys(all);
    const name = (ik as { name?: unknown }).name;
    if (typeof name === "string") {
      // Own keys only: a row naming "__proto__" or "constructor" names no configured interaction.
      const it = Object.hasOwn(all, name) ? all[name] : undefined;
      if (!it) throw new InputError("extra_info.interaction_kwargs.name", `unknown interaction '${name}'; configured interactions: ${pyList(names)}`);
      return it;
    }
    if (name !== undefined && name !== null) throw new InputError("extra_info.interaction_kwargs.name", `must be a string naming one of the configured interactions ${pyList(names)}`);
    if (names.length > 0) return all[names[0]!];
    throw new InputError("extra_info.interaction_kwargs", "the row asks for a simulated user but none is configured (add `interactions: [{name, url}]` to the tools file)");
  }
}
