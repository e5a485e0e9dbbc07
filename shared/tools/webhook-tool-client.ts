import { z } from "zod";
import { ToolError } from "../errors.ts";
import type { ToolSchema, ToolSpec } from "../schema/index.ts";
import { DEFAULT_WEBHOOK_MAX_REPLY_BYTES } from "../http/outbound.ts";
import { postWebhook, WebhookError, type WebhookOptions } from "./webhook-post.ts";

/** One tool call to execute. `turn` is the assistant turn (1-based) that made it, `index` its position in that turn (0-based). */
export interface ToolCallRequest {
  name: string;
  /** Parsed arguments; must be a JSON object holding the schema's required parameters. */
  arguments: unknown;
  /** Trajectory key `{uid}_{session_id}_{output_index}`. */
  key: string;
  turn: number;
  index: number;
  /** `extra_info.tools_kwargs.<name>.create_kwargs` of the row. */
  create_kwargs?: Record<string, unknown>;
  /** The row's `extra_info.sandbox_kwargs`: the `create_kwargs` of the trajectory's sandbox create (tools files with a `sandbox` lifecycle). */
  sandbox_kwargs?: Record<string, unknown>;
  /** No tool result of this trajectory has been observed yet (a sandbox lost before that is replaced; after it, the loss fails the trajectory). */
  sandbox_fresh?: boolean;
  /** The trajectory's sandbox (set by `LeasedToolExecutor`): sent as the webhook body's `sandbox_id`/`lease_id` and MCP `_meta`. */
  sandbox?: { lease_id: string; sandbox_id: string };
  /**
   * The caller checkpoints pending calls (a durable session): a call that runs
   * as an MCP task resolves, once the server has created the task, to
   * `pending` with its `task_id` instead of waiting for the result; the caller
   * stores it, then waits with {@link ToolExecutor.awaitTask}. Without it the
   * executor waits for the task itself.
   */
  deferTasks?: boolean;
  signal?: AbortSignal;
}

/**
 * A call running as an MCP task whose result is awaited (first run or after a
 * resume): the tool, the call's id, the server's task id, the time left to
 * wait (`within_ms`, milliseconds from now; 0 or less: the wait is over) and
 * the whole wait's bound (`timeout_ms`, named in the error observation).
 */
export interface ToolTaskWait {
  name: string;
  call_id: string;
  task_id: string;
  within_ms: number;
  timeout_ms: number;
  signal?: AbortSignal;
}

/**
 * A tool's answer as the loop uses it. Failures are results too (`ok: false`)
 * whose `content` is text the model can read, naming the tool — never exceptions.
 */
export interface ToolResult {
  ok: boolean;
  content: string;
  /**
   * The reply as content parts, in the tool's order, when it holds images
   * (`{type: "image", image: "data:image/…;base64,…"}` among text parts);
   * absent for text-only replies (then `content` is the whole reply). With
   * it, `content` holds the text parts joined by `"\n"`. A loop with a
   * vision-language family renders the parts as the tool message's content;
   * a text-only family fails the trajectory (see `tool_agent`).
   */
  parts?: ToolContentPart[];
  reward?: number;
  metrics?: Record<string, unknown>;
  /** The idempotency key sent: `{key}:{turn}:{index}`; empty when no request was sent. */
  call_id: string;
  /** HTTP attempts made (0 when the call was refused before sending). */
  attempts: number;
  /**
   * The tool answered `202 Accepted`: its result comes later by callback
   * (`POST /v1/sessions/{key}/tool-results`). `content` still holds an error
   * text, for loops run without a durable session (which cannot wait).
   */
  pending?: boolean;
  /** With `pending`: how long the result may take (the tool's `timeout_ms`; an MCP server's `task_timeout_ms`). */
  timeout_ms?: number;
  /** With `pending`: the call runs as an MCP task of this id; its result is fetched with {@link ToolExecutor.awaitTask}, not delivered. */
  task_id?: string;
}

/** What a loop needs from its tools: their schemas (prompt order) and a way to call them. */
export interface ToolExecutor {
  /** Tool schemas in the tools file's order, as rendered into the prompt. */
  readonly schemas: readonly ToolSchema[];
  readonly names: readonly string[];
  /** Executes one call; resolves to a result for every failure (unknown tool, bad arguments, HTTP failure). */
  call(req: ToolCallRequest): Promise<ToolResult>;
  /**
   * Waits for the result of a call that runs as an MCP task (a `pending`
   * result with `task_id`), polling the same task id: it never sends the call
   * again. Resolves to a result for every failure (an unknown or expired task,
   * the wait's bound passed). Only executors with MCP servers have it.
   */
  awaitTask?(req: ToolTaskWait): Promise<ToolResult>;
  /** The same executor restricted to `names` (unknown names ignored), for `extra_info.tool_selection`. */
  select?(names: readonly string[]): ToolExecutor;
}

