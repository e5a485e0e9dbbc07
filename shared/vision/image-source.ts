import { InputError } from "../errors.ts";
import { readImageHeader, type ImageMime } from "./image-header.ts";

/** The most bytes one image may have (its encoded file): 32 MiB. */
export const MAX_IMAGE_BYTES = 32 * 1024 * 1024;

/**
 * The most pixels an image's header may declare: PIL's decompression-bomb
 * error threshold, `2 × Image.MAX_IMAGE_PIXELS` = 2 × 89,478,485. Above it
 * PIL (and so transformers and the engines) refuses to open the image; below
 * it `width × height` is exact in a double.
 * @see Pillow `PIL/Image.py` (`MAX_IMAGE_PIXELS`, `_decompression_bomb_check`)
 */
export const MAX_IMAGE_PIXELS = 2 * 89_478_485;

/**
 * Fetches an image URL's bytes for {@link loadImage}. edgeloop passes none
 * by default: an `http(s)` image URL in a row or a tool result is refused,
 * because fetching URLs that rows or tools name is a server-side request to
 * wherever they point (the same reason webhooks go through
 * shared/http/outbound.ts: no redirects, byte caps, deadlines). An embedder
 * that wants URLs supplies one built on that module, with an allowlist of
 * origins, and enforces `maxBytes` while the body streams.
 * @throws whatever it refuses with; {@link loadImage} wraps it as an InputError naming the field.
 */
export type ImageFetcher = (url: string, opts: { field: string; maxBytes: number }) => Promise<Uint8Array>;

/** An image as edgeloop records it: its bytes, their content hash and type, and the stored size. */
export interface LoadedImage {
  /** Lowercase hex SHA-256 of `data` (the encoded file, as given). */
  sha256: string;
  mime: ImageMime;
  /** The encoded file. */
  data: Uint8Array;
  /** Stored width and height in pixels (see `readImageHeader`). */
  width: number;
  height: number;
  /**
   * The base64 of `data` as the source sent it, when it came as a `data:` URI (validated: the
   * payload `data` was decoded from): reused for the engine's `image_data` and the record's inline
   * `data` instead of encoding the bytes again. Absent for fetched images.
   */
  base64?: string;
}

type Base64Codec = { fromBase64?: (s: string) => Uint8Array };

/**
 * `bytes` as base64: `Uint8Array.prototype.toBase64` where the runtime has it (Bun, recent V8),
 * else 32 KiB chunks through `btoa` (linear; no argument list over the engine's limit).
 */
