import type { AppConfig } from "../../shared/config/app-config.ts";
import { ConfigError } from "../../shared/errors.ts";
import { BlobOffloadQueue } from "../../shared/store/blob-offload-queue.ts";
import type { BlobStore } from "../../shared/store/blob-store.ts";
import type { TransferQueue } from "../../shared/store/types.ts";
import { FsBlobStore } from "./fs-blob-store.ts";
import { S3BlobStore } from "./s3-blob-store.ts";

/**
 * The blob store a `store.blobs.url` names: `file:///abs/dir` → {@link FsBlobStore},
 * `s3://bucket[/prefix]` → {@link S3BlobStore} (endpoint, region and
 * credentials from the standard AWS environment).
 * @throws ConfigError naming `store.blobs.url` for any other URL
 */
export function openBlobStore(url: string): BlobStore {
  if (url.startsWith("file://")) {
    const path = decodeURIComponent(new URL(url).pathname);
    return new FsBlobStore(path);
  }
  const m = /^s3:\/\/([^/]+)(?:\/(.*))?$/.exec(url);
  if (m) return new S3BlobStore({ bucket: m[1]!, ...(m[2] ? { prefix: m[2] } : {}) });
  throw new ConfigError("store.blobs.url", `expected file:///absolute/dir or s3://bucket/prefix, got '${url}'`);
}

/** `queue` behind the blob layer when the config names a blob store (`store.blobs.url`), else `queue` itself. */
export function withBlobs(config: AppConfig, queue: TransferQueue): TransferQueue {
  const b = config.store.blobs;
  if (!b.url) return queue;
  return new BlobOffloadQueue(queue, openBlobStore(b.url), { prefix: config.store.prefix, thresholdBytes: b.threshold_bytes });
}
