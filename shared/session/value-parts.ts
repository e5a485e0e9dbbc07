/**
 * Splitting a text value into parts that each fit a store's value or command
 * limit, and joining the parts back. A stored part is marked by its first
 * character: `+` (more parts of the same value follow) or `.` (the value's
 * last part), so a log of parts can be read back into its values without a
 * separate index.
 */

/** How a store measures a value: UTF-8 bytes (Redis, Upstash JSON) or UTF-16 code units × 2 (V8-serialised strings, Durable Objects). */
export type ValueMeasure = "utf8" | "utf16";

const enc = new TextEncoder();

/** Size of `s` in bytes as `measure` counts it. */
export function measureValue(s: string, measure: ValueMeasure): number {
  if (measure === "utf16") return s.length * 2;
  // Fast path: a UTF-8 string is at least as long as its UTF-16 length and at most 3× it.
  return s.length * 3 <= 0x7fffffff ? enc.encode(s).byteLength : Infinity;
}

/**
 * Splits `s` into pieces of at most `maxBytes` each (as `measure` counts;
 * a surrogate pair is never cut). `maxBytes` must be at least 4.
 */
export function splitValue(s: string, maxBytes: number, measure: ValueMeasure = "utf8"): string[] {
  if (maxBytes < 4) throw new RangeError(`maxBytes must be >= 4, got ${maxBytes}`);
  if (measure === "utf16") {
    const step = Math.floor(maxBytes / 2);
    if (s.length <= step) return [s];
    const out: string[] = [];
    for (let i = 0; i < s.length; ) {
      let end = Math.min(s.length, i + step);
      if (end < s.length && isHighSurrogate(s.charCodeAt(end - 1))) end--;
      out.push(s.slice(i, end));
      i = end;
    }
    return out;
  }
  if (s.length * 3 <= maxBytes) return [s];
  const out: string[] = [];
  let start = 0;
  let bytes = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    let w: number;
    let units = 1;
    if (c < 0x80) w = 1;
    else if (c < 0x800) w = 2;
    else if (isHighSurrogate(c) && i + 1 < s.length) {
      w = 4;
      units = 2;
    } else w = 3;
    if (bytes + w > maxBytes) {
      out.push(s.slice(start, i));
      start = i;
      bytes = 0;
    }
    bytes += w;
    i += units - 1;
  }
  out.push(s.slice(start));
  return out;
}

function isHighSurrogate(c: number): boolean {
  return c >= 0xd800 && c <= 0xdbff;
}

/**
 * `s` as marked parts (`+…`, last `.…`) of at most `maxBytes` each, marker
 * included.
 */
export function toParts(s: string, maxBytes: number, measure: ValueMeasure = "utf8"): string[] {
  const pieces = splitValue(s, maxBytes - (measure === "utf16" ? 2 : 1), measure);
  return pieces.map((p, i) => (i === pieces.length - 1 ? "." : "+") + p);
}

/**
 * The values of a log of marked parts, in order. A trailing run of parts
 * without its last part (`.`) is ignored: it was never committed.
 * @throws Error naming the index when a part has no marker.
 */
export function fromParts(parts: readonly string[]): string[] {
  const out: string[] = [];
  let cur: string[] = [];
  parts.forEach((p, i) => {
    const m = p.charCodeAt(0);
    if (m === 0x2b /* + */) cur.push(p.slice(1));
    else if (m === 0x2e /* . */) {
      cur.push(p.slice(1));
      out.push(cur.length === 1 ? cur[0]! : cur.join(""));
      cur = [];
    } else throw new Error(`stored part ${i} has no part marker`);
  });
  return out;
}
