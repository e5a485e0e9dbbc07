import { z } from "zod";
import { ConfigError, StoreError } from "../errors.ts";
import { keyPart } from "../store/key-encoding.ts";
import { SandboxReleaseReason } from "../schema/sandbox.ts";

/**
 * The state of a sandbox lease: `creating` (the record is written before the
 * provider's create is sent), `live` (the provider answered a sandbox id),
 * `releasing` (one caller won the claim and is releasing it at the provider),
 * `released` (gone; the record stays as a tombstone for a while).
 */
export type LeaseStatus = "creating" | "live" | "releasing" | "released";

/** Every {@link LeaseStatus}, in lifecycle order. */
export const LEASE_STATUSES = ["creating", "live", "releasing", "released"] as const satisfies readonly LeaseStatus[];

/**
 * Why a lease is (being) released, sent to the provider's `release_url` as
 * `reason`. The `reaped_*` reasons are set by {@link LeaseStore.claimDue}
 * (a create hold, a live TTL or a release hold that lapsed).
 */
export const LEASE_REASONS = SandboxReleaseReason.options;

/** One of {@link LEASE_REASONS}. */
export type LeaseReason = (typeof LEASE_REASONS)[number];

/**
 * The store's record of one trajectory key's lease (the checkpoint of the
 * lease: written as `creating` before the create request is sent).
 */
export interface LeaseRecord {
  /** The trajectory key (`{uid}_{session_id}_{output_index}`), as given. */
  key: string;
  /** `{key}~{attempt}`: the provider's idempotency key for create and release. */
  lease_id: string;
  /** 1-based; bumped by a renewing {@link LeaseStore.acquire} after a release. */
  attempt: number;
  status: LeaseStatus;
  /** The provider's sandbox id, once {@link LeaseStore.confirm}ed (null while creating, or when the create never answered). */
  sandbox_id: string | null;
  /**
   * The sandbox's own endpoint (its create reply's `base_url`), set by
   * {@link LeaseStore.confirm}; null when the reply had none, or before.
   */
  base_url: string | null;
  /** When the lease was granted, store clock, epoch ms. */
  created_ms: number;
  /**
   * When the current status lapses, store clock, epoch ms: the create hold
   * (`creating`), the TTL (`live`), the release hold (`releasing`), or the
   * end of the tombstone (`released`). A non-released lease past it is due
   * for {@link LeaseStore.claimDue}.
   */
  expires_ms: number;
  /** Why it is released (set by claimRelease/claimDue), null before. */
  reason: LeaseReason | null;
}

/**
 * Admission limits of {@link LeaseStore.acquire}, passed per call (the
 * sandbox spec's): a token bucket of `burst` tokens refilled at `rate_per_s`
 * per second of store clock (fractional tokens accrue), and `max_live`
 * leases at most in the live set (creating + live + releasing).
 */
export interface LeaseLimits {
  /** Tokens refilled per second, > 0 (fractions fine). */
  rate_per_s: number;
  /** Bucket size, >= 1 (also the tokens of an unused bucket). */
  burst: number;
  /** Largest live set, an integer >= 1. */
  max_live: number;
}

/** The outcome of {@link LeaseStore.acquire}. */
export type AcquireResult =
  /** A new `creating` lease (attempt = previous + 1, or 1): one token taken, one slot of the live set held. */
  | { outcome: "granted"; lease: LeaseRecord }
  /** The key already has a lease that is not `released`, or a released one and `renew` was false. Nothing changed. */
  | { outcome: "exists"; lease: LeaseRecord }
  /**
   * Nothing changed. `rate`: the bucket holds less than one token, `wait_ms`
   * (>= 1) is the time until it holds one; `cap`: the live set is full,
   * `wait_ms` is {@link CAP_WAIT_MS}, a hint (callers back off with jitter).
   */
  | { outcome: "wait"; wait_ms: number; cause: "rate" | "cap" };

/** A lease to heartbeat: its key and the lease id the caller holds. */
export interface LeaseRef {
  key: string;
  leaseId: string;
}

