import { EdgeloopError } from "../errors.ts";
import { redactUrl, type OutboundFetch } from "../http/outbound.ts";
import { sleepUnlessAborted } from "../http/sleep.ts";
import type { SandboxSpec } from "../schema/tool.ts";
import { SandboxCreateReply, type SandboxCreateBody, type SandboxHeartbeatBody, type SandboxReleaseBody } from "../schema/sandbox.ts";
import { MAX_LEASE_MS, type LeaseLimits, type LeaseReason, type LeaseRecord, type LeaseStore, type LeaseStoreStats } from "./lease-store.ts";
import { postWebhook, WebhookError, type WebhookOptions, type WebhookTarget } from "./webhook-post.ts";
import type { ToolCallRequest, ToolExecutor, ToolResult, ToolTaskWait } from "./webhook-tool-client.ts";

/** Why a lease was released (the `reason` of the provider's release body; docs/environments.md): one of `LEASE_REASONS`. */
export type LeaseReleaseReason = LeaseReason;

/** A trajectory's sandbox as its tool calls carry it. */
export interface SandboxLease {
  /** `{key}~{attempt}`: the idempotency key of the create and the id every release names. */
  lease_id: string;
  /** The provider's id of the sandbox (its create reply's `sandbox_id`). */
  sandbox_id: string;
  /** The sandbox's own endpoint (its create reply's `base_url`), null when the reply had none; kept in the lease record, so every owner of the session sees the same. */
  base_url: string | null;
}

/**
 * The trajectory's sandbox is gone while the trajectory still needs it (its
 * lease was reaped after missed heartbeats, or released by another owner):
 * the environment state its observations came from no longer exists, so the
 * trajectory fails rather than continue against a fresh sandbox. 409, code `sandbox_lost`.
 */
export class SandboxLostError extends EdgeloopError {
  override name = "SandboxLostError";
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string, key: string) {
    super(message, { status: 409, code: "sandbox_lost", key });
  }
}

/** No sandbox could be created for a trajectory (every attempt failed, or a create was refused): 502, code `sandbox_create_failed`. */
export class SandboxCreateError extends EdgeloopError {
  override name = "SandboxCreateError";
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string, key: string, cause?: unknown) {
    super(message, { status: 502, code: "sandbox_create_failed", key, ...(cause !== undefined ? { cause } : {}) });
  }
}

/** Process-local lease counters (the store's counters and live count are global: `LeaseStore.stats`). */
export interface LeaseMetrics {
  /** Creates answered with a sandbox id. */
  creates: number;
  /** Create attempts that failed (timeout, HTTP error, bad reply); each was released by its lease id. */
  create_failures: number;
  /** Releases this process made, by reason (reaped ones included, as `reaped_*`). */
  released: Record<string, number>;
  /** Releases that failed after their retries (left `releasing`; the reaper retries them). */
  release_failures: number;
  /** Leases found gone while their trajectory still held them (heartbeat refused, reaped under it). */
  lost: number;
}

/** What {@link SandboxLeases} reports as it happens (the Prometheus histograms: shared/telemetry/lease-metrics.ts). */
export interface LeaseObserver {
  /** A create answered with a sandbox id after `ms` milliseconds (the successful attempt only). */
  created(ms: number): void;
  /** A create attempt failed (and was released by its lease id). */
  createFailed(): void;
  /** A lease was released for `reason`, `ageMs` after its create was granted (store clock). */
  released(reason: string, ageMs: number): void;
}

