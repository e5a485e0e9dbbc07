import { z } from "zod";

/**
 * A blob key: 1–1024 characters of `[A-Za-z0-9._~%/-]`, `/`-separated
 * segments none of which is empty, `.` or `..` — so it names an object
 * under the blob store's root and nothing outside it (a filesystem store
 * joins it to its directory, S3 and R2 to their prefix).
 */
export const BlobKey = z
  .string()
  .min(1)
  .max(1024)
  .regex(/^[A-Za-z0-9._~%-]+(\/[A-Za-z0-9._~%-]+)*$/, "blob key may only hold [A-Za-z0-9._~%-] segments separated by '/'")
  .refine((k) => k.split("/").every((s) => s !== "." && s !== ".."), "blob key segments may not be '.' or '..'");

/**
 * The pointer a record holds in place of a part kept in the blob store
 * (docs/queue-layout.md, "Blobs"): the object's `key` under the store's root,
 * the lowercase hex `sha256` of its bytes and their count `bytes`. The
 * store's location (directory, bucket, R2 binding) is configuration, not in
 * the record, so readers name it (`--blob-store`, `Reader(blobs=…)`).
 */
export const BlobPointer = z.strictObject({
  key: BlobKey,
  sha256: z.string().regex(/^[0-9a-f]{64}$/, "sha256 must be 64 lowercase hex digits"),
  bytes: z.number().int().min(0),
  /** How the bytes are packed, for `routed_experts` (`RoutedExpertsDtype`): the stored field `routed_experts_dtype`. */
  dtype: z.enum(["uint8", "uint16", "int32"]),
});
export type BlobPointer = z.infer<typeof BlobPointer>;
