import { z } from "zod";
import { ConfigError, ConflictError, EdgeloopError, formatPath, InputError, NotFoundError } from "../../shared/errors.ts";
import { fnv1a32, hashInt, unitFloat } from "../../shared/inference/hash.ts";
import { MAX_TIMER_MS } from "../../shared/schema/config.ts";
import type { SandboxCreateBody, SandboxHeartbeatBody, SandboxReleaseBody } from "../../shared/schema/sandbox.ts";
import type { ToolCallRequestBody, ToolReply } from "../../shared/tools/webhook-tool-client.ts";
import { GuessNumberEnv } from "../openenv/example-env.ts";

/**
 * Faults the example sandbox provider injects (the lease chaos test), all
 * deterministic: a request's draw is `unit(hash(seed, kind, lease_id, n))`
 * with `n` the requests of that kind seen for that lease id before it (0-based),
 * so a repeated request draws again. Fields:
 * - `seed` (default 0);
 * - `create_delay_ms` (default 0): how long a create takes before its sandbox
 *   exists (a release meanwhile cancels it: no sandbox is made, the create is 409);
 * - `create_timeout_fraction` (default 0, 0..1): creates whose reply hangs — the
 *   sandbox is made (live at once, counted) and the reply held `hang_ms`, or
 *   until the client goes away or the provider stops, so the client sees a
 *   timeout after the sandbox exists;
 * - `hang_ms` (default 60 000): how long such a reply is held;
 * - `release_fail_fraction` (default 0, 0..1): releases answered 500 before
 *   anything is done (the lease is untouched).
 * Unknown keys are errors.
 */
export const SandboxFaults = z.strictObject({
  seed: z.number().int().default(0),
  create_delay_ms: z.number().int().min(0).max(MAX_TIMER_MS).default(0),
  create_timeout_fraction: z.number().min(0).max(1).default(0),
  hang_ms: z.number().int().min(0).max(MAX_TIMER_MS).default(60_000),
  release_fail_fraction: z.number().min(0).max(1).default(0),
});
export type SandboxFaults = z.input<typeof SandboxFaults>;

/** Exact counts of what the provider did since it started (`GET /stats` and `stats()`). */
export interface SandboxProviderStats {
  /** Sandboxes that exist now (made, not destroyed), a create whose reply is held included. */
  live: number;
  /** Creates in progress whose sandbox does not exist yet (within `create_delay_ms`). */
  creating: number;
  /** Sandboxes made, ever: `live + destroyed_released + destroyed_expired`. */
  created: number;
  /** Sandboxes destroyed by a release. */
  destroyed_released: number;
  /** Sandboxes destroyed by the provider when their `lifetime_s` ran out. */
  destroyed_expired: number;
  /** Creates repeated with a lease id that had a sandbox (or a create in progress): answered with the same sandbox, none made. */
  duplicate_creates: number;
  /** Creates refused with 409 because their lease id had been released before they arrived. */
  refused_released: number;
  /** Creates refused with 409 because their lease's sandbox had been destroyed after its lifetime. */
  refused_expired: number;
  /** Creates cancelled by a release that came while they were in progress: no sandbox made, answered 409. */
  cancelled_creates: number;
  /** Create replies held by the `create_timeout_fraction` fault. */
  create_timeouts: number;
  /** Releases answered 2xx (a live sandbox destroyed, or a create in progress cancelled). */
  releases: number;
  /** Releases answered 2xx, by the body's `reason` (finished, failed, cancelled, surplus, deadline, lost, reaped…); reasons never sent are absent. */
  releases_by_reason: Record<string, number>;
  /** Releases answered 404: an unknown or already released lease id, or a sandbox that had expired. */
  release_not_found: number;
  /** Releases answered 500 by the `release_fail_fraction` fault. */
  release_faults: number;
  /** Heartbeats answered 2xx. */
  heartbeats: number;
  /** Heartbeats answered 404 (the sandbox is unknown or gone). */
  heartbeat_not_found: number;
  /** Tool calls executed against a sandbox's state (repeated call ids not counted again). */
  tool_calls: number;
  /** Requests served by the sandboxes' OpenEnv environments (`/envs/{sandbox_id}/…`), by route (`reset`, `step`, `state`, …). */
  env_requests: Record<string, number>;
  /** The most sandboxes made within any 1000 ms window `[t, t + 1000)` of the provider's clock. */
  peak_creates_1s: number;
  /** Sandboxes made per second of the provider's clock (unix seconds, ascending; seconds with none left out). */
  creates_per_second: { second: number; count: number }[];
}