/** Capabilities of {@link SandboxLeases} (tests inject a fetch, a random source and short intervals). */
export interface SandboxLeasesOptions {
  /** HMAC secret of the webhooks (`tools.secret`): create, release and heartbeat are signed like tool calls. */
  secret?: string;
  fetch?: OutboundFetch;
  /** [0, 1) for the backoff's jitter; default `Math.random`. */
  random?: () => number;
  /**
   * The trajectory deadline, seconds (`rollout.trajectory_deadline_s`): the
   * default sandbox lifetime is this plus `ttl_s`. Null: no deadline (the
   * lifetime then defaults to 24 h plus `ttl_s`).
   */
  trajectoryDeadlineS?: number | null;
  /** Local clock for latencies, milliseconds (default `Date.now`). */
  now?: () => number;
  /** Told of creates and releases as they happen (metrics). */
  observer?: LeaseObserver;
  /** Leases the reaper claims per pass (default 100). */
  reapBatch?: number;
  /** Backoff while the limiter says wait: first delay and cap, milliseconds (default 50 and 2 000). */
  backoffMinMs?: number;
  backoffMaxMs?: number;
}

/** Default sandbox lifetime without a trajectory deadline: a day. */
const NO_DEADLINE_LIFETIME_S = 24 * 3600;

/**
 * The sandboxes of a tools file's `sandbox` lifecycle, one per trajectory
 * key, held as leases in a {@link LeaseStore} (docs/environments.md,
 * "Sandboxes and leases"):
 * - {@link ensure} creates a trajectory's sandbox on first use: the store grants
 *   the create (a global token bucket and live cap, on the store's clock) and
 *   writes the lease `creating` with its lease id before the create is sent, so
 *   a crash at any point leaves a lease the reaper releases by id; a create
 *   that fails or passes `create_timeout_ms` is released by its lease id (the
 *   sandbox it may have made is never orphaned) and retried with a new lease id.
 * - While this process runs the trajectory its lease is refreshed every
 *   `ttl_s / 3` seconds ({@link start}); {@link release} releases it exactly
 *   once (only the store's claim winner calls the provider) when the
 *   trajectory ends; {@link detach} stops refreshing without releasing (the
 *   session moves to another owner or is carried).
 * - The reaper ({@link reapOnce}) releases leases whose TTL passed (their owner
 *   died), whose create never finished, or whose release did not complete.
 */
export class SandboxLeases {
  readonly spec: SandboxSpec;
  readonly store: LeaseStore;
  /** Seconds sent as the sandbox's `lifetime_s`. */
  readonly lifetimeS: number;
  readonly limits: LeaseLimits;
  readonly metrics: LeaseMetrics = { creates: 0, create_failures: 0, released: {}, release_failures: 0, lost: 0 };
  private readonly opts: SandboxLeasesOptions;
  private readonly attached = new Map<string, SandboxLease>();
  private readonly lostKeys = new Map<string, string>();
  private readonly inflight = new Map<string, Promise<SandboxLease>>();
  /** Lease ids whose release this process claimed and the provider kept failing (left `releasing`), with the last error. */
  private readonly failedReleases = new Map<string, string>();
  private timers: ReturnType<typeof setInterval>[] = [];

  /** @throws TypeError when `spec.lifetime_s` is below the trajectory deadline (a sandbox would die under a healthy trajectory). */
  constructor(spec: SandboxSpec, store: LeaseStore, opts: SandboxLeasesOptions = {}) {
    this.spec = spec;
    this.store = store;
    this.opts = opts;
    const deadline = opts.trajectoryDeadlineS ?? null;
    this.lifetimeS = spec.lifetime_s ?? (deadline ?? NO_DEADLINE_LIFETIME_S) + spec.ttl_s;
    if (deadline !== null && this.lifetimeS < deadline) {
      throw new TypeError(`sandbox.lifetime_s (${this.lifetimeS} s) is below rollout.trajectory_deadline_s (${deadline} s): a sandbox would be destroyed under a trajectory still running; raise lifetime_s or lower the deadline`);
    }
    this.limits = { rate_per_s: spec.max_creates_per_s, burst: spec.create_burst ?? 1, max_live: spec.max_live };
  }

