import fc from "fast-check";

/** One edit of a JSON value: pick a path by `at`, then set/delete/add/wrap, or edit the serialised text. */
type Edit = { at: number; n: number; kind: number; value: unknown };

function paths(v: unknown, prefix: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  out.push(prefix);
  if (Array.isArray(v)) v.forEach((x, i) => paths(x, [...prefix, i], out));
  else if (v && typeof v === "object") for (const [k, x] of Object.entries(v)) paths(x, [...prefix, k], out);
  return out;
}

function setAt(root: unknown, path: (string | number)[], fn: (old: unknown, parent: unknown, key: string | number) => unknown): unknown {
  if (path.length === 0) return fn(root, undefined, "");
  const copy = structuredClone(root) as Record<string | number, unknown>;
  let cur: Record<string | number, unknown> = copy;
  for (const p of path.slice(0, -1)) cur = cur[p] as Record<string | number, unknown>;
  const last = path[path.length - 1]!;
  const next = fn(cur[last], cur, last);
  if (next === DELETE) {
    if (Array.isArray(cur)) cur.splice(last as number, 1);
    else delete cur[last];
  } else cur[last] = next;
  return copy;
}

const DELETE = Symbol("delete");

/** Applies `edits` to a valid value and returns the body text (sometimes no longer JSON). */
export function applyEdits(valid: unknown, edits: Edit[]): string {
  let v = structuredClone(valid);
  const textEdits: Edit[] = [];
  for (const e of edits) {
    const ps = paths(v);
    const p = ps[e.at % ps.length]!;
    switch (e.kind % 7) {
      case 0:
        v = setAt(v, p, () => e.value);
        break;
      case 1:
        v = p.length ? setAt(v, p, () => DELETE) : v;
        break;
      case 2:
        v = setAt(v, p, (old) => (old && typeof old === "object" && !Array.isArray(old) ? { ...old, [`k${e.n % 5}`]: e.value } : old));
        break;
      case 3:
        v = setAt(v, p, (old) => [old]);
        break;
      case 4:
        v = setAt(v, p, (old) => (typeof old === "number" ? -old * 1e9 : typeof old === "string" ? old.repeat(1 + (e.n % 3)) + "\u0000_" : old));
        break;
      default:
        textEdits.push(e);
    }
  }
  let text = JSON.stringify(v) ?? "null";
  for (const e of textEdits) {
    const i = e.n % (text.length + 1);
    text = e.kind % 7 === 5 ? text.slice(0, i) : text.slice(0, i) + String.fromCharCode(e.at % 128) + text.slice(i);
  }
  return text;
}

const edit: fc.Arbitrary<Edit> = fc.record({ at: fc.nat(), n: fc.nat(), kind: fc.nat(), value: fc.jsonValue({ maxDepth: 2 }) });

/**
 * Bodies for an endpoint: mutations of its valid bodies (half), the valid
 * bodies themselves, and random text/JSON/bytes.
 */
export function bodies(valid: unknown[]): fc.Arbitrary<string | Uint8Array> {
  const arbs: fc.Arbitrary<string | Uint8Array>[] = [
    fc.string({ unit: "binary", maxLength: 200 }),
    fc.json({ maxDepth: 3 }),
    fc.uint8Array({ maxLength: 200 }),
  ];
  if (valid.length) {
    arbs.push(
      fc.tuple(fc.constantFrom(...valid), fc.array(edit, { minLength: 1, maxLength: 4 })).map(([v, es]) => applyEdits(v, es)),
      fc.tuple(fc.constantFrom(...valid), fc.array(edit, { minLength: 1, maxLength: 2 })).map(([v, es]) => applyEdits(v, es)),
      fc.constantFrom(...valid).map((v) => JSON.stringify(v)),
    );
  }
  return fc.oneof(...arbs);
}

/** Path segments: ids that exist, plausible ones, and junk (URL-encoded). */
export function segment(known: () => string[]): fc.Arbitrary<string> {
  return fc.oneof(
    fc.nat().map((i) => {
      const k = known();
      return k.length ? k[i % k.length]! : "none";
    }),
    fc.uuid().map((u) => `${u}_0_0`),
    fc.string({ unit: "binary", minLength: 1, maxLength: 60 }).map((s) => encodeURIComponent(s)),
    fc.constantFrom("..", "%2e%2e", "a_b", "x_0_0", "_0_0", "a".repeat(300)),
  );
}
