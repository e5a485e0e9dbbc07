import { InputError } from "../errors.ts";

/** An image format edgeloop reads the dimensions of. */
export type ImageMime = "image/png" | "image/jpeg" | "image/webp" | "image/gif";

/** What an image's header says: its format and its stored size in pixels. */
export interface ImageHeader {
  mime: ImageMime;
  width: number;
  height: number;
}

/** The most bytes of a JPEG scanned for its frame header (SOF); APP segments (EXIF, ICC) before it are skipped by length, not read. */
const MAX_JPEG_SCAN = 16 * 1024 * 1024;

const u16be = (b: Uint8Array, i: number) => (b[i]! << 8) | b[i + 1]!;
const u16le = (b: Uint8Array, i: number) => b[i]! | (b[i + 1]! << 8);
const u24le = (b: Uint8Array, i: number) => b[i]! | (b[i + 1]! << 8) | (b[i + 2]! << 16);
const u32be = (b: Uint8Array, i: number) => ((b[i]! << 24) >>> 0) + (b[i + 1]! << 16) + (b[i + 2]! << 8) + b[i + 3]!;
const ascii = (b: Uint8Array, i: number, s: string) => {
  if (i + s.length > b.length) return false;
  for (let k = 0; k < s.length; k++) if (b[i + k] !== s.charCodeAt(k)) return false;
  return true;
};

/**
 * The format and stored dimensions of a PNG, JPEG, WebP or GIF image, read
 * from its header only (no pixel is decoded). Every read is bounds-checked
 * and the scan is linear: PNG, GIF and WebP read fixed offsets; a JPEG's
 * segments are skipped by their lengths until the first frame header (SOF0–
 * SOF15 except DHT/JPG/DAC), over at most 16 MiB.
 *
 * The size is the one stored in the file, as PIL's `Image.size` reports it
 * (GIF: the logical screen; WebP: the canvas of VP8X, else the frame). EXIF
 * orientation is not applied: transformers' `load_image` transposes by it
 * and engines that open bytes with PIL alone do not, so a rotated JPEG (EXIF
 * orientation 5–8) has its sides swapped between the two.
 * @throws InputError (field `field`) naming what is wrong: an unknown
 *   format, a truncated header, a zero side.
 * @see PNG (RFC 2083 §4.1.1 IHDR), JPEG (ITU T.81 B.2.2), WebP container (RFC 9649 §2.5–2.7), GIF89a §18
 */
export function readImageHeader(bytes: Uint8Array, field: string): ImageHeader {
  const h = sniff(bytes, field);
  if (h.width < 1 || h.height < 1) throw new InputError(field, `the ${h.mime} header gives a ${h.width}x${h.height} image`);
  return h;
}

function sniff(b: Uint8Array, field: string): ImageHeader {
  const short = (what: string): never => {
    throw new InputError(field, `the ${what} image is truncated (${b.length} bytes) before its size`);
  };
  if (b.length >= 8 && b[0] === 0x89 && ascii(b, 1, "PNG\r\n\x1a\n")) {
    if (b.length < 24) short("PNG");
    if (!ascii(b, 12, "IHDR")) throw new InputError(field, "the PNG image does not start with an IHDR chunk");
    return { mime: "image/png", width: u32be(b, 16), height: u32be(b, 20) };
  }
  if (ascii(b, 0, "GIF87a") || ascii(b, 0, "GIF89a")) {
    if (b.length < 10) short("GIF");
    return { mime: "image/gif", width: u16le(b, 6), height: u16le(b, 8) };
  }
  if (ascii(b, 0, "RIFF") && ascii(b, 8, "WEBP")) return webp(b, field, short);
  if (b.length >= 3 && b[0] === 0xff && b[1] === 0xd8 && b[2] === 0xff) return jpeg(b, field, short);
  throw new InputError(field, "is not a PNG, JPEG, WebP or GIF image (unknown signature)");
}

function webp(b: Uint8Array, field: string, short: (w: string) => never): ImageHeader {
  if (b.length < 30) short("WebP");
  if (ascii(b, 12, "VP8X")) return { mime: "image/webp", width: u24le(b, 24) + 1, height: u24le(b, 27) + 1 };
  if (ascii(b, 12, "VP8L")) {
    if (b[20] !== 0x2f) throw new InputError(field, "the lossless WebP image has no VP8L signature byte");
    const bits = (b[21]! | (b[22]! << 8) | (b[23]! << 16) | (b[24]! << 24)) >>> 0;
    return { mime: "image/webp", width: (bits & 0x3fff) + 1, height: ((bits >>> 14) & 0x3fff) + 1 };
  }
  if (ascii(b, 12, "VP8 ")) {
    if (b[23] !== 0x9d || b[24] !== 0x01 || b[25] !== 0x2a) throw new InputError(field, "the lossy WebP image has no VP8 key-frame start code");
    return { mime: "image/webp", width: u16le(b, 26) & 0x3fff, height: u16le(b, 28) & 0x3fff };
  }
  throw new InputError(field, "the WebP image's first chunk is not VP8, VP8L or VP8X");
}

function jpeg(b: Uint8Array, field: string, short: (w: string) => never): ImageHeader {
  const end = Math.min(b.length, MAX_JPEG_SCAN);
  let i = 2;
  while (i < end) {
    if (b[i] !== 0xff) throw new InputError(field, `the JPEG image has no marker at byte ${i}`);
    // Fill bytes (0xFF runs) may precede a marker.
    while (i < end && b[i] === 0xff) i++;
    if (i >= end) break;
    const marker = b[i++]!;
    // Markers without a length: TEM, RST0–7, SOI.
    if (marker === 0x01 || (marker >= 0xd0 && marker <= 0xd8)) continue;
    if (marker === 0xd9 || marker === 0xda) throw new InputError(field, "the JPEG image has no frame header (SOF) before its scan data");
    if (i + 2 > end) break;
    const len = u16be(b, i);
    if (len < 2) throw new InputError(field, `the JPEG image has a segment of length ${len} at byte ${i}`);
    const sof = marker >= 0xc0 && marker <= 0xcf && marker !== 0xc4 && marker !== 0xc8 && marker !== 0xcc;
    if (sof) {
      if (i + 7 > b.length) break;
      return { mime: "image/jpeg", width: u16be(b, i + 5), height: u16be(b, i + 3) };
    }
    i += len;
  }
  return short("JPEG");
}
