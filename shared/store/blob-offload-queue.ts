import { z } from "zod";
import { BlobIntegrityError, ConfigError, EdgeloopError, InputError, StoreError } from "../errors.ts";
import { BlobKey, type TrajectoryRecord } from "../schema/index.ts";
import { blobKeyOf, recordBlobPrefix, sha256Hex, type BlobStore } from "./blob-store.ts";
import { checkReadOptions, DEFAULT_PREFIX } from "./queue-args.ts";
import { packedRoutedExpertsOf, unpackRoutedExpertsBytes } from "./record-codec.ts";
import { deliverGroups } from "./tree-delivery.ts";
import type { CompleteGroup, FilteredGroup, GroupStatus, Partition, PutOptions, PutResult, ReadGroupsOptions, TransferQueue } from "./types.ts";

/** Default {@link BlobOffloadOptions.thresholdBytes}: 1 MiB of packed bytes (a 32K-token record of 8 layers × top-4 in uint8 stays inline). */
export const DEFAULT_BLOB_THRESHOLD_BYTES = 1_048_576;

/** Options of {@link BlobOffloadQueue}, checked when it is constructed. */
export const BlobOffloadOptions = z.strictObject({
  /** The inner queue's key prefix (`store.prefix`): blob keys start with it, so two deployments can share one bucket. Default `edgeloop:`. */
  prefix: z.string().default(DEFAULT_PREFIX),
  /** A record part is kept in the blob store when its packed bytes are at least this many (`store.blobs.threshold_bytes`, default 1 MiB); 0 offloads every one. */
  thresholdBytes: z.number().int().min(0, "store.blobs.threshold_bytes must be >= 0 (bytes)").default(DEFAULT_BLOB_THRESHOLD_BYTES),
  /** Blobs fetched at once by a read of many records (default 8). */
  readConcurrency: z.number().int().min(1).default(8),
});
export type BlobOffloadOptions = z.input<typeof BlobOffloadOptions>;

/** The field name offloaded parts carry in blob keys and errors. */
const FIELD = "routed_experts";

/**
 * A {@link TransferQueue} that keeps large record parts out of the inner
 * queue's store (Redis, Upstash, memory), in a {@link BlobStore}
 * (docs/queue-layout.md, "Blobs"). Store-agnostic: it wraps any queue and
 * changes nothing in its layout but the fields of an offloaded record.
 *
 * **Writes.** A record whose packed `routed_experts` reach
 * `thresholdBytes` has them written to the blob store first — under
 * {@link blobKeyOf} `(prefix, key, "routed_experts", sha256)`, durable before
 * the call returns — and only then is the record put, holding
 * `routed_experts_blob = {key, sha256, bytes, dtype}` in their place. So a
 * record is visible only once its blob is durable; a failed blob write fails
 * the put with a retryable {@link StoreError} (code `blob_write_failed`,
 * field `routed_experts`) and stores no record. A put refused for good
 * (InputError, ConflictError, GroupCancelledError) deletes the blob it wrote.
 *
 * **Reads.** Every record read holding a pointer gets its blob fetched, its
 * byte count and SHA-256 checked and its experts unpacked back into
 * `routed_experts` (the pointer removed): the record reads exactly as it was
 * put. A blob that is missing or whose bytes differ fails that record only:
 * `get` throws a {@link BlobIntegrityError} naming the key and field; in a
 * group (`readCompleteGroups`, `sessionRecords`, `filteredGroups`) the record
 * is returned with `error` set to that message (counted in the group's
 * `failed`), its pointer kept and no `routed_experts`. A blob store that does
 * not answer fails the read (retryable StoreError; the group is delivered
 * again after the visibility timeout). `deliver: "tree"` is applied after the
 * blobs are read back.
 *
 * A record put without the layer may carry `routed_experts_blob` itself (a
 * raw view); through the layer, `put` refuses it (InputError).
 * @throws ConfigError at construction for options out of range or a prefix that cannot form a blob key
 */