/** Options of {@link SandboxPool}. */
export interface SandboxPoolOptions {
  faults?: SandboxFaults;
  /** Prefix of sandbox ids, then a counter from 1 (default `sbx-<6 random hex>-`, so ids of two provider runs differ). */
  idPrefix?: string;
  /** Milliseconds since the epoch: the clock of the creation times behind `peak_creates_1s` and `creates_per_second` (default `Date.now`). Lifetimes run on timers. */
  now?: () => number;
  /**
   * Every sandbox runs its own example OpenEnv environment (guess-the-number,
   * infra/openenv/example-env.ts; its HTTP routes, one episode per sandbox)
   * and its create reply carries `base_url` = `{provider}/envs/{sandbox_id}`
   * (default false: no environment, no `base_url`).
   */
  openenv?: boolean;
}

/** One sandbox: its lease, and the state its tools read and write. */
interface Sandbox {
  id: string;
  lease_id: string;
  files: Map<string, string>;
  /** Answers by call id, so a retried call is executed once. */
  calls: Map<string, { fingerprint: string; reply: ToolReply }>;
  timer: ReturnType<typeof setTimeout> | null;
  /** The sandbox's OpenEnv environment ({@link SandboxPoolOptions.openenv}), null without one. */
  env: GuessNumberEnv | null;
}

/** What the provider knows of a lease id. */
interface Lease {
  status: "creating" | "live" | "expired" | "released";
  key: string;
  sandbox: Sandbox | null;
  /** Resolves when a create in progress ends (made or cancelled). */
  done: Promise<void> | null;
}

/** A destroyed sandbox id, remembered so a call naming it is told why it is gone. */
interface Tombstone {
  lease_id: string;
  cause: "released" | "expired";
}

const DRAW_CREATE = 0x6372;
const DRAW_RELEASE = 0x726c;

/** The deterministic fault draw of {@link SandboxFaults}: true when unit(hash(seed, kind, lease_id, n)) < fraction. */
export function sandboxFaultDecision(fraction: number, seed: number, kind: "create" | "release", leaseId: string, n: number): boolean {
  if (fraction <= 0) return false;
  const salt = kind === "create" ? DRAW_CREATE : DRAW_RELEASE;
  return unitFloat(hashInt(hashInt(hashInt(hashInt(0x5bd1e995, seed), salt), fnv1a32(leaseId)), n)) < fraction;
}

/** The injected 500 of a failing release (`release_fail_fraction`). */
class InjectedFaultError extends EdgeloopError {
  override name = "InjectedFaultError";
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string) {
    super(message, { status: 500, code: "injected_fault", retryable: true });
  }
}

function stringArg(args: Record<string, unknown>, name: string): string | undefined {
  const v = args[name];
  return typeof v === "string" ? v : undefined;
}

/**
 * The sandboxes of the example provider and their leases, in memory: the
 * provider contract of shared/schema/sandbox.ts (create idempotent by
 * `lease_id`, a released lease id never gets a sandbox, release idempotent by
 * `lease_id` with 404 for "already gone", heartbeat restarting the lifetime),
 * lifetimes enforced by timers, the {@link SandboxFaults}, and two tools over a
 * per-sandbox file map. Every lease id and sandbox id seen is remembered for
 * the life of the pool (an example and test double, not a service).
 * Errors are thrown as EdgeloopErrors the HTTP app returns as they are.
 */
