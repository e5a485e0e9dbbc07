import type { RedisReply } from "../store/redis-commander.ts";
import { parseEntries, type StreamConsumer } from "../store/stream-consumer.ts";
import type { JobKeys } from "./job-keys.ts";
import type { JobRedis } from "./job-redis.ts";
import type { QueueStats } from "./job-types.ts";

/**
 * Depth (jobs a worker can claim now: never claimed, plus stranded ones),
 * in flight (held by a worker that heart-beats them), stranded (held by a
 * consumer with a job idle past the lease: it stopped heart-beating, so the
 * next claim reclaims them) and the oldest unacknowledged job's age (from
 * its stream id's milliseconds and the Redis clock); `depth + in_flight` is
 * XLEN, every job still to do. `workers.known` counts workers that claimed or
 * heart-beat within two leases (a worker blocked on an empty queue claims
 * every second; a busy one heart-beats), `busy` those of them holding
 * jobs that are not stranded. A worker silent for longer (SIGKILLed, its host gone) is pruned:
 * dropped from `{prefix}jobs:workers` and, once its jobs have been
 * reclaimed (no pending entries), from the consumer group (XGROUP
 * DELCONSUMER), so it is not counted forever.
 * `defaultLeaseMs`: the lease assumed when no worker recorded one (`{p}jobs:lease`).
 */
export async function queueStats(r: JobRedis, k: JobKeys, consumers: StreamConsumer, group: string, defaultLeaseMs: number): Promise<QueueStats> {
  const { pending, consumers: cs } = await consumers.info();
  const [len, first, time, seen, claimedWith] = await r.pipe([["XLEN", k.stream], ["XRANGE", k.stream, "-", "+", "COUNT", "1"], ["TIME"], ["ZRANGE", k.workersKey, "0", "-1", "WITHSCORES"], ["GET", k.leaseKey]]);
  const leaseMs = Number(claimedWith) > 0 ? Number(claimedWith) : defaultLeaseMs;
  // A consumer with a job idle past the lease has stopped heart-beating (a live worker's heartbeats keep
  // each of its jobs below ~5/6 of the lease): its jobs are stranded, reclaimable by the next claim. One XPENDING IDLE … COUNT 1 per holder.
  const holders = cs.filter((c) => Number(c.pending ?? 0) > 0);
  const idle = holders.length
    ? await consumers.withGroup(() => r.pipe(holders.map((c) => ["XPENDING", k.stream, group, "IDLE", String(leaseMs), "-", "+", "1", String(c.name)])))
    : [];
  const strandedBy = new Set(holders.filter((_, i) => Array.isArray(idle[i]) && (idle[i] as RedisReply[]).length > 0).map((c) => String(c.name)));
  const stranded = holders.reduce((n, c) => n + (strandedBy.has(String(c.name)) ? Number(c.pending) : 0), 0);
  const inFlight = Math.max(0, pending - stranded);
  const oldest = parseEntries(first)[0]?.id;
  const t = time as RedisReply[];
  const nowMs = Number(t[0]) * 1000 + Math.floor(Number(t[1]) / 1000);
  // Worker clocks may drift from Redis's by seconds; two leases (60 s by default) absorb that.
  const horizon = nowMs - 2 * leaseMs;
  const live = new Set<string>();
  // ZRANGE WITHSCORES: flat [member, score, …] (RESP2, Upstash) or [[member, score], …] (RESP3).
  const reply = (seen as RedisReply[] | null) ?? [];
  const pairs = reply.every(Array.isArray) ? (reply as RedisReply[][]) : reply.flatMap((v, i) => (i % 2 === 0 ? [[v, reply[i + 1]] as RedisReply[]] : []));
  for (const [member, score] of pairs) if (Number(score) >= horizon) live.add(String(member));
  const dead = cs.filter((c) => !live.has(String(c.name)) && Number(c.pending ?? 0) === 0);
  await Promise.all([
    r.call(["ZREMRANGEBYSCORE", k.workersKey, "-inf", `(${horizon}`]),
    ...dead.map((c) => r.call(["XGROUP", "DELCONSUMER", k.stream, group, String(c.name)])),
  ]).catch(() => {});
  return {
    mode: "queue",
    depth: Math.max(0, Number(len) - inFlight),
    in_flight: inFlight,
    stranded: Math.min(stranded, Math.max(0, Number(len) - inFlight)),
    oldest_age_ms: oldest ? Math.max(0, nowMs - Number(oldest.split("-")[0])) : 0,
    workers: { known: live.size, busy: cs.filter((c) => live.has(String(c.name)) && !strandedBy.has(String(c.name)) && Number(c.pending ?? 0) > 0).length },
  };
}
