import { formatPrometheus, type PromFamily } from "../telemetry/prometheus.ts";
import { FAILURE_KINDS, REPIN_REASONS, type ReplicaState, type ReplicaStatus } from "./replica-pool.ts";
import { redactUrl } from "../http/outbound.ts";

const STATES: readonly ReplicaState[] = ["healthy", "unhealthy", "ejected", "half_open"];

/**
 * The gateway's Prometheus exposition (`GET /metrics`), from the pool's
 * replica statuses: per replica `edgeloop_gateway_replica_healthy`,
 * `…_replica_state{state}` (1 for the current state), `…_inflight`,
 * `…_requests_total`, `…_failures_total{kind}` (timeout, client_abort,
 * connect, http_5xx, bad_reply), `…_ejections_total`, `…_probes_total{result}`
 * `…_repins_total{reason}` (routing keys that left the replica),
 * `…_prompt_tokens_total`, `…_cached_tokens_total` and `…_prefix_hit_rate`
 * (the replica's reported prefix-cache hits; 0 before any report).
 */
export function gatewayMetricsText(replicas: readonly ReplicaStatus[]): string {
  const per = (name: string, help: string, type: PromFamily["type"], value: (r: ReplicaStatus) => number): PromFamily => ({
    name,
    help,
    type,
    samples: replicas.map((r) => ({ labels: { replica: redactUrl(r.url) }, value: value(r) })),
  });
  const families: PromFamily[] = [
    per("edgeloop_gateway_replica_healthy", "1 when the replica is in rotation (state healthy)", "gauge", (r) => (r.healthy ? 1 : 0)),
    {
      name: "edgeloop_gateway_replica_state",
      help: "The replica's circuit state (1 for the current one)",
      type: "gauge",
      samples: replicas.flatMap((r) => STATES.map((state) => ({ labels: { replica: redactUrl(r.url), state }, value: r.state === state ? 1 : 0 }))),
    },
    per("edgeloop_gateway_inflight", "Calls in flight at the replica", "gauge", (r) => r.inflight),
    per("edgeloop_gateway_requests_total", "Calls routed to the replica (attempts, failed ones included)", "counter", (r) => r.attempts),
    per("edgeloop_gateway_served_total", "Replies from the replica passed on with a 2xx status", "counter", (r) => r.served),
    {
      name: "edgeloop_gateway_failures_total",
      help: "Calls that failed at the replica before any token came back, by kind",
      type: "counter",
      samples: replicas.flatMap((r) => FAILURE_KINDS.map((kind) => ({ labels: { replica: redactUrl(r.url), kind }, value: r.failures_by_kind[kind] }))),
    },
    per("edgeloop_gateway_ejections_total", "Times the circuit breaker ejected the replica", "counter", (r) => r.ejections),
    {
      name: "edgeloop_gateway_probes_total",
      help: "Half-open probe calls sent to the replica after a cool-down, by result",
      type: "counter",
      samples: replicas.flatMap((r) => [
        { labels: { replica: redactUrl(r.url), result: "ok" }, value: r.probes_ok },
        { labels: { replica: redactUrl(r.url), result: "failed" }, value: r.probes_failed },
      ]),
    },
    {
      name: "edgeloop_gateway_repins_total",
      help: "Routing keys (sessions) that moved away from the replica, by reason",
      type: "counter",
      samples: replicas.flatMap((r) => REPIN_REASONS.map((reason) => ({ labels: { replica: redactUrl(r.url), reason }, value: r.repins_by_reason[reason] }))),
    },
    per("edgeloop_gateway_prompt_tokens_total", "Prompt tokens of served calls whose reply reported prefix-cache use", "counter", (r) => r.prompt_tokens),
    per("edgeloop_gateway_cached_tokens_total", "Prompt tokens the replica reported as served from its prefix cache", "counter", (r) => r.cached_tokens),
    per("edgeloop_gateway_prefix_hit_rate", "cached_tokens / prompt_tokens of the replica's reports (0 before any)", "gauge", (r) => r.prefix_hit_rate ?? 0),
  ];
  return formatPrometheus(families);
}
