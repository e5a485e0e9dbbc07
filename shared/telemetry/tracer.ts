import { context, SpanStatusCode, trace, type Attributes, type Context, type Span, type Tracer } from "@opentelemetry/api";

/** Instrumentation scope name of every edgeloop span. */
export const TRACER_NAME = "edgeloop";

/**
 * Span attribute names. The trajectory key is on every span of a trajectory so
 * that a trace backend can find all of them by key.
 */
export const SpanAttr = {
  key: "edgeloop.trajectory.key",
  uid: "edgeloop.uid",
  sessionId: "edgeloop.session_id",
  agentName: "edgeloop.agent_name",
  batchId: "edgeloop.batch_id",
  turn: "edgeloop.turn",
  requestId: "edgeloop.request_id",
  replica: "edgeloop.replica",
  promptTokens: "edgeloop.prompt_tokens",
  maxTokens: "edgeloop.max_tokens",
  outputTokens: "edgeloop.output_tokens",
  cachedTokens: "edgeloop.cached_tokens",
  finishReason: "edgeloop.finish_reason",
  numPreempted: "edgeloop.num_preempted",
  toolName: "edgeloop.tool.name",
  toolIndex: "edgeloop.tool.index",
  toolOk: "edgeloop.tool.ok",
  toolAttempts: "edgeloop.tool.attempts",
  toolCallId: "edgeloop.tool.call_id",
  reward: "edgeloop.reward",
  numTurns: "edgeloop.num_turns",
  truncated: "edgeloop.truncated",
  responseTokens: "edgeloop.response_tokens",
  stored: "edgeloop.queue.stored",
  queueOp: "edgeloop.queue.op",
} as const;

/** The edgeloop tracer from the global provider: a no-op until an SDK registers one at the edge. */
export function edgeloopTracer(): Tracer {
  return trace.getTracer(TRACER_NAME);
}

/** Marks a span failed with the error (exception event + ERROR status). */
export function recordError(span: Span, e: unknown): void {
  if (!span.isRecording()) return;
  span.recordException(e instanceof Error ? e : String(e));
  span.setStatus({ code: SpanStatusCode.ERROR, message: e instanceof Error ? e.message : String(e) });
}

/**
 * Runs `fn` inside a new active span `name` (child of `parent`, default the
 * active context), ends it when `fn` settles and records a thrown error.
 * With no tracer provider registered this is a no-op span: no allocation
 * beyond the API's shared non-recording span.
 */
export async function withSpan<T>(name: string, attributes: Attributes, fn: (span: Span) => Promise<T>, parent?: Context): Promise<T> {
  const tracer = edgeloopTracer();
  const ctx = parent ?? context.active();
  const span = tracer.startSpan(name, { attributes }, ctx);
  try {
    return await context.with(trace.setSpan(ctx, span), () => fn(span));
  } catch (e) {
    recordError(span, e);
    throw e;
  } finally {
    span.end();
  }
}
