import { InputError } from "../errors.ts";
import { parseTrajectoryKey, Uid } from "../schema/index.ts";
import type { Partition, ReadGroupsOptions } from "./types.ts";

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
export function checkReadOptions(opts: ReadGroupsOptions): Required<ReadGroupsOptions> {
  if (typeof opts.consumer !== "string" || opts.consumer.length === 0 || opts.consumer.length > 200) {
    throw new InputError("consumer", "must be a non-empty string of at most 200 characters");
  }
  if (!Number.isInteger(opts.max) || opts.max < 1 || opts.max > 10_000) {
    throw new InputError("max", `must be an integer in 1..10000, got ${String(opts.max)}`);
  }
  const block = opts.block_ms ?? 0;
  if (!Number.isInteger(block) || block < 0) throw new InputError("block_ms", `must be an integer >= 0, got ${String(block)}`);
  return { consumer: opts.consumer, max: opts.max, block_ms: block, partition: checkPartition(opts.partition) };
}

/** Orders trajectory keys by `session_id`, then `output_index`. */
export function compareKeys(a: string, b: string): number {
  const x = parseTrajectoryKey(a);
  const y = parseTrajectoryKey(b);
  return x.session_id - y.session_id || x.output_index - y.output_index;
}
