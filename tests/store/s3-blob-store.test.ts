import { afterAll } from "bun:test";
import { PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { S3BlobStore } from "../../infra/blobs/s3-blob-store.ts";
import { deleteByPrefix, randomPrefix, requireRedis } from "../helpers/redis.ts";
import { startS3Server } from "../helpers/s3-server.ts";
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
  overwrite: async (key, bytes) => void (await raw.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `runs/a/${key}`, Body: bytes }))),
  failing: () => new S3BlobStore({ bucket: "no-such-bucket", endpoint: s3.endpoint, credentials: s3.credentials }),
};
blobStoreContract(target);
blobLayerCases(target, base, hasRedis);
