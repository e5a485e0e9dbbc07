import { z } from "zod";
import { AuthError, EdgeloopError, inputErrorFromZod, InputError } from "../errors.ts";
import { SIGNATURE_HEADER, verifySignature } from "../tools/signature.ts";
import type { ToolResultDelivery } from "./trajectory-session.ts";

/**
 * Body of `POST /v1/sessions/{key}/tool-results`: the awaited call's id, its
 * result text, an optional reward, `ok: false` when the tool failed (then
 * `content` is the error text the model sees, counted in
 * `extra_fields.tool_errors`), and optional `metrics` (recorded in
 * `extra_fields.tool_metrics`), as a synchronous reply's. Strict: any other
 * key is refused (400 naming it), so a misspelt `reward` is not dropped silently.
 */
export const ToolResultCallback = z.strictObject({
  call_id: z.string().min(1).max(1000),
  content: z.string(),
  reward: z.number().nullish(),
  ok: z.boolean().optional(),
  metrics: z.record(z.string(), z.unknown()).nullish(),
});
export type ToolResultCallback = z.infer<typeof ToolResultCallback>;

/**
 * Checks and parses a tool-result callback: the raw body must carry a
 * valid, fresh `x-edgeloop-signature` (the scheme tool calls are signed
 * with: `t=<unix s>,v1=<hex HMAC-SHA256 of "<t>.<body>">`), checked before
 * the body is read; then, when `contentType` is given (an HTTP request's
 * `content-type` header, `null` when absent), it must be `application/json`;
 * then the body must be JSON of {@link ToolResultCallback}.
 * Without a secret every callback is refused: call ids (`{key}:{turn}:{index}`)
 * are predictable, so an unsigned callback would let anyone who reaches the
 * port inject observations.
 * @throws {@link CallbacksDisabledError} (403) when no secret is configured; AuthError (401) for a
 *   missing, bad or stale signature; InputError 415 (field `content-type`) for a body
 *   not sent as `application/json`; InputError (400) naming the field.
 */
export async function parseToolResultCallback(
  raw: string,
  signature: string | null | undefined,
  opts: { secret?: string | null; nowSeconds?: number; windowSeconds?: number; contentType?: string | null } = {},
): Promise<ToolResultDelivery> {
  if (!opts.secret) throw new CallbacksDisabledError();
  if (!(await verifySignature(opts.secret, signature, raw, opts.nowSeconds ?? Date.now() / 1000, opts.windowSeconds))) {
    throw new AuthError(`missing, bad or stale ${SIGNATURE_HEADER}`);
  }
  if (opts.contentType !== undefined) {
    const type = (opts.contentType ?? "").split(";")[0]!.trim().toLowerCase();
    if (type !== "application/json") {
      throw new InputError("content-type", `expected application/json, got ${type ? `'${type.slice(0, 100)}'` : "none"}`, { status: 415 });
    }
  }
  let json: unknown;
  try {
    json = JSON.parse(raw);
  } catch {
    throw new InputError("body", "malformed JSON");
  }
  const r = ToolResultCallback.safeParse(json);
  if (!r.success) throw inputErrorFromZod("", r.error.issues);
  return {
    call_id: r.data.call_id,
    content: r.data.content,
    ...(r.data.reward != null ? { reward: r.data.reward } : {}),
    ...(r.data.ok !== undefined ? { ok: r.data.ok } : {}),
    ...(r.data.metrics != null ? { metrics: r.data.metrics } : {}),
  };
}

/** A callback refused because no webhook secret (`tools.secret`) is configured: 403, code `forbidden`. */
export class CallbacksDisabledError extends EdgeloopError {
  override name = "CallbacksDisabledError";
  constructor() {
    super("callbacks need tools.secret: asynchronous tool results must be signed (x-edgeloop-signature); set tools.secret (--tools-secret) on serve, the workers and the tool servers", {
      status: 403,
      code: "forbidden",
    });
  }
}
