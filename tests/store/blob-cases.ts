import { describe, expect, test } from "bun:test";
import { createRedisTransferQueue } from "../../infra/redis/redis-transfer-queue.ts";
import { IoRedisCommander } from "../../infra/redis/ioredis-commander.ts";
import { BlobIntegrityError, StoreError } from "../../shared/errors.ts";
import type { TrajectoryRecord } from "../../shared/schema/index.ts";
import { BlobOffloadQueue } from "../../shared/store/blob-offload-queue.ts";
import { blobKeyOf, recordBlobPrefix, sha256Hex, type BlobStore } from "../../shared/store/blob-store.ts";
import { collectGarbage } from "../../shared/store/gc.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { rawRedis, REDIS_URL } from "../helpers/redis.ts";
import { makeRecord, transferQueueContract } from "./contract.ts";

/** One blob store under test: how to open it, overwrite one of its objects behind the layer's back, and one of its kind that cannot write. */
export interface BlobTarget {
  name: string;
  open(): BlobStore;
  /** Replaces the object `key` with `bytes` directly in the backing store (a corruption). */
  overwrite(key: string, bytes: Uint8Array): Promise<void>;
  /** A store of the same kind whose writes fail (a real failure: a directory that cannot be made, a bucket that does not exist). */
  failing(): BlobStore;
}

/** 64 prompt + 64 response tokens × [8 layers, top-4]: 4,096 expert ids (ids < 200, a −1 every 97th), 4,096 bytes packed as uint8. */
export function bigExperts(uid: string, session_id: number, salt = 0): TrajectoryRecord {
  const prompt = Array.from({ length: 64 }, (_, i) => 1000 + i);
  const response = Array.from({ length: 64 }, (_, i) => 2000 + i);
  const experts = Array.from({ length: 128 * 8 * 4 }, (_, i) => (i % 97 === 5 ? -1 : (i * 31 + salt) % 200));
  return makeRecord(uid, session_id, {
    prompt_ids: prompt,
    response_ids: response,
    response_mask: response.map(() => 1),
    rollout_log_probs: response.map((_, i) => -i / 64),
    routed_experts: experts,
    routed_experts_shape: [8, 4],
  });
}

/** The bytes the layer must store for {@link bigExperts}: one uint8 per id, −1 as 0xff. */
export function packedUint8(rec: TrajectoryRecord): Uint8Array {
  return Uint8Array.from(rec.routed_experts!.map((v) => (v === -1 ? 0xff : v)));
}

async function rejects(p: Promise<unknown>): Promise<unknown> {
  try {
    await p;
  } catch (e) {
    return e;
  }
  throw new Error("expected a rejection");
}

/**
 * The blob layer over one blob store: the transfer-queue contract with every
 * record's experts offloaded (memory and Redis TCP inner queues), then the
 * blob-specific cases over Redis TCP — exact stored fields and bytes, a
 * corrupted blob failing one record naming key and field, gc removing blobs,
 * and a failed blob write leaving no record.
 */