export class SandboxPool {
  private readonly faults: z.output<typeof SandboxFaults>;
  private readonly idPrefix: string;
  private readonly now: () => number;
  /** True: each sandbox gets its own OpenEnv environment ({@link SandboxPoolOptions.openenv}). */
  readonly openenv: boolean;
  private readonly envRequests = new Map<string, number>();
  private readonly leases = new Map<string, Lease>();
  private readonly sandboxes = new Map<string, Sandbox | Tombstone>();
  private readonly createDraws = new Map<string, number>();
  private readonly releaseDraws = new Map<string, number>();
  /** Creation times (ms, {@link SandboxPoolOptions.now}), in the order made. */
  private readonly createdAt: number[] = [];
  private readonly holds = new Set<() => void>();
  private seq = 0;
  private closed = false;
  private readonly releaseReasons = new Map<string, number>();
  private readonly counts = {
    live: 0,
    creating: 0,
    created: 0,
    destroyed_released: 0,
    destroyed_expired: 0,
    duplicate_creates: 0,
    refused_released: 0,
    refused_expired: 0,
    cancelled_creates: 0,
    create_timeouts: 0,
    releases: 0,
    release_not_found: 0,
    release_faults: 0,
    heartbeats: 0,
    heartbeat_not_found: 0,
    tool_calls: 0,
  };

  /** @throws ConfigError naming the `faults` field that is out of range or unknown. */
  constructor(opts: SandboxPoolOptions = {}) {
    const f = SandboxFaults.safeParse(opts.faults ?? {});
    if (!f.success) throw new ConfigError(formatPath("faults", f.error.issues[0]!.path), f.error.issues[0]!.message);
    this.faults = f.data;
    this.idPrefix = opts.idPrefix ?? `sbx-${crypto.getRandomValues(new Uint8Array(3)).reduce((s, b) => s + b.toString(16).padStart(2, "0"), "")}-`;
    this.now = opts.now ?? Date.now;
    this.openenv = opts.openenv ?? false;
  }

  /**
   * A create (`POST create_url`): the lease's sandbox id. A lease id seen
   * before answers its sandbox (waiting for a create in progress); none is
   * made twice. Takes `create_delay_ms`; a reply drawn to hang is held after
   * the sandbox is made (until `hang_ms`, `signal`, or {@link close}).
   * @throws ConflictError (409): the lease id was released (before or during
   *   the create, or while its reply was held), its sandbox expired, or it
   *   was created for another trajectory key.
   */
  async create(body: SandboxCreateBody, signal?: AbortSignal): Promise<{ sandbox_id: string }> {
    const n = this.createDraws.get(body.lease_id) ?? 0;
    this.createDraws.set(body.lease_id, n + 1);
    const hang = sandboxFaultDecision(this.faults.create_timeout_fraction, this.faults.seed, "create", body.lease_id, n);
    let lease = this.leases.get(body.lease_id);
    if (lease) {
      if (lease.status === "released") {
        this.counts.refused_released++;
        throw this.notLive(body.lease_id, lease);
      }
      if (lease.status === "expired") {
        this.counts.refused_expired++;
        throw this.notLive(body.lease_id, lease);
      }
      if (lease.key !== body.key) throw new ConflictError(`key: lease '${body.lease_id}' belongs to key '${lease.key}', not '${body.key}'`, { field: "key" });
      this.counts.duplicate_creates++;
      if (lease.status === "creating") await lease.done;
    } else {
      lease = { status: "creating", key: body.key, sandbox: null, done: null };
      this.leases.set(body.lease_id, lease);
      let finish!: () => void;
      lease.done = new Promise<void>((resolve) => (finish = resolve));
      this.counts.creating++;
      if (this.faults.create_delay_ms > 0) await this.hold(this.faults.create_delay_ms);
      this.counts.creating--;
      if (lease.status === "released") this.counts.cancelled_creates++;
      else if (this.closed) this.leases.delete(body.lease_id);
      else this.make(body, lease);
      lease.done = null;
      finish();
    }
    if (this.closed && lease.status === "creating") throw new EdgeloopError("the provider stopped before the sandbox was made", { status: 503, code: "stopping", retryable: true });
    if (lease.status !== "live") throw this.notLive(body.lease_id, lease);
    const id = lease.sandbox!.id;
    if (hang) {
      this.counts.create_timeouts++;
      await this.hold(this.faults.hang_ms, signal);
      if (lease.status !== "live") throw this.notLive(body.lease_id, lease);
    }
    return { sandbox_id: id };
  }

