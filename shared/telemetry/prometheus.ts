/** One sample line of a metric family: `name{labels} value`, with an optional name suffix (`_bucket`, `_sum`, `_count`). */
export interface PromSample {
  labels?: Record<string, string>;
  value: number;
  suffix?: "_bucket" | "_sum" | "_count";
}

/** A metric family: `# HELP`, `# TYPE`, then its samples in order. */
export interface PromFamily {
  name: string;
  help: string;
  type: "counter" | "gauge" | "histogram" | "summary" | "untyped";
  samples: PromSample[];
}

/** `Content-Type` of the text exposition format. */
export const PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

/**
 * Renders families in the Prometheus text exposition format 0.0.4: HELP text
 * escapes `\` and newlines, label values escape `\`, `"` and newlines; values
 * are Go-style (`+Inf`, `-Inf`, `NaN`, shortest round-trip decimals).
 * The output ends with a newline.
 * @throws Error for a metric or label name outside the allowed characters (a programming error).
 * @see https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format
 */
export function formatPrometheus(families: readonly PromFamily[]): string {
  const out: string[] = [];
  for (const f of families) {
    if (!METRIC_NAME.test(f.name)) throw new Error(`invalid metric name '${f.name}'`);
    out.push(`# HELP ${f.name} ${f.help.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")}`);
    out.push(`# TYPE ${f.name} ${f.type}`);
    for (const s of f.samples) out.push(`${f.name}${s.suffix ?? ""}${formatLabels(s.labels)} ${formatValue(s.value)}`);
  }
  return out.length ? out.join("\n") + "\n" : "";
}

function formatLabels(labels: Record<string, string> | undefined): string {
  if (!labels) return "";
  const parts = Object.entries(labels).map(([k, v]) => {
    if (!LABEL_NAME.test(k) || k.startsWith("__")) throw new Error(`invalid label name '${k}'`);
    return `${k}="${v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n")}"`;
  });
  return parts.length ? `{${parts.join(",")}}` : "";
}

/** A sample value as Prometheus writes it. */
export function formatValue(v: number): string {
  if (Number.isNaN(v)) return "NaN";
  if (v === Infinity) return "+Inf";
  if (v === -Infinity) return "-Inf";
  return String(v);
}