export function bytesToBase64(bytes: Uint8Array): string {
  const own = (bytes as unknown as { toBase64?: () => string }).toBase64;
  if (typeof own === "function") return own.call(bytes);
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

/**
 * The image reference of a content part: `{type: "image", image: string}`
 * (verl's rows) or `{type: "image_url", image_url: {url}}` (OpenAI chat) —
 * a `data:` URI or an `http(s)` URL.
 * @throws InputError (field `field`, or `field.image` / `field.image_url.url`) for any other shape.
 */
export function imagePartSource(part: unknown, field: string): { source: string; field: string } {
  const p = part as { type?: unknown; image?: unknown; image_url?: unknown } | null;
  if (p?.type === "image") {
    if (typeof p.image !== "string") throw new InputError(`${field}.image`, "expected a data: URI or an http(s) URL string");
    return { source: p.image, field: `${field}.image` };
  }
  if (p?.type === "image_url") {
    const u = p.image_url as { url?: unknown } | string | undefined;
    const url = typeof u === "string" ? u : u?.url;
    if (typeof url !== "string") throw new InputError(`${field}.image_url.url`, "expected a data: URI or an http(s) URL string");
    return { source: url, field: `${field}.image_url.url` };
  }
  throw new InputError(field, "expected an image part {type: image, image} or {type: image_url, image_url: {url}}");
}

const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

/**
 * The bytes of a base64 `data:` URI (`data:image/png;base64,iVBOR…`). The
 * declared media type is not trusted: the format comes from the bytes.
 * Checked before decoding: the payload's length bounds the bytes, so a URI
 * over `maxBytes` is refused without decoding it; one linear pass checks
 * the alphabet.
 * @throws InputError (field `field`) for another scheme, a non-base64
 *   payload, or more than `maxBytes` bytes.
 */
export function decodeDataUri(uri: string, field: string, maxBytes = MAX_IMAGE_BYTES): Uint8Array {
  if (!uri.startsWith("data:")) throw new InputError(field, "expected a data: URI");
  const comma = uri.indexOf(",", 5);
  if (comma < 0 || comma > 256) throw new InputError(field, "the data: URI has no ',' after its media type");
  const head = uri.slice(5, comma);
  if (!/;base64$/i.test(head)) throw new InputError(field, "the data: URI is not base64 (expected data:image/…;base64,…)");
  const payload = uri.slice(comma + 1);
  if (Math.floor((payload.length * 3) / 4) > maxBytes + 2) throw new InputError(field, `the image is larger than ${maxBytes} bytes (the cap)`);
  if (payload.length % 4 !== 0 || !BASE64.test(payload)) throw new InputError(field, "the data: URI payload is not base64");
  // Uint8Array.fromBase64 where the runtime has it (Bun, recent V8): the alphabet was checked above.
  const fromBase64 = (Uint8Array as unknown as Base64Codec).fromBase64;
  if (typeof fromBase64 === "function") {
    const out = fromBase64(payload);
    if (out.length > maxBytes) throw new InputError(field, `the image is larger than ${maxBytes} bytes (the cap)`);
    return out;
  }
  const bin = atob(payload);
  if (bin.length > maxBytes) throw new InputError(field, `the image is larger than ${maxBytes} bytes (the cap)`);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/** Lowercase hex SHA-256 of `bytes` (Web Crypto). */
export async function sha256Hex(bytes: Uint8Array): Promise<string> {
  const d = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes as Uint8Array<ArrayBuffer>));
  let s = "";
  for (const b of d) s += b.toString(16).padStart(2, "0");
  return s;
}

/**
 * Loads one image reference: a `data:` URI is decoded; an `http(s)` URL is
 * fetched with `opts.fetch` when given and refused otherwise (see
 * {@link ImageFetcher}); anything else is refused. Then the header gives the
 * format and size and the bytes their hash.
 * @throws InputError naming `field`: a refused URL, a bad URI, an unknown
 *   format, more than `maxBytes` bytes, or the fetcher's failure.
 */
export async function loadImage(source: string, field: string, opts: { fetch?: ImageFetcher; maxBytes?: number } = {}): Promise<LoadedImage> {
  const maxBytes = opts.maxBytes ?? MAX_IMAGE_BYTES;
  let data: Uint8Array;
  let base64: string | undefined;
  if (source.startsWith("data:")) {
    data = decodeDataUri(source, field, maxBytes);
    base64 = source.slice(source.indexOf(",", 5) + 1);
  } else if (/^https?:\/\//i.test(source)) {
    if (!opts.fetch) throw new InputError(field, "image URLs are not fetched (no image fetcher configured): pass the image inline as a data:image/…;base64 URI");
    try {
      data = await opts.fetch(source, { field, maxBytes });
    } catch (e) {
      if (e instanceof InputError) throw e;
      throw new InputError(field, `fetching the image failed: ${(e as Error)?.message ?? String(e)}`, { cause: e });
    }
    if (data.length > maxBytes) throw new InputError(field, `the image is larger than ${maxBytes} bytes (the cap)`);
  } else {
    throw new InputError(field, `expected a data: URI or an http(s) URL, got '${source.slice(0, 40)}'`);
  }
  const header = readImageHeader(data, field);
  if (header.width * header.height > MAX_IMAGE_PIXELS) {
    throw new InputError(field, `a ${header.width}x${header.height} image has more than ${MAX_IMAGE_PIXELS} pixels (PIL's decompression-bomb limit)`);
  }
  return { sha256: await sha256Hex(data), mime: header.mime, data, width: header.width, height: header.height, ...(base64 !== undefined ? { base64 } : {}) };
}
