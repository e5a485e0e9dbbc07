import { StoreError } from "../errors.ts";
import type { PlannedTrajectory } from "../rollout/batch.ts";
import type { RedisArg } from "../store/redis-commander.ts";
import { checkCommand, commandBytes } from "../store/request-size.ts";
import { batchIndexMember, type JobKeys } from "./job-keys.ts";
import type { BatchSpec, ExpectedGroup, PreparedBatch } from "./job-types.ts";

/**
 * Builds every write of a batch (what `JobQueue.prepare` returns) and checks
 * each against the store's request limit `max` (bytes; `Infinity`: none)
 * before anything is written: each row once (`{p}jobs:batch:{id}:rows`, not
 * copied into its `n` jobs), the spec and the keys (in chunks), one small
 * job entry per trajectory (the row by reference: entry field `r`), and
 * the reserve rows' job entries of an over-sampled batch. `ttl`: seconds
 * the batch's keys are kept, as a Redis argument.
 * @throws StoreError (413, code `request_too_large`, field `rows[i]` for a row) when one write alone is
 *   over the limit: the batch is refused and nothing has been written.
 */
export function prepareBatch(
  k: JobKeys,
  limits: { max: number; ttl: string },
  spec: BatchSpec,
  keys: readonly string[],
  jobs: readonly PlannedTrajectory[],
  opts: { reserve?: readonly PlannedTrajectory[]; fingerprints?: ReadonlyMap<string, string> },
): PreparedBatch {
  const { max, ttl } = limits;
      const rowsKey = k.rowsKey(spec.batch_id);
  const rows: RedisArg[][] = [];
  const rowBytes = new Map<number, number>();
  const reserveJobs = opts.reserve ?? [];
  for (const t of [...jobs, ...reserveJobs]) {
    if (!t.row || rowBytes.has(t.row_index)) continue;
    const json = JSON.stringify(t.row);
    rowBytes.set(t.row_index, json.length);
    const cmd = ["HSET", rowsKey, String(t.row_index), json];
    if (commandBytes(cmd, "json") > max * 0.95) {
      throw new StoreError(`rows[${t.row_index}] is ${commandBytes(cmd, "json")} bytes as stored; the store accepts requests of at most ${max} bytes (store.max_request_bytes): nothing was written`, {
        retryable: false,
        status: 413,
        code: "request_too_large",
        field: `rows[${t.row_index}]`,
      });
    }
    rows.push(cmd);
  }
  if (rows.length) rows.push(["EXPIRE", rowsKey, ttl]);
  // Keys in chunks, so a 100k-key batch is several values of bounded size, not one.
  const chunkKeys = Math.max(1, Math.min(10_000, Math.floor(max / 4 / (keys.reduce((m, k) => Math.max(m, k.length), 1) + 8))));
  const chunks: string[] = [];
  for (let i = 0; i < keys.length; i += chunkKeys) chunks.push(JSON.stringify(keys.slice(i, i + chunkKeys)));
  const os = spec.oversample ? ["os:target", String(spec.oversample.target_groups), "os:mode", spec.oversample.partial_rollout] : [];
  const batch: RedisArg[][] = [["HSET", k.batchKey(spec.batch_id), "spec", JSON.stringify(spec), "kn", String(chunks.length), ...os]];
  chunks.forEach((c, i) => batch.push(["HSET", k.batchKey(spec.batch_id), `k:${i}`, c]));
  batch.push(["EXPIRE", k.batchKey(spec.batch_id), ttl], ["ZADD", k.batchesKey(), "0", batchIndexMember(spec.started_at, spec.batch_id)]);
  const entries = jobs.map((t) => {
    const ref = t.row !== null;
    // `rb`: the row's size, so a worker reads rows in requests of bounded size.
    return ["XADD", k.stream, "*", "batch", spec.batch_id, "key", t.key, ...(ref ? ["r", "1", "rb", String(rowBytes.get(t.row_index))] : []), "t", JSON.stringify(ref ? { ...t, row: null } : t)];
  });
  // Reserve rows (over-sampled batches): their job entries wait in a hash until a filtered group starts them (FILTERED_LUA).
  const reserve: RedisArg[][] = [];
  const byUid = new Map<string, PlannedTrajectory[]>();
  for (const t of reserveJobs) byUid.set(t.uid, [...(byUid.get(t.uid) ?? []), t]);
  const part = spec.validate ? "val" : "train";
  for (const [uid, ts] of byUid) {
    const fp = opts.fingerprints?.get(uid);
    const x = JSON.stringify({ n: ts[0]!.group_size, part, ...(fp ? { fp } : {}) } satisfies ExpectedGroup);
    const entry = { uid, x, jobs: ts.map((t) => (t.row !== null ? { key: t.key, rb: String(rowBytes.get(t.row_index)), t: JSON.stringify({ ...t, row: null }) } : { key: t.key, t: JSON.stringify(t) })) };
    reserve.push(["HSET", k.reserveJobsKey(spec.batch_id), uid, JSON.stringify(entry)]);
  }
  if (byUid.size) {
    reserve.push(["RPUSH", k.reserveKey(spec.batch_id), ...byUid.keys()], ["EXPIRE", k.reserveKey(spec.batch_id), ttl], ["EXPIRE", k.reserveJobsKey(spec.batch_id), ttl]);
  }
  for (const c of [...batch, ...entries, ...reserve]) checkCommand(c, max, "json");
  return { spec, jobs: jobs.length, rows, batch, entries, reserve };
}