  /** One line for the start-up banner: where sandboxes come from, their TTL and lifetime against the deadline, the limiter. */
  describe(): string {
    const s = this.spec;
    const deadline = this.opts.trajectoryDeadlineS ?? null;
    return `sandbox    create ${redactUrl(s.create_url)} (${s.create}), lease ttl ${s.ttl_s} s, lifetime ${this.lifetimeS} s ≥ trajectory deadline ${deadline === null ? "none" : `${deadline} s`}, ≤ ${this.limits.rate_per_s}/s (burst ${this.limits.burst}), ≤ ${this.limits.max_live} live`;
  }

  /**
   * What `GET /v1/sandboxes` answers: the spec's limits, the store's stats
   * (shared by every process on it) and this process's counters.
   * @throws StoreError when the store cannot be read.
   */
  async snapshot(): Promise<{ spec: Record<string, unknown>; store: LeaseStoreStats; process: LeaseMetrics }> {
    const s = this.spec;
    return {
      spec: { create_url: redactUrl(s.create_url), create: s.create, ttl_s: s.ttl_s, lifetime_s: this.lifetimeS, max_creates_per_s: this.limits.rate_per_s, create_burst: this.limits.burst, max_live: this.limits.max_live },
      store: await this.store.stats(),
      process: structuredClone(this.metrics),
    };
  }

  /**
   * The leases whose release this process claimed and the provider kept
   * failing, not released since (they stay `releasing` for a reaper): their
   * lease ids and the last error. What a process reports when it exits.
   */
  unreleased(): { lease_ids: string[]; last_error: string | null } {
    const ids = [...this.failedReleases.keys()];
    return { lease_ids: ids, last_error: ids.length ? this.failedReleases.get(ids[ids.length - 1]!)! : null };
  }

  /** The lease this process holds for `key`, if any. */
  leaseOf(key: string): SandboxLease | undefined {
    return this.attached.get(key);
  }

  /**
   * The sandbox trajectory `key` ran in, `{lease_id, sandbox_id}`: the lease
   * this process holds, else the store's record (a session resumed here after
   * another owner died may never have touched its sandbox in this process;
   * a released lease's record still names it). Undefined when the key never
   * had a confirmed sandbox. One store read when the lease is not held here.
   */
  async sandboxOf(key: string): Promise<{ lease_id: string; sandbox_id: string } | undefined> {
    const held = this.attached.get(key);
    if (held) return { lease_id: held.lease_id, sandbox_id: held.sandbox_id };
    const rec = await this.store.get(key);
    return rec?.sandbox_id ? { lease_id: rec.lease_id, sandbox_id: rec.sandbox_id } : undefined;
  }

  /**
   * The sandbox of trajectory `key`, created if it has none. `fresh`: no
   * result of a call into the sandbox has been observed by the trajectory yet
   * (a lease lost before that is replaced; after it, the loss fails the trajectory).
   * Concurrent calls for one key share one create.
   * @throws SandboxLostError, SandboxCreateError; the signal's reason when aborted while waiting.
   */
  ensure(key: string, createKwargs: Record<string, unknown>, opts: { fresh: boolean; signal?: AbortSignal }): Promise<SandboxLease> {
    const lost = this.lostKeys.get(key);
    if (lost !== undefined && !opts.fresh) return Promise.reject(new SandboxLostError(lost, key));
    const held = this.attached.get(key);
    if (held) return Promise.resolve(held);
    const running = this.inflight.get(key);
    if (running) return running;
    const p = this.acquireLease(key, createKwargs, opts).finally(() => this.inflight.delete(key));
    this.inflight.set(key, p);
    return p;
  }

