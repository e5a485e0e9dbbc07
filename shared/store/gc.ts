import { decodeKeyPart, keyPart } from "./key-encoding.ts";
import type { RedisCommander, RedisReply } from "./redis-commander.ts";
import { recordBlobPrefix, type BlobStore } from "./blob-store.ts";

/** Ages (seconds) past which `edgeloop gc` removes each kind of data; null: never. */
export interface GcAges {
  /** Records of a finished group: seconds since the group was delivered (or first seen finished). */
  records: number | null;
  /** The group's hash, key set, stream entry (and its records). */
  groups: number | null;
  /** Finished durable sessions: seconds since they finished. */
  sessions: number | null;
  /** Batch metadata of batches with no job left: seconds since submission. */
  batches: number | null;
}

/** Options of {@link collectGarbage}. */
export interface GcOptions {
  /** Key prefix (default `edgeloop:`). */
  prefix?: string;
  ages: GcAges;
  /**
   * The expiry finished sessions were written with (`store.retention.sessions`,
   * seconds): a finished session's age is this minus its remaining TTL.
   */
  sessionTtlSeconds: number;
  /** Report what would be removed; change nothing (not even the `gc_seen` marks). */
  dryRun?: boolean;
  /** Epoch milliseconds (default `Date.now()`). */
  nowMs?: () => number;
  /** SCAN COUNT hint (default 500). */
  scanCount?: number;
  /**
   * The blob store records' large parts were written to (`store.blobs`):
   * every record removed has its blobs removed with it, by prefix
   * (`recordBlobPrefix`), before its hash goes. Absent: blobs are not touched.
   */
  blobs?: BlobStore;
}

/** What one {@link collectGarbage} pass found and removed (or, dry-run, would remove). */
export interface GcReport {
  dry_run: boolean;
  /** Keys removed (or to be removed), by kind. */
  deleted: { records: number; groups: number; sessions: number; batches: number; keys: number; blobs?: number };
  /**
   * What was kept, and why: groups not finished (`incomplete_groups`),
   * delivered but not yet read and acknowledged by every consumer group of
   * its stream (`undelivered_groups`), finished but younger than the ages
   * (`recent_groups`), finished without a delivery (filtered, withdrawn) and
   * seen by gc for the first time — their age counts from this pass, so a
   * later pass removes them (`first_seen_groups`; a dry run marks nothing and
   * counts them here every time); sessions and batches still running.
   * Every scanned group is in exactly one of these or in `deleted.groups`,
   * or had only its records removed (`deleted.records`, `ages.records` < `ages.groups`).
   */
  kept: {
    incomplete_groups: number;
    undelivered_groups: number;
    recent_groups: number;
    first_seen_groups: number;
    running_sessions: number;
    running_batches: number;
  };
  scanned: { groups: number; sessions: number; batches: number };
}

const BATCH_ID = /^[0-9a-f-]{36}$/;

