import type { S3Client, S3ClientConfig } from "@aws-sdk/client-s3";
import { ConfigError, StoreError } from "../../shared/errors.ts";
import type { BlobStore } from "../../shared/store/blob-store.ts";

/** Options of {@link S3BlobStore}; unset ones come from the standard AWS environment. */
export interface S3BlobStoreOptions {
  bucket: string;
  /** Key prefix inside the bucket (`s3://bucket/prefix` → `prefix/`); default none. */
  prefix?: string;
  /** S3-compatible endpoint (MinIO, R2's S3 API, …); default `AWS_ENDPOINT_URL_S3`, then `AWS_ENDPOINT_URL`, else AWS. Path-style addressing when set. */
  endpoint?: string;
  /** Default `AWS_REGION`, then `AWS_DEFAULT_REGION`, else `us-east-1`. */
  region?: string;
  /** Default: the SDK's provider chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, profiles, instance roles). */
  credentials?: { accessKeyId: string; secretAccessKey: string; sessionToken?: string };
}

/**
 * A {@link BlobStore} in an S3-compatible bucket (`--blob-store
 * s3://bucket/prefix`) through `@aws-sdk/client-s3`: blob `k` is the object
 * `{prefix}k`. A put is one `PutObject` carrying `x-amz-checksum-sha256`, so
 * the server refuses bytes that changed on the way; S3 acknowledges a PUT once
 * the object is durably stored (read-after-write consistent).
 * @see https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html
 * @see https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html (AWS_ENDPOINT_URL_S3)
 */
export class S3BlobStore implements BlobStore {
  readonly location: string;
  /** The SDK is loaded on first use: a CLI without a blob store (or with a file:// one) never loads it. */
  private sdk: Promise<{ client: S3Client; s3: typeof import("@aws-sdk/client-s3") }> | undefined;
  private readonly clientConfig: S3ClientConfig;
  private readonly bucket: string;
  private readonly prefix: string;

  constructor(opts: S3BlobStoreOptions) {
    if (!/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(opts.bucket)) throw new ConfigError("store.blobs.url", `'${opts.bucket}' is not an S3 bucket name (3-63 of [a-z0-9.-])`);
    this.bucket = opts.bucket;
    this.prefix = opts.prefix ? opts.prefix.replace(/^\/+|\/+$/g, "") + "/" : "";
    const endpoint = opts.endpoint ?? process.env.AWS_ENDPOINT_URL_S3 ?? process.env.AWS_ENDPOINT_URL;
    this.clientConfig = {
      region: opts.region ?? process.env.AWS_REGION ?? process.env.AWS_DEFAULT_REGION ?? "us-east-1",
      ...(endpoint ? { endpoint, forcePathStyle: true } : {}),
      ...(opts.credentials ? { credentials: opts.credentials } : {}),
      // The SDK's default CRC32 trailers are not understood by every S3-compatible server; the SHA-256 checksum is sent explicitly.
      requestChecksumCalculation: "WHEN_REQUIRED",
      responseChecksumValidation: "WHEN_REQUIRED",
    };
    this.location = `s3://${this.bucket}/${this.prefix}`;
  }

  private load(): Promise<{ client: S3Client; s3: typeof import("@aws-sdk/client-s3") }> {
    this.sdk ??= import("@aws-sdk/client-s3").then((s3) => ({ s3, client: new s3.S3Client(this.clientConfig) }));
    return this.sdk;
  }

  async put(key: string, bytes: Uint8Array, sha256: string): Promise<void> {
    const { client, s3 } = await this.load();
    try {
      await client.send(new s3.PutObjectCommand({ Bucket: this.bucket, Key: this.prefix + key, Body: bytes, ContentLength: bytes.byteLength, ChecksumSHA256: Buffer.from(sha256, "hex").toString("base64"), ContentType: "application/octet-stream" }));
    } catch (cause) {
      throw this.error("write", key, cause);
    }
  }

  async get(key: string): Promise<Uint8Array | null> {
    const { client, s3 } = await this.load();
    try {
      const r = await client.send(new s3.GetObjectCommand({ Bucket: this.bucket, Key: this.prefix + key }));
      return await r.Body!.transformToByteArray();
    } catch (cause) {
      if (cause instanceof s3.S3ServiceException && (cause.name === "NoSuchKey" || cause.$metadata?.httpStatusCode === 404)) return null;
      throw this.error("read", key, cause);
    }
  }

  async deletePrefix(prefix: string): Promise<number> {
    const { client, s3 } = await this.load();
    let n = 0;
    let token: string | undefined;
    try {
      do {
        const page = await client.send(new s3.ListObjectsV2Command({ Bucket: this.bucket, Prefix: this.prefix + prefix, ...(token ? { ContinuationToken: token } : {}) }));
        // One DeleteObject per key: a record has a blob or two, and DeleteObjects needs a Content-MD5 some servers check differently.
        for (const o of page.Contents ?? []) {
          await client.send(new s3.DeleteObjectCommand({ Bucket: this.bucket, Key: o.Key! }));
          n++;
        }
        token = page.IsTruncated ? page.NextContinuationToken : undefined;
      } while (token);
    } catch (cause) {
      throw this.error("delete", prefix, cause);
    }
    return n;
  }

  async close(): Promise<void> {
    if (this.sdk) (await this.sdk).client.destroy();
  }

  private error(op: string, key: string, cause: unknown): StoreError {
    const m = (cause as { name?: string; $metadata?: { httpStatusCode?: number } } | null) ?? {};
    const status = m.$metadata ? ` (${m.name}, HTTP ${m.$metadata.httpStatusCode ?? "?"})` : "";
    return new StoreError(`${this.location}: cannot ${op} blob ${key}${status}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause, code: "blob_store_error" });
  }
}
