import { boundedLoadCap } from "./bounded-load-hash.ts";

/** Default lifetime of a session pin, refreshed by every call that uses it: 1 hour, in ms. */
export const DEFAULT_PIN_TTL_MS = 3_600_000;
/** Default lifetime of an in-flight lease without a heartbeat: 30 s, in ms (a dead instance's load is gone after it). */
export const DEFAULT_LEASE_TTL_MS = 30_000;

/** One routing decision asked of a {@link RoutingState}. */
export interface RouteRequest {
  /** The routing key (trajectory key): its pin is read, kept or moved, and refreshed. Absent: least-loaded, no pin. */
  key?: string;
  /**
   * The replicas this call may use, in preference order for a key with no
   * usable pin (the gateway passes the rendezvous order of the prompt's prefix
   * key, else of the routing key). Non-empty; replicas already tried by this
   * call and replicas this instance saw refuse connections are left out.
   */
  order: readonly string[];
  /** True: a key with no usable pin takes the first replica of `order` under the cap; false: the least-loaded one (default: whether `key` is set). */
  ordered?: boolean;
  /** ε of the bounded-load cap `max(⌈t/n⌉, ⌊(1+ε)·t/n⌋)` over live leases (t includes this call), for placing a key with no usable pin. */
  epsilon: number;
  /** ε of the cap past which a pinned key moves (default `epsilon`); larger keeps sessions (and their cached prefixes) in place through bursts. */
  stickyEpsilon?: number;
  /**
   * A pinned key never moves for load while its replica holds fewer live
   * leases than this (default 0): at a handful of calls in flight the cap's
   * `⌈t/n⌉` floor is 1–2, and moving a session there throws its cached prefix
   * away for nothing.
   */
  stickyMinLoad?: number;
}

/** What {@link RoutingState.route} decided. */
export interface RouteResult {
  /** The replica to call. */
  url: string;
  /** The in-flight lease taken on `url`: pass it to {@link RoutingState.release} when the call ends. */
  lease: string;
  /** True when this call is the half-open probe of an ejected replica whose cool-down passed (one instance gets it). */
  probe: boolean;
  /** The replica the key was pinned to before this call (null: no pin, or no key). */
  previous: string | null;
  /** Replicas among `order` that the shared state holds as ejected: URL → end of the cool-down (epoch ms). */
  ejected: Record<string, number>;
}

/**
 * Routing state that every gateway instance of a deployment shares: session
 * pins (TTL, refreshed on use), per-replica in-flight **leases** (expiring, so
 * a crashed instance leaks no load) and replica ejections (the circuit state),
 * with one decision rule:
 *
 * 1. an ejected replica in `order` whose cool-down has passed and whose probe
 *    slot is free becomes this call's half-open probe (the slot is taken, so
 *    one instance probes it);
 * 2. otherwise the open replicas (not ejected; all of `order` when every one is)
 *    are loaded with their live leases; `cap = max(⌈(t+1)/n⌉, ⌊(1+ε)(t+1)/n⌋)`;
 * 3. the key's pin is kept when its replica is open and under the sticky cap
 *    (the same formula with `stickyEpsilon`, at least `stickyMinLoad`); else
 *    (`ordered`) the first open replica of `order` under the cap (else the
 *    first open one), or (not `ordered`) the least-loaded open replica;
 * 4. the pin is written with its TTL and a lease is taken on the replica.
 *
 * Implementations: {@link MemoryRoutingState} (one process; the contract's
 * reference) and `RedisRoutingState` (TCP or Upstash REST: one EVAL per route).
 * @see Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads" (2018) for the cap
 */
export interface RoutingState {
  /** Decides one call's replica and takes a lease on it (see the rule above). */
  route(req: RouteRequest): Promise<RouteResult>;
  /** Ends a call's lease (idempotent; an expired lease is already gone). */
  release(url: string, lease: string): Promise<void>;
  /** Marks `url` ejected until `untilMs` (epoch ms) for every instance, and frees its probe slot. */
  eject(url: string, untilMs: number): Promise<void>;
  /** Marks `url` healthy for every instance (a probe or any call succeeded there). */
  restore(url: string): Promise<void>;
  /** Frees `url`'s probe slot without a verdict (the probe call was cancelled); it stays ejected. */
  endProbe(url: string): Promise<void>;
  /** Live leases per replica among `urls` (status pages, tests). */
  inflight(urls: readonly string[]): Promise<Record<string, number>>;
  /** The replica `key` is pinned to, or null. */
  pinned(key: string): Promise<string | null>;
  /** Stops heartbeats and closes what the state opened (not a commander it was given). */
  close(): Promise<void>;
}

/** Options shared by the implementations. */
export interface RoutingStateOptions {
  /** Pin lifetime in ms, refreshed on use (default {@link DEFAULT_PIN_TTL_MS}). */
  pinTtlMs?: number;
  /** Lease lifetime in ms; held leases are renewed every third of it (default {@link DEFAULT_LEASE_TTL_MS}). */
  leaseTtlMs?: number;
  /** Wall clock in epoch ms (tests). */
  now?: () => number;
}

