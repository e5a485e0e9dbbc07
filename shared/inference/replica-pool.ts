import { LRUCache } from "lru-cache";
import { BoundedLoadHashRouter } from "./bounded-load-hash.ts";
import { RoundRobinRouter } from "./round-robin-router.ts";
import type { ReplicaLoad, RoutingPolicy, RoutingPolicyName } from "./routing-policy.ts";
import { StickyRouter } from "./sticky-router.ts";

/**
 * Why one call failed at one replica before any token came back:
 * `timeout` (the gateway's per-attempt deadline passed), `client_abort` (the
 * caller gave up at its own declared deadline while the replica was silent),
 * `connect` (refused or reset), `http_5xx`, `bad_reply` (a 2xx whose body is
 * not JSON or not the engine's wire schema).
 */
export type FailureKind = "timeout" | "client_abort" | "connect" | "http_5xx" | "bad_reply";
export const FAILURE_KINDS: readonly FailureKind[] = ["timeout", "client_abort", "connect", "http_5xx", "bad_reply"];

/**
 * A replica's circuit state: `healthy`; `unhealthy` (a refused connection or a
 * failed health check; the next passing health check restores it); `ejected`
 * (`ejectAfter` consecutive failures: out of rotation until `ejected_until_ms`);
 * `half_open` (the cool-down passed and one probe call is in flight: success
 * restores it, failure ejects it again).
 */
export type ReplicaState = "healthy" | "unhealthy" | "ejected" | "half_open";

/**
 * Why a routing key left a replica (`repins_by_reason`): `unhealthy` (it was
 * ejected, half-open or unhealthy), `failover` (it failed this very call),
 * `load` (the policy spread load elsewhere: bounded-load hashing's cap).
 * Keys of a removed replica move uncounted (its record is gone).
 */
export type RepinReason = "unhealthy" | "failover" | "load";
export const REPIN_REASONS: readonly RepinReason[] = ["unhealthy", "failover", "load"];

/** What the pool knows about one replica (the gateway's `/admin/replicas` shows this). */
export interface ReplicaStatus {
  url: string;
  /** True only in state `healthy`: the policy routes to it. */
  healthy: boolean;
  state: ReplicaState;
  /** Calls currently being served. */
  inflight: number;
  /** Replies from it passed on to the caller with a 2xx status (a call it actually served). */
  served: number;
  /** Calls routed to it so far: every attempt, failed ones, probes and non-2xx replies included. */
  attempts: number;
  /** Calls that failed here before any token came back (every kind). */
  failures: number;
  failures_by_kind: Record<FailureKind, number>;
  /** Failures since the last success (the breaker's counter). */
  consecutive_failures: number;
  /** Times the breaker ejected it. */
  ejections: number;
  /** Half-open probes sent to it; how many restored it and how many failed (re-ejecting it). */
  probes: number;
  probes_ok: number;
  probes_failed: number;
  /** Routing keys that moved away from it, by reason. */
  repins: number;
  repins_by_reason: Record<RepinReason, number>;
  /** While ejected: when (epoch ms) a half-open probe may go. */
  ejected_until_ms: number | null;
  /** Prompt tokens of the 2xx replies it served (their `usage.prompt_tokens` / `meta_info.prompt_tokens`). */
  prompt_tokens: number;
  /**
   * Prompt tokens it reported as served from its prefix cache: vLLM's
   * `usage.prompt_tokens_details.cached_tokens` (absent counts as 0: vLLM omits
   * a zero), SGLang's `meta_info.cached_tokens`.
   */
  cached_tokens: number;
  /** `cached_tokens / prompt_tokens`; null until the replica has reported a cache count at all (vLLM without `--enable-prompt-tokens-details`). */
  prefix_hit_rate: number | null;
}

/** The circuit breaker's settings. */
export interface BreakerOptions {
  /** Consecutive failures that eject a replica (default 3). */
  ejectAfter?: number;
  /** Cool-down after an ejection before one probe call is let through, in ms (default 10,000). */
  cooldownMs?: number;
  /** Routing keys remembered for re-pin counting (default 10,000). */
  maxKeys?: number;
  /** Wall clock in epoch ms (tests). */
  now?: () => number;
}

