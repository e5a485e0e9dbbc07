import type { ReplicaLoad, RoutingPolicy } from "./routing-policy.ts";

/** Baseline policy: cycles through the candidates, ignoring the key (no affinity, no load awareness). */
export class RoundRobinRouter implements RoutingPolicy {
  readonly name = "round_robin" as const;
  private next = 0;

  /** The next candidate in turn. */
  choose(_key: string | undefined, candidates: readonly ReplicaLoad[]): string {
    const c = candidates[this.next % candidates.length];
    this.next = (this.next + 1) % 1_000_000_007;
    return c.url;
  }
}
