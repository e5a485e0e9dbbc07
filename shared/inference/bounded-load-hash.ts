import { fnv1a32, mix32 } from "./hash.ts";
import { leastInflight, type ReplicaLoad, type RoutingPolicy } from "./routing-policy.ts";

/** Default ε of bounded-load hashing: a replica may carry up to 1.25× the mean in-flight load. */
export const DEFAULT_EPSILON = 0.25;

/**
 * Rendezvous (highest-random-weight) hashing with bounded load: a key's
 * replicas are ordered by `hash(key, url)`; the call goes to the first one
 * whose in-flight count is below the cap `max(⌈t/n⌉, ⌊(1+ε)·t/n⌋)`, where
 * `t` = total in-flight including this call, else spills to the next in that
 * order. (Flooring keeps max/mean ≤ 1+ε once loads are large enough; the
 * `⌈t/n⌉` floor keeps the cap feasible at small loads.) Needs no
 * shared state, so many gateway instances agree on a key's replica whenever
 * nobody is overloaded; adding or removing a replica moves only ~1/n keys.
 * Calls without a key go to the least in-flight candidate.
 * @see Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads" (2018)
 * @see SGLang Model Gateway `consistent_hashing` (docs/engines.md §4.1)
 */
export class BoundedLoadHashRouter implements RoutingPolicy {
  readonly name = "bounded_load_hash" as const;
  readonly epsilon: number;

  constructor(opts: { epsilon?: number } = {}) {
    const eps = opts.epsilon ?? DEFAULT_EPSILON;
    if (!(eps > 0) || !Number.isFinite(eps)) throw new RangeError(`epsilon must be a positive number, got ${eps}`);
    this.epsilon = eps;
  }

  /** The first candidate in the key's rendezvous order that is under the load bound. */
  choose(key: string | undefined, candidates: readonly ReplicaLoad[]): string {
    if (key === undefined) return leastInflight(candidates).url;
    const order = rendezvousOrder(key, candidates);
    let total = 0;
    for (const c of candidates) total += c.inflight;
    const cap = boundedLoadCap(total + 1, candidates.length, this.epsilon);
    for (const c of order) if (c.inflight < cap) return c.url;
    return order[0].url;
  }
}

/** `candidates` sorted by descending rendezvous weight for `key` (ties by URL, so the order is total). */
export function rendezvousOrder<T extends { url: string }>(key: string, candidates: readonly T[]): T[] {
  const k = fnv1a32(key);
  return candidates
    .map((c) => ({ c, w: mix32(fnv1a32(c.url, k) ^ k) }))
    .sort((a, b) => b.w - a.w || (a.c.url < b.c.url ? -1 : a.c.url > b.c.url ? 1 : 0))
    .map((x) => x.c);
}

/** The most in-flight calls one of `n` replicas may hold when `t` are in flight in all: `max(⌈t/n⌉, ⌊(1+ε)·t/n⌋)`. */
export function boundedLoadCap(t: number, n: number, epsilon: number): number {
  return Math.max(Math.ceil(t / n), Math.floor(((1 + epsilon) * t) / n));
}
