import { FetchSpanExporter } from "../telemetry/fetch-exporter.ts";
import { otlpTracesUrl, setupTelemetry, type Telemetry } from "../telemetry/setup.ts";

/** The OpenTelemetry variables the Workers entry reads (wrangler.toml `[vars]` or secrets). */
export interface TelemetryEnv {
  /** OTLP/HTTP base URL; spans go to `{it}/v1/traces`. Unset: no tracing. */
  OTEL_EXPORTER_OTLP_ENDPOINT?: string;
  /** Full traces URL, instead of the base. */
  OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?: string;
  /** `service.name` of the spans (default `edgeloop`). */
  OTEL_SERVICE_NAME?: string;
  /** `true`: no tracing even with an endpoint. */
  OTEL_SDK_DISABLED?: string;
}

let isolate: { telemetry: Telemetry | null } | undefined;

/**
 * The isolate's tracer provider, registered on first call (the Worker's and
 * each Durable Object's isolate register their own): the same setup as the
 * CLI's (`setupTelemetry`: OTLP/HTTP JSON, `AsyncLocalStorage` context under
 * `nodejs_compat`), with {@link FetchSpanExporter} as the exporter: the stock
 * exporter's fetch transport sets `mode` and `keepalive`, which workerd's
 * `fetch` refuses, so its exports never left. Null without an endpoint (or
 * with `OTEL_SDK_DISABLED=true`).
 * A Worker has no process exit to flush on: callers pass {@link flushSpans}'
 * promise to `waitUntil` (Worker requests) or await it (Durable Object alarms).
 */
export function workerTelemetry(env: TelemetryEnv): Telemetry | null {
  if (!isolate) {
    const url = otlpTracesUrl({ ...env });
    isolate = { telemetry: url ? setupTelemetry({ exporter: new FetchSpanExporter({ url }), serviceName: env.OTEL_SERVICE_NAME || "edgeloop" }) : null };
  }
  return isolate.telemetry;
}

/** Exports the spans ended so far (never throws: tracing must not fail a request or an alarm). */
export function flushSpans(t: Telemetry | null): Promise<void> {
  return t ? t.flush().catch(() => undefined) : Promise.resolve();
}
