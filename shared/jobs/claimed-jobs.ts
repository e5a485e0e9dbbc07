import type { PlannedTrajectory } from "../rollout/batch.ts";
import type { RedisReply } from "../store/redis-commander.ts";
import type { StreamEntry } from "../store/stream-consumer.ts";
import type { JobKeys } from "./job-keys.ts";
import type { JobRedis } from "./job-redis.ts";
import type { ExpectedGroup, Job } from "./job-types.ts";

// Claimed jobs (JobQueue.claim): a job stream entry read as a Job, and the rows its entry refers to filled in.

/**
 * Fills in the rows of jobs whose entry refers to its batch's rows hash
 * (one HGET per distinct row, pipelined). A row that is gone (the batch
 * expired) makes the job's trajectory fail on its own (`row_error`).
 * Replies are bounded like requests: rows are read in pipelines of at most
 * `maxRequestBytes` (bytes; undefined: no limit).
 */
export async function attachRows(r: JobRedis, k: JobKeys, maxRequestBytes: number | undefined, jobs: Job[]): Promise<void> {
  const need = new Map<string, { batch: string; index: number; bytes: number; jobs: Job[] }>();
  for (const j of jobs) {
    if (!j.rowRef) continue;
    const id = `${j.batch_id}\u0000${j.trajectory.row_index}`;
    const e = need.get(id) ?? { batch: j.batch_id, index: j.trajectory.row_index, bytes: j.rowBytes ?? 0, jobs: [] };
    e.jobs.push(j);
    need.set(id, e);
  }
  if (need.size === 0) return;
  const wanted = [...need.values()];
  // Replies bounded like requests: rows are read in pipelines of at most the store's request size.
  const max = (maxRequestBytes ?? Infinity) * 0.8;
  const got: RedisReply[] = [];
  for (let i = 0; i < wanted.length; ) {
    let size = 0;
    let end = i;
    while (end < wanted.length && (end === i || size + wanted[end]!.bytes <= max)) size += wanted[end++]!.bytes;
    got.push(...(await r.pipe(wanted.slice(i, end).map((w) => ["HGET", k.rowsKey(w.batch), String(w.index)]))));
    i = end;
  }
  wanted.forEach((w, i) => {
    const raw = got[i];
    for (const j of w.jobs) {
      delete j.rowRef;
      delete j.rowBytes;
      if (typeof raw === "string") j.trajectory = { ...j.trajectory, row: JSON.parse(raw) as PlannedTrajectory["row"] };
      else {
        j.trajectory = { ...j.trajectory, row: null, row_error: `row ${w.index} of batch ${w.batch} is gone from ${k.rowsKey(w.batch)} (expired?)` };
        j.rowLost = true;
      }
    }
  });
}

/**
 * A job stream entry as a {@link Job} (`deliveries`: 1 for a fresh read, the
 * XPENDING count for a reclaimed one), or null for an entry that is not a
 * job or cannot be parsed.
 */
export function toJob(e: StreamEntry, deliveries: number): Job | null {
  if (!e.fields?.t || !e.fields.batch) return null;
  try {
    return {
      id: e.id,
      batch_id: e.fields.batch,
      trajectory: JSON.parse(e.fields.t) as PlannedTrajectory,
      deliveries,
      ...(e.fields.r === "1" ? { rowRef: true, rowBytes: Number(e.fields.rb ?? 0) } : {}),
      ...(e.fields.x ? { expect: JSON.parse(e.fields.x) as ExpectedGroup } : {}),
    };
  } catch {
    return null;
  }
}