  /**
   * A release (`POST release_url`), idempotent by lease id: destroys the
   * lease's sandbox, or cancels its create in progress. Afterwards a create
   * with that lease id is refused — also when the release came first (an
   * unknown lease id is remembered as released).
   * @returns the destroyed sandbox's id, null when none existed yet.
   * @throws InjectedFaultError (500) when `release_fail_fraction` draws it, before anything is done;
   *   NotFoundError (404): the lease id is unknown, already released, or its sandbox expired;
   *   ConflictError (409, field `sandbox_id`): the body names another sandbox than the lease's.
   */
  release(body: SandboxReleaseBody): { sandbox_id: string | null } {
    const n = this.releaseDraws.get(body.lease_id) ?? 0;
    this.releaseDraws.set(body.lease_id, n + 1);
    if (sandboxFaultDecision(this.faults.release_fail_fraction, this.faults.seed, "release", body.lease_id, n)) {
      this.counts.release_faults++;
      throw new InjectedFaultError(`injected release failure (lease '${body.lease_id}')`);
    }
    const lease = this.leases.get(body.lease_id);
    if (!lease) {
      this.leases.set(body.lease_id, { status: "released", key: body.key, sandbox: null, done: null });
      this.counts.release_not_found++;
      throw new NotFoundError(`lease_id: no sandbox for lease '${body.lease_id}' (it counts as released: a later create with it is refused)`, { field: "lease_id" });
    }
    if (lease.status === "released" || lease.status === "expired") {
      const why = lease.status === "released" ? "was already released" : `had its sandbox destroyed when its lifetime ran out`;
      lease.status = "released";
      this.counts.release_not_found++;
      throw new NotFoundError(`lease_id: lease '${body.lease_id}' ${why}`, { field: "lease_id" });
    }
    const sandbox = lease.sandbox;
    if (body.sandbox_id !== null && body.sandbox_id !== sandbox?.id) {
      throw new ConflictError(`sandbox_id: lease '${body.lease_id}' has ${sandbox ? `sandbox '${sandbox.id}'` : "no sandbox yet (its create is in progress)"}, not '${body.sandbox_id}'`, { field: "sandbox_id" });
    }
    lease.status = "released";
    if (sandbox) this.destroy(sandbox, "released");
    this.counts.releases++;
    this.releaseReasons.set(body.reason, (this.releaseReasons.get(body.reason) ?? 0) + 1);
    return { sandbox_id: sandbox?.id ?? null };
  }

  /**
   * A heartbeat (`POST heartbeat_url`): the sandbox now lives `lifetime_s`
   * seconds from now.
   * @throws NotFoundError (404, field `sandbox_id`): the sandbox is unknown or gone;
   *   ConflictError (409, field `lease_id`): it belongs to another lease.
   */
  heartbeat(body: SandboxHeartbeatBody): void {
    let sandbox: Sandbox;
    try {
      sandbox = this.liveSandbox(body.sandbox_id, body.lease_id);
    } catch (e) {
      if (e instanceof NotFoundError) this.counts.heartbeat_not_found++;
      throw e;
    }
    this.schedule(sandbox, body.lifetime_s * 1000);
    this.counts.heartbeats++;
  }

