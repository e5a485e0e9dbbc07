import { keyPart } from "./key-encoding.ts";

/**
 * Where record parts too large for Redis live (docs/queue-layout.md,
 * "Blobs"): an object store addressed by {@link BlobKey}-shaped keys
 * (`/`-separated, `[A-Za-z0-9._~%-]` segments). Runtime-free: a filesystem
 * directory (`infra/blobs/fs-blob-store.ts`), an S3-compatible bucket
 * (`infra/blobs/s3-blob-store.ts`) and Cloudflare R2 through its Worker
 * binding (`infra/cloudflare/r2-blob-store.ts`) implement it, chosen at the
 * edge; one contract suite (`tests/store/blob-store-contract.ts`) runs on each.
 *
 * Errors: implementations throw a retryable `StoreError` (code
 * `blob_store_error`) when the store cannot be reached or refuses a request.
 */
export interface BlobStore {
  /** Where the blobs live, for banners and errors (`file:///data/blobs`, `s3://bucket/prefix`, `r2:EDGELOOP_BLOBS`); no credentials. */
  readonly location: string;
  /**
   * Writes `bytes` under `key`, replacing what was there. Resolves only once
   * the object is durable (the file fsynced and renamed into place, the S3/R2
   * PUT acknowledged): the caller writes the record pointing at it after.
   * `sha256` (lowercase hex of `bytes`) lets stores that check uploads (R2,
   * S3's `x-amz-checksum-sha256`) refuse bytes damaged in transit.
   */
  put(key: string, bytes: Uint8Array, sha256: string): Promise<void>;
  /** The bytes under `key`, or null when there is no such object. */
  get(key: string): Promise<Uint8Array | null>;
  /** Deletes every object whose key starts with `prefix` (a `…/` directory-like prefix); returns how many were deleted. Idempotent. */
  deletePrefix(prefix: string): Promise<number>;
  /** Releases connections (optional). */
  close?(): Promise<void>;
}

/**
 * The blob-key prefix of one record: `{keyPart(prefix)}/traj/{keyPart(key)}/`
 * (`edgeloop%3A/traj/g1_0_0/`; an empty queue prefix drops its segment).
 * Every blob of the record lives under it, so `edgeloop gc` deletes a
 * record's blobs with {@link BlobStore.deletePrefix} and needs no refcounts:
 * records never share blobs.
 */
export function recordBlobPrefix(queuePrefix: string, recordKey: string): string {
  return `${queuePrefix ? `${keyPart(queuePrefix, "prefix")}/` : ""}traj/${keyPart(recordKey)}/`;
}

/**
 * The blob key of one record part: `{recordBlobPrefix}{field}.{sha256}`. The
 * digest in the name makes a retried put (same bytes) write the same object
 * and a rewrite with other bytes another one — never a half-replaced blob
 * under a record's live pointer.
 */
export function blobKeyOf(queuePrefix: string, recordKey: string, field: string, sha256: string): string {
  return `${recordBlobPrefix(queuePrefix, recordKey)}${field}.${sha256}`;
}

/** Lowercase hex SHA-256 of `bytes` (WebCrypto: Bun, Deno, Node, workerd). */
export async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>));
  let out = "";
  for (let i = 0; i < digest.length; i++) out += digest[i]!.toString(16).padStart(2, "0");
  return out;
}
