import { ExportResultCode, type ExportResult } from "@opentelemetry/core";
import { JsonTraceSerializer } from "@opentelemetry/otlp-transformer";
import type { ReadableSpan, SpanExporter } from "@opentelemetry/sdk-trace";
import { context } from "@opentelemetry/api";
import { suppressTracing } from "@opentelemetry/core";

/**
 * An OTLP/HTTP (JSON) span exporter that sends with plain `fetch` (method,
 * headers, body, signal — nothing else): for runtimes whose `fetch` refuses
 * the browser options the stock exporter's fetch transport sets (workerd
 * throws on `mode` and `keepalive`). The body is the OTLP JSON encoding from
 * `@opentelemetry/otlp-transformer` (the stock exporters' own serializer).
 * One POST per export; a non-2xx or a network error fails that export (the
 * span processor drops those spans; tracing never fails the work it traces).
 * @see https://opentelemetry.io/docs/specs/otlp/#otlphttp
 */
export class FetchSpanExporter implements SpanExporter {
  private readonly pending = new Set<Promise<unknown>>();
  private stopped = false;

  constructor(private readonly opts: { url: string; timeoutMs?: number; headers?: Record<string, string> }) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    if (this.stopped) return done({ code: ExportResultCode.FAILED, error: new Error("exporter shut down") });
    const body = JsonTraceSerializer.serializeRequest(spans);
    if (!body) return done({ code: ExportResultCode.FAILED, error: new Error("spans could not be serialised") });
    // The export's own fetch is not traced (it would trace itself forever).
    const p = context.with(suppressTracing(context.active()), () =>
      fetch(this.opts.url, {
        method: "POST",
        headers: { "content-type": "application/json", ...this.opts.headers },
        body: body as Uint8Array<ArrayBuffer>,
        signal: AbortSignal.timeout(this.opts.timeoutMs ?? 10_000),
        redirect: "manual",
      }),
    ).then(
      async (res) => {
        await res.body?.cancel().catch(() => undefined);
        done(res.ok ? { code: ExportResultCode.SUCCESS } : { code: ExportResultCode.FAILED, error: new Error(`OTLP endpoint answered HTTP ${res.status}`) });
      },
      (e: unknown) => done({ code: ExportResultCode.FAILED, error: e instanceof Error ? e : new Error(String(e)) }),
    );
    this.pending.add(p);
    void p.finally(() => this.pending.delete(p));
  }

  /** Waits for the exports in flight. */
  async forceFlush(): Promise<void> {
    await Promise.all([...this.pending]);
  }

  async shutdown(): Promise<void> {
    this.stopped = true;
    await this.forceFlush();
  }
}
