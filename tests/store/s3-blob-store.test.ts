import { afterAll } from "bun:test";
import { GetObjectCommand, PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { S3BlobStore } from "../../infra/blobs/s3-blob-store.ts";
import { deleteByPrefix, randomPrefix, requireRedis } from "../helpers/redis.ts";
import { startS3Server } from "../helpers/s3-server.ts";
import { HANG_MS } from "../helpers/bounds.ts";
import { waitFor } from "../helpers/wait.ts";
import { blobLayerCases, blobStoreContract, type BlobTarget } from "./blob-cases.ts";

// The blob layer over an S3-protocol server (s3rver on a loopback port, SigV4 checked): the BlobStore
// contract, the transfer-queue contract with blobs on, and the blob cases.
const hasRedis = await requireRedis();
const base = randomPrefix("blobs-s3");
const s3 = await startS3Server();
const raw = new S3Client({ endpoint: s3.endpoint, region: "us-east-1", forcePathStyle: true, credentials: s3.credentials });
afterAll(async () => {
  raw.destroy();
  await s3.stop();
  if (hasRedis) await deleteByPrefix(base);
});

const target: BlobTarget = {
  name: "s3 (s3rver)",
  open: () => new S3BlobStore({ bucket: s3.bucket, prefix: "runs/a", endpoint: s3.endpoint, credentials: s3.credentials }),
  // s3rver can answer a PUT before its file holds the new bytes (CI once read 0 of 10 bytes right after): wait until
  // the server serves what was put, as S3's read-after-write consistency promises, before the case reads through the layer.
  overwrite: async (key, bytes) => {
    await raw.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `runs/a/${key}`, Body: bytes }));
    await waitFor(async () => {
      const got = await raw.send(new GetObjectCommand({ Bucket: s3.bucket, Key: `runs/a/${key}` }));
      const body = await got.Body!.transformToByteArray();
      return body.length === bytes.length && body.every((b, i) => b === bytes[i]);
    }, `s3rver serves the overwritten ${key}`, HANG_MS);
  },
  failing: () => new S3BlobStore({ bucket: "no-such-bucket", endpoint: s3.endpoint, credentials: s3.credentials }),
};
blobStoreContract(target);
blobLayerCases(target, base, hasRedis);
