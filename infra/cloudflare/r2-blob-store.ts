import { StoreError } from "../../shared/errors.ts";
import type { BlobStore } from "../../shared/store/blob-store.ts";
import type { R2Bucket } from "./cf-types.ts";

/**
 * A {@link BlobStore} in a Cloudflare R2 bucket through its Worker binding
 * (wrangler.toml `r2_buckets`, binding `EDGELOOP_BLOBS`): blob `k` is the
 * object `{prefix}k`. A put passes the SHA-256, so R2 refuses bytes that do
 * not match it; R2 acknowledges a put once the object is durable and
 * strongly consistent. Trainers outside Cloudflare read the same objects
 * through R2's S3 API (`s3://bucket/prefix` with `AWS_ENDPOINT_URL_S3`).
 * @see https://developers.cloudflare.com/r2/api/workers/workers-api-reference/#r2putoptions (`sha256`)
 */
export class R2BlobStore implements BlobStore {
  readonly location: string;
  private readonly prefix: string;

  constructor(
    private readonly bucket: R2Bucket,
    opts: { binding?: string; prefix?: string } = {},
  ) {
    this.prefix = opts.prefix ? opts.prefix.replace(/^\/+|\/+$/g, "") + "/" : "";
    this.location = `r2:${opts.binding ?? "EDGELOOP_BLOBS"}/${this.prefix}`;
  }

  async put(key: string, bytes: Uint8Array, sha256: string): Promise<void> {
    try {
      await this.bucket.put(this.prefix + key, bytes, { sha256, httpMetadata: { contentType: "application/octet-stream" } });
    } catch (cause) {
      throw this.error("write", key, cause);
    }
  }

  async get(key: string): Promise<Uint8Array | null> {
    try {
      const o = await this.bucket.get(this.prefix + key);
      return o === null ? null : new Uint8Array(await o.arrayBuffer());
    } catch (cause) {
      throw this.error("read", key, cause);
    }
  }

  async deletePrefix(prefix: string): Promise<number> {
    let n = 0;
    let cursor: string | undefined;
    try {
      do {
        const page = await this.bucket.list({ prefix: this.prefix + prefix, ...(cursor ? { cursor } : {}) });
        if (page.objects.length) await this.bucket.delete(page.objects.map((o) => o.key));
        n += page.objects.length;
        cursor = page.truncated ? page.cursor : undefined;
      } while (cursor);
    } catch (cause) {
      throw this.error("delete", prefix, cause);
    }
    return n;
  }

  private error(op: string, key: string, cause: unknown): StoreError {
    return new StoreError(`${this.location}: cannot ${op} blob ${key}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause, code: "blob_store_error" });
  }
}