/** A snapshot of the store, for metrics. */
export interface LeaseStoreStats {
  /** Leases in status `live` (not the whole live set: that is live + creating + releasing). */
  live: number;
  /** Leases in status `creating`. */
  creating: number;
  /** Leases in status `releasing`. */
  releasing: number;
  /** Tokens in the bucket now (refilled to the store clock with the last acquire's limits); null before any grant. */
  tokens: number | null;
  /**
   * Monotonic counters, present once counted: `granted`, `confirmed`,
   * `create_failed` (claimRelease with reason create_failed),
   * `released:<reason>` (finishRelease, by the record's reason),
   * `reaped:<reason>` (claimDue); Redis only: `orphaned` (a due entry
   * whose record was gone, dropped by claimDue).
   */
  counters: Record<string, number>;
}

/**
 * Shared state of sandbox leases: one lease per trajectory key, admission by
 * token bucket and live cap, and the expiry index the reaper claims from.
 * Every method is atomic on its own (across processes, for the Redis store),
 * and every transition names the lease id it expects, so a caller holding a
 * stale lease id changes nothing. Clock: the store's (never the caller's).
 *
 * Arguments are checked before the store is touched: a key that cannot be
 * encoded ({@link keyPart}) throws InputError; bad limits, hold/TTL ms or
 * claim limits throw ConfigError naming the field. Store failures and
 * malformed replies throw StoreError.
 */
export interface LeaseStore {
  /**
   * Grants a new `creating` lease of `key` expiring at now + `holdMs`, or
   * says why not (see {@link AcquireResult}). `renew`: a released lease of
   * the key is replaced by attempt + 1 (else `exists` with the released one).
   * Order of checks: existing lease, live cap, token bucket.
   */
  acquire(key: string, limits: LeaseLimits, holdMs: number, opts: { renew: boolean }): Promise<AcquireResult>;
  /** The key's record (a released one while its tombstone lasts), or null. */
  get(key: string): Promise<LeaseRecord | null>;
  /**
   * `creating` with `leaseId` → `live` with `sandboxId` (and `baseUrl`, the
   * create reply's `base_url`; default null), expiring now + `ttlMs`; null
   * (nothing changed) if the lease is not that any more.
   */
  confirm(key: string, leaseId: string, sandboxId: string, ttlMs: number, baseUrl?: string | null): Promise<LeaseRecord | null>;
  /** Each `live` lease of `entries` with its lease id → expires now + `ttlMs`; true per entry renewed, in order (one round trip for all). */
  heartbeat(entries: readonly LeaseRef[], ttlMs: number): Promise<boolean[]>;
  /**
   * `creating`|`live` with `leaseId` → `releasing` with `reason`, expiring
   * now + `holdMs` (after which the reaper takes it over). The winner gets the
   * record; everyone else (another claim won, wrong lease id, no lease) null.
   */
  claimRelease(key: string, leaseId: string, reason: LeaseReason, holdMs: number): Promise<LeaseRecord | null>;
  /** `releasing` with `leaseId` → `released`: out of the live set, a tombstone for `tombstoneS`. False (nothing changed) otherwise. */
  finishRelease(key: string, leaseId: string): Promise<boolean>;
  /**
   * Claims at most `limit` non-released leases whose `expires_ms` <= now,
   * earliest first: each → `releasing`, expiring now + `holdMs`, reason
   * `reaped_create` (was creating), `reaped_ttl` (was live) or
   * `reaped_release` (was releasing: its releaser died). Returns the claimed
   * records; a lease is claimed by one caller only.
   */
  claimDue(limit: number, holdMs: number): Promise<LeaseRecord[]>;
  /** Gauges and counters, see {@link LeaseStoreStats}. */
  stats(): Promise<LeaseStoreStats>;
  /** The store's clock, epoch ms. */
  now(): Promise<number>;
}

/** `wait_ms` of a `cap` wait: a hint, ms. */
export const CAP_WAIT_MS = 100;
/** Default tombstone lifetime of a released record, seconds (7 days). */
export const DEFAULT_TOMBSTONE_S = 604_800;
/** Largest `limit` of one {@link LeaseStore.claimDue}. */
export const MAX_CLAIM_DUE = 10_000;
/** Longest hold or TTL accepted, ms (30 days). */
export const MAX_LEASE_MS = 30 * 86_400_000;

