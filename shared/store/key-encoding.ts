import { InputError } from "../errors.ts";

/** Characters a key part keeps as they are: those Python's `urllib.parse.quote(s, safe="")` never escapes. */
const KEY_PART_SAFE = /^[A-Za-z0-9._~-]+$/;
/** What `encodeURIComponent` leaves alone but a key part must not hold (`*` is a SCAN/KEYS glob). */
const URI_EXTRA = /[!'()*]/g;

/**
 * Encodes one user-supplied component of a Redis key (a uid, a trajectory
 * key, a session key, a batch id, a routing key) so that key namespaces stay
 * disjoint whatever the input holds. Every key edgeloop builds is the
 * prefix, fixed words and encoded parts joined by `:`; an encoded part never
 * holds `:`, `{`, `}`, `*`, `?`, `[`, whitespace, control characters or
 * non-ASCII, so no input can form another namespace's key, a glob, or a Redis
 * Cluster hash tag.
 *
 * The encoding is the identity on `[A-Za-z0-9._~-]+` (every uid, trajectory key,
 * UUID and stream id edgeloop accepts, so the stored layout of ordinary ids is
 * unchanged) and otherwise percent-encodes each UTF-8 byte outside that set
 * as `%XX` (upper-case hex). It is injective (`%` itself is always encoded)
 * and equals Python's `urllib.parse.quote(value, safe="")`, which
 * `clients/python` uses.
 * @see docs/queue-layout.md ("Keys")
 * @param value the component, 1 or more UTF-16 code units, well-formed Unicode.
 * @param field the input field it came from, named in the error.
 * @throws InputError (400) for an empty string, a non-string or a lone surrogate.
 */
export function keyPart(value: string, field = "key"): string {
  if (typeof value !== "string" || value.length === 0) throw new InputError(field, "must be a non-empty string to form a store key");
  if (KEY_PART_SAFE.test(value)) return value;
  let enc: string;
  try {
    enc = encodeURIComponent(value);
  } catch {
    throw new InputError(field, "is not well-formed Unicode (lone surrogate)");
  }
  return enc.replace(URI_EXTRA, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/** True when {@link keyPart} leaves `value` unchanged (the value already is a plain key part). */
export function isPlainKeyPart(value: string): boolean {
  return typeof value === "string" && KEY_PART_SAFE.test(value);
}

/**
 * The inverse of {@link keyPart}: the original component of an encoded key
 * part (for tools that scan keys, like gc), or null when `part` is not the
 * output of {@link keyPart} (a key another program wrote).
 */
export function decodeKeyPart(part: string): string | null {
  try {
    const v = decodeURIComponent(part);
    return v.length > 0 && keyPart(v) === part ? v : null;
  } catch {
    return null;
  }
}
