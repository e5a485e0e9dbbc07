/** The routing policies the gateway offers (DESIGN §4.2). */
export type RoutingPolicyName = "least_inflight_sticky" | "bounded_load_hash" | "round_robin";

/** One replica as a policy sees it: its base URL and its in-flight call count. */
export interface ReplicaLoad {
  url: string;
  inflight: number;
}

/**
 * Chooses a replica for a call. `candidates` is non-empty, in the pool's
 * insertion order, and holds only replicas that may serve this call (healthy,
 * not already tried by this call). Policies keep no replica list of their own:
 * a removed or unhealthy replica simply stops being a candidate.
 */
export interface RoutingPolicy {
  readonly name: RoutingPolicyName;
  /** The URL of the chosen candidate. `key` is the routing key (absent: no affinity wanted). */
  choose(key: string | undefined, candidates: readonly ReplicaLoad[]): string;
  /** Drops whatever the policy remembers about a removed replica (optional). */
  forget?(url: string): void;
}

/** The candidate with the fewest in-flight calls; ties go to the earliest (verl's insertion-order tie-break). */
export function leastInflight(candidates: readonly ReplicaLoad[]): ReplicaLoad {
  let best = candidates[0];
  for (const c of candidates) if (c.inflight < best.inflight) best = c;
  return best;
}