const LimitsSchema = z.object({
  rate_per_s: z.number().finite().gt(0, "must be > 0"),
  burst: z.number().finite().gte(1, "must be >= 1"),
  max_live: z.number().int("must be an integer").gte(1, "must be >= 1"),
});

/**
 * Checks {@link LeaseLimits}.
 * @throws ConfigError naming `limits.<field>` (e.g. `config limits.rate_per_s: must be > 0`).
 */
export function checkLimits(limits: LeaseLimits): LeaseLimits {
  const r = LimitsSchema.safeParse(limits);
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  throw new ConfigError(["limits", ...issue.path.map(String)].join("."), issue.message);
}

/**
 * Checks a duration argument (hold, TTL), ms: an integer in 1..{@link MAX_LEASE_MS}.
 * @throws ConfigError naming `field`.
 */
export function checkMs(ms: number, field: string): number {
  if (!Number.isSafeInteger(ms) || ms < 1 || ms > MAX_LEASE_MS) throw new ConfigError(field, `must be an integer of ms in 1..${MAX_LEASE_MS}, got ${String(ms)}`);
  return ms;
}

/** @throws ConfigError naming `limit` unless an integer in 1..{@link MAX_CLAIM_DUE}. */
export function checkClaimLimit(limit: number): number {
  if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_CLAIM_DUE) throw new ConfigError("limit", `must be an integer in 1..${MAX_CLAIM_DUE}, got ${String(limit)}`);
  return limit;
}

/** @throws ConfigError naming `reason` unless one of {@link LEASE_REASONS}. */
export function checkReason(reason: string): LeaseReason {
  if (!(LEASE_REASONS as readonly string[]).includes(reason)) throw new ConfigError("reason", `must be one of ${LEASE_REASONS.join(", ")}, got ${JSON.stringify(reason)}`);
  return reason as LeaseReason;
}

/** @throws ConfigError naming `field` unless a string of 1..256 characters (a lease id, a sandbox id). */
export function checkId(id: string, field: string): string {
  if (typeof id !== "string" || id.length < 1 || id.length > 256) throw new ConfigError(field, "must be a string of 1..256 characters");
  return id;
}

/** @throws ConfigError naming `baseUrl` unless null or a string of 1..2048 characters (the create reply's `base_url`, already a checked URL). */
export function checkBaseUrl(url: string | null): string | null {
  if (url !== null && (typeof url !== "string" || url.length < 1 || url.length > 2048)) throw new ConfigError("baseUrl", "must be null or a string of 1..2048 characters");
  return url;
}

/** The lease id of `key`'s `attempt`: `{key}~{attempt}`. */
export function leaseIdOf(key: string, attempt: number): string {
  return `${key}~${attempt}`;
}

/** Reason claimDue gives a due lease, by its status. */
const REAP_REASON: Record<Exclude<LeaseStatus, "released">, LeaseReason> = { creating: "reaped_create", live: "reaped_ttl", releasing: "reaped_release" };

/** Options of {@link MemoryLeaseStore}. */
export interface MemoryLeaseStoreOptions {
  /** The store clock, epoch ms (default `Date.now`); tests inject one they move. */
  now?: () => number;
  /** Lifetime of a released record, seconds (default {@link DEFAULT_TOMBSTONE_S}). */
  tombstoneS?: number;
}

/** @throws ConfigError naming `tombstoneS` unless an integer >= 1. */
export function checkTombstoneS(s: number): number {
  if (!Number.isSafeInteger(s) || s < 1) throw new ConfigError("tombstoneS", `must be an integer of seconds >= 1, got ${String(s)}`);
  return s;
}

/**
 * {@link LeaseStore} in one process's memory (tests, a single-process run):
 * the same contract as the Redis store, on an injectable clock. Released
 * records are dropped once their tombstone lapses (checked when read).
 */