  private async acquireLease(key: string, createKwargs: Record<string, unknown>, opts: { fresh: boolean; signal?: AbortSignal }): Promise<SandboxLease> {
    const s = this.spec;
    const holdMs = Math.min(MAX_LEASE_MS, s.create_timeout_ms + s.ttl_s * 1000);
    let failures = 0;
    let lastError = "";
    for (let waits = 0; ; ) {
      if (opts.signal?.aborted) throw opts.signal.reason ?? new Error("aborted");
      const rec = await this.store.get(key);
      if (rec && rec.status === "live" && rec.sandbox_id) {
        // A lease of this key from an earlier owner of the session (it died or handed over): the sandbox goes on.
        const lease = { lease_id: rec.lease_id, sandbox_id: rec.sandbox_id, base_url: rec.base_url };
        this.attach(key, lease);
        return lease;
      }
      if (rec && rec.status === "creating") {
        // An earlier owner died inside its create: release that half-made sandbox by its id, then create anew.
        const rel = await this.releaseRecord(key, rec.lease_id, "create_failed");
        // A release the provider keeps failing leaves the lease `releasing`: waiting for it would hang the trajectory.
        if (rel.error !== undefined) throw new SandboxCreateError(`sandbox create for '${key}' cannot start: the half-made lease ${rec.lease_id} of an earlier owner could not be released (${rel.error}); it is left to the reaper`, key);
        continue;
      }
      if (rec && (rec.status === "releasing" || rec.status === "released") && rec.reason !== "create_failed" && rec.reason !== "reaped_create" && !opts.fresh) {
        throw new SandboxLostError(`sandbox ${rec.sandbox_id ?? "(unnamed)"} of lease ${rec.lease_id} was released (${rec.reason ?? "unknown"}) while trajectory '${key}' still used it; its environment state is gone`, key);
      }
      const got = await this.store.acquire(key, this.limits, holdMs, { renew: true });
      if (got.outcome === "exists") {
        // Released by a reaper that is still at it (releasing): wait for it to finish.
        await this.backoff(waits++, 100, opts.signal);
        continue;
      }
      if (got.outcome === "wait") {
        await this.backoff(waits++, got.wait_ms, opts.signal);
        continue;
      }
      waits = 0;
      const lease = got.lease;
      const t0 = this.now();
      let sandboxId: string;
      let baseUrl: string | null;
      try {
        const reply = await postWebhook(this.target(s.create_url, s.create_timeout_ms, 0), { lease_id: lease.lease_id, key, create_kwargs: createKwargs, lifetime_s: this.lifetimeS } satisfies SandboxCreateBody, this.webhookOpts(opts.signal));
        const parsed = SandboxCreateReply.safeParse(reply.body);
        if (!parsed.success) {
          const i = parsed.error.issues[0];
          const field = i?.path[0] === "base_url" ? "base_url" : "sandbox_id";
          throw new SandboxCreateError(`sandbox create ${redactUrl(s.create_url)}: reply has no valid ${field} (${i?.message ?? "bad reply"})`, key);
        }
        sandboxId = parsed.data.sandbox_id;
        baseUrl = parsed.data.base_url ?? null;
      } catch (e) {
        this.metrics.create_failures++;
        this.opts.observer?.createFailed();
        // Whatever the provider made under this lease id is released by that id: a timed-out create is never orphaned.
        const rel = await this.releaseRecord(key, lease.lease_id, "create_failed");
        if (opts.signal?.aborted) throw opts.signal.reason ?? e;
        lastError = errorText(e);
        failures++;
        const refused = e instanceof SandboxCreateError || (e instanceof WebhookError && !e.retryable);
        // A failed release leaves this key's lease `releasing` (the reaper retries it): a retry would wait on it until the deadline.
        if (refused || failures > s.create_retries || rel.error !== undefined) {
          const unreleased = rel.error !== undefined ? `; its release by lease id ${lease.lease_id} failed too (${rel.error}), left to the reaper` : "";
          throw new SandboxCreateError(`sandbox create for '${key}' failed after ${failures} attempt${failures === 1 ? "" : "s"}: ${lastError}${unreleased}`, key, e);
        }
        continue;
      }
      const confirmed = await this.store.confirm(key, lease.lease_id, sandboxId, s.ttl_s * 1000, baseUrl);
      if (!confirmed) {
        // The create took longer than its hold and the reaper claimed the lease: it releases the sandbox; make another.
        this.metrics.create_failures++;
        this.opts.observer?.createFailed();
        if (++failures > s.create_retries) throw new SandboxCreateError(`sandbox create for '${key}' outlived its lease hold (${holdMs} ms) ${failures} times`, key);
        continue;
      }
      this.metrics.creates++;
      this.opts.observer?.created(this.now() - t0);
      const out = { lease_id: lease.lease_id, sandbox_id: sandboxId, base_url: baseUrl };
      this.attach(key, out);
      return out;
    }
  }