export const DEFAULT_EJECT_AFTER = 3;
export const DEFAULT_COOLDOWN_MS = 10_000;

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

/** Internal record: the status plus the probe flag and whether it ever reported a cache count. */
interface Replica extends ReplicaStatus {
  probing: boolean;
  cache_reported: boolean;
}

/**
 * The replicas behind one gateway instance: membership (add/remove at run
 * time), health, in-flight counts, a circuit breaker per replica, and a
 * {@link RoutingPolicy} that picks among them. Runtime-free and synchronous,
 * so acquire and the outcome calls are atomic in a single-threaded event loop.
 *
 * Breaker: every failure ({@link fail}) counts; `ejectAfter` in a row eject
 * the replica (out of rotation, so the keys pinned to it are re-pinned on
 * their next call, counted in `repins`); after `cooldownMs` the next call is
 * sent to it as the one half-open probe, whatever its key (the key's pin is
 * left alone); {@link succeed} restores it, a failure ejects it again for
 * another cool-down.
 * @see Envoy outlier detection (`consecutive_5xx`, `base_ejection_time`) and the circuit-breaker pattern's half-open state
 */
export class ReplicaPool {
  readonly policy: RoutingPolicy;
  readonly ejectAfter: number;
  readonly cooldownMs: number;
  private readonly replicas = new Map<string, Replica>();
  private readonly now: () => number;
  /** The replica each routing key was last served by (keyed policies only), for re-pin counting. */
  private readonly lastByKey: LRUCache<string, string> | undefined;

  constructor(urls: readonly string[], policy: RoutingPolicy, breaker: BreakerOptions = {}) {
    this.policy = policy;
    this.ejectAfter = breaker.ejectAfter ?? DEFAULT_EJECT_AFTER;
    this.cooldownMs = breaker.cooldownMs ?? DEFAULT_COOLDOWN_MS;
    if (!Number.isInteger(this.ejectAfter) || this.ejectAfter < 1) throw new RangeError(`ejectAfter must be an integer >= 1, got ${this.ejectAfter}`);
    if (!(this.cooldownMs >= 0)) throw new RangeError(`cooldownMs must be >= 0, got ${this.cooldownMs}`);
    this.now = breaker.now ?? (() => Date.now());
    this.lastByKey = policy.name === "round_robin" ? undefined : new LRUCache({ max: breaker.maxKeys ?? 10_000 });
    for (const u of urls) this.add(u);
  }

  /** Adds a replica (healthy, zero load); re-adding an existing URL restores it to healthy. */
  add(url: string): void {
    const u = normaliseUrl(url);
    const r = this.replicas.get(u);
    if (r) this.restore(r);
    else this.replicas.set(u, fresh(u));
  }

  /** Removes a replica; its sticky keys move on their next call. Returns whether it was there. */
  remove(url: string): boolean {
    const u = normaliseUrl(url);
    this.policy.forget?.(u);
    return this.replicas.delete(u);
  }

  /**
   * Health-check result (or a refused connection). A failed check makes a
   * healthy replica `unhealthy`; a passing one restores an `unhealthy`
   * replica. An ejected or half-open replica is left to its breaker: a replica
   * that answers `/health` but hangs or garbles calls must prove itself with a
   * real call. Unknown URLs are ignored.
   */
  setHealthy(url: string, healthy: boolean): void {
    const r = this.replicas.get(normaliseUrl(url));
    if (!r || r.state === "ejected" || r.state === "half_open") return;
    if (healthy) this.restore(r);
    else {
      r.state = "unhealthy";
      r.healthy = false;
    }
  }

  /** Replica URLs in insertion order. */
  urls(): string[] {
    return [...this.replicas.keys()];
  }

  /** A snapshot of every replica's status. */
  status(): ReplicaStatus[] {
    return [...this.replicas.values()].map(({ probing: _p, cache_reported: _c, ...r }) => ({
      ...r,
      failures_by_kind: { ...r.failures_by_kind },
      repins_by_reason: { ...r.repins_by_reason },
      prefix_hit_rate: r.prompt_tokens > 0 && _c ? r.cached_tokens / r.prompt_tokens : null,
    }));
  }

