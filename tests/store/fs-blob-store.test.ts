import { afterAll } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FsBlobStore } from "../../infra/blobs/fs-blob-store.ts";
import { deleteByPrefix, randomPrefix, requireRedis } from "../helpers/redis.ts";
import { blobLayerCases, blobStoreContract, type BlobTarget } from "./blob-cases.ts";

// The blob layer over a directory: the BlobStore contract, the transfer-queue contract with blobs on, and the blob cases.
const hasRedis = await requireRedis();
const base = randomPrefix("blobs-fs");
const dir = mkdtempSync(join(tmpdir(), "edgeloop-blobs-"));
// A regular file where the failing store's root directory would have to be: every mkdir under it fails (ENOTDIR).
writeFileSync(join(dir, "not-a-dir"), "x");
afterAll(async () => {
  rmSync(dir, { recursive: true, force: true });
  if (hasRedis) await deleteByPrefix(base);
});

const target: BlobTarget = {
  name: "filesystem",
  open: () => new FsBlobStore(join(dir, "root")),
  overwrite: async (key, bytes) => writeFileSync(join(dir, "root", key), bytes),
  failing: () => new FsBlobStore(join(dir, "not-a-dir", "root")),
};
blobStoreContract(target);
blobLayerCases(target, base, hasRedis);
