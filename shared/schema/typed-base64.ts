/**
 * Typed arrays as base64 text, for checkpoints: token ids as little-endian
 * int32, log-probs as little-endian float32 (bit-exact, 4 bytes a value
 * instead of ~20 characters of JSON), the mask as bytes. Web-standard only
 * (`btoa`/`atob`), so it runs in every runtime.
 */

const CHUNK = 0x8000;

function bytesToBase64(bytes: Uint8Array): string {
  let bin = "";
  for (let i = 0; i < bytes.length; i += CHUNK) bin += String.fromCharCode(...bytes.subarray(i, i + CHUNK));
  return btoa(bin);
}

function base64ToBytes(b64: string): Uint8Array {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

const littleEndian = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

function leBytes(view: Int32Array | Float32Array | Float64Array): Uint8Array {
  const w = view.BYTES_PER_ELEMENT;
  const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
  if (littleEndian) return bytes;
  const copy = new Uint8Array(bytes);
  for (let i = 0; i < copy.length; i += w) copy.subarray(i, i + w).reverse();
  return copy;
}

function fromLe(bytes: Uint8Array, w = 4): ArrayBuffer {
  if (bytes.length % w !== 0) throw new RangeError(`base64 payload of ${bytes.length} bytes is not a whole number of ${w}-byte values`);
  const copy = new Uint8Array(bytes);
  if (!littleEndian) for (let i = 0; i < copy.length; i += w) copy.subarray(i, i + w).reverse();
  return copy.buffer;
}

/** Int32 values (token ids) → base64 of their little-endian bytes. */
export function encodeInt32(values: ArrayLike<number>): string {
  return bytesToBase64(leBytes(values instanceof Int32Array ? values : Int32Array.from(values)));
}

/** The inverse of {@link encodeInt32}. @throws RangeError when the payload is not whole int32 values. */
export function decodeInt32(b64: string): Int32Array {
  return new Int32Array(fromLe(base64ToBytes(b64)));
}

/** Float32 values (log-probs) → base64 of their little-endian bytes; bit-exact. */
export function encodeFloat32(values: ArrayLike<number>): string {
  return bytesToBase64(leBytes(values instanceof Float32Array ? values : Float32Array.from(values)));
}

/** The inverse of {@link encodeFloat32}. @throws RangeError when the payload is not whole float32 values. */
export function decodeFloat32(b64: string): Float32Array {
  return new Float32Array(fromLe(base64ToBytes(b64)));
}

/** Float64 values (log-probs that are not all float32) → base64 of their little-endian bytes; bit-exact. */
export function encodeFloat64(values: ArrayLike<number>): string {
  return bytesToBase64(leBytes(values instanceof Float64Array ? values : Float64Array.from(values)));
}

/** The inverse of {@link encodeFloat64}. @throws RangeError when the payload is not whole float64 values. */
export function decodeFloat64(b64: string): Float64Array {
  return new Float64Array(fromLe(base64ToBytes(b64), 8));
}

/** Byte values (the 0/1 response mask) → base64. */
export function encodeUint8(values: ArrayLike<number>): string {
  return bytesToBase64(values instanceof Uint8Array ? values : Uint8Array.from(values));
}

/** The inverse of {@link encodeUint8}. */
export function decodeUint8(b64: string): Uint8Array {
  return base64ToBytes(b64);
}
