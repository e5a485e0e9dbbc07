import { context, SpanStatusCode, trace, type Context, type Span } from "@opentelemetry/api";
import type { GenerateRequest, InferenceClient } from "../inference/types.ts";
import type { TokenOutput } from "../schema/index.ts";
import type { ToolCallRequest, ToolExecutor, ToolResult, ToolTaskWait } from "../tools/webhook-tool-client.ts";
import { edgeloopTracer, recordError, SpanAttr } from "../telemetry/tracer.ts";
import { sessionWaits } from "../telemetry/waits.ts";
import { processMetrics } from "../telemetry/process-metrics.ts";

/** Options of a {@link TrajectoryTracer}. */
export interface TrajectoryTracerOptions {
  /** Parent of the turn spans (the trajectory's `agent_loop.run`); default the active context. */
  parent?: Context;
  /** Monotonic milliseconds for tool-call latencies (default `performance.now()`). */
  nowMs?: () => number;
  /** Replica name for `inference.generate` when the reply does not carry `extra_fields.replica` (e.g. the engine URL). */
  replica?: string;
}

/**
 * Instruments one trajectory from the outside, without touching the loop:
 * wraps its inference client and tools so that every engine call opens an
 * `agent_loop.turn` span (ending the previous turn), with the call itself as
 * an `inference.generate` child and the turn's tool calls as `tool.call`
 * children. A turn therefore spans one generation and the tool round that
 * follows it. Also collects each tool call's wall-clock latency (milliseconds,
 * in completion order) for the batch metrics, traced or not, counts each
 * open engine and tool call in {@link sessionWaits} (the stall warning's view),
 * and observes every engine and tool call in {@link processMetrics} (`/metrics`).
 *
 * One instance per trajectory; call {@link end} when the loop returns.
 */
export class TrajectoryTracer {
  /** Latency of every tool call made through {@link tools}, milliseconds. */
  readonly toolLatenciesMs: number[] = [];
  private readonly parent: Context;
  private readonly nowMs: () => number;
  private turnSpan: Span | null = null;
  private turnCtx: Context | null = null;
  private turns = 0;

  constructor(
    readonly key: string,
    private readonly opts: TrajectoryTracerOptions = {},
  ) {
    this.parent = opts.parent ?? context.active();
    this.nowMs = opts.nowMs ?? (() => performance.now());
  }

  /** Ends the open turn (if any) and opens the next one (1-based `edgeloop.turn`); returns its context. */
  beginTurn(): Context {
    this.endTurn();
    this.turns++;
    const span = edgeloopTracer().startSpan("agent_loop.turn", { attributes: { [SpanAttr.key]: this.key, [SpanAttr.turn]: this.turns } }, this.parent);
    this.turnSpan = span;
    this.turnCtx = trace.setSpan(this.parent, span);
    return this.turnCtx;
  }

  /** The open turn's context, else the parent's. */
  currentContext(): Context {
    return this.turnCtx ?? this.parent;
  }

  /** Ends the open turn; call once the loop has returned (or thrown). */
  end(): void {
    this.endTurn();
  }

  /** `inner` with every `generate` traced as a new turn plus its `inference.generate` span. */
  client(inner: InferenceClient): InferenceClient {
    return new TracingInferenceClient(inner, this);
  }

  /** `inner` with every call traced as `tool.call` inside the current turn and timed. */
  tools(inner: ToolExecutor): ToolExecutor {
    return new TracingToolExecutor(inner, this);
  }

  /** @internal */
  replica(out: TokenOutput): string | undefined {
    const r = out.extra_fields?.replica;
    return typeof r === "string" ? r : this.opts.replica;
  }

  /** @internal */
  now(): number {
    return this.nowMs();
  }

  private endTurn(): void {
    this.turnSpan?.end();
    this.turnSpan = null;
    this.turnCtx = null;
  }
}

/**
 * An {@link InferenceClient} whose `generate` opens a turn and an
 * `inference.generate` span: key, request id, prompt tokens and `max_tokens`
 * up front; output tokens, finish reason, cached tokens, `num_preempted` and
 * replica (when known) from the reply; engine errors recorded.
 */
class TracingInferenceClient implements InferenceClient {
  constructor(
    private readonly inner: InferenceClient,
    private readonly t: TrajectoryTracer,
  ) {}

