import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BatchSpanProcessor, SimpleSpanProcessor, TracerProvider, type SpanExporter } from "@opentelemetry/sdk-trace";

/** Options of {@link setupTelemetry}. */
export interface TelemetryOptions {
  /** Where spans go; default an OTLP/HTTP (JSON) exporter configured from `OTEL_EXPORTER_OTLP_*`. */
  exporter?: SpanExporter;
  /** `service.name` of the resource (default `OTEL_SERVICE_NAME`, else `edgeloop`). */
  serviceName?: string;
  /** Export every span as it ends (tests) instead of in batches. */
  simple?: boolean;
}

/** A registered tracer provider; `shutdown` flushes pending spans and unregisters the globals. */
export interface Telemetry {
  provider: TracerProvider;
  flush(): Promise<void>;
  shutdown(): Promise<void>;
}

/**
 * Registers the OpenTelemetry SDK as the global tracer provider, with an
 * `AsyncLocalStorage` context manager so that spans opened in `shared/`
 * nest across `await`s. Only edges (CLI, servers, tests) call this; `shared/`
 * talks to `@opentelemetry/api` only and stays a no-op without it.
 * @see https://opentelemetry.io/docs/languages/js/
 */
export function setupTelemetry(opts: TelemetryOptions = {}): Telemetry {
  const exporter = opts.exporter ?? new OTLPTraceExporter();
  const processor = opts.simple ? new SimpleSpanProcessor({ exporter }) : new BatchSpanProcessor({ exporter });
  const provider = new TracerProvider({
    resource: resourceFromAttributes({ "service.name": opts.serviceName ?? process.env.OTEL_SERVICE_NAME ?? "edgeloop" }),
    spanProcessors: [processor],
  });
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  trace.setGlobalTracerProvider(provider);
  let down: Promise<void> | null = null;
  return {
    provider,
    flush: () => provider.forceFlush(),
    shutdown() {
      down ??= provider.shutdown().finally(() => {
        trace.disable();
        context.disable();
      });
      return down;
    },
  };
}

/**
 * {@link setupTelemetry} with the OTLP/HTTP exporter when
 * `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is
 * set and `OTEL_SDK_DISABLED` is not `true`; otherwise null and nothing is
 * registered (tracing stays the API's no-op).
 */
export function setupTelemetryFromEnv(env: Record<string, string | undefined> = process.env): Telemetry | null {
  const url = otlpTracesUrl(env);
  if (!url) return null;
  return setupTelemetry({ exporter: new OTLPTraceExporter({ url }), serviceName: env.OTEL_SERVICE_NAME });
}

/**
 * The OTLP/HTTP traces URL the environment names: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
 * as is, else `OTEL_EXPORTER_OTLP_ENDPOINT` + `/v1/traces` (the OTLP
 * exporter specification's rule); null without either, or with
 * `OTEL_SDK_DISABLED=true`.
 * @see https://opentelemetry.io/docs/specs/otel/protocol/exporter/
 */
export function otlpTracesUrl(env: Record<string, string | undefined>): string | null {
  if (env.OTEL_SDK_DISABLED?.toLowerCase() === "true") return null;
  return env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT || (env.OTEL_EXPORTER_OTLP_ENDPOINT ? `${env.OTEL_EXPORTER_OTLP_ENDPOINT.replace(/\/+$/, "")}/v1/traces` : null);
}
