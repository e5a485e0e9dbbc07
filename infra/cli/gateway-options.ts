import type { GatewayOptions } from "../../functions/gateway.ts";
import type { GatewayConfig } from "../../shared/config/app-config.ts";

/**
 * The `createGatewayApp` options a config's `gateway` section sets (every key
 * but `shared_state`, `lease_ttl_ms` and `pin_ttl_ms`, which shape the
 * routing state: {@link buildRoutingState}). One place for `edgeloop gateway`,
 * the embedded gateway in front of simulated replicas and a teacher's `urls`.
 */
export function gatewayOptions(g: GatewayConfig): Pick<GatewayOptions, "attemptTimeoutMs" | "ejectAfter" | "cooldownMs" | "maxAttempts" | "healthIntervalMs" | "epsilon" | "stickyEpsilon" | "maxStickyKeys"> {
  return {
    ...(g.attempt_timeout_ms ? { attemptTimeoutMs: g.attempt_timeout_ms } : {}),
    ejectAfter: g.eject_after,
    cooldownMs: g.cooldown_ms,
    maxAttempts: g.max_attempts,
    healthIntervalMs: g.health_interval_ms,
    ...(g.epsilon !== null ? { epsilon: g.epsilon } : {}),
    ...(g.sticky_epsilon !== null ? { stickyEpsilon: g.sticky_epsilon } : {}),
    maxStickyKeys: g.max_sticky_keys,
  };
}