export function blobLayerCases(t: BlobTarget, base: string, hasRedis: boolean): void {
  transferQueueContract(`memory + blobs (${t.name})`, { open: (opts) => new BlobOffloadQueue(new MemoryTransferQueue(opts), t.open(), { prefix: opts.prefix, thresholdBytes: 0 }), sharesState: false }, `${base}mem:`);
  if (!hasRedis) return;
  transferQueueContract(`redis tcp + blobs (${t.name})`, { open: (opts) => new BlobOffloadQueue(createRedisTransferQueue({ url: REDIS_URL, ...opts }), t.open(), { prefix: opts.prefix, thresholdBytes: 0 }), sharesState: true }, `${base}tcp:`);

  describe(`blob layer over redis tcp: ${t.name}`, () => {
    let n = 0;
    const open = (threshold = 1024) => {
      const prefix = `${base}b${n++}:`;
      const q = new BlobOffloadQueue(createRedisTransferQueue({ url: REDIS_URL, prefix }), t.open(), { prefix, thresholdBytes: threshold });
      return { q, prefix };
    };

    test("routed experts above the threshold go to the blob store (written first), the record holds {key, sha256, bytes} and reads back byte-exact; below it they stay inline", async () => {
      const { q, prefix } = open();
      const raw = rawRedis();
      try {
        const rec = bigExperts("blob", 0);
        const bytes = packedUint8(rec);
        const sha = await sha256Hex(bytes);
        expect(sha).toBe(new Bun.CryptoHasher("sha256").update(bytes).digest("hex"));
        const key = blobKeyOf(prefix, "blob_0_0", "routed_experts", sha);
        expect(key).toBe(`${prefix.replaceAll(":", "%3A")}/traj/blob_0_0/routed_experts.${sha}`);
        await q.expectGroup("blob", 2);
        expect(await q.put(rec)).toEqual({ key: "blob_0_0", stored: true });
        const h = await raw.hgetall(`${prefix}traj:blob_0_0`);
        expect(Object.keys(h).sort()).toEqual(["meta", "prompt_ids", "response_ids", "response_mask", "rollout_log_probs", "routed_experts_blob", "routed_experts_dtype", "routed_experts_shape"]);
        expect(h.routed_experts_blob).toBe(JSON.stringify({ key, sha256: sha, bytes: 4096 }));
        expect(h.routed_experts_dtype).toBe("uint8");
        expect(h.routed_experts_shape).toBe("[8,4]");
        expect(Buffer.from((await q.blobs.get(key))!).equals(Buffer.from(bytes))).toBe(true);
        expect(JSON.stringify(await q.get("blob_0_0"))).toBe(JSON.stringify(rec));
        // The inner queue alone gives the raw pointer.
        expect((await q.inner.get("blob_0_0"))!.routed_experts_blob).toEqual({ key, sha256: sha, bytes: 4096, dtype: "uint8" });
        // A record under the threshold is stored as before, inline.
        const small = makeRecord("blob", 1, { routed_experts: Array.from({ length: 28 }, (_, i) => i % 8), routed_experts_shape: [2, 2] });
        await q.put(small);
        const hs = await raw.hgetall(`${prefix}traj:blob_1_0`);
        expect(hs.routed_experts).toBe(Buffer.from(Uint8Array.from(small.routed_experts!)).toString("base64"));
        expect(hs.routed_experts_blob).toBeUndefined();
        const [g] = await q.readCompleteGroups({ consumer: "c", max: 1 });
        expect(g!.failed).toBe(0);
        expect(JSON.stringify(g!.records)).toBe(JSON.stringify([rec, small]));
        // A rewrite of the same key stores nothing (put-once) and leaves the one blob.
        expect(await q.put(rec)).toEqual({ key: "blob_0_0", stored: false });
        // Ids above 254 pack to little-endian uint16 (−1 as 0xffff) in the blob, as they would inline.
        const wide = { ...bigExperts("wide", 0), routed_experts: bigExperts("wide", 0).routed_experts!.map((v, i) => (v === -1 ? -1 : v + (i % 3) * 400)) };
        await q.put(wide);
        const hw = await raw.hgetall(`${prefix}traj:wide_0_0`);
        expect(hw.routed_experts_dtype).toBe("uint16");
        const want = Buffer.from(Uint16Array.from(wide.routed_experts.map((v) => (v === -1 ? 0xffff : v))).buffer);
        const ptr = JSON.parse(hw.routed_experts_blob!) as { key: string; sha256: string; bytes: number };
        expect([ptr.bytes, ptr.sha256]).toEqual([8192, new Bun.CryptoHasher("sha256").update(want).digest("hex")]);
        expect(Buffer.from((await q.blobs.get(ptr.key))!).equals(want)).toBe(true);
        expect(JSON.stringify(await q.get("wide_0_0"))).toBe(JSON.stringify(wide));
        // Beyond 65,534 the record is int32, as inline.
        const huge = { ...bigExperts("huge", 0), routed_experts: bigExperts("huge", 0).routed_experts!.map((v, i) => (i === 7 ? 70_000 : v)) };
        await q.put(huge);
        expect((await q.inner.get("huge_0_0"))!.routed_experts_blob!.dtype).toBe("int32");
        expect(JSON.stringify(await q.get("huge_0_0"))).toBe(JSON.stringify(huge));
      } finally {
        await raw.quit();
        await q.close();
      }
    });

    test("a corrupted blob fails its record naming key and field (get throws; in a group only that record gets error set)", async () => {
      const { q, prefix } = open();
      try {
        const a = bigExperts("bad", 0);
        const b = bigExperts("bad", 1, 7);
        await q.expectGroup("bad", 2);
        await q.put(a);
        await q.put(b);
        const sha = await sha256Hex(packedUint8(a));
        const key = blobKeyOf(prefix, "bad_0_0", "routed_experts", sha);
        const flipped = packedUint8(a);
        flipped[100] ^= 1;
        await t.overwrite(key, flipped);
        const e = await rejects(q.get("bad_0_0"));
        expect(e).toBeInstanceOf(BlobIntegrityError);
        expect((e as BlobIntegrityError).key).toBe("bad_0_0");
        expect((e as BlobIntegrityError).field).toBe("routed_experts");
        expect((e as BlobIntegrityError).code).toBe("blob_corrupt");
        expect((e as Error).message).toBe(`record bad_0_0: blob of routed_experts (${key}) has sha256 ${await sha256Hex(flipped)}, the record says ${sha}`);
        const [g] = await q.readCompleteGroups({ consumer: "c", max: 1 });
        expect(g!.failed).toBe(1);
        expect(g!.records[0]!.error).toBe((e as Error).message);
        expect(g!.records[0]!.routed_experts).toBeUndefined();
        expect(JSON.stringify(g!.records[1])).toBe(JSON.stringify(b));
        // A truncated blob names its byte count.
        await t.overwrite(key, packedUint8(a).subarray(0, 10));
        expect(((await rejects(q.get("bad_0_0"))) as Error).message).toBe(`record bad_0_0: blob of routed_experts (${key}) has 10 bytes, the record says 4096`);
      } finally {
        await q.close();
      }
    });

    test("gc deletes a record's blobs with the record", async () => {
      const { q, prefix } = open();
      const commander = new IoRedisCommander(REDIS_URL);
      try {
        await q.expectGroup("gc", 1);
        const rec = bigExperts("gc", 0);
        await q.put(rec);
        const key = blobKeyOf(prefix, "gc_0_0", "routed_experts", await sha256Hex(packedUint8(rec)));
        const [g] = await q.readCompleteGroups({ consumer: "c", max: 1 });
        await q.ack([g!.delivery_id]);
        expect(await q.blobs.get(key)).not.toBeNull();
        const ages = { records: 60, groups: null, sessions: null, batches: null };
        const later = Date.now() + 120_000;
        const report = await collectGarbage(commander, { prefix, ages, sessionTtlSeconds: 60, blobs: q.blobs, nowMs: () => later });
        expect(report.deleted.records).toBe(1);
        expect(report.deleted.blobs).toBe(1);
        expect(await q.blobs.get(key)).toBeNull();
        expect(await q.inner.get("gc_0_0")).toBeNull();
        expect(await q.blobs.deletePrefix(recordBlobPrefix(prefix, "gc_0_0"))).toBe(0);
      } finally {
        await commander.close();
        await q.close();
      }
    });

    test("a put refused for good after its blob was written (a ConflictError) deletes the blob", async () => {
      const { q, prefix } = open();
      try {
        await q.put(bigExperts("conf", 0));
        const late = { ...bigExperts("conf", 0, 3), key: "conf_0_1", output_index: 1 };
        const e = await rejects(q.put(late));
        expect((e as Error).name).toBe("ConflictError");
        expect(await q.blobs.deletePrefix(recordBlobPrefix(prefix, "conf_0_1"))).toBe(0);
        expect(await q.inner.get("conf_0_1")).toBeNull();
        expect(await q.blobs.deletePrefix(recordBlobPrefix(prefix, "conf_0_0"))).toBe(1);
      } finally {
        await q.close();
      }
    });

    test("a blob write that fails fails the put (retryable, naming key and field) and leaves no record; the retry stores it", async () => {
      const prefix = `${base}f${n++}:`;
      const broken = new BlobOffloadQueue(createRedisTransferQueue({ url: REDIS_URL, prefix }), t.failing(), { prefix, thresholdBytes: 1024 });
      const { q } = { q: new BlobOffloadQueue(createRedisTransferQueue({ url: REDIS_URL, prefix }), t.open(), { prefix, thresholdBytes: 1024 }) };
      try {
        await broken.expectGroup("fail", 1);
        const rec = bigExperts("fail", 0);
        const e = await rejects(broken.put(rec));
        expect(e).toBeInstanceOf(StoreError);
        expect((e as StoreError).retryable).toBe(true);
        expect((e as StoreError).code).toBe("blob_write_failed");
        expect((e as StoreError).key).toBe("fail_0_0");
        expect((e as StoreError).field).toBe("routed_experts");
        expect(await q.get("fail_0_0")).toBeNull();
        expect(await q.inner.get("fail_0_0")).toBeNull();
        const st = await q.groupStatus("fail");
        expect([st.records, st.finished, st.complete]).toEqual([0, 0, false]);
        expect(await q.readCompleteGroups({ consumer: "c", max: 1 })).toEqual([]);
        expect(await q.put(rec)).toEqual({ key: "fail_0_0", stored: true });
        expect(JSON.stringify(await q.get("fail_0_0"))).toBe(JSON.stringify(rec));
      } finally {
        await broken.close();
        await q.close();
      }
    });
  });
}