  /**
   * Releases `key`'s lease (`reason` goes to the provider) if it has one that
   * is not released: exactly one caller across every process wins the
   * store's claim and calls the provider. Never aborted by the trajectory's
   * signal (a cancelled trajectory still releases). Resolves true when this
   * call released it; false when there was nothing to release, another caller
   * won, or the provider kept failing (the reaper retries it then).
   */
  async release(key: string, reason: LeaseReleaseReason): Promise<boolean> {
    // A create still in flight settles first (it attaches its lease, or releases it itself when it failed).
    const pending = this.inflight.get(key);
    if (pending) await pending.catch(() => undefined);
    const held = this.attached.get(key);
    this.detach(key);
    const leaseId = held?.lease_id ?? (await this.store.get(key))?.lease_id;
    if (!leaseId) return false;
    return (await this.releaseRecord(key, leaseId, reason)).released;
  }

  /** Stops refreshing `key`'s lease without releasing it (its session is carried or owned elsewhere now). */
  detach(key: string): void {
    this.attached.delete(key);
    this.lostKeys.delete(key);
  }

  /**
   * Claims and releases one lease. `released`: this call released it; `error`
   * (set only then) the provider's last failure when it kept failing (the
   * lease is left `releasing` for the reaper). Neither: another caller won the claim.
   */
  private async releaseRecord(key: string, leaseId: string, reason: LeaseReleaseReason): Promise<{ released: boolean; error?: string }> {
    const hold = this.releaseHoldMs();
    const claimed = await this.store.claimRelease(key, leaseId, reason, hold);
    if (!claimed) return { released: false };
    return this.callRelease(claimed, reason, hold);
  }

  private releaseHoldMs(): number {
    const s = this.spec;
    return Math.min(MAX_LEASE_MS, s.release_timeout_ms * (s.release_retries + 1) + s.ttl_s * 1000);
  }

  /** POSTs the release of a claimed lease and marks it released; `error` (left `releasing`) when the provider kept failing. */
  private async callRelease(rec: LeaseRecord, reason: LeaseReason, holdMs: number): Promise<{ released: boolean; error?: string }> {
    const s = this.spec;
    try {
      await postWebhook(this.target(s.release_url, s.release_timeout_ms, s.release_retries), { lease_id: rec.lease_id, sandbox_id: rec.sandbox_id, key: rec.key, reason } satisfies SandboxReleaseBody, this.webhookOpts(undefined));
    } catch (e) {
      // 404: the provider has no such sandbox any more — released as far as anyone can tell.
      if (!(e instanceof WebhookError && e.status === 404)) {
        this.metrics.release_failures++;
        this.failedReleases.set(rec.lease_id, errorText(e));
        return { released: false, error: errorText(e) };
      }
    }
    this.failedReleases.delete(rec.lease_id);
    await this.store.finishRelease(rec.key, rec.lease_id);
    this.metrics.released[reason] = (this.metrics.released[reason] ?? 0) + 1;
    this.opts.observer?.released(reason, Math.max(0, rec.expires_ms - holdMs - rec.created_ms));
    return { released: true };
  }

