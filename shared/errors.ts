/**
 * The edgeloop error hierarchy.
 *
 * Every error thrown on purpose by edgeloop is an {@link EdgeloopError}. Code
 * decides by the structured fields (`status`, `retryable`, `field`, `key`,
 * `code`), never by matching message text. `toResponse()` turns any of them
 * into the JSON error body the HTTP functions return; a 5xx body never carries
 * a stack trace.
 */

/** Options common to every edgeloop error. */
export interface EdgeloopErrorOptions {
  /** The underlying error, kept for logs and debugging. */
  cause?: unknown;
  /** HTTP status this error maps to (default 500). */
  status?: number;
  /** True when the same operation may succeed if retried (default false). */
  retryable?: boolean;
  /** Dotted path of the input field at fault, e.g. `rows[3].prompt`. */
  field?: string;
  /** Trajectory key (`{uid}_{session_id}_{output_index}`) the error belongs to. */
  key?: string;
  /** Stable machine-readable code, e.g. `context_overflow`. */
  code?: string;
}

/** Base class of every error edgeloop throws on purpose. */
export class EdgeloopError extends Error {
  override name = "EdgeloopError";
  readonly status: number;
  readonly retryable: boolean;
  readonly field?: string;
  readonly key?: string;
  readonly code: string;

  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.status = opts.status ?? 500;
    this.retryable = opts.retryable ?? false;
    this.field = opts.field;
    this.key = opts.key;
    this.code = opts.code ?? "internal";
  }

  /** JSON body for HTTP responses: `{error: {code, message, field?}}`; 5xx messages are generic. */
  toJSON(): { error: { code: string; message: string; field?: string } } {
    const message = this.status >= 500 && !this.exposeMessage ? "internal error" : this.message;
    return { error: { code: this.code, message, ...(this.field ? { field: this.field } : {}) } };
  }

  /** Whether a 5xx keeps its message in the body (only for messages written to be shown). */
  protected get exposeMessage(): boolean {
    return false;
  }

  /** A `Response` with this error's status and JSON body. */
  toResponse(headers?: Record<string, string>): Response {
    return new Response(JSON.stringify(this.toJSON()), {
      status: this.status,
      headers: { "content-type": "application/json", ...headers },
    });
  }
}

/** Bad input at a boundary (HTTP body, dataset row, CLI flag): 400, names the field. */
export class InputError extends EdgeloopError {
  override name = "InputError";
  constructor(field: string, message: string, opts: EdgeloopErrorOptions = {}) {
    super(`${field}: ${message}`, { status: 400, code: "invalid_input", ...opts, field });
  }
}

/** Invalid configuration, raised eagerly at construction; the message names the path and the fix. */
export class ConfigError extends EdgeloopError {
  override name = "ConfigError";
  constructor(path: string, message: string, opts: EdgeloopErrorOptions = {}) {
    super(`config ${path}: ${message}`, { status: 400, code: "invalid_config", ...opts, field: path });
  }
}

/** Missing or wrong credentials (bearer token, webhook signature): 401. */
export class AuthError extends EdgeloopError {
  override name = "AuthError";
  constructor(message = "unauthorized", opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 401, code: "unauthorized", ...opts });
  }
}

/** A resource that does not exist: 404. */
export class NotFoundError extends EdgeloopError {
  override name = "NotFoundError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 404, code: "not_found", ...opts });
  }
}

/** A request that conflicts with current state (e.g. an already-answered call id): 409. */
/** What this deployment cannot do (yet): 501, code `not_implemented`; the message says what and why, and is shown. */
export class NotImplementedError extends EdgeloopError {
  override name = "NotImplementedError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 501, code: "not_implemented", ...opts });
  }
  protected override get exposeMessage(): boolean {
    return true;
  }
}

export class ConflictError extends EdgeloopError {
  override name = "ConflictError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 409, code: "conflict", ...opts });
  }
}

/** A chat template that cannot be handled append-only, or fails to render. */
export class TemplateError extends EdgeloopError {
  override name = "TemplateError";
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 500, code: "template_error", ...opts });
  }
}

/** A trajectory that breaks one of DESIGN §2's invariants; names the invariant and the index. */
export class TrajectoryInvariantError extends EdgeloopError {
  override name = "TrajectoryInvariantError";
  readonly invariant: string;
  readonly index?: number;
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(invariant: string, message: string, index?: number, opts: EdgeloopErrorOptions = {}) {
    super(`${invariant}: ${message}${index === undefined ? "" : ` (at index ${index})`}`, {
      status: 500,
      code: "invariant_broken",
      ...opts,
    });
    this.invariant = invariant;
    this.index = index;
  }
}

