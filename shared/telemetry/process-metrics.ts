import { FieldCounts, TOOL_LATENCY_BUCKETS } from "./batch-metrics.ts";
import type { PromFamily, PromSample } from "./prometheus.ts";

/** Upper bounds (seconds) of the engine request latency histogram buckets; `+Inf` is implied. */
export const ENGINE_LATENCY_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300] as const;

/** A histogram of {@link FieldCounts} with its Prometheus samples: `_bucket` (cumulative, `+Inf` = count), `_sum`, `_count`, each with `labels` added. */
export class Histogram extends FieldCounts {
  samples(labels: Record<string, string> = {}): PromSample[] {
    const h = this.snapshot();
    return [
      ...h.buckets.map((b) => ({ suffix: "_bucket" as const, labels: { ...labels, le: String(b.le) }, value: b.count })),
      { suffix: "_sum", labels, value: h.sum },
      { suffix: "_count", labels, value: h.count },
    ];
  }
}

/**
 * What this process itself did, counted where it happens (the trajectory
 * tracer's engine and tool wrappers, which every agent loop runs through —
 * in-process batches, durable sessions, `edgeloop worker`), whatever became
 * of the trajectory afterwards (stored, failed, cancelled, surplus). Each
 * process reports its own calls: `serve` in queue mode makes none (its
 * workers do, and expose them on `--metrics-port`), so summing over processes
 * counts every call once.
 *
 * `edgeloop_tool_calls_total` and `edgeloop_tool_call_duration_seconds_count`
 * are bumped together for every tool call sent, so they are always equal. A
 * tool call the loop answers itself (an unknown tool, malformed arguments) is
 * sent nowhere: it counts in the records' `extra_fields.tool_calls` and
 * `tool_errors` (and `edgeloop_tool_errors_total`), not here.
 */
export class ProcessMetrics {
  private readonly tool = new Histogram(TOOL_LATENCY_BUCKETS);
  private toolErrors = 0;
  private readonly engine = { ok: new Histogram(ENGINE_LATENCY_BUCKETS), error: new Histogram(ENGINE_LATENCY_BUCKETS) };
  private promptTokens = 0;
  private generatedTokens = 0;
  private engineRetries = 0;

  /** One tool call: its latency (seconds, webhook round trip with retries) and whether it answered ok. */
  observeToolCall(seconds: number, ok: boolean): void {
    this.tool.observe(seconds);
    if (!ok) this.toolErrors++;
  }

  /**
   * One engine `generate` call: its latency (seconds, retries included),
   * whether it returned tokens, and — when it did — the prompt tokens sent
   * and the tokens generated (`rate()` of their counters is tokens/s).
   */
  observeEngineCall(seconds: number, ok: boolean, tokens?: { prompt: number; generated: number }): void {
    this.engine[ok ? "ok" : "error"].observe(seconds);
    if (tokens) {
      this.promptTokens += tokens.prompt;
      this.generatedTokens += tokens.generated;
    }
  }

  /** One retry of an engine call (a retryable failure answered by another attempt: `RetryingClient`, teacher calls). */
  observeEngineRetry(): void {
    this.engineRetries++;
  }

  /** The families to render with `formatPrometheus`. */
  families(): PromFamily[] {
    return [
      { name: "edgeloop_tool_calls_total", help: "Tool calls this process sent to a tool (each a webhook round trip, retries included), whatever became of their trajectory; calls edgeloop answered itself (unknown tool, malformed call) are not sent.", type: "counter", samples: [{ value: this.tool.count }] },
      { name: "edgeloop_tool_call_errors_total", help: "Of edgeloop_tool_calls_total, the calls that answered with an error (ok: false) or threw.", type: "counter", samples: [{ value: this.toolErrors }] },
      { name: "edgeloop_tool_call_duration_seconds", help: "Latency of each tool call this process made (webhook round trip, retries included).", type: "histogram", samples: this.tool.samples() },
      {
        name: "edgeloop_engine_request_duration_seconds",
        help: "Latency of each engine generate call this process made (retries included), by outcome (ok: tokens returned; error: the call failed after its retries, or was aborted).",
        type: "histogram",
        samples: [...this.engine.ok.samples({ outcome: "ok" }), ...this.engine.error.samples({ outcome: "error" })],
      },
      { name: "edgeloop_engine_prompt_tokens_total", help: "Prompt tokens of the engine generate calls this process made that returned (rate() is prompt tokens/s).", type: "counter", samples: [{ value: this.promptTokens }] },
      { name: "edgeloop_engine_generated_tokens_total", help: "Tokens the engine generated for this process's calls that returned (rate() is generated tokens/s).", type: "counter", samples: [{ value: this.generatedTokens }] },
      { name: "edgeloop_engine_retries_total", help: "Engine call attempts this process retried after a retryable failure (engine unavailable, a garbled reply).", type: "counter", samples: [{ value: this.engineRetries }] },
    ];
  }
}

/** The process's metrics: fed by the trajectory tracer, rendered by `serve`'s `/metrics` and `worker --metrics-port`. */
export const processMetrics = new ProcessMetrics();