/**
 * Removes what a Redis/Upstash store no longer needs (`edgeloop gc`), by
 * `SCAN … MATCH {p}… TYPE hash` (never `KEYS`), in three passes:
 * - **groups** (`{p}group:{uid}`): only a group whose every session finished
 *   (`finished >= expected`), or one a cancelled batch withdrew, is a
 *   candidate. Its age counts from its delivery (the stream id in
 *   `delivery_id`, milliseconds) or, for a group never enqueued (filtered,
 *   withdrawn), from the first gc pass that saw it finished (field
 *   `gc_seen`, epoch ms, set once). A delivered group is removed only once
 *   **every** consumer group of its stream (`trainers`, and any other a
 *   reader names, e.g. Python's `Reader(group="ppo-trainer")`) has read
 *   past its entry and holds it in no pending list (`XINFO GROUPS`,
 *   `XPENDING`): never data some trainer has not acknowledged. A stream
 *   without any consumer group has been read by nobody: its groups stay. Older than `ages.records`: its records (`traj:{key}`) go;
 *   older than `ages.groups`: the records, the group hash, its key set, its
 *   stream entry (`XDEL`) and its place in the filtered list go too.
 * - **sessions** (`{p}session:{key}`): a session without an expiry is running
 *   or waiting and is never touched; a finished one got the expiry
 *   `sessionTtlSeconds` when it finished, so it finished
 *   `sessionTtlSeconds − TTL` seconds ago; older than `ages.sessions` it is
 *   deleted. Agent-gateway sessions (`{p}session:agent:{key}`) carry an
 *   expiry while running and are left to it.
 * - **batches** (`{p}jobs:batch:{id}`): a batch with any job left in
 *   `{p}jobs` is running and kept; otherwise, submitted longer ago than
 *   `ages.batches` (`spec.started_at`), its hash, rows, done stream,
 *   over-sampling keys and index entry (`{p}jobs:batches`) are deleted.
 * Idempotent; safe to run while batches run. Runtime-free (any {@link RedisCommander}).
 * @throws whatever the commander throws (a Redis error, an unreachable store).
 * @see https://redis.io/docs/latest/commands/scan/ (SCAN's guarantees: a key present for the whole scan is returned at least once)
 * @see https://github.com/antirez/redis/pull/6116 (`SCAN … TYPE type`, Redis 6.0 and later)
 */
