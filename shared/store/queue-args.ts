import { ConflictError, InputError } from "../errors.ts";
import { AgentRoleName, parseTrajectoryKey, Uid } from "../schema/index.ts";
import { checkDelivery } from "./tree-delivery.ts";
import type { CompleteGroup, Partition, ReadGroupsOptions } from "./types.ts";

/** Default visibility timeout of a delivered, unacked group: 5 minutes. */
export const DEFAULT_VISIBILITY_TIMEOUT_MS = 300_000;
/** Default consumer-group name. */
export const DEFAULT_GROUP = "trainers";
/** Default Redis key prefix. */
export const DEFAULT_PREFIX = "edgeloop:";

/** Checks a uid at the boundary. Throws {@link InputError} (`uid`) when it is empty, too long or holds `_`. */
export function checkUid(uid: unknown): string {
  const r = Uid.safeParse(uid);
  if (!r.success) throw new InputError("uid", r.error.issues[0]?.message ?? "invalid uid");
  return r.data;
}

/** Checks a partition name; `undefined` means `train`. Throws {@link InputError} (`partition`). */
export function checkPartition(p: unknown): Partition {
  if (p === undefined) return "train";
  if (p !== "train" && p !== "val") throw new InputError("partition", `must be "train" or "val", got ${JSON.stringify(p)}`);
  return p;
}

/** Checks `expectGroup`'s `n`. Throws {@link InputError} (`n`). */
export function checkGroupSize(n: unknown): number {
  if (typeof n !== "number" || !Number.isInteger(n) || n < 1 || n > 1_000_000) {
    throw new InputError("n", `must be an integer in 1..1000000, got ${String(n)}`);
  }
  return n;
}

/** Checks a trajectory key. Throws {@link InputError} (`key`). */
export function checkKey(key: unknown): string {
  if (typeof key !== "string") throw new InputError("key", "must be a string");
  parseTrajectoryKey(key);
  return key;
}

/** Checks the read options; returns them with defaults filled in. Throws {@link InputError} naming the option. */
export function checkReadOptions(opts: ReadGroupsOptions): Required<Omit<ReadGroupsOptions, "agent_role">> & Pick<ReadGroupsOptions, "agent_role"> {
  if (typeof opts.consumer !== "string" || opts.consumer.length === 0 || opts.consumer.length > 200) {
    throw new InputError("consumer", "must be a non-empty string of at most 200 characters");
  }
  if (!Number.isInteger(opts.max) || opts.max < 1 || opts.max > 10_000) {
    throw new InputError("max", `must be an integer in 1..10000, got ${String(opts.max)}`);
  }
  const block = opts.block_ms ?? 0;
  if (!Number.isInteger(block) || block < 0) throw new InputError("block_ms", `must be an integer >= 0, got ${String(block)}`);
  let role: { agent_role?: string } = {};
  if (opts.agent_role !== undefined) {
    const r = AgentRoleName.safeParse(opts.agent_role);
    if (!r.success) throw new InputError("agent_role", r.error.issues[0]!.message);
    role = { agent_role: r.data };
  }
  return { consumer: opts.consumer, max: opts.max, block_ms: block, partition: checkPartition(opts.partition), ...role, deliver: checkDelivery(opts.deliver) };
}

/**
 * The delivered groups with only the records of agent role `role` (the read
 * option `agent_role`), `failed` counted over those; unchanged when `role`
 * is undefined. Records without `agent_role` belong to no role.
 */
export function recordsOfRole(groups: CompleteGroup[], role: string | undefined): CompleteGroup[] {
  if (role === undefined) return groups;
  return groups.map((g) => {
    const records = g.records.filter((r) => r.agent_role === role);
    return { ...g, records, failed: records.filter((r) => r.error !== null).length };
  });
}

/** Orders trajectory keys by `session_id`, then `output_index`. */
export function compareKeys(a: string, b: string): number {
  const x = parseTrajectoryKey(a);
  const y = parseTrajectoryKey(b);
  return x.session_id - y.session_id || x.output_index - y.output_index;
}

/** Checks a session id (`0 ≤ session_id < 1 000 000`). Throws {@link InputError} (`session_id`). */
export function checkSessionId(sid: unknown): number {
  if (typeof sid !== "number" || !Number.isInteger(sid) || sid < 0 || sid >= 1_000_000) {
    throw new InputError("session_id", `must be an integer in 0..999999, got ${String(sid)}`);
  }
  return sid;
}

/** Checks `finishSession`'s output count (0 = a session without output). Throws {@link InputError} (`outputs`). */
export function checkOutputs(n: unknown): number {
  if (typeof n !== "number" || !Number.isInteger(n) || n < 0 || n > 1_000_000) {
    throw new InputError("outputs", `must be an integer in 0..1000000, got ${String(n)}`);
  }
  return n;
}

/** Checks a group fingerprint (hex, as `groupFingerprint` makes it); `undefined` → null. Throws {@link InputError} (`fingerprint`). */
export function checkFingerprint(fp: unknown): string | null {
  if (fp === undefined || fp === null) return null;
  if (typeof fp !== "string" || !/^[0-9a-f]{16,128}$/.test(fp)) throw new InputError("fingerprint", "must be 16-128 lowercase hex digits");
  return fp;
}

/** The 409 of a uid registered with another prompt group's fingerprint. */
export function fingerprintConflict(uid: string): ConflictError {
  return new ConflictError(`uid '${uid}' names another prompt group: a uid names one prompt group; use a new uid for new samples`, { field: "uid" });
}

/** The 409 of a write that contradicts a session's output count. */
export function sessionConflict(uid: string, sid: number, what: string): ConflictError {
  return new ConflictError(`session ${uid}_${sid} ${what}`, { field: "output_index" });
}
