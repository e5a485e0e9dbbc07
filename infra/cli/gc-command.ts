import { parseLayeredConfig } from "../../shared/config/app-config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { collectGarbage, type GcAges, type GcReport } from "../../shared/store/gc.ts";
import { UpstashCommander } from "../../shared/store/upstash-transfer-queue.ts";
import { IoRedisCommander } from "../redis/ioredis-commander.ts";
import { readConfigFile, resolveConfigPaths } from "./files.ts";
import { checkStore } from "./builders/store.ts";
import { openBlobStore } from "../blobs/open-blob-store.ts";

/** Flags of `edgeloop gc`. */
export interface GcFlags {
  config?: string;
  store?: string;
  storePrefix?: string;
  /** store.blobs.url: records' blobs are deleted with them. */
  blobStore?: string;
  /** Seconds: one age for every kind (records, groups, sessions, batches) instead of `store.retention`. */
  olderThan?: number;
  dryRun?: boolean;
  json?: boolean;
}

/** The report as the lines `edgeloop gc` prints (stdout). */
export function formatGcReport(r: GcReport): string {
  const verb = r.dry_run ? "would delete" : "deleted";
  return [
    `${verb.padEnd(24)} ${r.deleted.records} records, ${r.deleted.groups} groups, ${r.deleted.sessions} sessions, ${r.deleted.batches} batches (${r.deleted.keys} keys)${r.deleted.blobs !== undefined ? `, ${r.deleted.blobs} blobs` : ""}`,
    `kept                     ${r.kept.incomplete_groups} incomplete groups, ${r.kept.undelivered_groups} delivered groups not yet acknowledged by every consumer group, ` +
      `${r.kept.recent_groups} groups younger than their age, ${r.kept.first_seen_groups} filtered/withdrawn groups first seen now (their age starts here), ` +
      `${r.kept.running_sessions} running sessions, ${r.kept.running_batches} running batches`,
    `scanned                  ${r.scanned.groups} groups, ${r.scanned.sessions} sessions, ${r.scanned.batches} batches`,
  ].join("\n");
}

/**
 * `edgeloop gc [--older-than DURATION] [--dry-run]`: removes what the
 * store's Redis (or Upstash) no longer needs — records and groups finished,
 * delivered and acknowledged longer ago than `store.retention.records` /
 * `.groups`, finished sessions older than `store.retention.sessions`,
 * metadata of batches with no job left older than `store.retention.batches`
 * ({@link collectGarbage}: SCAN by prefix, never KEYS; never an incomplete
 * group's data, a running session or a running batch). `--older-than` sets
 * one age for all four. Prints what it deleted (or, `--dry-run`, would).
 * @throws ConfigError (exit 2) for the memory store or an unreachable store.
 */
export async function gcCommand(flags: GcFlags): Promise<void> {
  const fileCfg = flags.config ? resolveConfigPaths(await readConfigFile(flags.config), flags.config) : {};
  const config = parseLayeredConfig(fileCfg, { store: { url: flags.store, prefix: flags.storePrefix, blobs: { url: flags.blobStore } } }, flags.config ?? "flags");
  if (config.store.url === "memory") throw new ConfigError("store.url", "edgeloop gc needs a Redis or Upstash store (--store redis://host:port or upstash): the memory store lives and dies with its process");
  // gc deletes what is finished and waits for no replica: store.durability does not apply to it.
  await checkStore(config, 3_000, { noReplicaCheck: true });
  const redis =
    config.store.url === "upstash"
      ? new UpstashCommander({ url: process.env.UPSTASH_REDIS_REST_URL!, token: process.env.UPSTASH_REDIS_REST_TOKEN! })
      : new IoRedisCommander(config.store.url);
  try {
    const r = config.store.retention;
    const ages: GcAges = flags.olderThan !== undefined ? { records: flags.olderThan, groups: flags.olderThan, sessions: flags.olderThan, batches: flags.olderThan } : { records: r.records, groups: r.groups, sessions: r.sessions, batches: r.batches };
    const blobs = config.store.blobs.url ? openBlobStore(config.store.blobs.url) : undefined;
    const report = await collectGarbage(redis, { prefix: config.store.prefix, ages, sessionTtlSeconds: r.sessions, dryRun: flags.dryRun ?? false, ...(blobs ? { blobs } : {}) });
    await blobs?.close?.();
    process.stdout.write((flags.json ? JSON.stringify(report) : formatGcReport(report)) + "\n");
  } finally {
    await redis.close();
  }
}