  /**
   * One reaper pass: claims up to `reapBatch` leases past their expiry (in
   * every process's store: a lease not refreshed for `ttl_s`, a create that
   * never finished, a release that did not complete) and releases each.
   * Resolves to the number released.
   */
  async reapOnce(): Promise<number> {
    const hold = this.releaseHoldMs();
    const due = await this.store.claimDue(this.opts.reapBatch ?? 100, hold);
    let n = 0;
    await Promise.all(
      due.map(async (rec) => {
        // A lease this process still holds yet could not refresh in time is lost to its trajectory.
        if (this.attached.has(rec.key)) this.markLost(rec.key, `sandbox ${rec.sandbox_id ?? "(unnamed)"} of lease ${rec.lease_id} was reaped (${rec.reason}) while trajectory '${rec.key}' held it`);
        if ((await this.callRelease(rec, rec.reason ?? "reaped_ttl", hold)).released) n++;
      }),
    );
    return n;
  }

  /**
   * Refreshes every lease this process holds (one store call), and calls the
   * provider's `heartbeat_url` for each when configured. A lease the store
   * or the provider no longer knows is lost: the trajectory's next call fails.
   */
  async heartbeatOnce(): Promise<void> {
    const entries = [...this.attached].map(([key, l]) => ({ key, leaseId: l.lease_id }));
    if (entries.length === 0) return;
    const ok = await this.store.heartbeat(entries, this.spec.ttl_s * 1000);
    entries.forEach((e, i) => {
      if (!ok[i]) this.markLost(e.key, `the lease ${e.leaseId} of trajectory '${e.key}' expired before it was refreshed (ttl ${this.spec.ttl_s} s); its sandbox is released`);
    });
    const url = this.spec.heartbeat_url;
    if (!url) return;
    await Promise.all(
      entries.map(async (e, i) => {
        const l = this.attached.get(e.key);
        if (!ok[i] || !l) return;
        try {
          await postWebhook(this.target(url, this.spec.release_timeout_ms, 0), { lease_id: l.lease_id, sandbox_id: l.sandbox_id, lifetime_s: this.lifetimeS } satisfies SandboxHeartbeatBody, this.webhookOpts(undefined));
        } catch (err) {
          if (err instanceof WebhookError && err.status === 404) this.markLost(e.key, `the provider no longer has sandbox ${l.sandbox_id} of trajectory '${e.key}' (heartbeat: 404)`);
        }
      }),
    );
  }

  /**
   * Starts the heartbeat (every `ttl_s / 3` s) and, with `reaper`, the reaper
   * (every `ttl_s / 4` s, at most 5 s) of this process. Their failures (a store
   * outage) are counted and retried at the next tick. Returns a stop function.
   */
  start(opts: { reaper: boolean; heartbeatMs?: number; reapMs?: number; onError?: (e: unknown) => void }): () => void {
    const tick = (f: () => Promise<unknown>) => () => void f().catch((e) => opts.onError?.(e));
    const hb = setInterval(tick(() => this.heartbeatOnce()), opts.heartbeatMs ?? (this.spec.ttl_s * 1000) / 3);
    this.timers.push(hb);
    if (opts.reaper) this.timers.push(setInterval(tick(() => this.reapOnce()), opts.reapMs ?? Math.min(5_000, (this.spec.ttl_s * 1000) / 4)));
    for (const t of this.timers) (t as { unref?: () => void }).unref?.();
    return () => this.stop();
  }

  /** Stops the timers of {@link start} (leases stay as they are). */
  stop(): void {
    for (const t of this.timers) clearInterval(t);
    this.timers = [];
  }

  private attach(key: string, lease: SandboxLease): void {
    this.attached.set(key, lease);
    this.lostKeys.delete(key);
  }

  private markLost(key: string, why: string): void {
    this.attached.delete(key);
    this.lostKeys.set(key, why);
    this.metrics.lost++;
  }