/**
 * The rule's choice among open replicas, shared by both implementations'
 * tests and the memory state (the Redis script applies the same steps).
 * `loads[i]` = live leases of `open[i]`.
 */
export function chooseOpen(open: readonly string[], loads: readonly number[], pinned: string | null, ordered: boolean, epsilon: number, stickyEpsilon = epsilon, stickyMinLoad = 0): string {
  let total = 0;
  for (const l of loads) total += l;
  const cap = boundedLoadCap(total + 1, open.length, epsilon);
  if (pinned !== null) {
    const i = open.indexOf(pinned);
    if (i >= 0 && loads[i] < Math.max(stickyMinLoad, boundedLoadCap(total + 1, open.length, stickyEpsilon))) return pinned;
  }
  if (!ordered) {
    let best = 0;
    for (let i = 1; i < open.length; i++) if (loads[i] < loads[best]) best = i;
    return open[best];
  }
  for (let i = 0; i < open.length; i++) if (loads[i] < cap) return open[i];
  return open[0];
}

/**
 * {@link RoutingState} in one process's memory: the default when no store is
 * configured, and the reference the Redis implementation is tested against.
 * Leases expire after `leaseTtlMs` unless the call ends first (a process
 * that dies takes this state with it, so there is nothing to heartbeat).
 */
export class MemoryRoutingState implements RoutingState {
  private readonly pins = new Map<string, { url: string; until: number }>();
  private readonly leases = new Map<string, Map<string, number>>();
  private readonly ejected = new Map<string, number>();
  private readonly probes = new Map<string, number>();
  private readonly pinTtlMs: number;
  private readonly leaseTtlMs: number;
  private readonly now: () => number;
  private seq = 0;

  constructor(opts: RoutingStateOptions = {}) {
    this.pinTtlMs = opts.pinTtlMs ?? DEFAULT_PIN_TTL_MS;
    this.leaseTtlMs = opts.leaseTtlMs ?? DEFAULT_LEASE_TTL_MS;
    this.now = opts.now ?? (() => Date.now());
  }

  async route(req: RouteRequest): Promise<RouteResult> {
    if (req.order.length === 0) throw new RangeError("route: order must name at least one replica");
    const now = this.now();
    const ejected: Record<string, number> = {};
    for (const url of req.order) {
      const until = this.ejected.get(url);
      if (until !== undefined) ejected[url] = until;
    }
    const previous = req.key === undefined ? null : this.livePin(req.key, now);
    for (const url of req.order) {
      const until = ejected[url];
      if (until !== undefined && until <= now && (this.probes.get(url) ?? 0) <= now) {
        this.probes.set(url, now + this.leaseTtlMs);
        return { url, lease: this.take(url, now), probe: true, previous, ejected };
      }
    }
    let open = req.order.filter((u) => ejected[u] === undefined);
    if (open.length === 0) open = [...req.order];
    const loads = open.map((u) => this.count(u, now));
    const url = chooseOpen(open, loads, previous, req.ordered ?? req.key !== undefined, req.epsilon, req.stickyEpsilon ?? req.epsilon, req.stickyMinLoad ?? 0);
    if (req.key !== undefined) this.pins.set(req.key, { url, until: now + this.pinTtlMs });
    return { url, lease: this.take(url, now), probe: false, previous, ejected };
  }

  async release(url: string, lease: string): Promise<void> {
    this.leases.get(url)?.delete(lease);
  }

  async eject(url: string, untilMs: number): Promise<void> {
    this.ejected.set(url, untilMs);
    this.probes.delete(url);
  }

  async restore(url: string): Promise<void> {
    this.ejected.delete(url);
    this.probes.delete(url);
  }

  async endProbe(url: string): Promise<void> {
    this.probes.delete(url);
  }

  async inflight(urls: readonly string[]): Promise<Record<string, number>> {
    const now = this.now();
    return Object.fromEntries(urls.map((u) => [u, this.count(u, now)]));
  }

  async pinned(key: string): Promise<string | null> {
    return this.livePin(key, this.now());
  }

  async close(): Promise<void> {}

  private livePin(key: string, now: number): string | null {
    const p = this.pins.get(key);
    if (!p) return null;
    if (p.until <= now) {
      this.pins.delete(key);
      return null;
    }
    return p.url;
  }

  private take(url: string, now: number): string {
    const lease = `m${++this.seq}`;
    let m = this.leases.get(url);
    if (!m) this.leases.set(url, (m = new Map()));
    m.set(lease, now + this.leaseTtlMs);
    return lease;
  }

  private count(url: string, now: number): number {
    const m = this.leases.get(url);
    if (!m) return 0;
    let n = 0;
    for (const [id, until] of m) {
      if (until > now) n++;
      else m.delete(id);
    }
    return n;
  }
}
