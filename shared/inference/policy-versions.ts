/** The policy version trajectories are generated with, and its sequence number (1 for the first version set, +1 per change). */
export interface PolicyVersion {
  version: string | number;
  seq: number;
}

/**
 * The current policy version, set by the trainer after each weight update
 * (`POST /v1/model-version {version}`), shared by every process of a
 * deployment (API and workers). Each turn records the version it was
 * generated under (`extra_fields.model_versions`). The trainer also
 * reports the newest version whose groups it has consumed (`POST
 * /v1/consumed-version {version}`): `rollout.max_staleness` holds new
 * trajectories while the current version is more than that many versions
 * ahead of it ({@link waitForAdmission}), or — with `staleness_policy: fail`
 * — fails a trajectory whose first turn is more than that many versions behind.
 */
export interface PolicyVersions {
  /**
   * The current version, or null when none was ever set. Never from a cache:
   * a read started after a `set` returned (at any process of the deployment)
   * sees that set or a later one, so a turn dispatched after
   * `POST /v1/model-version` returned is stamped with the posted version.
   */
  current(): Promise<PolicyVersion | null>;
  /** Makes `version` current; setting the current version again changes nothing. Returns it with its seq. */
  set(version: string | number): Promise<PolicyVersion>;
  /** The seq `version` got when it was set, or null for a version never set here. */
  seqOf(version: unknown): Promise<number | null>;
  /** The newest version the trainer reported consuming ({@link setConsumed}), or null when it never did. */
  consumed(): Promise<PolicyVersion | null>;
  /**
   * Records that the trainer has consumed the groups generated under
   * `version` (a version set before). Monotonic: reporting an older version
   * than the one recorded changes nothing. Returns the recorded consumed version.
   * @throws InputError (field `version`) for a version never set with {@link set}.
   */
  setConsumed(version: string | number): Promise<PolicyVersion>;
  /** `current` and `consumed` read together, never from a cache: what admission decides on. */
  admissionState(): Promise<{ current: PolicyVersion | null; consumed: PolicyVersion | null }>;
  /** Resolves when `current` or `consumed` may have changed, or after `ms` at the latest (rejects with the signal's reason on abort). */
  waitChange(ms: number, signal?: AbortSignal): Promise<void>;
}
