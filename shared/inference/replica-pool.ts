import { BoundedLoadHashRouter } from "./bounded-load-hash.ts";
import { RoundRobinRouter } from "./round-robin-router.ts";
import type { ReplicaLoad, RoutingPolicy, RoutingPolicyName } from "./routing-policy.ts";
import { StickyRouter } from "./sticky-router.ts";

/** What the pool knows about one replica (the gateway's `/admin/replicas` shows this). */
export interface ReplicaStatus {
  url: string;
  healthy: boolean;
  /** Calls currently being served. */
  inflight: number;
  /** Calls routed here so far (including failed ones). */
  served: number;
  /** Calls that failed here before any token came back (connection error or 5xx). */
  failures: number;
}

/** Builds the policy object for a policy name (ε only matters to `bounded_load_hash`). */
export function createRoutingPolicy(name: RoutingPolicyName, opts: { epsilon?: number; maxKeys?: number } = {}): RoutingPolicy {
  switch (name) {
    case "least_inflight_sticky":
      return new StickyRouter({ maxKeys: opts.maxKeys });
    case "bounded_load_hash":
      return new BoundedLoadHashRouter({ epsilon: opts.epsilon });
    case "round_robin":
      return new RoundRobinRouter();
    default:
      throw new RangeError(`unknown routing policy ${JSON.stringify(name)}; use least_inflight_sticky, bounded_load_hash or round_robin`);
  }
}

/**
 * The replicas behind one gateway instance: membership (add/remove at run
 * time), health, in-flight counts, and a {@link RoutingPolicy} that picks
 * among them. Runtime-free and synchronous, so acquire/release are atomic
 * in a single-threaded event loop.
 */
export class ReplicaPool {
  readonly policy: RoutingPolicy;
  private readonly replicas = new Map<string, ReplicaStatus>();

  constructor(urls: readonly string[], policy: RoutingPolicy) {
    this.policy = policy;
    for (const u of urls) this.add(u);
  }

  /** Adds a replica (healthy, zero load); re-adding an existing URL resets its health only. */
  add(url: string): void {
    const u = normaliseUrl(url);
    const r = this.replicas.get(u);
    if (r) r.healthy = true;
    else this.replicas.set(u, { url: u, healthy: true, inflight: 0, served: 0, failures: 0 });
  }

  /** Removes a replica; its sticky keys move on their next call. Returns whether it was there. */
  remove(url: string): boolean {
    const u = normaliseUrl(url);
    this.policy.forget?.(u);
    return this.replicas.delete(u);
  }

  /** Marks a replica healthy or not (health checks, connection failures). Unknown URLs are ignored. */
  setHealthy(url: string, healthy: boolean): void {
    const r = this.replicas.get(normaliseUrl(url));
    if (r) r.healthy = healthy;
  }

  /** Replica URLs in insertion order. */
  urls(): string[] {
    return [...this.replicas.keys()];
  }

  /** A snapshot of every replica's status. */
  status(): ReplicaStatus[] {
    return [...this.replicas.values()].map((r) => ({ ...r }));
  }

  /**
   * Picks a replica for one call and counts it in flight. Candidates are the
   * healthy replicas not in `exclude`; when none is healthy, every replica not
   * in `exclude` (health may be stale, and trying beats failing). Returns
   * undefined when nothing is left. Pair every success with {@link release}.
   */
  acquire(key: string | undefined, exclude?: ReadonlySet<string>): string | undefined {
    const open: ReplicaLoad[] = [];
    const healthy: ReplicaLoad[] = [];
    for (const r of this.replicas.values()) {
      if (exclude?.has(r.url)) continue;
      open.push(r);
      if (r.healthy) healthy.push(r);
    }
    const candidates = healthy.length > 0 ? healthy : open;
    if (candidates.length === 0) return undefined;
    const url = this.policy.choose(key, candidates);
    const r = this.replicas.get(url)!;
    r.inflight++;
    r.served++;
    return url;
  }

  /** Ends one in-flight call on `url` (never below zero; unknown URLs are ignored). */
  release(url: string, failed = false): void {
    const r = this.replicas.get(url);
    if (!r) return;
    if (r.inflight > 0) r.inflight--;
    if (failed) r.failures++;
  }
}

/** Strips trailing slashes so `http://h:1/` and `http://h:1` are one replica. */
export function normaliseUrl(url: string): string {
  return url.replace(/\/+$/, "");
}
