/**
 * Hand-written checks for the fast paths of engine-reply parsing: each says
 * whether a value is one that the matching zod schema surely accepts (a
 * "no" only means "let zod decide"), without zod's per-element cost.
 */

/** A non-null, non-array object (what `z.object` / `z.looseObject` accept as the container). */
export const isObj = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);
/** `undefined` or `null` (what `.nullish()` lets through). */
export const nil = (v: unknown): boolean => v === undefined || v === null;
/** `z.number().int()` (safe integers; zod decides anything else). */
export const isInt = (v: unknown): boolean => typeof v === "number" && Number.isSafeInteger(v);
/** A finite number (`z.number()` rejects NaN and ±Infinity). */
export const isNum = (v: unknown): boolean => typeof v === "number" && Number.isFinite(v);
/** Absent, null or a string (`z.string().nullish()`). */
export const optStr = (v: unknown): boolean => nil(v) || typeof v === "string";
/** Absent, null or a safe integer (`z.number().int().nullish()`). */
export const optInt = (v: unknown): boolean => nil(v) || isInt(v);

/** Absent, null, or an array of ids that `z.array(z.number().int().min(0))` accepts. */
export function optIdArray(v: unknown): boolean {
  if (nil(v)) return true;
  if (!Array.isArray(v)) return false;
  for (let i = 0; i < v.length; i++) {
    const x = v[i];
    if (typeof x !== "number" || !Number.isSafeInteger(x) || x < 0) return false;
  }
  return true;
}


/** Absent, null, or a safe integer ≥ 0 (`z.number().int().min(0).nullish()`). */
export const optId = (v: unknown): boolean => nil(v) || (isInt(v) && (v as number) >= 0);