/**
 * The JSON body edgeloop POSTs to a webhook tool: `call_id` (the idempotency
 * key `{key}:{turn}:{index}`, the same on every retry), `name` (the tool),
 * `arguments` (the model's parsed arguments, a JSON object), `key` (trajectory
 * key `{uid}_{session_id}_{output_index}`), `turn` (the assistant turn that
 * made the call, 1-based), `create_kwargs` (the row's
 * `extra_info.tools_kwargs.<name>.create_kwargs`, `{}` when absent), and for
 * a trajectory that holds a sandbox lease (a tools file with a `sandbox`
 * lifecycle) `sandbox_id` and `lease_id` (absent otherwise).
 * docs/schemas/tool-call-request.json is generated from it.
 */
export const ToolCallRequestBody = z.object({
  call_id: z.string().min(1),
  name: z.string().min(1),
  arguments: z.record(z.string(), z.unknown()),
  key: z.string(),
  turn: z.number().int().min(1),
  create_kwargs: z.record(z.string(), z.unknown()),
  /** The trajectory's sandbox: the provider's create reply `sandbox_id` (1..256 characters); absent when the trajectory holds no sandbox lease. */
  sandbox_id: z.string().min(1).max(256).optional(),
  /** The trajectory's sandbox lease, `{key}~{attempt}` (the id its create and release name); sent with `sandbox_id`. */
  lease_id: z.string().min(1).optional(),
});
export type ToolCallRequestBody = z.infer<typeof ToolCallRequestBody>;

/** One part of a tool reply's content list: text, or an image as a `data:` URI (verl's `{type: "image", image}`). */
export const ToolContentPart = z.union([
  z.strictObject({ type: z.literal("text"), text: z.string() }),
  z.strictObject({ type: z.literal("image"), image: z.string().regex(/^data:/, "expected a data:image/…;base64 URI (image URLs are not fetched)") }),
]);
export type ToolContentPart = z.infer<typeof ToolContentPart>;

/**
 * The body a tool webhook must answer with `200` (docs/schemas/tool-reply.json
 * is generated from it). `content` is the text the model reads, or a list of
 * parts (text and `data:` URI images, in order) for vision-language families.
 */
export const ToolReply = z.object({
  content: z.union([z.string(), z.array(ToolContentPart).max(64)], { error: "expected a string, or a list of at most 64 parts {type: text, text} | {type: image, image: data URI}" }),
  reward: z.number().nullish(),
  metrics: z.record(z.string(), z.unknown()).nullish(),
});
export type ToolReply = z.infer<typeof ToolReply>;

/** The idempotency key of a call: `{key}:{turn}:{index}`, reused on every retry. */
export function toolCallId(key: string, turn: number, index: number): string {
  return `${key}:${turn}:${index}`;
}

/** `['a', 'b']` — the list format verl's messages use (`Available tools: [...]`). */
export function pyList(names: readonly string[]): string {
  return `[${names.map((n) => `'${n}'`).join(", ")}]`;
}

/**
 * Calls webhook tools (DESIGN §4.3, issue 4 §5): `POST url` with
 * `content-type: application/json` and body
 * `{"call_id", "name", "arguments", "key", "turn", "create_kwargs"}`
 * ({@link ToolCallRequestBody}; the contract is docs/tool-webhooks.md), signed
 * with `x-edgeloop-signature` when a secret is set, per-tool `timeout_ms` and
 * `max_retries` (backoff on 5xx/timeouts/connection errors, same `call_id`).
 * The reply must be `200 {"content": string | parts, "reward"?: number, "metrics"?: object}`
 * (parts: {@link ToolContentPart}; images reach the model only with a vision-language family).
 * `202 Accepted` (a later callback) comes back as a `pending` result that a
 * durable session awaits; a loop without one reads its error `content`.
 *
 * Arguments are checked lightly before sending: a JSON object with every
 * `required` parameter of the schema (full JSON-Schema validation is the
 * tool's job).
 * @see verl `ToolAgentLoop._call_tool` for the error texts (`Unknown function …`, `Error executing tool …`)
 */
export class WebhookToolClient implements ToolExecutor {
  readonly schemas: readonly ToolSchema[];
  readonly names: readonly string[];
  private readonly specs: Map<string, ToolSpec>;

  constructor(
    tools: readonly ToolSpec[],
    private readonly opts: WebhookOptions & { secret?: string } = {},
  ) {
    this.specs = new Map(tools.map((t) => [t.name, t]));
    this.schemas = tools.map((t) => t.schema);
    this.names = tools.map((t) => t.name);
  }

  select(names: readonly string[]): WebhookToolClient {
    const keep = new Set(names);
    return new WebhookToolClient([...this.specs.values()].filter((t) => keep.has(t.name)), this.opts);
  }

