import type { z } from "zod";
import { inputErrorFromZod } from "../errors.ts";

/** Small readers shared by the agent gateway's request parsers (chat completions, Responses, Messages). */

/** null and undefined both count as absent in every API the gateway speaks. */
export const nullish = (v: unknown): v is null | undefined => v === null || v === undefined;

/** A plain JSON object (not null, not an array). */
export function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/**
 * `value` checked with `schema`.
 * @throws InputError naming `field` (and the path inside it) with zod's message.
 */
export function parseField<S extends z.ZodType>(field: string, schema: S, value: unknown): z.infer<S> {
  const r = schema.safeParse(value);
  if (!r.success) throw inputErrorFromZod(field, r.error.issues);
  return r.data;
}

/** The keys of `ignored` that `body` carries with a non-null value, in the body's order (empty for a non-object body): what `x-edgeloop-ignored-keys` names. */
export function presentKeys(body: unknown, ignored: readonly string[]): string[] {
  if (!isRecord(body)) return [];
  return Object.keys(body).filter((k) => ignored.includes(k) && !nullish(body[k]));
}
