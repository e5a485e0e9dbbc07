import { z } from "zod";
import { MAX_TIMER_MS } from "./config.ts";

/**
 * The sandbox provider contract (issue 29; docs: the lead's leases design,
 * "The provider contract"): what edgeloop POSTs to a sandbox provider's
 * `create_url`, `release_url` and `heartbeat_url` (JSON, signed with
 * `x-edgeloop-signature` like tool webhooks when `tools.secret` is set), and
 * the create reply it accepts. The provider side is implemented by the
 * example provider (infra/sandbox/provider.ts); edgeloop's lease manager is
 * the client.
 */

/** The longest `lifetime_s`, seconds: {@link MAX_TIMER_MS} in whole seconds (about 24.8 days), as a provider turns it into a timer in ms. */
export const MAX_SANDBOX_LIFETIME_S = Math.floor(MAX_TIMER_MS / 1000);

/** A provider's sandbox id: 1..256 characters, chosen by the provider. */
export const SandboxId = z.string().min(1).max(256);
export type SandboxId = z.infer<typeof SandboxId>;

/**
 * A lease id, `{key}~{attempt}` (attempt 1-based): the idempotency key of a
 * create and the name every release and heartbeat of that sandbox uses.
 * Providers treat it as an opaque non-empty string.
 */
export const LeaseId = z.string().min(1);

/** A sandbox lifetime, whole seconds, 1..{@link MAX_SANDBOX_LIFETIME_S}. */
const LifetimeS = z.number().int().positive().max(MAX_SANDBOX_LIFETIME_S, `must be <= ${MAX_SANDBOX_LIFETIME_S} (seconds; setTimeout's largest delay)`);

/**
 * Why a lease is released (the release body's `reason`):
 * `finished`, `failed`, `cancelled` (the trajectory ended so), `surplus`
 * (an oversampled trajectory no longer needed), `deadline` (the trajectory's
 * deadline passed), `create_failed` (a create that timed out or failed,
 * released by its lease id whether or not its sandbox id was ever heard),
 * `reaped_ttl` (a live lease whose owner stopped heartbeating),
 * `reaped_create` (a lease stuck in `creating`), `reaped_release` (a release
 * that was claimed but never finished).
 */
export const SandboxReleaseReason = z.enum(["finished", "failed", "cancelled", "surplus", "deadline", "create_failed", "reaped_ttl", "reaped_create", "reaped_release"]);
export type SandboxReleaseReason = z.infer<typeof SandboxReleaseReason>;

/**
 * `POST create_url`: `lease_id` (the idempotency key: a create repeated with
 * a lease id the provider already made a sandbox for is answered with the same
 * `sandbox_id`, and no second sandbox), `key` (the trajectory key
 * `{uid}_{session_id}_{output_index}`), `create_kwargs` (the row's
 * `extra_info.sandbox_kwargs`, `{}` when absent), `lifetime_s` (seconds after
 * which the provider destroys the sandbox on its own; edgeloop sends at least
 * the trajectory deadline). A create whose lease id was already released must
 * leave no sandbox behind: the provider answers `409` (or creates and
 * destroys). Answered by `200` {@link SandboxCreateReply}.
 */
export const SandboxCreateBody = z.object({
  lease_id: LeaseId,
  key: z.string().min(1),
  create_kwargs: z.record(z.string(), z.unknown()),
  lifetime_s: LifetimeS,
});
export type SandboxCreateBody = z.infer<typeof SandboxCreateBody>;

/**
 * The sandbox's own endpoint, as a create reply may name it: an `http(s)://`
 * URL without query or fragment, at most 2048 characters (e.g. the OpenEnv
 * server running in that container, which `openenv.base_url: "sandbox"` plays).
 */
export const SandboxBaseUrl = z
  .string()
  .max(2048, "must be at most 2048 characters")
  .refine((s) => {
    try {
      const u = new URL(s);
      return (u.protocol === "http:" || u.protocol === "https:") && !u.search && !u.hash;
    } catch {
      return false;
    }
  }, "must be an http(s):// URL without query or fragment (the sandbox's own endpoint)");

/**
 * The `200` reply of a create: `{sandbox_id}` (1..256 characters) and,
 * optionally, `base_url` ({@link SandboxBaseUrl}: the sandbox's own endpoint;
 * absent or null when the sandbox has none). The lease keeps `base_url`, so a
 * session resumed in another process reaches the same endpoint. Other fields
 * are allowed and ignored.
 */
export const SandboxCreateReply = z.looseObject({ sandbox_id: SandboxId, base_url: SandboxBaseUrl.nullish() });
export type SandboxCreateReply = z.infer<typeof SandboxCreateReply>;

/**
 * `POST release_url`: `lease_id` (idempotent by it), `sandbox_id` (null when
 * edgeloop never heard it: a create that timed out), `key`, `reason`
 * ({@link SandboxReleaseReason}). Answered `2xx`; `404` means the sandbox is
 * already gone and counts as released. After a release, a create with the
 * same lease id is refused (`409`).
 */
export const SandboxReleaseBody = z.object({
  lease_id: LeaseId,
  sandbox_id: SandboxId.nullable(),
  key: z.string().min(1),
  reason: SandboxReleaseReason,
});
export type SandboxReleaseBody = z.infer<typeof SandboxReleaseBody>;

/**
 * `POST heartbeat_url` (optional): `lease_id`, `sandbox_id`, `lifetime_s`
 * (the provider's own destroy timer restarts: the sandbox now lives this many
 * seconds from the heartbeat). Answered `2xx`; `404` means the sandbox is gone.
 */
export const SandboxHeartbeatBody = z.object({
  lease_id: LeaseId,
  sandbox_id: SandboxId,
  lifetime_s: LifetimeS,
});
export type SandboxHeartbeatBody = z.infer<typeof SandboxHeartbeatBody>;