  async call(req: ToolCallRequest): Promise<ToolResult> {
    const spec = this.specs.get(req.name);
    if (!spec) {
      return { ok: false, call_id: "", attempts: 0, content: `Unknown function '${req.name}'. Available tools: ${pyList(this.names)}` };
    }
    const argError = checkToolArguments(spec.schema, req.arguments);
    if (argError) return { ok: false, call_id: "", attempts: 0, content: `Invalid arguments for '${req.name}': ${argError}` };
    const call_id = toolCallId(req.key, req.turn, req.index);
    const body: ToolCallRequestBody = { call_id, name: req.name, arguments: req.arguments as Record<string, unknown>, key: req.key, turn: req.turn, create_kwargs: req.create_kwargs ?? {}, ...(req.sandbox ? { sandbox_id: req.sandbox.sandbox_id, lease_id: req.sandbox.lease_id } : {}) };
    const fail = (reason: string, attempts: number): ToolResult => ({ ok: false, call_id, attempts, content: `Error executing tool '${req.name}': ${reason}` });
    let reply;
    try {
      reply = await postWebhook(
        { url: spec.url, secret: this.opts.secret, timeout_ms: spec.timeout_ms, max_retries: spec.max_retries, ...(spec.max_reply_bytes ? { max_reply_bytes: spec.max_reply_bytes } : {}) },
        body,
        { ...this.opts, signal: req.signal ?? this.opts.signal },
      );
    } catch (e) {
      const attempts = e instanceof WebhookError ? e.attempts : 1;
      return fail(e instanceof ToolError ? describeFailure(e, spec, attempts) : String(e), attempts);
    }
    if (reply.status === 202) {
      return {
        ...fail("the tool answered 202 Accepted (asynchronous result), which needs durable sessions; this loop only takes synchronous 200 replies", reply.attempts),
        pending: true,
        timeout_ms: spec.timeout_ms,
      };
    }
    if (reply.status !== 200) return fail(`unexpected HTTP ${reply.status}`, reply.attempts);
    const r = ToolReply.safeParse(reply.body);
    if (!r.success) return fail(`the tool's reply is not {"content": string | parts, "reward"?: number, "metrics"?: object} (${r.error.issues[0]?.path.join(".") || "body"}: ${r.error.issues[0]?.message})`, reply.attempts);
    return {
      ok: true,
      call_id,
      attempts: reply.attempts,
      ...contentOfParts(r.data.content),
      ...(r.data.reward != null ? { reward: r.data.reward } : {}),
      ...(r.data.metrics != null ? { metrics: r.data.metrics } : {}),
    };
  }
}

/**
 * A reply's `content` as a {@link ToolResult}'s `content` and `parts`: a
 * string is itself; a list is its text parts joined by `"\n"`, with `parts`
 * only when it holds an image (a list of text parts alone reads as its text).
 */
export function contentOfParts(content: string | readonly ToolContentPart[]): { content: string; parts?: ToolContentPart[] } {
  if (typeof content === "string") return { content };
  const text = content.flatMap((p) => (p.type === "text" ? [p.text] : [])).join("\n");
  return content.some((p) => p.type === "image") ? { content: text, parts: [...content] } : { content: text };
}

function describeFailure(e: ToolError, spec: ToolSpec, tries: number): string {
  const n = `${tries} attempt${tries > 1 ? "s" : ""}`;
  if (e.status === 499) return "aborted";
  if (e.code === "reply_too_large") return `the reply is larger than ${spec.max_reply_bytes ?? DEFAULT_WEBHOOK_MAX_REPLY_BYTES} bytes (the tool's max_reply_bytes)`;
  if (e.status >= 300 && e.status < 400) return `HTTP ${e.status} (a redirect; redirects are not followed)`;
  if (e.status === 504) return `timed out after ${spec.timeout_ms} ms (${n})`;
  if (e.status === 502 && e.retryable) return `could not connect (${n})`;
  if (e.retryable) return `HTTP ${e.status} (${n})`;
  if (e.status === 502) return "the reply is not JSON";
  return `HTTP ${e.status}`;
}

/**
 * Why a call's arguments cannot be sent to a tool of `schema` — not a JSON
 * object, or missing a `required` parameter — or undefined when they look
 * right (full JSON-Schema validation is the tool's job). Shared by every
 * {@link ToolExecutor} so that the model reads the same texts.
 */
export function checkToolArguments(schema: ToolSchema, args: unknown): string | undefined {
  if (args === null || typeof args !== "object" || Array.isArray(args)) return "arguments must be a JSON object";
  const required = (schema.function.parameters as { required?: unknown }).required;
  if (Array.isArray(required)) {
    const missing = required.filter((k): k is string => typeof k === "string" && !(k in (args as object)));
    if (missing.length > 0) return `missing required parameter${missing.length > 1 ? "s" : ""} ${missing.map((m) => `'${m}'`).join(", ")}`;
  }
  return undefined;
}