  /** A replica's circuit state (undefined for an unknown URL). */
  stateOf(url: string): ReplicaState | undefined {
    return this.replicas.get(normaliseUrl(url))?.state;
  }

  /**
   * Counts one call the shared routing state placed on `url` (see
   * `RoutingState`): in flight, attempted, and, for a `probe`, the replica's
   * half-open probe (its outcome is then judged by {@link succeed} / {@link fail}
   * as for a probe this pool chose). Returns false for an unknown URL.
   */
  begin(url: string, probe: boolean): boolean {
    const r = this.replicas.get(url);
    if (!r) return false;
    r.inflight++;
    r.attempts++;
    if (probe) {
      r.state = "half_open";
      r.healthy = false;
      r.probing = true;
      r.probes++;
    }
    return true;
  }

  /**
   * Mirrors the shared state's view of `url`'s ejection: `untilMs` (epoch ms)
   * when another instance ejected it, null when it is not ejected there (a
   * replica ejected here but restored elsewhere comes back). A probe in flight
   * here is left alone. Unknown URLs are ignored.
   */
  mirror(url: string, untilMs: number | null): void {
    const r = this.replicas.get(url);
    if (!r || r.probing) return;
    if (untilMs !== null) {
      r.state = "ejected";
      r.healthy = false;
      r.ejected_until_ms = untilMs;
    } else if (r.state === "ejected" || r.state === "half_open") this.restore(r);
  }

  /**
   * Counts a routing key that left `from` (the shared state moved its pin):
   * reason `unhealthy` when `from` is not healthy here or `ejectedElsewhere`,
   * `failover` when this call already tried it, else `load`.
   */
  countRepin(from: string, exclude: ReadonlySet<string> | undefined, ejectedElsewhere: boolean): void {
    const old = this.replicas.get(from);
    if (!old) return;
    const reason: RepinReason = old.state !== "healthy" || ejectedElsewhere ? "unhealthy" : exclude?.has(from) ? "failover" : "load";
    old.repins++;
    old.repins_by_reason[reason]++;
  }

  /**
   * Adds one reply's counts to `url`'s hit rate: `prompt` tokens, `cached` of
   * them from its prefix cache (null: not reported, counted as 0; the hit rate
   * stays null until some reply reported a number).
   */
  noteCache(url: string, prompt: number, cached: number | null): void {
    const r = this.replicas.get(url);
    if (!r || !(prompt > 0)) return;
    r.prompt_tokens += prompt;
    if (cached !== null) {
      r.cache_reported = true;
      r.cached_tokens += Math.min(cached, prompt);
    }
  }

  /**
   * Picks a replica for one call and counts it in flight. First, an ejected
   * replica whose cool-down has passed (and that has no probe in flight, and
   * is not in `exclude`) takes this call as its half-open probe. Otherwise
   * candidates are the healthy replicas not in `exclude`; when none is
   * healthy, every replica not in `exclude` (health may be stale, and trying
   * beats failing). Returns undefined when nothing is left. End every call
   * with {@link succeed}, {@link fail} or {@link release}.
   */
  acquire(key: string | undefined, exclude?: ReadonlySet<string>): string | undefined {
    const now = this.now();
    for (const r of this.replicas.values()) {
      if (r.state === "ejected" && !r.probing && (r.ejected_until_ms ?? 0) <= now && !exclude?.has(r.url)) {
        r.state = "half_open";
        r.probing = true;
        r.probes++;
        r.inflight++;
        r.attempts++;
        return r.url;
      }
    }
    const open: ReplicaLoad[] = [];
    const healthy: ReplicaLoad[] = [];
    for (const r of this.replicas.values()) {
      if (exclude?.has(r.url)) continue;
      open.push(r);
      if (r.state === "healthy") healthy.push(r);
    }
    const candidates = healthy.length > 0 ? healthy : open;
    if (candidates.length === 0) return undefined;
    const url = this.policy.choose(key, candidates);
    const r = this.replicas.get(url)!;
    r.inflight++;
    r.attempts++;
    if (key !== undefined && this.lastByKey) this.notePin(key, url, exclude);
    return url;
  }