  /**
   * A tool call against the state of the call's sandbox (`sandbox_id`, and
   * `lease_id` when sent, of the tool-webhook body): `sbx_write {path, content}`
   * stores a file, `sbx_read {path}` returns it. Bad arguments come back as
   * `Error: …` content, as the example tool server's do. A repeated `call_id`
   * gets the first answer and is executed once.
   * @throws InputError (400, field `sandbox_id`) without a sandbox id;
   *   NotFoundError (404, field `sandbox_id`) for an unknown or destroyed sandbox;
   *   ConflictError (409): `lease_id` is not the sandbox's lease (field `lease_id`),
   *   or the call id was used for a different call.
   */
  tool(name: "sbx_write" | "sbx_read", call: ToolCallRequestBody): ToolReply {
    if (call.sandbox_id === undefined) {
      throw new InputError("sandbox_id", `required: '${name}' runs in a sandbox, so the call must name one (the trajectory needs a sandbox lease: a tools file with a sandbox lifecycle)`);
    }
    const sandbox = this.liveSandbox(call.sandbox_id, call.lease_id);
    const fingerprint = JSON.stringify([name, call.arguments]);
    const prior = sandbox.calls.get(call.call_id);
    if (prior) {
      if (prior.fingerprint !== fingerprint) throw new ConflictError(`call_id '${call.call_id}' was already used for a different call`);
      return prior.reply;
    }
    const reply = name === "sbx_write" ? writeFile(sandbox, call.arguments) : readFile(sandbox, call.arguments);
    sandbox.calls.set(call.call_id, { fingerprint, reply });
    this.counts.tool_calls++;
    return reply;
  }

  /**
   * The OpenEnv environment of live sandbox `id`, counting one request to
   * `route` (its HTTP route without the slash).
   * @throws NotFoundError (404, field `sandbox_id`): the sandbox is unknown or
   *   destroyed, or the pool runs without {@link SandboxPoolOptions.openenv}.
   */
  envOf(id: string, route: string): GuessNumberEnv {
    const sandbox = this.liveSandbox(id, undefined);
    if (!sandbox.env) throw new NotFoundError(`sandbox_id: sandbox '${id}' runs no OpenEnv environment (start the provider with openenv)`, { field: "sandbox_id" });
    this.envRequests.set(route, (this.envRequests.get(route) ?? 0) + 1);
    return sandbox.env;
  }

  /** The counts of {@link SandboxProviderStats}, exact at the moment of the call. */
  stats(): SandboxProviderStats {
    const times = [...this.createdAt].sort((a, b) => a - b);
    let peak = 0;
    for (let i = 0, j = 0; j < times.length; j++) {
      while (times[j]! - times[i]! >= 1000) i++;
      peak = Math.max(peak, j - i + 1);
    }
    const bySecond = new Map<number, number>();
    for (const t of times) {
      const s = Math.floor(t / 1000);
      bySecond.set(s, (bySecond.get(s) ?? 0) + 1);
    }
    return { ...this.counts, releases_by_reason: Object.fromEntries(this.releaseReasons), env_requests: Object.fromEntries(this.envRequests), peak_creates_1s: peak, creates_per_second: [...bySecond].map(([second, count]) => ({ second, count })) };
  }

  /** Stops every lifetime timer and releases every held reply (their creates then answer as the lease stands). Sandboxes stay counted as they are. */
  close(): void {
    this.closed = true;
    for (const v of this.sandboxes.values()) if ("timer" in v && v.timer) clearTimeout(v.timer);
    for (const end of [...this.holds]) end();
  }