export class BlobOffloadQueue implements TransferQueue {
  private readonly opts: z.output<typeof BlobOffloadOptions>;

  constructor(
    readonly inner: TransferQueue,
    readonly blobs: BlobStore,
    opts: BlobOffloadOptions = {},
  ) {
    const r = BlobOffloadOptions.safeParse(opts);
    if (!r.success) throw new ConfigError(`store.blobs.${r.error.issues[0]?.path.join(".") ?? ""}`, r.error.issues[0]?.message ?? "invalid");
    this.opts = r.data;
    if (!BlobKey.safeParse(`${recordBlobPrefix(this.opts.prefix, "a_0_0")}${FIELD}`).success) {
      throw new ConfigError("store.prefix", `'${this.opts.prefix}' cannot start a blob key (a '.' or '..' segment): choose another prefix`);
    }
  }

  async put(record: TrajectoryRecord, opts?: PutOptions): Promise<PutResult> {
    if (record !== null && typeof record === "object" && (record as { routed_experts_blob?: unknown }).routed_experts_blob !== undefined) {
      throw new InputError("record.routed_experts_blob", "is written by the blob layer: put routed_experts instead", { key: record.key });
    }
    const packed = record !== null && typeof record === "object" ? packedRoutedExpertsOf(record) : null;
    if (!packed || packed.bytes.byteLength < this.opts.thresholdBytes) return this.inner.put(record, opts);
    const sha256 = await sha256Hex(packed.bytes);
    const key = blobKeyOf(this.opts.prefix, record.key, FIELD, sha256);
    try {
      await this.blobs.put(key, packed.bytes, sha256);
    } catch (cause) {
      throw new StoreError(`blob store ${this.blobs.location}: writing ${FIELD} of record ${record.key} failed: ${cause instanceof Error ? cause.message : String(cause)}`, {
        cause,
        retryable: true,
        key: record.key,
        field: FIELD,
        code: "blob_write_failed",
      });
    }
    const { routed_experts: _inline, ...rest } = record;
    const pointed: TrajectoryRecord = { ...rest, routed_experts_blob: { key, sha256, bytes: packed.bytes.byteLength, dtype: packed.dtype } };
    try {
      return await this.inner.put(pointed, opts);
    } catch (e) {
      // Refused for good: no record will ever point at this blob (a retryable failure keeps it for the retry).
      if (e instanceof EdgeloopError && !e.retryable) await this.blobs.deletePrefix(key).catch(() => 0);
      throw e;
    }
  }

  markFailed(key: string, reason: string, fields?: Partial<TrajectoryRecord>): Promise<PutResult> {
    return this.inner.markFailed(key, reason, fields);
  }

  expectGroup(uid: string, n: number, partition?: Partition, fingerprint?: string): Promise<void> {
    return this.inner.expectGroup(uid, n, partition, fingerprint);
  }

  finishSession(uid: string, session_id: number, outputs: number): Promise<boolean> {
    return this.inner.finishSession(uid, session_id, outputs);
  }

  async sessionRecords(uid: string, session_id: number): Promise<TrajectoryRecord[] | null> {
    const recs = await this.inner.sessionRecords(uid, session_id);
    return recs === null ? null : this.resolveAll(recs);
  }

  async get(key: string): Promise<TrajectoryRecord | null> {
    const rec = await this.inner.get(key);
    return rec === null ? null : this.resolve(rec);
  }

  groupStatus(uid: string): Promise<GroupStatus> {
    return this.inner.groupStatus(uid);
  }

  cancelGroups(uids: readonly string[]): Promise<{ withdrawn: string[]; complete: string[] }> {
    if (!this.inner.cancelGroups) return Promise.reject(new Error("this transfer queue cannot cancel groups"));
    return this.inner.cancelGroups(uids);
  }

  filterGroup(uid: string, reason: string): Promise<boolean> {
    if (!this.inner.filterGroup) return Promise.reject(new Error("this transfer queue cannot filter groups"));
    return this.inner.filterGroup(uid, reason);
  }

