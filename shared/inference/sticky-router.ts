import { LRUCache } from "lru-cache";
import { leastInflight, type ReplicaLoad, type RoutingPolicy } from "./routing-policy.ts";

/** verl's sticky cache size (`DEFAULT_ROUTING_CACHE_SIZE`). */
export const DEFAULT_STICKY_KEYS = 10_000;

/**
 * verl's `least_inflight_sticky`: a key's first call goes to the candidate
 * with the fewest in-flight calls (ties: insertion order), and the key is
 * pinned there in an LRU of `maxKeys` keys; later calls with that key go to
 * the same replica while it is a candidate. Best effort: when the pinned
 * replica is removed, unhealthy or already tried by this call, the key is
 * re-pinned to a new least-loaded choice (and stays there).
 * State is per gateway instance; run one instance, or use {@link BoundedLoadHashRouter}.
 * @see verl `GlobalRequestLoadBalancer.acquire_server` (verl-agent-loop-spec.md §9.1)
 */
export class StickyRouter implements RoutingPolicy {
  readonly name = "least_inflight_sticky" as const;
  private readonly pins: LRUCache<string, string>;

  constructor(opts: { maxKeys?: number } = {}) {
    this.pins = new LRUCache({ max: opts.maxKeys ?? DEFAULT_STICKY_KEYS });
  }

  /** The pinned replica when it is a candidate, else the least in-flight candidate (then pinned). */
  choose(key: string | undefined, candidates: readonly ReplicaLoad[]): string {
    if (key !== undefined) {
      const pinned = this.pins.get(key);
      if (pinned !== undefined && candidates.some((c) => c.url === pinned)) return pinned;
    }
    const url = leastInflight(candidates).url;
    if (key !== undefined) this.pins.set(key, url);
    return url;
  }

  /** Drops every pin to `url`. */
  forget(url: string): void {
    for (const [k, v] of this.pins.entries()) if (v === url) this.pins.delete(k);
  }

  /** The replica `key` is pinned to, if any (for tests and status pages). */
  pinned(key: string): string | undefined {
    return this.pins.peek(key);
  }

  /** Number of pinned keys. */
  get size(): number {
    return this.pins.size;
  }
}