export async function collectGarbage(redis: RedisCommander, opts: GcOptions): Promise<GcReport> {
  const p = opts.prefix ?? "edgeloop:";
  const now = (opts.nowMs ?? Date.now)();
  const dry = opts.dryRun ?? false;
  const count = String(opts.scanCount ?? 500);
  const report: GcReport = {
    dry_run: dry,
    deleted: { records: 0, groups: 0, sessions: 0, batches: 0, keys: 0, ...(opts.blobs ? { blobs: 0 } : {}) },
    kept: { incomplete_groups: 0, undelivered_groups: 0, recent_groups: 0, first_seen_groups: 0, running_sessions: 0, running_batches: 0 },
    scanned: { groups: 0, sessions: 0, batches: 0 },
  };
  // Counts the keys that exist (a batch may lack its over-sampling keys): EXISTS in a dry run, UNLINK's reply otherwise.
  const del = async (keys: string[]): Promise<void> => {
    for (let i = 0; i < keys.length; i += 500) report.deleted.keys += Number(await redis.exec([dry ? "EXISTS" : "UNLINK", ...keys.slice(i, i + 500)]));
  };
  const scan = async function* (match: string): AsyncGenerator<string[]> {
    let cursor = "0";
    do {
      const [next, keys] = (await redis.exec(["SCAN", cursor, "MATCH", match, "COUNT", count, "TYPE", "hash"])) as [string, string[]];
      cursor = String(next);
      if (keys.length) yield keys.map(String);
    } while (cursor !== "0");
  };

  // Per partition stream: every consumer group and how far it has read (`last-delivered-id`); [] when there is none.
  const readers = new Map<string, { name: string; last: string }[]>();
  const groupsOf = async (stream: string): Promise<{ name: string; last: string }[]> => {
    const known = readers.get(stream);
    if (known) return known;
    let out: { name: string; last: string }[] = [];
    try {
      const groups = (await redis.exec(["XINFO", "GROUPS", stream])) as RedisReply[];
      out = groups.map((g) => fields(g)).map((f) => ({ name: f.name ?? "", last: f["last-delivered-id"] ?? "0-0" }));
    } catch {
      out = []; // no such stream
    }
    readers.set(stream, out);
    return out;
  };

  const grp = `${p}group:`;
  for await (const keys of scan(`${globEscape(grp)}*`)) {
    const uids = keys.map((k) => k.slice(grp.length));
    const rows = (await redis.pipeline(keys.map((k) => ["HMGET", k, "expected", "finished", "enqueued", "delivery_id", "partition", "cancelled", "filtered", "gc_seen"]))) as (RedisReply | Error)[];
    for (let i = 0; i < keys.length; i++) {
      const r = rows[i];
      if (r instanceof Error || !Array.isArray(r)) continue;
      report.scanned.groups++;
      const [expected, finished, enqueued, deliveryId, partition, cancelled, filtered, seen] = r.map((x) => (x == null ? null : String(x)));
      const done = cancelled === "1" || (expected != null && Number(finished ?? 0) >= Number(expected));
      if (!done) {
        report.kept.incomplete_groups++;
        continue;
      }
      let since: number;
      const stream = `${p}groups:${partition === "val" ? "val" : "train"}`;
      if (enqueued === "1" && deliveryId) {
        since = Number(deliveryId.split("-")[0]);
      } else if (seen != null) {
        since = Number(seen);
      } else {
        // First sight of a finished group that was never enqueued: its clock starts now.
        if (!dry) await redis.exec(["HSETNX", keys[i]!, "gc_seen", String(now)]);
        report.kept.first_seen_groups++;
        continue;
      }
      const ageS = (now - since) / 1000;
      const dropGroup = opts.ages.groups !== null && ageS >= opts.ages.groups;
      const dropRecords = dropGroup || (opts.ages.records !== null && ageS >= opts.ages.records);
      if (!dropRecords) {
        report.kept.recent_groups++;
        continue;
      }
      if (enqueued === "1" && deliveryId && !(await acknowledgedByAll(redis, stream, deliveryId, await groupsOf(stream)))) {
        report.kept.undelivered_groups++;
        continue;
      }
      const members = ((await redis.exec(["SMEMBERS", `${grp}${uids[i]}:keys`])) as RedisReply[]).map(String);
      const trajKeys = members.map((k) => `${p}traj:${keyPart(k)}`);
      const existing = trajKeys.length ? ((await redis.pipeline(trajKeys.map((k) => ["EXISTS", k]))) as RedisReply[]).filter((x) => Number(x) === 1).length : 0;
      report.deleted.records += existing;
      // Blobs first: a pass that dies between the two leaves a record whose blob is gone (its read fails naming it), never an unreachable blob.
      if (opts.blobs && !dry) for (const k of members) report.deleted.blobs! += await opts.blobs.deletePrefix(recordBlobPrefix(p, k));
      await del(trajKeys);
      if (!dropGroup) continue;
      report.deleted.groups++;
      await del([keys[i]!, `${grp}${uids[i]}:keys`]);
      if (!dry && enqueued === "1" && deliveryId) await redis.exec(["XDEL", stream, deliveryId]);
      if (!dry && filtered != null) await redis.exec(["LREM", `${p}groups:filtered:${partition === "val" ? "val" : "train"}`, "0", decodeKeyPart(uids[i]!) ?? uids[i]!]);
    }
  }

  if (opts.ages.sessions !== null) {
    const ses = `${p}session:`;
    for await (const keys of scan(`${globEscape(ses)}*`)) {
      const own = keys.filter((k) => !k.startsWith(`${ses}agent:`));
      if (!own.length) continue;
      const ttls = (await redis.pipeline(own.map((k) => ["PTTL", k]))) as (RedisReply | Error)[];
      const old: string[] = [];
      own.forEach((k, i) => {
        report.scanned.sessions++;
        const ms = Number(ttls[i]);
        if (!(ms >= 0)) {
          if (ms === -1) report.kept.running_sessions++;
          return;
        }
        const finishedAgoS = opts.sessionTtlSeconds - ms / 1000;
        if (finishedAgoS >= opts.ages.sessions!) old.push(k);
      });
      report.deleted.sessions += old.length;
      await del(old);
    }
  }

  if (opts.ages.batches !== null) {
    const running = await batchesWithJobs(redis, `${p}jobs`);
    const bat = `${p}jobs:batch:`;
    for await (const keys of scan(`${globEscape(bat)}*`)) {
      for (const k of keys) {
        const id = k.slice(bat.length);
        if (!BATCH_ID.test(id)) continue;
        report.scanned.batches++;
        if (running.has(id)) {
          report.kept.running_batches++;
          continue;
        }
        const spec = await redis.exec(["HGET", k, "spec"]);
        const startedAt = typeof spec === "string" ? Number((JSON.parse(spec) as { started_at?: number }).started_at ?? NaN) : NaN;
        if (!(now - startedAt >= opts.ages.batches * 1000)) continue;
        const extra: string[] = [];
        let cursor = "0";
        do {
          const [next, found] = (await redis.exec(["SCAN", cursor, "MATCH", `${globEscape(k)}:w:*`, "COUNT", count])) as [string, string[]];
          cursor = String(next);
          extra.push(...found.map(String));
        } while (cursor !== "0");
        report.deleted.batches++;
        await del([k, `${k}:rows`, `${k}:done`, `${k}:reserve`, `${k}:launched`, `${k}:reserve-jobs`, ...extra]);
        if (!dry) await redis.exec(["ZREMRANGEBYLEX", `${p}jobs:batches`, `[${String(Math.floor(startedAt)).padStart(15, "0")}:${id}`, `[${String(Math.floor(startedAt)).padStart(15, "0")}:${id}`]);
      }
    }
  }
  return report;
}