  async filteredGroups(opts: { partition?: Partition; max: number }): Promise<FilteredGroup[]> {
    if (!this.inner.filteredGroups) return [];
    const groups = await this.inner.filteredGroups(opts);
    for (const g of groups) {
      g.records = await this.resolveAll(g.records);
      g.failed = g.records.filter((r) => r.error !== null).length;
    }
    return groups;
  }

  async readCompleteGroups(opts: ReadGroupsOptions): Promise<CompleteGroup[]> {
    const o = checkReadOptions(opts);
    // Tree nodes slice routed_experts by row: cut them once the blobs are read back.
    const groups = await this.inner.readCompleteGroups({ ...opts, deliver: "leaves" });
    for (const g of groups) {
      g.records = await this.resolveAll(g.records);
      g.failed = g.records.filter((r) => r.error !== null).length;
    }
    return deliverGroups(groups, o.deliver);
  }

  ack(deliveryIds: readonly string[], partition?: Partition): Promise<number> {
    return this.inner.ack(deliveryIds, partition);
  }

  async close(): Promise<void> {
    await this.inner.close();
    await this.blobs.close?.();
  }

  /**
   * The record with its blob read back into `routed_experts`.
   * @throws BlobIntegrityError when the blob is missing or its bytes are not those the pointer names
   * @throws StoreError (retryable) when the blob store does not answer
   */
  async resolve(rec: TrajectoryRecord): Promise<TrajectoryRecord> {
    const ptr = rec.routed_experts_blob;
    if (ptr === undefined) return rec;
    let bytes: Uint8Array | null;
    try {
      bytes = await this.blobs.get(ptr.key);
    } catch (cause) {
      if (cause instanceof BlobIntegrityError) throw cause;
      throw new StoreError(`blob store ${this.blobs.location}: reading ${FIELD} of record ${rec.key} failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause, retryable: true, key: rec.key, field: FIELD });
    }
    if (bytes === null) throw new BlobIntegrityError(`record ${rec.key}: blob of ${FIELD} (${ptr.key}) is missing from ${this.blobs.location}`, { key: rec.key, field: FIELD, code: "blob_missing" });
    if (bytes.byteLength !== ptr.bytes) {
      throw new BlobIntegrityError(`record ${rec.key}: blob of ${FIELD} (${ptr.key}) has ${bytes.byteLength} bytes, the record says ${ptr.bytes}`, { key: rec.key, field: FIELD, code: "blob_corrupt" });
    }
    const sha = await sha256Hex(bytes);
    if (sha !== ptr.sha256) {
      throw new BlobIntegrityError(`record ${rec.key}: blob of ${FIELD} (${ptr.key}) has sha256 ${sha}, the record says ${ptr.sha256}`, { key: rec.key, field: FIELD, code: "blob_corrupt" });
    }
    const { routed_experts_blob: _ptr, ...rest } = rec;
    const out = { ...rest, routed_experts: unpackRoutedExpertsBytes(bytes, ptr.dtype) } as Record<string, unknown>;
    // Back in the schema's field order (routed_experts before routed_experts_shape), as the record was put.
    const ordered: Record<string, unknown> = {};
    for (const k of Object.keys(rec)) {
      if (k === "routed_experts_shape") ordered.routed_experts = out.routed_experts;
      if (k !== "routed_experts_blob") ordered[k] = out[k];
    }
    return ordered as TrajectoryRecord;
  }

  /** {@link resolve} over records, `readConcurrency` blobs at once; a record whose blob fails its check comes back with `error` set instead of failing the others. */
  private async resolveAll(recs: TrajectoryRecord[]): Promise<TrajectoryRecord[]> {
    const out = recs.slice();
    let next = 0;
    const worker = async () => {
      while (next < out.length) {
        const i = next++;
        try {
          out[i] = await this.resolve(out[i]!);
        } catch (e) {
          if (!(e instanceof BlobIntegrityError)) throw e;
          out[i] = { ...out[i]!, error: e.message };
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(this.opts.readConcurrency, out.length) }, worker));
    return out;
  }
}
