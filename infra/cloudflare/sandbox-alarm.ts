import type { SandboxSpec } from "../../shared/schema/tool.ts";
import type { SandboxLeases } from "../../shared/tools/sandbox-leases.ts";
import type { DurableObjectStorage } from "./cf-types.ts";

/**
 * Name (`idFromName`) of the one object of the sessions class that runs the
 * deployment's sandbox-lease reaper. Never a trajectory key: those end in
 * `_{session_id}_{output_index}`.
 */
export const SANDBOX_REAPER_NAME = "edgeloop:sandbox-reaper";

/** Storage entry of the reaper object: the number of times it was woken (present while its alarm runs passes). */
export const REAPER_ENTRY = "sandbox_reaper";

/** Storage entry of a session object whose trajectory was granted a lease: the trajectory key (its lease is in the lease store). */
export const LEASE_ENTRY = "sandbox_lease";

/** Milliseconds between heartbeats of a live lease: `ttl_s / 3` (as the CLI's heartbeat). */
export function heartbeatMs(spec: SandboxSpec): number {
  return Math.floor((spec.ttl_s * 1000) / 3);
}

/** Milliseconds between reaper passes: `min(5 s, ttl_s / 4)` (as the CLI's reaper). */
export function reapMs(spec: SandboxSpec): number {
  return Math.min(5_000, Math.floor((spec.ttl_s * 1000) / 4));
}

/**
 * When a waiting session's alarm should fire: its own wake-up time
 * (`deadlineMs`, the earliest awaited call's or the trajectory's deadline;
 * null: none) or, while it holds a lease, its next heartbeat
 * (`nowMs + heartbeatMs`), whichever is first. Null: no alarm.
 */
export function waitingAlarmAt(deadlineMs: number | null, holdsLease: boolean, spec: SandboxSpec | null, nowMs: number): number | null {
  const beat = holdsLease && spec ? nowMs + heartbeatMs(spec) : null;
  if (deadlineMs === null) return beat;
  return beat === null ? deadlineMs : Math.min(deadlineMs, beat);
}

/**
 * Wakes the reaper object (its `POST /sandbox-reaper`): counts the wake-up
 * and arms its alarm `reapMs` from now unless one is armed. Idempotent but
 * for the count, which tells a pass in flight that a lease may have been
 * granted after it read the store ({@link reaperPass}).
 */
export async function wakeReaper(storage: DurableObjectStorage, spec: SandboxSpec, nowMs: number): Promise<void> {
  const n = (await storage.get<number>(REAPER_ENTRY)) ?? 0;
  await storage.put(REAPER_ENTRY, n + 1);
  if ((await storage.getAlarm()) === null) await storage.setAlarm(nowMs + reapMs(spec));
}

/**
 * One alarm of the reaper object: a reaper pass over the whole lease store
 * ({@link SandboxLeases.reapOnce}: leases whose TTL, create hold or release
 * hold lapsed, released with `reaped_ttl`, `reaped_create`,
 * `reaped_release`), then the alarm is re-armed `reapMs` later while the
 * store's live set (creating + live + releasing) is not empty or a wake-up
 * came during the pass; otherwise the reaper goes idle (entry deleted) until
 * the next grant wakes it. Resolves to the number released.
 * @throws StoreError when the store cannot be read (the alarm's outage backoff retries it).
 */
export async function reaperPass(storage: DurableObjectStorage, leases: SandboxLeases, nowMs: () => number): Promise<number> {
  const before = await storage.get<number>(REAPER_ENTRY);
  const n = await leases.reapOnce();
  const st = await leases.store.stats();
  const woken = (await storage.get<number>(REAPER_ENTRY)) !== before;
  if (st.live + st.creating + st.releasing > 0 || woken) await storage.setAlarm(nowMs() + reapMs(leases.spec));
  else await storage.delete([REAPER_ENTRY]);
  return n;
}