  private async backoff(attempt: number, atLeastMs: number, signal?: AbortSignal): Promise<void> {
    const min = this.opts.backoffMinMs ?? 50;
    const cap = this.opts.backoffMaxMs ?? 2_000;
    // Full jitter over an exponential ceiling, never below the limiter's own hint.
    const ceiling = Math.min(cap, min * 2 ** Math.min(attempt, 16));
    const ms = Math.max(atLeastMs, Math.floor((this.opts.random ?? Math.random)() * ceiling));
    await sleepUnlessAborted(Math.min(ms, cap), signal);
  }

  private target(url: string, timeoutMs: number, retries: number): WebhookTarget {
    return { url, timeout_ms: timeoutMs, max_retries: retries, ...(this.opts.secret ? { secret: this.opts.secret } : {}), ...(this.spec.max_reply_bytes ? { max_reply_bytes: this.spec.max_reply_bytes } : {}) };
  }

  private webhookOpts(signal: AbortSignal | undefined): WebhookOptions {
    const extra = this.spec.headers;
    const base = this.opts.fetch;
    let f: OutboundFetch | undefined = base;
    if (extra) {
      const inner: OutboundFetch = base ?? ((input, init) => fetch(input, init));
      f = (input, init) => {
        const h = new Headers(init?.headers);
        for (const [k, v] of Object.entries(extra)) if (!h.has(k)) h.set(k, v);
        return inner(input, { ...init, headers: h });
      };
    }
    return { ...(f ? { fetch: f as typeof fetch } : {}), ...(signal ? { signal } : {}), retryMinTimeoutMs: 100, retryMaxTimeoutMs: 2_000 };
  }

  private now(): number {
    return (this.opts.now ?? Date.now)();
  }
}

/**
 * A {@link ToolExecutor} whose calls run in their trajectory's sandbox: each
 * call first gets the trajectory's lease ({@link SandboxLeases.ensure}, with
 * the row's `extra_info.sandbox_kwargs` as the create's `create_kwargs`) and
 * carries its `sandbox_id` and `lease_id` (webhook body fields; MCP `_meta`).
 * A sandbox that cannot be created or was lost fails the trajectory (the error
 * is thrown, not turned into an observation: it is not the policy's doing).
 */
export class LeasedToolExecutor implements ToolExecutor {
  constructor(
    private readonly inner: ToolExecutor,
    readonly leases: SandboxLeases,
  ) {}
  get schemas() {
    return this.inner.schemas;
  }
  get names() {
    return this.inner.names;
  }
  async call(req: ToolCallRequest): Promise<ToolResult> {
    // A call of a tool that does not exist is refused by the inner executor without making a sandbox for it.
    if (!this.inner.names.includes(req.name)) return this.inner.call(req);
    const lease = await this.leases.ensure(req.key, req.sandbox_kwargs ?? {}, { fresh: req.sandbox_fresh ?? false, ...(req.signal ? { signal: req.signal } : {}) });
    return this.inner.call({ ...req, sandbox: lease });
  }
  /** The inner executor's wait: the task already runs in the sandbox its call was sent with. */
  awaitTask(req: ToolTaskWait): Promise<ToolResult> {
    if (!this.inner.awaitTask) return Promise.resolve({ ok: false, call_id: req.call_id, attempts: 0, content: `Error executing tool '${req.name}': no MCP server offers it to wait for task '${req.task_id}'` });
    return this.inner.awaitTask(req);
  }
  select(names: readonly string[]): ToolExecutor {
    return new LeasedToolExecutor(this.inner.select ? this.inner.select(names) : this.inner, this.leases);
  }
}

/** A row's `extra_info.sandbox_kwargs` (the sandbox create's `create_kwargs`): `{}` when absent or not a JSON object. */
export function sandboxKwargsOf(row: { extra_info?: unknown }): Record<string, unknown> {
  const sk = ((row.extra_info ?? {}) as Record<string, unknown>).sandbox_kwargs;
  return sk && typeof sk === "object" && !Array.isArray(sk) ? (sk as Record<string, unknown>) : {};
}

function errorText(e: unknown): string {
  return e instanceof Error ? e.message : String(e);
}
