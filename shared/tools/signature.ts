/** The header carrying a webhook's signature: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">`. */
export const SIGNATURE_HEADER = "x-edgeloop-signature";

const encoder = new TextEncoder();
const keys = new Map<string, Promise<CryptoKey>>();

function hmacKey(secret: string): Promise<CryptoKey> {
  let k = keys.get(secret);
  if (!k) {
    k = crypto.subtle.importKey("raw", encoder.encode(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
    if (keys.size > 64) keys.clear();
    keys.set(secret, k);
  }
  return k;
}

function toHex(buf: ArrayBuffer): string {
  const b = new Uint8Array(buf);
  let s = "";
  for (let i = 0; i < b.length; i++) s += b[i]!.toString(16).padStart(2, "0");
  return s;
}

/** Hex HMAC-SHA256 of `"<t>.<rawBody>"` under `secret` (Web Crypto). */
export async function signatureDigest(secret: string, t: number, rawBody: string): Promise<string> {
  const sig = await crypto.subtle.sign("HMAC", await hmacKey(secret), encoder.encode(`${t}.${rawBody}`));
  return toHex(sig);
}

/**
 * The `x-edgeloop-signature` value for `rawBody` sent at `nowSeconds` (unix
 * seconds, an integer): `t=<now>,v1=<hex>`. The same scheme signs tool calls,
 * interaction calls, reward calls and (later) session callbacks.
 */
export async function signatureHeader(secret: string, rawBody: string, nowSeconds: number): Promise<string> {
  const t = Math.floor(nowSeconds);
  return `t=${t},v1=${await signatureDigest(secret, t, rawBody)}`;
}

/** Compares two strings in time that depends only on their lengths. */
export function constantTimeEqual(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * Checks a `x-edgeloop-signature` header against the raw body. True only when
 * the header is well formed, its timestamp is within `windowSeconds` of
 * `nowSeconds` (either direction, so replays of old requests fail), and one of
 * its `v1` digests (several are allowed, for secret rotation) matches —
 * compared in constant time.
 */
export async function verifySignature(
  secret: string,
  header: string | null | undefined,
  rawBody: string,
  nowSeconds: number,
  windowSeconds = 300,
): Promise<boolean> {
  if (!header) return false;
  let t: number | undefined;
  const digests: string[] = [];
  for (const part of header.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const k = part.slice(0, eq).trim();
    const v = part.slice(eq + 1).trim();
    if (k === "t" && /^\d+$/.test(v)) t = Number(v);
    else if (k === "v1" && v) digests.push(v.toLowerCase());
  }
  if (t === undefined || digests.length === 0) return false;
  if (Math.abs(nowSeconds - t) > windowSeconds) return false;
  const expected = await signatureDigest(secret, t, rawBody);
  let ok = false;
  for (const d of digests) ok = constantTimeEqual(d, expected) || ok;
  return ok;
}