export class MemoryLeaseStore implements LeaseStore {
  private readonly clock: () => number;
  private readonly tombstoneMs: number;
  private readonly records = new Map<string, LeaseRecord>();
  private readonly counters = new Map<string, number>();
  private bucket: { tokens: number; ts: number; rate: number; burst: number } | null = null;

  constructor(opts: MemoryLeaseStoreOptions = {}) {
    this.clock = opts.now ?? (() => Date.now());
    this.tombstoneMs = checkTombstoneS(opts.tombstoneS ?? DEFAULT_TOMBSTONE_S) * 1000;
  }

  async acquire(key: string, limits: LeaseLimits, holdMs: number, opts: { renew: boolean }): Promise<AcquireResult> {
    keyPart(key, "key");
    const { rate_per_s: rate, burst, max_live } = checkLimits(limits);
    checkMs(holdMs, "holdMs");
    const now = this.clock();
    const t = Math.floor(now);
    const prev = this.record(key, t);
    if (prev && (prev.status !== "released" || !opts.renew)) return { outcome: "exists", lease: { ...prev } };
    if (this.liveSet() >= max_live) return { outcome: "wait", wait_ms: CAP_WAIT_MS, cause: "cap" };
    const tokens = this.tokensAt(now, rate, burst);
    if (tokens < 1) return { outcome: "wait", wait_ms: Math.ceil(((1 - tokens) * 1000) / rate), cause: "rate" };
    this.bucket = { tokens: tokens - 1, ts: now, rate, burst };
    const attempt = prev ? prev.attempt + 1 : 1;
    const lease: LeaseRecord = { key, lease_id: leaseIdOf(key, attempt), attempt, status: "creating", sandbox_id: null, base_url: null, created_ms: t, expires_ms: t + holdMs, reason: null };
    this.records.set(key, lease);
    this.count("granted");
    return { outcome: "granted", lease: { ...lease } };
  }

  async get(key: string): Promise<LeaseRecord | null> {
    keyPart(key, "key");
    const r = this.record(key, Math.floor(this.clock()));
    return r ? { ...r } : null;
  }

  async confirm(key: string, leaseId: string, sandboxId: string, ttlMs: number, baseUrl: string | null = null): Promise<LeaseRecord | null> {
    keyPart(key, "key");
    checkId(leaseId, "leaseId");
    checkId(sandboxId, "sandboxId");
    checkMs(ttlMs, "ttlMs");
    checkBaseUrl(baseUrl);
    const t = Math.floor(this.clock());
    const r = this.record(key, t);
    if (!r || r.status !== "creating" || r.lease_id !== leaseId) return null;
    Object.assign(r, { status: "live", sandbox_id: sandboxId, base_url: baseUrl, expires_ms: t + ttlMs });
    this.count("confirmed");
    return { ...r };
  }

  async heartbeat(entries: readonly LeaseRef[], ttlMs: number): Promise<boolean[]> {
    for (const e of entries) {
      keyPart(e.key, "key");
      checkId(e.leaseId, "leaseId");
    }
    checkMs(ttlMs, "ttlMs");
    const t = Math.floor(this.clock());
    return entries.map((e) => {
      const r = this.record(e.key, t);
      if (!r || r.status !== "live" || r.lease_id !== e.leaseId) return false;
      r.expires_ms = t + ttlMs;
      return true;
    });
  }

  async claimRelease(key: string, leaseId: string, reason: LeaseReason, holdMs: number): Promise<LeaseRecord | null> {
    keyPart(key, "key");
    checkId(leaseId, "leaseId");
    checkReason(reason);
    checkMs(holdMs, "holdMs");
    const t = Math.floor(this.clock());
    const r = this.record(key, t);
    if (!r || (r.status !== "creating" && r.status !== "live") || r.lease_id !== leaseId) return null;
    Object.assign(r, { status: "releasing", reason, expires_ms: t + holdMs });
    if (reason === "create_failed") this.count("create_failed");
    return { ...r };
  }

  async finishRelease(key: string, leaseId: string): Promise<boolean> {
    keyPart(key, "key");
    checkId(leaseId, "leaseId");
    const t = Math.floor(this.clock());
    const r = this.record(key, t);
    if (!r || r.status !== "releasing" || r.lease_id !== leaseId) return false;
    Object.assign(r, { status: "released", expires_ms: t + this.tombstoneMs });
    this.count(`released:${r.reason}`);
    return true;
  }