  /**
   * Ends a call that got a usable reply: the failure streak ends and the
   * replica is healthy again, whatever its state (a half-open probe that
   * succeeded, or an ejected/unhealthy replica tried because none was healthy).
   * `served` (default true): the reply passed on was a 2xx, counted in
   * `served`; a 4xx the engine answered (e.g. a context overflow) is a working
   * replica but not a served call.
   */
  succeed(url: string, served = true): void {
    const r = this.replicas.get(url);
    if (!r) return;
    if (r.inflight > 0) r.inflight--;
    if (served) r.served++;
    if (r.probing) r.probes_ok++;
    this.restore(r);
  }

  /**
   * Ends a call that failed at `url` before any token came back, counting it
   * by kind. The `ejectAfter`-th failure in a row, or any failure of a
   * half-open probe, ejects the replica for `cooldownMs`; a refused
   * connection also marks a healthy replica `unhealthy` at once.
   * @returns whether this failure ejected the replica.
   */
  fail(url: string, kind: FailureKind): boolean {
    const r = this.replicas.get(url);
    if (!r) return false;
    if (r.inflight > 0) r.inflight--;
    r.failures++;
    r.failures_by_kind[kind]++;
    r.consecutive_failures++;
    if (r.probing || (r.state !== "ejected" && r.consecutive_failures >= this.ejectAfter)) {
      if (r.probing) r.probes_failed++;
      r.probing = false;
      r.state = "ejected";
      r.healthy = false;
      r.ejections++;
      r.ejected_until_ms = this.now() + this.cooldownMs;
      return true;
    }
    if (kind === "connect" && r.state === "healthy") {
      r.state = "unhealthy";
      r.healthy = false;
    }
    return false;
  }

  /**
   * Ends a call with no verdict on the replica (the caller cancelled before
   * its deadline; a streamed reply). `failed` (legacy) counts it as an
   * `http_5xx` failure. Never goes below zero; unknown URLs are ignored. A
   * half-open probe ended this way frees the probe slot, so the next call probes.
   */
  release(url: string, failed = false): void {
    if (failed) {
      this.fail(url, "http_5xx");
      return;
    }
    const r = this.replicas.get(url);
    if (!r) return;
    if (r.inflight > 0) r.inflight--;
    if (r.probing) {
      r.probing = false;
      r.state = "ejected";
    }
  }

  /** Total re-pins over every replica. */
  get repins(): number {
    let n = 0;
    for (const r of this.replicas.values()) n += r.repins;
    return n;
  }

  private notePin(key: string, url: string, exclude: ReadonlySet<string> | undefined): void {
    const prev = this.lastByKey!.get(key);
    this.lastByKey!.set(key, url);
    if (prev === undefined || prev === url) return;
    const old = this.replicas.get(prev);
    if (!old) return;
    const reason: RepinReason = old.state !== "healthy" ? "unhealthy" : exclude?.has(prev) ? "failover" : "load";
    old.repins++;
    old.repins_by_reason[reason]++;
  }

  private restore(r: Replica): void {
    r.state = "healthy";
    r.healthy = true;
    r.probing = false;
    r.consecutive_failures = 0;
    r.ejected_until_ms = null;
  }
}

function fresh(url: string): Replica {
  return {
    url,
    healthy: true,
    state: "healthy",
    inflight: 0,
    served: 0,
    attempts: 0,
    failures: 0,
    failures_by_kind: Object.fromEntries(FAILURE_KINDS.map((k) => [k, 0])) as Record<FailureKind, number>,
    consecutive_failures: 0,
    ejections: 0,
    probes: 0,
    probes_ok: 0,
    probes_failed: 0,
    repins: 0,
    repins_by_reason: Object.fromEntries(REPIN_REASONS.map((k) => [k, 0])) as Record<RepinReason, number>,
    ejected_until_ms: null,
    prompt_tokens: 0,
    cached_tokens: 0,
    prefix_hit_rate: null,
    probing: false,
    cache_reported: false,
  };
}

/** Strips trailing slashes so `http://h:1/` and `http://h:1` are one replica. */
export function normaliseUrl(url: string): string {
  return url.replace(/\/+$/, "");
}