  /** The 409 of a create whose lease has no live sandbox: released, or expired. */
  private notLive(leaseId: string, lease: Lease): ConflictError {
    if (lease.status === "expired") {
      return new ConflictError(`lease_id: the sandbox of lease '${leaseId}' was destroyed when its lifetime ran out; a lease gets one sandbox`, { field: "lease_id" });
    }
    return new ConflictError(`lease_id: lease '${leaseId}' was released; a released lease gets no sandbox`, { field: "lease_id" });
  }

  private make(body: SandboxCreateBody, lease: Lease): void {
    const sandbox: Sandbox = {
      id: `${this.idPrefix}${++this.seq}`,
      lease_id: body.lease_id,
      files: new Map(),
      calls: new Map(),
      timer: null,
      env: this.openenv ? new GuessNumberEnv() : null,
    };
    this.sandboxes.set(sandbox.id, sandbox);
    lease.status = "live";
    lease.sandbox = sandbox;
    this.counts.live++;
    this.counts.created++;
    this.createdAt.push(this.now());
    this.schedule(sandbox, body.lifetime_s * 1000);
  }

  /** (Re)starts the sandbox's lifetime: destroyed `ms` from now. */
  private schedule(sandbox: Sandbox, ms: number): void {
    if (sandbox.timer) clearTimeout(sandbox.timer);
    sandbox.timer = setTimeout(() => {
      sandbox.timer = null;
      const lease = this.leases.get(sandbox.lease_id)!;
      lease.status = "expired";
      this.destroy(sandbox, "expired");
    }, ms);
    (sandbox.timer as { unref?: () => void }).unref?.();
  }

  private destroy(sandbox: Sandbox, cause: "released" | "expired"): void {
    if (sandbox.timer) clearTimeout(sandbox.timer);
    sandbox.timer = null;
    this.sandboxes.set(sandbox.id, { lease_id: sandbox.lease_id, cause });
    this.counts.live--;
    if (cause === "released") this.counts.destroyed_released++;
    else this.counts.destroyed_expired++;
  }

  /** The live sandbox `id`, checked against `leaseId` when given. */
  private liveSandbox(id: string, leaseId: string | undefined): Sandbox {
    const s = this.sandboxes.get(id);
    if (!s) throw new NotFoundError(`sandbox_id: no sandbox '${id}'`, { field: "sandbox_id" });
    if (!("files" in s)) {
      throw new NotFoundError(`sandbox_id: sandbox '${id}' was destroyed (${s.cause === "released" ? "its lease was released" : "its lifetime ran out"})`, { field: "sandbox_id" });
    }
    if (leaseId !== undefined && leaseId !== s.lease_id) throw new ConflictError(`lease_id: sandbox '${id}' belongs to lease '${s.lease_id}', not '${leaseId}'`, { field: "lease_id" });
    return s;
  }

  /** Waits `ms`, or less when `signal` aborts or the pool closes. */
  private hold(ms: number, signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal?.aborted || this.closed) return resolve();
      const done = () => {
        clearTimeout(t);
        signal?.removeEventListener("abort", done);
        this.holds.delete(done);
        resolve();
      };
      const t = setTimeout(done, ms);
      signal?.addEventListener("abort", done, { once: true });
      this.holds.add(done);
    });
  }
}

function writeFile(sandbox: Sandbox, args: Record<string, unknown>): ToolReply {
  const path = stringArg(args, "path");
  const content = stringArg(args, "content");
  if (!path) return { content: "Error: sbx_write needs a non-empty string argument 'path'." };
  if (content === undefined) return { content: "Error: sbx_write needs a string argument 'content'." };
  sandbox.files.set(path, content);
  return { content: `Wrote ${new TextEncoder().encode(content).length} bytes to ${path}.` };
}

function readFile(sandbox: Sandbox, args: Record<string, unknown>): ToolReply {
  const path = stringArg(args, "path");
  if (!path) return { content: "Error: sbx_read needs a non-empty string argument 'path'." };
  const text = sandbox.files.get(path);
  return { content: text ?? `Error: no file '${path}' in this sandbox.` };
}
