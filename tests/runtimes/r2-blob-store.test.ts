import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Miniflare } from "miniflare";
import { workerBlobs } from "../../infra/cloudflare/env.ts";
import type { R2Bucket } from "../../infra/cloudflare/cf-types.ts";
import { parseAppConfig } from "../../shared/config/app-config.ts";
import { ConfigError, StoreError } from "../../shared/errors.ts";
import { BlobOffloadQueue } from "../../shared/store/blob-offload-queue.ts";
import { sha256Hex, type BlobStore } from "../../shared/store/blob-store.ts";
import { MemoryTransferQueue } from "../../shared/store/memory-transfer-queue.ts";
import { deleteByPrefix, randomPrefix, requireRedis } from "../helpers/redis.ts";
import { bigExperts, blobLayerCases, blobStoreContract, packedUint8, type BlobTarget } from "../store/blob-cases.ts";

// Cloudflare R2 through its Worker binding: the R2BlobStore runs inside workerd (Miniflare's R2 behind it), served
// over HTTP by tests/runtimes/fixtures/r2-blob-worker.ts; the blob layer's cases drive it from here.
const hasRedis = await requireRedis();
const base = randomPrefix("blobs-r2");
const outdir = mkdtempSync(join(tmpdir(), "edgeloop-r2-worker-"));
const built = await Bun.build({ entrypoints: [join(import.meta.dir, "fixtures", "r2-blob-worker.ts")], outdir, target: "browser", format: "esm" });
if (!built.success) throw new Error(`bundling the R2 fixture failed: ${built.logs.join("\n")}`);
const mf = new Miniflare({ modulesRoot: outdir, modules: [{ type: "ESModule", path: join(outdir, "r2-blob-worker.js") }], compatibilityDate: "2026-04-07", r2Buckets: ["EDGELOOP_BLOBS"] });
const origin = (await mf.ready).origin;
const bucket = (await mf.getR2Bucket("EDGELOOP_BLOBS")) as unknown as R2Bucket;
afterAll(async () => {
  await mf.dispose();
  rmSync(outdir, { recursive: true, force: true });
  if (hasRedis) await deleteByPrefix(base);
});

/** A BlobStore whose every call is the Worker's R2BlobStore (`badSha`: it is handed the digest of other bytes, which R2 refuses). */
function workerStore(badSha = false): BlobStore {
  const err = async (r: Response) => new StoreError(`worker: ${r.status} ${await r.text()}`, { code: "blob_store_error" });
  return {
    location: "r2:EDGELOOP_BLOBS/",
    async put(key, bytes, sha256) {
      const sha = badSha ? await sha256Hex(new Uint8Array(0)) : sha256;
      const r = await fetch(`${origin}/blob/${key}?sha256=${sha}`, { method: "PUT", body: bytes as Uint8Array<ArrayBuffer> });
      if (r.status !== 204) throw await err(r);
    },
    async get(key) {
      const r = await fetch(`${origin}/blob/${key}`);
      if (r.status === 404) return null;
      if (r.status !== 200) throw await err(r);
      return new Uint8Array(await r.arrayBuffer());
    },
    async deletePrefix(prefix) {
      const r = await fetch(`${origin}/prefix/${prefix}`, { method: "DELETE" });
      if (r.status !== 200) throw await err(r);
      return ((await r.json()) as { deleted: number }).deleted;
    },
  };
}

const target: BlobTarget = {
  name: "r2 (workerd)",
  open: () => workerStore(),
  overwrite: async (key, bytes) => void (await bucket.put(key, bytes)),
  failing: () => workerStore(true),
};
blobStoreContract(target);
blobLayerCases(target, base, hasRedis);

test("inside workerd: a record put through BlobOffloadQueue over R2 reads back byte-exact; the record holds the pointer, R2 the packed bytes", async () => {
  const rec = bigExperts("wk", 0);
  const r = await fetch(`${origin}/roundtrip?threshold=1024`, { method: "POST", body: JSON.stringify(rec) });
  expect(r.status).toBe(200);
  const { back, pointer } = (await r.json()) as { back: unknown; pointer: { key: string; sha256: string; bytes: number; dtype: string } };
  expect(JSON.stringify(back)).toBe(JSON.stringify(rec));
  const sha = await sha256Hex(packedUint8(rec));
  expect(pointer).toEqual({ key: `wk%3A/traj/wk_0_0/routed_experts.${sha}`, sha256: sha, bytes: 4096, dtype: "uint8" });
  const obj = await bucket.get(pointer.key);
  expect(Buffer.from(await obj!.arrayBuffer()).equals(Buffer.from(packedUint8(rec)))).toBe(true);
});

test("workerBlobs: the EDGELOOP_BLOBS binding puts the queue behind the blob layer (threshold from EDGELOOP_BLOB_THRESHOLD_BYTES or store.blobs); unbound leaves it; a store.blobs.url is refused", async () => {
  const config = parseAppConfig({});
  const inner = new MemoryTransferQueue();
  expect(workerBlobs({}, config, "p:", inner)).toBe(inner);
  const q = workerBlobs({ EDGELOOP_BLOBS: bucket, EDGELOOP_BLOB_THRESHOLD_BYTES: "0" }, config, "p:", inner) as BlobOffloadQueue;
  expect(q).toBeInstanceOf(BlobOffloadQueue);
  await q.put(makeSmall());
  expect((await inner.get("wb_0_0"))!.routed_experts_blob!.bytes).toBe(28);
  expect(JSON.stringify(await q.get("wb_0_0"))).toBe(JSON.stringify(makeSmall()));
  expect(() => workerBlobs({ EDGELOOP_BLOBS: bucket, EDGELOOP_BLOB_THRESHOLD_BYTES: "-1" }, config, "p:", inner)).toThrow(ConfigError);
  expect(() => workerBlobs({}, parseAppConfig({ store: { blobs: { url: "file:///tmp/x" } } }), "p:", inner)).toThrow("store.blobs.url");
});

function makeSmall() {
  const r = bigExperts("wb", 0);
  return { ...r, prompt_ids: r.prompt_ids.slice(0, 4), response_ids: r.response_ids.slice(0, 3), response_mask: [1, 1, 1] as (0 | 1)[], rollout_log_probs: [-0.5, -0.25, -0.125], routed_experts: Array.from({ length: 28 }, (_, i) => i % 9), routed_experts_shape: [2, 2] as [number, number] };
}