/**
 * Whether every consumer group of `stream` read the entry `id` and acknowledged it: each has read past
 * it (`last-delivered-id` ≥ id) and holds it in no pending list. False when the stream has no group.
 * @see https://redis.io/docs/latest/commands/xinfo-groups/ (`last-delivered-id`)
 * @see https://redis.io/docs/latest/commands/xpending/ (the extended form `XPENDING key group start end count`)
 */
async function acknowledgedByAll(redis: RedisCommander, stream: string, id: string, groups: { name: string; last: string }[]): Promise<boolean> {
  if (!groups.length) return false;
  for (const g of groups) {
    if (compareIds(id, g.last) > 0) return false;
    const pending = (await redis.exec(["XPENDING", stream, g.name, id, id, "1"])) as RedisReply[];
    if (pending.length !== 0) return false;
  }
  return true;
}

/** The batch ids that still have a job entry in the job stream (claimed or waiting): their batches are running. */
async function batchesWithJobs(redis: RedisCommander, stream: string): Promise<Set<string>> {
  const out = new Set<string>();
  let from = "-";
  for (;;) {
    const entries = (await redis.exec(["XRANGE", stream, from, "+", "COUNT", "500"])) as RedisReply[];
    if (!entries.length) return out;
    for (const e of entries) {
      const [id, kv] = e as [string, RedisReply];
      const f = fields(kv);
      if (f.batch) out.add(f.batch);
      from = `(${String(id)}`;
    }
    if (entries.length < 500) return out;
  }
}

/** A flat `[k, v, k, v, …]` reply (or a RESP3 map) as an object of strings. */
function fields(r: RedisReply): Record<string, string> {
  const out: Record<string, string> = {};
  if (Array.isArray(r)) {
    for (let i = 0; i + 1 < r.length; i += 2) out[String(r[i])] = r[i + 1] == null ? "" : String(r[i + 1]);
  } else if (r && typeof r === "object") {
    for (const [k, v] of Object.entries(r)) out[k] = v == null ? "" : String(v);
  }
  return out;
}

/** Orders two stream ids `<ms>-<seq>`. */
function compareIds(a: string, b: string): number {
  const [am, as] = a.split("-").map(Number) as [number, number];
  const [bm, bs] = b.split("-").map(Number) as [number, number];
  return am !== bm ? am - bm : (as ?? 0) - (bs ?? 0);
}


/**
 * `s` as a literal in a Redis glob pattern (`SCAN … MATCH`, `KEYS`): `*`,
 * `?`, `[`, `]` and `\` are escaped with a backslash, so a prefix holding
 * them (`x*`, `a[b]`) matches only its own keys, never another prefix's.
 * @see https://redis.io/docs/latest/commands/keys/ (the glob syntax; `\` escapes special characters)
 */
export function globEscape(s: string): string {
  return s.replace(/[*?[\]\\]/g, (c) => `\\${c}`);
}