  async generate(req: GenerateRequest): Promise<TokenOutput> {
    const turnCtx = this.t.beginTurn();
    const span = edgeloopTracer().startSpan(
      "inference.generate",
      {
        attributes: {
          [SpanAttr.key]: this.t.key,
          [SpanAttr.requestId]: req.request_id,
          [SpanAttr.promptTokens]: req.prompt_ids.length,
          [SpanAttr.maxTokens]: req.max_tokens,
        },
      },
      turnCtx,
    );
    const waited = sessionWaits.begin({ kind: "engine" });
    const t0 = this.t.now();
    let ok = false;
    let tokens: { prompt: number; generated: number } | undefined;
    try {
      const out = await context.with(trace.setSpan(turnCtx, span), () => this.inner.generate(req));
      ok = true;
      tokens = { prompt: req.prompt_ids.length, generated: out.token_ids.length };
      if (span.isRecording()) {
        span.setAttribute(SpanAttr.outputTokens, out.token_ids.length);
        span.setAttribute(SpanAttr.finishReason, out.finish_reason);
        span.setAttribute(SpanAttr.numPreempted, out.num_preempted);
        if (out.cached_tokens !== undefined) span.setAttribute(SpanAttr.cachedTokens, out.cached_tokens);
        const replica = this.t.replica(out);
        if (replica !== undefined) span.setAttribute(SpanAttr.replica, replica);
      }
      return out;
    } catch (e) {
      recordError(span, e);
      throw e;
    } finally {
      waited();
      processMetrics.observeEngineCall(Math.max(0, this.t.now() - t0) / 1000, ok, tokens);
      span.end();
    }
  }

  maxModelLen(): Promise<number | undefined> {
    return this.inner.maxModelLen?.() ?? Promise.resolve(undefined);
  }
  servableLength(contextLen: number): number {
    return this.inner.servableLength ? this.inner.servableLength(contextLen) : contextLen;
  }
}

/** A {@link ToolExecutor} that traces (`tool.call`) and times every call; a failed call (`ok: false`) gets ERROR status. */
class TracingToolExecutor implements ToolExecutor {
  constructor(
    private readonly inner: ToolExecutor,
    private readonly t: TrajectoryTracer,
  ) {}

  get schemas() {
    return this.inner.schemas;
  }

  get names() {
    return this.inner.names;
  }

  async call(req: ToolCallRequest): Promise<ToolResult> {
    const parent = this.t.currentContext();
    const span = edgeloopTracer().startSpan(
      "tool.call",
      { attributes: { [SpanAttr.key]: this.t.key, [SpanAttr.toolName]: req.name, [SpanAttr.turn]: req.turn, [SpanAttr.toolIndex]: req.index } },
      parent,
    );
    const t0 = this.t.now();
    const waited = sessionWaits.begin({ kind: "tool", name: req.name });
    let ok = false;
    try {
      const r = await context.with(trace.setSpan(parent, span), () => this.inner.call(req));
      ok = r.ok;
      if (span.isRecording()) {
        span.setAttribute(SpanAttr.toolOk, r.ok);
        span.setAttribute(SpanAttr.toolAttempts, r.attempts);
        if (r.call_id) span.setAttribute(SpanAttr.toolCallId, r.call_id);
        if (!r.ok) span.setStatus({ code: SpanStatusCode.ERROR, message: r.content.slice(0, 200) });
      }
      return r;
    } catch (e) {
      recordError(span, e);
      throw e;
    } finally {
      waited();
      const ms = Math.max(0, this.t.now() - t0);
      this.t.toolLatenciesMs.push(ms);
      processMetrics.observeToolCall(ms / 1000, ok);
      span.end();
    }
  }

  /** The inner executor's task wait, traced as `tool.await_task` (ERROR status when it ends `ok: false`). */
  async awaitTask(req: ToolTaskWait): Promise<ToolResult> {
    if (!this.inner.awaitTask) return { ok: false, call_id: req.call_id, attempts: 0, content: `Error executing tool '${req.name}': no MCP server offers it to wait for task '${req.task_id}'` };
    const parent = this.t.currentContext();
    const span = edgeloopTracer().startSpan("tool.await_task", { attributes: { [SpanAttr.key]: this.t.key, [SpanAttr.toolName]: req.name, [SpanAttr.toolCallId]: req.call_id } }, parent);
    const waited = sessionWaits.begin({ kind: "tool", name: req.name });
    try {
      const r = await context.with(trace.setSpan(parent, span), () => this.inner.awaitTask!(req));
      if (span.isRecording()) {
        span.setAttribute(SpanAttr.toolOk, r.ok);
        if (!r.ok) span.setStatus({ code: SpanStatusCode.ERROR, message: r.content.slice(0, 200) });
      }
      return r;
    } catch (e) {
      recordError(span, e);
      throw e;
    } finally {
      waited();
      span.end();
    }
  }

  select(names: readonly string[]): ToolExecutor {
    return new TracingToolExecutor(this.inner.select ? this.inner.select(names) : this.inner, this.t);
  }
}