  async claimDue(limit: number, holdMs: number): Promise<LeaseRecord[]> {
    checkClaimLimit(limit);
    checkMs(holdMs, "holdMs");
    const t = Math.floor(this.clock());
    const due = [...this.records.values()]
      .filter((r) => r.status !== "released" && r.expires_ms <= t)
      .sort((a, b) => a.expires_ms - b.expires_ms || (a.key < b.key ? -1 : a.key > b.key ? 1 : 0))
      .slice(0, limit);
    return due.map((r) => {
      const reason = REAP_REASON[r.status as Exclude<LeaseStatus, "released">];
      Object.assign(r, { status: "releasing", reason, expires_ms: t + holdMs });
      this.count(`reaped:${reason}`);
      return { ...r };
    });
  }

  async stats(): Promise<LeaseStoreStats> {
    const now = this.clock();
    const n = { creating: 0, live: 0, releasing: 0 };
    for (const r of this.records.values()) if (r.status !== "released") n[r.status]++;
    const tokens = this.bucket ? this.tokensAt(now, this.bucket.rate, this.bucket.burst) : null;
    return { ...n, tokens, counters: Object.fromEntries(this.counters) };
  }

  async now(): Promise<number> {
    return this.clock();
  }

  /** The key's record, dropping a released one whose tombstone lapsed at `t`. */
  private record(key: string, t: number): LeaseRecord | undefined {
    const r = this.records.get(key);
    if (r && r.status === "released" && r.expires_ms <= t) {
      this.records.delete(key);
      return undefined;
    }
    return r;
  }

  private liveSet(): number {
    let n = 0;
    for (const r of this.records.values()) if (r.status !== "released") n++;
    return n;
  }

  /** Tokens at `now`: refilled since the last grant (never above `burst`; a clock that stepped back refills nothing). */
  private tokensAt(now: number, rate: number, burst: number): number {
    if (!this.bucket) return burst;
    return Math.min(burst, this.bucket.tokens + (Math.max(0, now - this.bucket.ts) * rate) / 1000);
  }

  private count(name: string): void {
    this.counters.set(name, (this.counters.get(name) ?? 0) + 1);
  }
}

const IntText = z.string().regex(/^\d{1,16}$/, "expected a decimal integer").transform(Number);
/** zod schema of a record hash as stored (every value a string; `sandbox_id`, `base_url` and `reason` absent while null). */
export const LeaseRecordHash = z.object({
  key: z.string().min(1),
  lease_id: z.string().min(1),
  attempt: IntText.refine((n) => n >= 1, "expected >= 1"),
  status: z.enum(LEASE_STATUSES),
  sandbox_id: z.string().min(1).optional(),
  base_url: z.string().min(1).optional(),
  created_ms: IntText,
  expires_ms: IntText,
  reason: z.enum(LEASE_REASONS).optional(),
});

/**
 * Parses a stored record hash (field → string) into a {@link LeaseRecord}.
 * @throws StoreError naming `what` and the first field that is wrong.
 */
export function parseLeaseRecord(hash: Record<string, unknown>, what: string): LeaseRecord {
  const r = LeaseRecordHash.safeParse(hash);
  if (!r.success) {
    const i = r.error.issues[0]!;
    throw new StoreError(`lease store ${what}: malformed record, field ${i.path.join(".") || "(root)"}: ${i.message}`);
  }
  const d = r.data;
  if (d.lease_id !== leaseIdOf(d.key, d.attempt)) throw new StoreError(`lease store ${what}: malformed record, field lease_id: ${JSON.stringify(d.lease_id)} is not {key}~{attempt}`);
  return { key: d.key, lease_id: d.lease_id, attempt: d.attempt, status: d.status, sandbox_id: d.sandbox_id ?? null, base_url: d.base_url ?? null, created_ms: d.created_ms, expires_ms: d.expires_ms, reason: d.reason ?? null };
}
