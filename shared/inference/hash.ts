/**
 * Small non-cryptographic hashes shared by the routers and the simulated
 * engine's prefix cache. Pure functions over strings and integers, identical
 * on every runtime (so stateless gateway instances agree).
 */

/** 32-bit FNV-1a of a string's UTF-16 code units, as an unsigned integer. */
export function fnv1a32(s: string, seed = 0x811c9dc5): number {
  let h = seed >>> 0;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return mix32(h);
}

/**
 * Two {@link fnv1a32} hashes of `s` with seeds `a` and `b`, in one pass
 * (long strings: the agent gateway's request hash), as one 16-hex-digit
 * string: `fnv1a32(s, a)` then `fnv1a32(s, b)`, each zero-padded to 8.
 */
export function fnv1a32x2Hex(s: string, a: number, b: number): string {
  let h1 = a >>> 0;
  let h2 = b >>> 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    h1 = Math.imul(h1 ^ c, 0x01000193);
    h2 = Math.imul(h2 ^ c, 0x01000193);
  }
  return mix32(h1).toString(16).padStart(8, "0") + mix32(h2).toString(16).padStart(8, "0");
}

/** murmur3's 32-bit finaliser: spreads FNV's weak low bits. */
export function mix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/** Folds one 32-bit integer into a running 32-bit hash. */
export function hashInt(h: number, v: number): number {
  h ^= v >>> 0;
  h = Math.imul(h, 0x01000193);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  return h >>> 0;
}

/** A uniform float in [0, 1) from a 32-bit hash. */
export function unitFloat(h: number): number {
  return mix32(h) / 4294967296;
}