/** Base of every error coming from an inference engine. */
export class EngineError extends EdgeloopError {
  override name = "EngineError";
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 502, code: "engine_error", ...opts });
  }
}

/** The prompt plus `max_tokens` exceeds the model's context (vLLM/SGLang answer 400). Not retryable. */
export class ContextOverflowError extends EngineError {
  override name = "ContextOverflowError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { code: "context_overflow", retryable: false, ...opts });
  }
}

/** The engine cannot be reached or is not serving (connection refused, 503, timeout). Retryable. */
export class EngineUnavailableError extends EngineError {
  override name = "EngineUnavailableError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 503, code: "engine_unavailable", retryable: true, ...opts });
  }
}

/** The engine aborted the request (client abort, preemption, weight update; SGLang may say HTTP 499). */
export class EngineAbortedError extends EngineError {
  override name = "EngineAbortedError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { code: "engine_aborted", retryable: true, ...opts });
  }
}

/** The engine answered something we cannot trust (no token ids, misaligned log-probs, bad JSON). */
export class BadEngineResponseError extends EngineError {
  override name = "BadEngineResponseError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { code: "bad_engine_response", retryable: false, ...opts });
  }
}

/** A tool webhook failed after its retries (used internally; the loop turns it into an observation). */
export class ToolError extends EdgeloopError {
  override name = "ToolError";
  protected override get exposeMessage(): boolean {
    return true;
  }
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 502, code: "tool_error", ...opts });
  }
}

/** The transfer queue or session storage failed (connection lost, full). 503, retryable by default. */
export class StoreError extends EdgeloopError {
  override name = "StoreError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 503, code: "store_error", retryable: true, ...opts });
  }
}

/**
 * A record part kept in the blob store ({@link BlobStore}, shared/store/blob-store.ts)
 * that cannot be read back as its pointer describes: missing, another byte
 * count, or another SHA-256 (`code` `blob_missing` / `blob_corrupt`). Names
 * the record `key` and its `field` (e.g. `routed_experts`). Not retryable:
 * the bytes stored are wrong, reading again gives the same.
 */
export class BlobIntegrityError extends StoreError {
  override name = "BlobIntegrityError";
  constructor(message: string, opts: EdgeloopErrorOptions & { key: string; field: string; code: "blob_missing" | "blob_corrupt" }) {
    super(message, { retryable: false, ...opts });
  }
}

/** Turns a zod error into an {@link InputError} naming the first failing field under `prefix`. */
export function inputErrorFromZod(
  prefix: string,
  issues: ReadonlyArray<{ path: ReadonlyArray<PropertyKey>; message: string; code?: string; keys?: readonly string[] }>,
): InputError {
  const first = issues[0];
  // An unknown key is named as the field itself (`bogus`, `config.rollout.respone_length`), not its parent object.
  const unknownKey = first?.code === "unrecognized_keys" && first.keys?.length ? [first.keys[0]!] : [];
  const path = first ? formatPath(prefix, [...first.path, ...unknownKey]) : prefix;
  const more = issues.length > 1 ? ` (and ${issues.length - 1} more issue${issues.length > 2 ? "s" : ""})` : "";
  return new InputError(path || "body", `${first?.message ?? "invalid"}${more}`);
}

/** `formatPath("rows", [3, "prompt", 0])` → `rows[3].prompt[0]`. */
export function formatPath(prefix: string, path: ReadonlyArray<PropertyKey>): string {
  let out = prefix;
  for (const p of path) {
    if (typeof p === "number") out += `[${p}]`;
    else out += out ? `.${String(p)}` : String(p);
  }
  return out;
}

/**
 * A write to a group withdrawn by a cancelled batch (`TransferQueue.cancelGroups`):
 * nothing was stored. 409 `group_cancelled`, not retryable.
 */
export class GroupCancelledError extends EdgeloopError {
  override name = "GroupCancelledError";
  constructor(uid: string) {
    super(`group ${uid.slice(0, 200)} was withdrawn by a cancelled batch: nothing is stored for it`, { status: 409, code: "group_cancelled", retryable: false });
  }
}

/**
 * The teacher engine (`rollout.teacher`) could not score a finished
 * trajectory after retries: its reply was unusable or the engine failed. The
 * trajectory fails with this (`on_error: fail`) or is kept without
 * `teacher_log_probs` and with `extra_fields.teacher_error` (`on_error: keep`).
 * Code `teacher_error`; the message names the teacher and the cause.
 */
export class TeacherError extends EdgeloopError {
  override name = "TeacherError";
  constructor(message: string, opts: EdgeloopErrorOptions = {}) {
    super(message, { status: 502, code: "teacher_error", ...opts });
  }
}