/** The {@link BlobStore} contract: put/get exact bytes, overwrite, missing → null, deletePrefix by record prefix. */
export function blobStoreContract(t: BlobTarget): void {
  describe(`BlobStore contract: ${t.name}`, () => {
    test("put then get returns the exact bytes; a missing key is null; deletePrefix removes only its prefix and counts", async () => {
      const s = t.open();
      const id = crypto.randomUUID().slice(0, 8);
      const a = Uint8Array.from({ length: 70_000 }, (_, i) => (i * 7) & 0xff);
      const b = new Uint8Array([0, 255, 1]);
      await s.put(`c${id}/traj/k_0_0/routed_experts.aa`, a, await sha256Hex(a));
      await s.put(`c${id}/traj/k_0_0/other.bb`, b, await sha256Hex(b));
      await s.put(`c${id}/traj/k_0_1/routed_experts.cc`, b, await sha256Hex(b));
      expect(Buffer.from((await s.get(`c${id}/traj/k_0_0/routed_experts.aa`))!).equals(Buffer.from(a))).toBe(true);
      expect(Array.from((await s.get(`c${id}/traj/k_0_0/other.bb`))!)).toEqual([0, 255, 1]);
      expect(await s.get(`c${id}/traj/nope/x`)).toBeNull();
      await s.put(`c${id}/traj/k_0_0/other.bb`, a, await sha256Hex(a));
      expect((await s.get(`c${id}/traj/k_0_0/other.bb`))!.byteLength).toBe(70_000);
      expect(await s.deletePrefix(`c${id}/traj/k_0_0/`)).toBe(2);
      expect(await s.get(`c${id}/traj/k_0_0/routed_experts.aa`)).toBeNull();
      expect(Array.from((await s.get(`c${id}/traj/k_0_1/routed_experts.cc`))!)).toEqual([0, 255, 1]);
      expect(await s.deletePrefix(`c${id}/traj/k_0_0/`)).toBe(0);
      expect(await s.deletePrefix(`c${id}/traj/k_0_1/routed_experts.cc`)).toBe(1);
      await s.close?.();
    });
  });
}
